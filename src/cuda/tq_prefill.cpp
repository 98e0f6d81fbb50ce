// Host side of CUDA chunked-prefill attention: plan_prefill (block shape over query tokens × GQA heads, kernel
// instance and its shared-memory limit) and prefill_attention (argument checks, one launch through
// tq_prefill.cu). Nothing is allocated per call, so a run can be captured in a CUDA graph.
#include "kvcompact/cuda/tq_prefill.hpp"

#include <algorithm>
#include <cmath>

#include "align.hpp"
#include "attention_checks.hpp"
#include "check.hpp"
#include "prefill_params.hpp"
#include "prefill_plan_check.hpp"
#include "prefill_split.hpp"

namespace kvcompact::cuda::tq {

namespace {
using detail::kMaxGridX;
using detail::kMaxGridYZ;
constexpr std::uint32_t kKeyTile = 64;      // key tokens per tile of the warpgroup kernel

// Query tiles (blocks before any key split) of a launch of `entries` batch entries: the key split's units, each
// with its partials and counter in the workspace (entry-major, so a smaller launch uses the first ones).
std::uint64_t query_tiles(const PrefillPlan& plan, std::uint64_t entries) {
  return entries * plan.layout.kv_heads * plan.head_groups * plan.tiles;
}
std::uint64_t key_tiles(const PrefillPlan& plan) { return (std::uint64_t{plan.max_length} + kKeyTile - 1) / kKeyTile; }
// Floats of one split's partial in the workspace (the block's rows of outputs, then their maxima and sums); the
// workspace holds query_tiles(plan, max_batch) · key_splits partials, then one counter per query tile.
std::uint64_t partial_floats(const PrefillPlan& plan) {
  return detail::prefill_wgmma_partial_floats(plan.config.has_qjl() && !plan.folded_keys);
}
// Bytes of the partials and counters (0 without a key split); the folded key tiles follow at this offset rounded
// up to 256 bytes.
std::uint64_t split_bytes(const PrefillPlan& plan) {
  if (plan.key_splits <= 1) return 0;
  const std::uint64_t units = query_tiles(plan, plan.max_batch);
  return units * plan.key_splits * partial_floats(plan) * 4u + units * 4u;  // partials, then counters
}
std::uint64_t fold_offset(const PrefillPlan& plan) { return kvcompact::cuda::detail::align256(split_bytes(plan)); }
std::uint64_t fold_bytes(const PrefillPlan& plan) {
  return plan.folded_keys ? std::uint64_t{plan.max_batch} * plan.layout.kv_heads * key_tiles(plan) *
                                detail::folded_tile_bytes(plan.config.has_qjl())
                          : 0u;
}
// The workspace a plan's fields need (with_key_splits' workspace_bytes).
std::uint64_t needed_workspace(const PrefillPlan& plan) {
  return plan.folded_keys ? fold_offset(plan) + fold_bytes(plan) : split_bytes(plan);
}
}  // namespace

bool prefill_supported(std::uint32_t head_dim, const kvcompact::tq::QuantConfig& config) {
  const std::uint32_t cb = config.key_code_bits();
  return detail::prefill_block_rows(head_dim, config.has_qjl()) != 0 && cb >= 1 && cb <= 5 &&
         config.value_bits >= 2 && config.value_bits <= 4;
}

Result<PrefillPlan> plan_prefill(const LayerLayout& layout, const kvcompact::tq::QuantConfig& config,
                                 std::uint32_t q_heads, std::uint32_t max_rows, std::uint32_t max_length,
                                 int multiprocessors, PrefillPrecision precision, PrefillKernel kernel,
                                 std::uint32_t max_batch) {
  KVC_TRY(detail::check_plan_heads_and_mode(layout, config, q_heads, prefill_supported(layout.head_dim, config), "prefill"));
  if (precision != PrefillPrecision::HiLo && precision != PrefillPrecision::Fast) {
    return make_error(ErrorCode::InvalidArgument, "unknown prefill precision {}", static_cast<int>(precision));
  }
  if (kernel != PrefillKernel::Auto && kernel != PrefillKernel::Portable && kernel != PrefillKernel::Warpgroup) {
    return make_error(ErrorCode::InvalidArgument, "unknown prefill kernel {}", static_cast<int>(kernel));
  }
  const bool qjl = config.has_qjl();
  const bool wgmma_exists = detail::prefill_wgmma_supported(layout.head_dim, qjl);
  if (kernel == PrefillKernel::Warpgroup && !wgmma_exists) {
    return make_error(ErrorCode::Unsupported, "the warpgroup prefill kernel needs head_dim 128 (head_dim {})",
                      layout.head_dim);
  }
  const bool use_wgmma = kernel == PrefillKernel::Warpgroup || (kernel == PrefillKernel::Auto && wgmma_exists);
  if (max_rows == 0) {
    return make_error(ErrorCode::InvalidArgument, "max_rows must be at least 1 (a prefill chunk has rows)");
  }
  if (max_batch == 0 || max_batch > kMaxGridYZ) {
    return make_error(ErrorCode::InvalidArgument, "max_batch {} must be in [1, {}]", max_batch, kMaxGridYZ);
  }
  if (multiprocessors < 1) {
    return make_error(ErrorCode::InvalidArgument, "multiprocessors {} must be at least 1", multiprocessors);
  }
  if (max_length > layout.capacity) {
    return make_error(ErrorCode::OutOfRange, "max_length {} exceeds the layout capacity {}", max_length,
                      layout.capacity);
  }
  if (max_rows > max_length) {
    return make_error(ErrorCode::OutOfRange, "max_rows {} exceeds max_length {} (query rows need stored keys)",
                      max_rows, max_length);
  }
  // The warpgroup kernel folds the keys in Fast precision (docs/cuda-prefill.md, "Folded keys"). HiLo keeps the
  // QJL block's exact sign tiles, and its MSE keys gained nothing from folding (0.97-1.01 in the H200 A/B).
  const PrefillKernel runs = use_wgmma ? PrefillKernel::Warpgroup : PrefillKernel::Portable;
  const bool folded = detail::prefill_folds_keys(runs, precision);
  const int fold = !folded ? detail::kFoldNone : (qjl ? detail::kFoldQjl : detail::kFoldMse);
  const std::uint32_t block_rows = detail::prefill_plan_block_rows(layout.head_dim, qjl, runs, folded);
  PrefillPlan plan;
  plan.layout = layout;
  plan.config = config;
  plan.precision = precision;
  plan.kernel = runs;
  plan.folded_keys = folded;
  plan.q_heads = q_heads;
  plan.max_rows = max_rows;
  plan.max_length = max_length;
  plan.block_rows = block_rows;
  const detail::PrefillTiling tiling = detail::prefill_tiling(q_heads / layout.kv_heads, block_rows, max_rows);
  plan.heads_per_block = tiling.heads_per_block;
  plan.tokens_per_block = tiling.tokens_per_block;
  plan.head_groups = tiling.head_groups;
  const std::uint64_t tiles = tiling.tiles;
  const std::uint64_t grid_y = std::uint64_t{layout.kv_heads} * plan.head_groups;
  if (tiles > kMaxGridX || grid_y > kMaxGridYZ) {
    return make_error(ErrorCode::OutOfRange, "prefill grid ({}, {}) exceeds the CUDA limits", tiles, grid_y);
  }
  plan.tiles = static_cast<std::uint32_t>(tiles);
  const bool split_p = precision == PrefillPrecision::HiLo;
  if (use_wgmma) {
    KVC_CUDA_TRY(detail::prepare_prefill_wgmma(qjl && !folded, split_p, fold));
    plan.blocks_per_sm = detail::prefill_wgmma_blocks_per_sm(qjl && !folded, split_p, fold);
  } else {
    KVC_CUDA_TRY(detail::prepare_prefill(layout.head_dim, qjl, split_p));
    plan.blocks_per_sm = detail::prefill_blocks_per_sm(layout.head_dim, qjl, split_p);
  }
  plan.max_batch = max_batch;
  std::uint32_t splits = 1;
  if (use_wgmma && plan.blocks_per_sm > 0) {
    const std::uint64_t slots = static_cast<std::uint64_t>(multiprocessors) * plan.blocks_per_sm;
    splits = detail::choose_key_splits(query_tiles(plan, max_batch), slots, key_tiles(plan), kMaxPrefillKeySplits);
    if (tiles * splits > kMaxGridX) splits = 1;
  }
  return with_key_splits(plan, splits);
}

Result<PrefillPlan> with_key_splits(const PrefillPlan& plan, std::uint32_t key_splits) {
  if (plan.block_rows == 0 || plan.tiles == 0) {
    return make_error(ErrorCode::InvalidArgument, "with_key_splits needs a plan from plan_prefill");
  }
  if (key_splits == 0 || key_splits > kMaxPrefillKeySplits) {
    return make_error(ErrorCode::InvalidArgument, "key_splits {} must be in [1, {}]", key_splits,
                      kMaxPrefillKeySplits);
  }
  if (key_splits > 1 && plan.kernel != PrefillKernel::Warpgroup) {
    return make_error(ErrorCode::Unsupported, "only the warpgroup prefill kernel splits the keys ({} asked for)",
                      key_splits);
  }
  if (key_splits > key_tiles(plan)) {
    return make_error(ErrorCode::OutOfRange, "{} key splits for max_length {}: at most one split per {}-token tile",
                      key_splits, plan.max_length, kKeyTile);
  }
  if (std::uint64_t{plan.tiles} * key_splits > kMaxGridX) {
    return make_error(ErrorCode::OutOfRange, "prefill grid of {} x {} blocks exceeds the CUDA limit", plan.tiles,
                      key_splits);
  }
  PrefillPlan out = plan;
  out.key_splits = key_splits;
  out.workspace_bytes = needed_workspace(out);
  return out;
}

static_assert(detail::kStatusBadSequence == kPrefillBadSequence && detail::kStatusRowsBeyondPlan == kPrefillRowsBeyondPlan &&
                  detail::kStatusPositionBeyondLength == kPrefillPositionBeyondLength &&
                  detail::kStatusKeysBeyondPlan == kPrefillKeysBeyondPlan,
              "the kernels' status bits and the public ones");

Status prefill_attention(const PrefillPlan& plan, const DeviceCodec& codec, const void* layer_data,
                         const PrefillArgs& args, void* workspace, void* stream) {
  const LayerLayout& layout = plan.layout;
  if (plan.block_rows == 0 || plan.tiles == 0) {
    return make_error(ErrorCode::InvalidArgument, "prefill_attention needs a plan from plan_prefill");
  }
  KVC_TRY(detail::check_prefill_plan_shape(plan));
  KVC_TRY(detail::check_codec_matches_plan(codec, layout, plan.config));
  if (args.batch > plan.max_batch) {
    return make_error(ErrorCode::OutOfRange, "prefill batch of {} entries exceeds the plan's max_batch {}",
                      args.batch, plan.max_batch);
  }
  if (plan.key_splits == 0 || plan.key_splits > kMaxPrefillKeySplits ||
      (plan.key_splits > 1 && plan.kernel != PrefillKernel::Warpgroup) ||
      std::uint64_t{plan.tiles} * plan.key_splits > kMaxGridX) {
    return make_error(ErrorCode::InvalidArgument, "prefill plan with {} key splits for the {} kernel",
                      plan.key_splits, plan.kernel == PrefillKernel::Warpgroup ? "warpgroup" : "portable");
  }
  // (Plans are plain structs: a field edited by hand must not make the kernels write past the workspace or pick
  // an instance that does not exist.)
  if (plan.folded_keys != detail::prefill_folds_keys(plan.kernel, plan.precision)) {
    return make_error(ErrorCode::InvalidArgument,
                      "prefill plan with folded_keys {} for the {} kernel in {} precision (plan_prefill folds exactly "
                      "the warpgroup kernel's fast-precision plans)",
                      plan.folded_keys, plan.kernel == PrefillKernel::Warpgroup ? "warpgroup" : "portable",
                      plan.precision == PrefillPrecision::Fast ? "fast" : "hi + lo");
  }
  if (plan.workspace_bytes < needed_workspace(plan)) {
    return make_error(ErrorCode::InvalidArgument, "prefill plan's workspace_bytes {} is below the {} its fields need",
                      plan.workspace_bytes, needed_workspace(plan));
  }
  if (args.batch == 0) return ok_status();
  if (layer_data == nullptr || args.queries == nullptr || args.output == nullptr || args.rows == nullptr ||
      args.first_positions == nullptr || args.lengths == nullptr) {
    return make_error(ErrorCode::InvalidArgument,
                      "prefill_attention needs layer data, queries, output, rows, first_positions and lengths");
  }
  if (plan.workspace_bytes > 0 && workspace == nullptr) {
    return make_error(ErrorCode::InvalidArgument, "prefill_attention needs a workspace of {} bytes",
                      plan.workspace_bytes);
  }
  KVC_TRY(detail::check_attention_inputs(layout, layer_data, args.window_begins, args.scale));
  detail::PrefillParams p{};
  p.layer = static_cast<const std::uint8_t*>(layer_data);
  p.tables = static_cast<const detail::Tables*>(codec.tables());
  p.queries = args.queries;
  p.output = args.output;
  p.sinks = args.sinks;
  p.seqs = args.seqs;
  p.first_positions = args.first_positions;
  p.rows = args.rows;
  p.lengths = args.lengths;
  p.window_begins = layout.exact_window > 0 ? args.window_begins : nullptr;
  detail::set_region_offsets(p, layout);
  p.head_dim = layout.head_dim;
  p.kv_heads = layout.kv_heads;
  p.sequences = layout.sequences;
  p.capacity = layout.capacity;
  p.window = layout.exact_window;
  p.q_heads = plan.q_heads;
  p.group = plan.q_heads / layout.kv_heads;
  p.heads_per_block = plan.heads_per_block;
  p.tokens_per_block = plan.tokens_per_block;
  p.head_groups = plan.head_groups;
  p.tiles = plan.tiles;
  p.batch = args.batch;
  p.max_rows = plan.max_rows;
  p.status = args.status;
  p.key_code_bits = plan.config.key_code_bits();
  p.value_bits = plan.config.value_bits;
  p.qjl = plan.config.has_qjl() ? 1u : 0u;
  p.split_p = plan.precision == PrefillPrecision::HiLo ? 1u : 0u;
  p.wgmma = plan.kernel == PrefillKernel::Warpgroup ? 1u : 0u;
  p.kc_bytes = layout.token.key_codes;
  p.ks_bytes = layout.token.key_signs;
  p.vc_bytes = layout.token.value_codes;
  const float scale = args.scale != 0.0f ? args.scale : 1.0f / std::sqrt(static_cast<float>(layout.head_dim));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.key_splits = plan.key_splits;
  if (plan.folded_keys) {
    p.folded_keys = static_cast<std::uint8_t*>(workspace) + fold_offset(plan);
    p.fold_tiles = static_cast<std::uint32_t>(key_tiles(plan));
  }
  if (plan.key_splits > 1) {
    p.partials = static_cast<float*>(workspace);
    const std::uint64_t partial_total = query_tiles(plan, plan.max_batch) * plan.key_splits * partial_floats(plan);
    p.counters = reinterpret_cast<std::uint32_t*>(p.partials + partial_total);
    KVC_CUDA_TRY(cudaMemsetAsync(p.counters, 0, query_tiles(plan, args.batch) * 4u, static_cast<cudaStream_t>(stream)));
  }
  if (plan.folded_keys) KVC_CUDA_TRY(detail::launch_fold_keys(p, static_cast<cudaStream_t>(stream)));
  KVC_CUDA_TRY(detail::launch_prefill(p, static_cast<cudaStream_t>(stream)));
  return ok_status();
}

}  // namespace kvcompact::cuda::tq
