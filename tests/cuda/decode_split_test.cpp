// plan_decode's split over the sequence (src/cuda/decode_split.hpp), on the CPU: the documented invariants on
// random shapes, the chosen split against an exhaustive evaluation of the same cost, and the H200 cases the
// model was introduced for.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "cuda/decode_split.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq::detail {
namespace {

using kvcompact::tq::testing::fresh_seed;

std::uint64_t modelled_cost(std::uint64_t chunk, std::uint64_t splits, std::uint64_t base, std::uint64_t slots) {
  return (base * splits + slots - 1) / slots * (chunk + kSplitOverheadTokens);
}

TEST(DecodeSplit, InvariantsAndOptimalityOnRandomShapes) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint64_t> len(1, 1u << 20), base(1, 4096), slots(1, 1000);
  for (int i = 0; i < 300; ++i) {
    const std::uint64_t L = len(rng), B = base(rng), S = slots(rng), tile = 128;
    SCOPED_TRACE("length " + std::to_string(L) + " base " + std::to_string(B) + " slots " + std::to_string(S));
    const DecodeSplit d = choose_decode_split(L, B, S, tile);
    ASSERT_GE(d.splits, 1u);
    EXPECT_EQ(d.chunk % tile, 0u);
    EXPECT_GE(d.chunk * d.splits, L);          // every token belongs to a split
    EXPECT_LT(d.chunk * (d.splits - 1), L);    // and no split is empty
    EXPECT_LE(d.splits, kMaxDecodeSplits);
    if (d.splits > 1) {
      EXPECT_GE(d.chunk, kMinSplitTokens / 2) << "splits far below the 512-token floor";
    }
    // No split count the model may choose from is cheaper.
    const std::uint64_t best = modelled_cost(d.chunk, d.splits, B, S);
    const std::uint64_t max_splits = std::min<std::uint64_t>(kMaxDecodeSplits, (L + kMinSplitTokens - 1) / kMinSplitTokens);
    for (std::uint64_t want = 1; want <= std::max<std::uint64_t>(max_splits, 1); ++want) {
      const std::uint64_t chunk = ((L + want - 1) / want + tile - 1) / tile * tile;
      const std::uint64_t splits = (L + chunk - 1) / chunk;
      EXPECT_GE(modelled_cost(chunk, splits, B, S), best) << "split count " << want;
    }
  }
}

TEST(DecodeSplit, FillsWholeWavesOnTheH200Shapes) {
  // 132 SMs × 5 resident blocks; Llama-3-8B (8 KV heads, one head group).
  const std::uint64_t slots = 660;
  // Batch 32 × 32K: "about four waves" gave 11 splits = 2816 blocks = 4.27 waves; the model avoids the partial wave.
  const DecodeSplit d32 = choose_decode_split(32768, 32 * 8, slots, 128);
  const double waves = static_cast<double>(32 * 8 * d32.splits) / slots;
  EXPECT_GT(waves - static_cast<double>(static_cast<std::uint64_t>(waves)), 0.5) << "splits " << d32.splits;
  // Batch 1 × 128K: one wave of long splits instead of four waves of 512-token splits.
  const DecodeSplit d1 = choose_decode_split(131072, 8, slots, 128);
  EXPECT_LE(8 * d1.splits, slots) << "splits " << d1.splits;
  EXPECT_GE(d1.splits, 64u) << "too few splits to fill the card";
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
