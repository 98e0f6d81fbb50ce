// Internal: how plan_prefill splits each query tile's keys over several blocks of the warpgroup kernel (the
// key split, docs/cuda-prefill.md). A pure function of the shape, so it is unit-tested on the CPU
// (tests/cuda/prefill_split_test.cpp).
#pragma once

#include <cstdint>

namespace kvcompact::cuda::tq::detail {

// A block's fixed cost in key tiles of streaming work: preparing its queries, filling the tile ring, the epilogue.
// Fitted on the H200 from 2048-token chunks over 8K keys (1790 µs unsplit in 3 waves, 1992 µs in 3 splits and 8
// waves); a sweep of 1–8 splits at 8K / 32K / 128K (docs/cuda-prefill.md) confirmed its choices.
inline constexpr double kPrefillBlockFixedTiles = 22.0;
// What each split adds in key tiles: its partial written, its share of the merge.
inline constexpr double kPrefillSplitTiles = 0.1;

// The split count in [1, max_splits] with the least modelled time for `units` query tiles of `key_tiles` key
// tiles each on `slots` resident blocks: blocks run in whole waves (a partial last wave costs a full one), and a
// block costs kPrefillBlockFixedTiles + its key tiles (+ kPrefillSplitTiles per split when split). Never more
// splits than key tiles; ties go to fewer splits.
inline std::uint32_t choose_key_splits(std::uint64_t units, std::uint64_t slots, std::uint64_t key_tiles,
                                       std::uint32_t max_splits) {
  if (units == 0 || slots == 0) return 1;
  std::uint32_t best = 1;
  double best_cost = 0.0;
  for (std::uint32_t s = 1; s <= max_splits && s <= key_tiles; ++s) {
    const double waves = static_cast<double>((units * s + slots - 1) / slots);
    const double per_block = kPrefillBlockFixedTiles + static_cast<double>((key_tiles + s - 1) / s) +
                             (s > 1 ? kPrefillSplitTiles * s : 0.0);
    const double cost = waves * per_block;
    if (s == 1 || cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace kvcompact::cuda::tq::detail
