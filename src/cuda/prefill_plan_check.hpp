// Internal: the block shape plan_prefill derives from a plan's layout, mode, q_heads, max_rows, kernel and
// precision, and the re-check prefill_attention makes of those fields on every run. Plans are plain structs; a
// field edited by hand (more tiles, fewer tokens per block, a kernel that has no instance for the head_dim, a
// max_length past the capacity) would otherwise make the kernels index past the queries or the output or leave
// rows unwritten. (The key splits, the folded keys and the workspace size are checked in tq_prefill.cpp, which
// owns the workspace layout.) Pure host code: unit-tested on the CPU (tests/cuda/prefill_plan_check_test.cpp).
#pragma once

#include <cstdint>

#include "kvcompact/core/error.hpp"
#include "kvcompact/cuda/tq_prefill.hpp"

namespace kvcompact::cuda::tq::detail {

// Blocks over (query tokens × the heads of one KV head's GQA group): a block holds `block_rows` query rows, as
// many whole heads as fit (tokens_per_block tokens of heads_per_block heads) or, for a group wider than a block,
// one token of block_rows heads in head_groups blocks; tiles blocks cover max_rows tokens.
struct PrefillTiling {
  std::uint32_t heads_per_block = 0;
  std::uint32_t tokens_per_block = 0;
  std::uint32_t head_groups = 0;
  std::uint64_t tiles = 0;
};
PrefillTiling prefill_tiling(std::uint32_t group, std::uint32_t block_rows, std::uint32_t max_rows);

// Whether plan_prefill folds the keys (docs/cuda-prefill.md, "Folded keys"): exactly the warpgroup kernel in Fast
// precision; no kernel instance serves a fold elsewhere.
inline bool prefill_folds_keys(PrefillKernel kernel, PrefillPrecision precision) {
  return kernel == PrefillKernel::Warpgroup && precision == PrefillPrecision::Fast;
}

// Query rows per block of the instance a plan runs: the warpgroup kernel's (QJL keys read as codes take its QJL
// block) or the portable kernel's for the head_dim.
std::uint32_t prefill_plan_block_rows(std::uint32_t head_dim, bool qjl, PrefillKernel kernel, bool folded);

// A plan's shape fields against each other (InvalidArgument naming the field): q_heads and the mode as
// plan_prefill checks them, a known precision, a kernel that is Portable or Warpgroup (never Auto) with an
// instance for the head_dim, 1 ≤ max_rows ≤ max_length ≤ capacity, 1 ≤ max_batch ≤ 65535, block_rows that of the
// instance, and heads_per_block, tokens_per_block, head_groups and tiles equal to prefill_tiling's.
Status check_prefill_plan_shape(const PrefillPlan& plan);

}  // namespace kvcompact::cuda::tq::detail
