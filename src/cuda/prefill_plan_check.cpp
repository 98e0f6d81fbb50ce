// The PrefillPlan shape invariants (prefill_plan_check.hpp), shared by plan_prefill (which derives the fields)
// and prefill_attention (which re-checks them before every launch).
#include "prefill_plan_check.hpp"

#include "attention_checks.hpp"
#include "prefill_params.hpp"

namespace kvcompact::cuda::tq::detail {

namespace {
const char* kernel_name(PrefillKernel kernel) {
  return kernel == PrefillKernel::Warpgroup ? "warpgroup" : kernel == PrefillKernel::Portable ? "portable" : "auto";
}
}  // namespace

PrefillTiling prefill_tiling(std::uint32_t group, std::uint32_t block_rows, std::uint32_t max_rows) {
  PrefillTiling t;
  if (block_rows == 0 || group == 0) return t;
  if (group <= block_rows) {
    t.heads_per_block = group;
    t.tokens_per_block = block_rows / group;
    t.head_groups = 1;
  } else {
    t.heads_per_block = block_rows;
    t.tokens_per_block = 1;
    t.head_groups = (group + block_rows - 1) / block_rows;
  }
  t.tiles = (std::uint64_t{max_rows} + t.tokens_per_block - 1) / t.tokens_per_block;
  return t;
}

std::uint32_t prefill_plan_block_rows(std::uint32_t head_dim, bool qjl, PrefillKernel kernel, bool folded) {
  return kernel == PrefillKernel::Warpgroup ? prefill_wgmma_block_rows(qjl && !folded) : prefill_block_rows(head_dim, qjl);
}

Status check_prefill_plan_shape(const PrefillPlan& plan) {
  const LayerLayout& layout = plan.layout;
  KVC_TRY(check_plan_heads_and_mode(layout, plan.config, plan.q_heads, prefill_supported(layout.head_dim, plan.config),
                                    "prefill"));
  // (Each message says "prefill plan": the field was edited after plan_prefill, which never makes such a plan.)
  if (plan.precision != PrefillPrecision::HiLo && plan.precision != PrefillPrecision::Fast) {
    return make_error(ErrorCode::InvalidArgument, "prefill plan's precision {} is unknown",
                      static_cast<int>(plan.precision));
  }
  const bool qjl = plan.config.has_qjl();
  if (plan.kernel != PrefillKernel::Portable &&
      (plan.kernel != PrefillKernel::Warpgroup || !prefill_wgmma_supported(layout.head_dim, qjl))) {
    return make_error(ErrorCode::InvalidArgument, "prefill plan's kernel {} ({}) has no instance for head_dim {} (a "
                      "plan names the kernel that runs, portable or warpgroup)",
                      static_cast<int>(plan.kernel), kernel_name(plan.kernel), layout.head_dim);
  }
  if (plan.max_rows == 0 || plan.max_rows > plan.max_length || plan.max_length > layout.capacity) {
    return make_error(ErrorCode::InvalidArgument, "prefill plan's max_rows {} and max_length {} must satisfy 1 ≤ "
                      "max_rows ≤ max_length ≤ capacity {}", plan.max_rows, plan.max_length, layout.capacity);
  }
  if (plan.max_batch == 0 || plan.max_batch > kMaxGridYZ) {
    return make_error(ErrorCode::InvalidArgument, "prefill plan's max_batch {} is outside 1 … {}", plan.max_batch,
                      kMaxGridYZ);
  }
  // (The instance plan_prefill picks: folded keys exactly for the warpgroup kernel in Fast precision. An edited
  // folded_keys is reported by prefill_attention's own check, so it is not taken as the block's shape here.)
  const std::uint32_t rows =
      prefill_plan_block_rows(layout.head_dim, qjl, plan.kernel, prefill_folds_keys(plan.kernel, plan.precision));
  if (plan.block_rows != rows) {
    return make_error(ErrorCode::InvalidArgument, "prefill plan's block_rows {} is not the {} kernel's {}",
                      plan.block_rows, kernel_name(plan.kernel), rows);
  }
  const PrefillTiling t = prefill_tiling(plan.q_heads / layout.kv_heads, rows, plan.max_rows);
  if (plan.heads_per_block != t.heads_per_block || plan.tokens_per_block != t.tokens_per_block ||
      plan.head_groups != t.head_groups || plan.tiles != t.tiles) {
    return make_error(ErrorCode::InvalidArgument, "prefill plan's tiling (heads_per_block {}, tokens_per_block {}, "
                      "head_groups {}, tiles {}) is not the ({}, {}, {}, {}) its q_heads, max_rows and kernel give",
                      plan.heads_per_block, plan.tokens_per_block, plan.head_groups, plan.tiles, t.heads_per_block,
                      t.tokens_per_block, t.head_groups, t.tiles);
  }
  if (std::uint64_t{layout.kv_heads} * t.head_groups > kMaxGridYZ) {
    return make_error(ErrorCode::InvalidArgument, "prefill plan's grid (kv heads x head groups {}) exceeds the CUDA "
                      "limit {}", std::uint64_t{layout.kv_heads} * t.head_groups, kMaxGridYZ);
  }
  return ok_status();
}

}  // namespace kvcompact::cuda::tq::detail
