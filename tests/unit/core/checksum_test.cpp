// XXH64 wrapper: known vector and stream == one-shot.
#include <gtest/gtest.h>

#include <random>
#include <string_view>
#include <vector>

#include "kvcompact/core/checksum.hpp"
#include "test_seed.hpp"

namespace kvcompact {
namespace {

TEST(Checksum, KnownEmptyInputValue) {
  // XXH64 of the empty input with seed 0 (published test vector).
  EXPECT_EQ(xxh64({}), 0xEF46DB3751D8E999ull);
}

// Non-empty inputs and non-zero seeds, so that a wrapper that dropped the seed or the length would fail: "a" and
// "abc" with seed 0 are the published vectors; the others come from an independent binding (python-xxhash 3).
TEST(Checksum, KnownValuesWithContentAndSeeds) {
  auto bytes = [](std::string_view s) {
    return std::vector<std::uint8_t>(s.begin(), s.end());
  };
  EXPECT_EQ(xxh64(bytes("a")), 0xD24EC4F1A98C6E5Bull);
  EXPECT_EQ(xxh64(bytes("abc")), 0x44BC2CF5AD770999ull);
  EXPECT_EQ(xxh64(bytes("abc"), 7), 0x9E755206156676D7ull);
  std::vector<std::uint8_t> ramp(100);
  for (std::size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<std::uint8_t>(i);
  EXPECT_EQ(xxh64(ramp, 123456789), 0xF96F532E91C7BCF4ull);
  Xxh64Stream stream(123456789);
  stream.update(std::span(ramp).first(37));
  stream.update(std::span(ramp).subspan(37));
  EXPECT_EQ(stream.digest(), 0xF96F532E91C7BCF4ull);
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
