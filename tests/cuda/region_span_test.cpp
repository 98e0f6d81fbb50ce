// The bulk copies' chunk span (src/cuda/region_span.hpp), on the CPU: for random record runs, the copy starts at a
// 16-byte boundary at most 15 bytes before the first record, covers every record, ends at a 16-byte boundary at
// most 15 bytes past the last one, and places the first record at start % 16 — against a byte-by-byte oracle.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "cuda/region_span.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq::detail {
namespace {

using kvcompact::tq::testing::fresh_seed;

TEST(RegionSpan, CoversTheRecordsWithinFifteenBytesEitherSide) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint64_t> base(0, std::uint64_t{1} << 40), token(0, 1u << 20);
  std::uniform_int_distribution<std::uint32_t> tokens(1, 64), bpt(1, 160);
  for (int i = 0; i < 20000; ++i) {
    const std::uint32_t b = bpt(rng), n = tokens(rng);
    // Regions start 16-byte aligned (layer offsets are), records at any token.
    const std::uintptr_t start = static_cast<std::uintptr_t>((base(rng) & ~std::uint64_t{15}) + token(rng) * b);
    const RegionSpan span = region_span(start, n, b);
    SCOPED_TRACE("start " + std::to_string(start) + " tokens " + std::to_string(n) + " bpt " + std::to_string(b));
    ASSERT_EQ(span.aligned % 16, 0u);
    ASSERT_EQ(span.bytes % 16, 0u);
    ASSERT_LE(span.aligned, start);
    ASSERT_LE(start - span.aligned, 15u);
    // Oracle: the smallest run of whole 16-byte chunks holding bytes [start, start + n·b).
    const std::uintptr_t end = start + std::uintptr_t{n} * b;
    const std::uintptr_t first_chunk = start / 16, last_chunk = (end - 1) / 16;
    EXPECT_EQ(span.aligned, first_chunk * 16);
    EXPECT_EQ(span.bytes, (last_chunk - first_chunk + 1) * 16);
    EXPECT_GE(span.aligned + span.bytes, end);
    EXPECT_LE(span.aligned + span.bytes - end, 15u);
  }
}

TEST(RegionSpan, AlignedRecordsCopyExactly) {
  // Records that start on a boundary and fill whole chunks are copied with no byte before or after them.
  const RegionSpan span = region_span(4096, 64, 48);
  EXPECT_EQ(span.aligned, 4096u);
  EXPECT_EQ(span.bytes, 64u * 48u);
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
