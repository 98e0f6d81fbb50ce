// plan_prefill's key split (src/cuda/prefill_split.hpp), on the CPU: the documented invariants on random
// shapes, the chosen count against an exhaustive evaluation of the same cost, and the benchmark's H200 shapes.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "cuda/prefill_split.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq::detail {
namespace {

using kvcompact::tq::testing::fresh_seed;

double modelled_cost(std::uint64_t units, std::uint64_t slots, std::uint64_t key_tiles, std::uint32_t s) {
  const double waves = static_cast<double>((units * s + slots - 1) / slots);
  return waves * (kPrefillBlockFixedTiles + static_cast<double>((key_tiles + s - 1) / s) +
                  (s > 1 ? kPrefillSplitTiles * s : 0.0));
}

TEST(PrefillKeySplit, InvariantsAndOptimalityOnRandomShapes) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint64_t> units(1, 5000), slots(1, 600), tiles(1, 40000);
  std::uniform_int_distribution<std::uint32_t> most(1, 8);
  for (int i = 0; i < 500; ++i) {
    const std::uint64_t U = units(rng), S = slots(rng), T = tiles(rng);
    const std::uint32_t M = most(rng);
    SCOPED_TRACE("units " + std::to_string(U) + " slots " + std::to_string(S) + " key tiles " + std::to_string(T) +
                 " max " + std::to_string(M));
    const std::uint32_t s = choose_key_splits(U, S, T, M);
    ASSERT_GE(s, 1u);
    EXPECT_LE(s, M);
    EXPECT_LE(std::uint64_t{s}, T);  // every split has a key tile
    const double chosen = modelled_cost(U, S, T, s);
    for (std::uint32_t other = 1; other <= M && other <= T; ++other) {
      const double cost = modelled_cost(U, S, T, other);
      EXPECT_GE(cost, chosen) << other << " splits are cheaper than the chosen " << s;
      if (other < s) {
        EXPECT_GT(cost, chosen) << "a tie must go to fewer splits (" << other << ")";
      }
    }
  }
}

TEST(PrefillKeySplit, DegenerateShapes) {
  EXPECT_EQ(choose_key_splits(0, 132, 100, 8), 1u);
  EXPECT_EQ(choose_key_splits(10, 0, 100, 8), 1u);
  EXPECT_EQ(choose_key_splits(1, 132, 1, 8), 1u);    // one key tile: nothing to split
  EXPECT_EQ(choose_key_splits(1, 132, 100, 1), 1u);  // splits not allowed
  EXPECT_EQ(choose_key_splits(1, 132, 3, 8), 3u);    // one block on 132 slots: as many splits as key tiles
}

// The benchmark's shapes on the H200 (a 2048-token chunk, 8 KV heads: 344 query tiles of 192 rows, 132
// resident blocks), where every count from 1 to 8 was measured (docs/results/prefill_ab_split_sweep.csv): none
// at 8K (1471 µs against 1522 for the best split), 3 at 32K (4612 µs; 4780 with 4, 5038 unsplit) and at 128K
// (17 673 µs; 17 725 with 8, 19 052 unsplit).
TEST(PrefillKeySplit, TheMeasuredH200Shapes) {
  EXPECT_EQ(choose_key_splits(344, 132, (8192 + 2048) / 64, 8), 1u);
  EXPECT_EQ(choose_key_splits(344, 132, (32768 + 2048) / 64, 8), 3u);
  EXPECT_EQ(choose_key_splits(344, 132, (131072 + 2048) / 64, 8), 3u);
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
