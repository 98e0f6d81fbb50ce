// Host side of CUDA decode attention: plan_decode (split over the sequence, workspace size, kernel
// shared-memory limit) and decode_attention (argument checks, launch through tq_decode.cu). run allocates
// nothing, so it can be captured in a CUDA graph.
#include <algorithm>
#include <cmath>

#include "attention_checks.hpp"
#include "check.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "params.hpp"

namespace kvcompact::cuda::tq {

namespace {
constexpr std::uint64_t kMaxSplits = 4096;  // the merge kernel keeps one weight per split in shared memory
// A block's fixed cost (prologue, partial write, its share of the merge) in tokens of streaming work; a rough
// figure from the batch-1 timings (a split of 512 tokens runs at about two thirds of the long-split speed).
constexpr std::uint64_t kSplitOverheadTokens = 256;
std::uint64_t align256(std::uint64_t x) { return (x + 255u) & ~std::uint64_t{255}; }
}  // namespace

bool decode_supported(std::uint32_t head_dim, const kvcompact::tq::QuantConfig& config) {
  return detail::decode_smem_bytes(head_dim, config.key_code_bits(), config.value_bits, config.has_qjl()) != 0;
}

Result<DecodePlan> plan_decode(const LayerLayout& layout, const kvcompact::tq::QuantConfig& config,
                               std::uint32_t q_heads, std::uint32_t max_length, int multiprocessors) {
  using detail::kDecodeGroup;
  using detail::kDecodeTile;
  if (layout.kv_heads == 0 || q_heads == 0 || q_heads % layout.kv_heads != 0) {
    return make_error(ErrorCode::InvalidArgument, "q_heads {} must be a positive multiple of kv_heads {}", q_heads,
                      layout.kv_heads);
  }
  if (!decode_supported(layout.head_dim, config)) {
    return make_error(ErrorCode::Unsupported,
                      "CUDA decode attention has no kernel for head_dim {} with mode {} (head_dim 64/128/256, key "
                      "code bits 1..5, value bits 2..4)",
                      layout.head_dim, config.name());
  }
  if (max_length > layout.capacity) {
    return make_error(ErrorCode::OutOfRange, "max_length {} exceeds the layout capacity {}", max_length,
                      layout.capacity);
  }
  if (layout.exact_window > detail::kMaxWindow) {
    return make_error(ErrorCode::Unsupported, "exact window {} exceeds the CUDA decode limit {}", layout.exact_window,
                      detail::kMaxWindow);
  }
  if (multiprocessors <= 0) multiprocessors = 1;
  DecodePlan plan;
  plan.layout = layout;
  plan.config = config;
  plan.q_heads = q_heads;
  plan.max_length = max_length;
  const std::uint64_t head_groups = (q_heads / layout.kv_heads + kDecodeGroup - 1) / kDecodeGroup;
  const std::uint64_t base = std::max<std::uint64_t>(1, std::uint64_t{layout.sequences} * layout.kv_heads * head_groups);
  // The split count minimises the modelled time: whole waves of resident blocks (a partial last wave costs a
  // full one) × (tokens per split + the per-block overhead: query rotation, lookup tables, the partial's
  // write, worth about kSplitOverheadTokens). At least 512 tokens per split.
  KVC_CUDA_TRY(detail::prepare_decode(layout.head_dim, config.key_code_bits(), config.value_bits, config.has_qjl()));
  const int per_sm = std::max(1, detail::decode_blocks_per_sm(layout.head_dim, config.key_code_bits(), config.value_bits, config.has_qjl()));
  const std::uint64_t slots = static_cast<std::uint64_t>(per_sm) * static_cast<std::uint64_t>(multiprocessors);
  const std::uint64_t length = std::max<std::uint64_t>(max_length, 1);
  const std::uint64_t max_splits = std::max<std::uint64_t>(1, std::min<std::uint64_t>(kMaxSplits, (length + 511) / 512));
  std::uint64_t chunk = 0, splits = 0, best_cost = 0;
  for (std::uint64_t want = 1; want <= max_splits; ++want) {
    const std::uint64_t c = (length + want - 1) / want;
    const std::uint64_t c_tiles = (c + kDecodeTile - 1) / kDecodeTile * kDecodeTile;
    const std::uint64_t s_eff = (length + c_tiles - 1) / c_tiles;
    const std::uint64_t waves = (base * s_eff + slots - 1) / slots;
    const std::uint64_t cost = waves * (c_tiles + kSplitOverheadTokens);
    if (splits == 0 || cost < best_cost) {
      best_cost = cost;
      chunk = c_tiles;
      splits = s_eff;
    }
  }
  plan.chunk = static_cast<std::uint32_t>(chunk);
  plan.splits = static_cast<std::uint32_t>(splits);
  const std::uint64_t parts = std::uint64_t{layout.sequences} * q_heads * (splits + 1);
  plan.workspace_bytes = align256(parts * layout.head_dim * 4) + align256(parts * 4);
  return plan;
}

Status decode_attention(const DecodePlan& plan, const DeviceCodec& codec, const void* layer_data,
                        const DecodeArgs& args, void* workspace, void* stream) {
  const LayerLayout& layout = plan.layout;
  KVC_TRY(detail::check_codec_matches_plan(codec, layout, plan.config));
  if (layer_data == nullptr || args.queries == nullptr || args.lengths == nullptr || args.output == nullptr ||
      workspace == nullptr) {
    return make_error(ErrorCode::InvalidArgument,
                      "decode_attention needs layer data, queries, lengths, output and workspace");
  }
  KVC_TRY(detail::check_attention_inputs(layout, layer_data, args.window_begins, args.scale));
  if (layout.sequences == 0) return ok_status();
  detail::DecodeParams p{};
  p.layer = static_cast<const std::uint8_t*>(layer_data);
  p.tables = static_cast<const detail::Tables*>(codec.tables());
  p.queries = args.queries;
  p.lengths = args.lengths;
  p.window_begins = args.window_begins;
  p.sinks = args.sinks;
  p.output = args.output;
  const std::uint64_t parts = std::uint64_t{layout.sequences} * plan.q_heads * (plan.splits + 1);
  p.part_o = static_cast<float*>(workspace);
  p.part_lse = reinterpret_cast<float*>(static_cast<std::uint8_t*>(workspace) + align256(parts * layout.head_dim * 4));
  detail::set_region_offsets(p, layout);
  p.head_dim = layout.head_dim;
  p.kv_heads = layout.kv_heads;
  p.capacity = layout.capacity;
  p.window = layout.exact_window;
  p.q_heads = plan.q_heads;
  p.group = plan.q_heads / layout.kv_heads;
  p.head_groups = (p.group + detail::kDecodeGroup - 1) / detail::kDecodeGroup;
  p.chunk = plan.chunk;
  p.splits = plan.splits;
  p.seqs = layout.sequences;
  p.tables_key_code_bits = plan.config.key_code_bits();
  p.tables_value_bits = plan.config.value_bits;
  p.tables_has_qjl = plan.config.has_qjl() ? 1u : 0u;
  const float scale = args.scale != 0.0f ? args.scale : 1.0f / std::sqrt(static_cast<float>(layout.head_dim));
  p.scale_log2 = scale * 1.4426950408889634f;
  KVC_CUDA_TRY(detail::launch_decode(p, static_cast<cudaStream_t>(stream)));
  return ok_status();
}

}  // namespace kvcompact::cuda::tq
