// Internal: how plan_decode splits each (sequence, KV head) over the sequence (flash-decoding). A pure
// function of the shape, so it is unit-tested on the CPU (tests/cuda/decode_split_test.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

namespace kvcompact::cuda::tq::detail {

inline constexpr std::uint64_t kMaxDecodeSplits = 4096;  // the merge kernel keeps one weight per split in shared memory
inline constexpr std::uint64_t kMinSplitTokens = 512;    // a split pays for its prologue and its partial
// A block's fixed cost (prologue, partial write, its share of the merge) in tokens of streaming work; a rough
// figure from the batch-1 timings (a split of 512 tokens runs at about two thirds of the long-split speed).
inline constexpr std::uint64_t kSplitOverheadTokens = 256;

struct DecodeSplit {
  std::uint64_t chunk = 0;   // tokens per split, a multiple of `tile`
  std::uint64_t splits = 0;  // ceil(length / chunk)
};

// The split with the least modelled time: whole waves of resident blocks (a partial last wave costs a full
// one) × (tokens per split + kSplitOverheadTokens). `blocks_per_split` = sequences × KV heads × head groups,
// `slots` = resident blocks per multiprocessor × multiprocessors, `length` ≥ 1. Ties go to fewer splits.
inline DecodeSplit choose_decode_split(std::uint64_t length, std::uint64_t blocks_per_split, std::uint64_t slots,
                                       std::uint64_t tile) {
  length = std::max<std::uint64_t>(length, 1);
  blocks_per_split = std::max<std::uint64_t>(blocks_per_split, 1);
  slots = std::max<std::uint64_t>(slots, 1);
  const std::uint64_t max_splits =
      std::max<std::uint64_t>(1, std::min<std::uint64_t>(kMaxDecodeSplits, (length + kMinSplitTokens - 1) / kMinSplitTokens));
  DecodeSplit best;
  std::uint64_t best_cost = 0;
  for (std::uint64_t want = 1; want <= max_splits; ++want) {
    const std::uint64_t c = (length + want - 1) / want;
    const std::uint64_t chunk = (c + tile - 1) / tile * tile;
    const std::uint64_t splits = (length + chunk - 1) / chunk;
    const std::uint64_t waves = (blocks_per_split * splits + slots - 1) / slots;
    const std::uint64_t cost = waves * (chunk + kSplitOverheadTokens);
    if (best.splits == 0 || cost < best_cost) {
      best_cost = cost;
      best = {chunk, splits};
    }
  }
  return best;
}

}  // namespace kvcompact::cuda::tq::detail
