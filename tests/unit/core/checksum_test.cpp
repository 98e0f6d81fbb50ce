// XXH64 wrapper: known vector and stream == one-shot.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kvcompact/core/checksum.hpp"
#include "test_seed.hpp"

namespace kvcompact {
namespace {

TEST(Checksum, KnownEmptyInputValue) {
  // XXH64 of the empty input with seed 0 (published test vector).
  EXPECT_EQ(xxh64({}), 0xEF46DB3751D8E999ull);
}

TEST(Checksum, StreamMatchesOneShot) {
  const std::uint64_t seed = kvcompact::testing_support::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> data(10007);
  for (auto& b : data) b = static_cast<std::uint8_t>(rng());
  Xxh64Stream stream(7);
  std::size_t pos = 0;
  while (pos < data.size()) {
    std::size_t n = std::min<std::size_t>(data.size() - pos, 1 + rng() % 999);
    stream.update(std::span(data).subspan(pos, n));
    pos += n;
  }
  EXPECT_EQ(stream.digest(), xxh64(data, 7));
  data[5000] ^= 1;
  EXPECT_NE(stream.digest(), xxh64(data, 7));
}

}  // namespace
}  // namespace kvcompact
