// Host side of CUDA decode attention: plan_decode (split over the sequence, workspace size, kernel
// shared-memory limit) and decode_attention (argument checks, launch through tq_decode.cu). run allocates
// nothing, so it can be captured in a CUDA graph.
#include <algorithm>
#include <cmath>
#include <utility>

#include "attention_checks.hpp"
#include "check.hpp"
#include "decode_plan_check.hpp"
#include "decode_split.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "params.hpp"

namespace kvcompact::cuda::tq {

bool decode_supported(std::uint32_t head_dim, const kvcompact::tq::QuantConfig& config) {
  return detail::decode_smem_bytes(head_dim, config.key_code_bits(), config.value_bits, config.has_qjl()) != 0;
}

Result<DecodePlan> plan_decode(const LayerLayout& layout, const kvcompact::tq::QuantConfig& config,
                               std::uint32_t q_heads, std::uint32_t max_length, int multiprocessors) {
  using detail::kDecodeGroup;
  KVC_TRY(detail::check_decode_shape(layout, config, q_heads));
  if (max_length > layout.capacity) {
    return make_error(ErrorCode::OutOfRange, "max_length {} exceeds the layout capacity {}", max_length,
                      layout.capacity);
  }
  if (multiprocessors <= 0) multiprocessors = 1;
  DecodePlan plan;
  plan.layout = layout;
  plan.config = config;
  plan.q_heads = q_heads;
  plan.max_length = max_length;
  const std::uint64_t head_groups = (q_heads / layout.kv_heads + kDecodeGroup - 1) / kDecodeGroup;
  const std::uint64_t base = std::max<std::uint64_t>(1, std::uint64_t{layout.sequences} * layout.kv_heads * head_groups);
  KVC_CUDA_TRY(detail::prepare_decode(layout.head_dim, config.key_code_bits(), config.value_bits, config.has_qjl()));
  // The split over the sequence from the resident-block count (decode_split.hpp: whole-wave cost model), for the
  // narrow kernel, or for its wide variant (4-bit keys, d = 128, mse modes) when the blocks of both would all run
  // in one wave: then no block runs after another on a multiprocessor, whose fixed costs the narrow kernel's
  // second resident block would hide, and one 16-warp block pays one table fill and one query preparation where
  // two 8-warp blocks pay two (docs/tq-decode-history.md, round 10). The wide kernel's own plan must be one wave
  // too (it has one block per multiprocessor to the narrow kernel's two): 32 × 4K (256 blocks) took it on the
  // narrow kernel's wave alone in round 10 and ran two waves, 15 % slower (round 11).
  auto split_for = [&](bool wide) {
    const int per_sm = std::max(1, detail::decode_blocks_per_sm(layout.head_dim, config.key_code_bits(), config.value_bits,
                                                                config.has_qjl(), q_heads / layout.kv_heads, wide));
    const std::uint64_t slots = static_cast<std::uint64_t>(per_sm) * static_cast<std::uint64_t>(multiprocessors);
    const std::uint32_t tile = detail::decode_tile_tokens(layout.head_dim, config.key_code_bits(), config.value_bits, wide);
    const detail::DecodeSplit split = detail::choose_decode_split(max_length, base, slots, tile);
    return std::pair{split, base * split.splits <= slots};
  };
  auto [split, one_wave] = split_for(false);
  if (one_wave && detail::decode_has_wide(layout.head_dim, config.key_code_bits(), config.has_qjl())) {
    const auto [wide_split, wide_one_wave] = split_for(true);
    if (wide_one_wave) {
      split = wide_split;
      plan.wide = true;
    }
  }
  const std::uint64_t chunk = split.chunk, splits = split.splits;
  plan.chunk = static_cast<std::uint32_t>(chunk);
  plan.splits = static_cast<std::uint32_t>(splits);
  plan.workspace_bytes = detail::decode_workspace(layout, q_heads, splits).bytes;
  return plan;
}

static_assert(detail::kStatusLengthBeyondPlan == kDecodeLengthBeyondPlan, "the kernels' status bit and the public one");

Status decode_attention(const DecodePlan& plan, const DeviceCodec& codec, const void* layer_data,
                        const DecodeArgs& args, void* workspace, void* stream) {
  const LayerLayout& layout = plan.layout;
  KVC_TRY(detail::check_decode_plan(plan));
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
  const detail::DecodeWorkspace regions = detail::decode_workspace(layout, plan.q_heads, plan.splits);
  std::uint8_t* const ws = static_cast<std::uint8_t*>(workspace);
  p.part_o = reinterpret_cast<float*>(ws);
  p.part_lse = reinterpret_cast<float*>(ws + regions.lse_offset);
  p.arrivals = reinterpret_cast<unsigned long long*>(ws + regions.arrivals_offset);
  p.merge_in_kernel = layout.exact_window == 0 ? 1u : 0u;
  p.wide = plan.wide ? 1u : 0u;
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
  p.max_length = plan.max_length;
  p.status = args.status;
  p.tables_key_code_bits = plan.config.key_code_bits();
  p.tables_value_bits = plan.config.value_bits;
  p.tables_has_qjl = plan.config.has_qjl() ? 1u : 0u;
  const float scale = args.scale != 0.0f ? args.scale : 1.0f / std::sqrt(static_cast<float>(layout.head_dim));
  p.scale_log2 = scale * 1.4426950408889634f;
  KVC_CUDA_TRY(detail::launch_decode(p, static_cast<cudaStream_t>(stream)));
  return ok_status();
}

}  // namespace kvcompact::cuda::tq
