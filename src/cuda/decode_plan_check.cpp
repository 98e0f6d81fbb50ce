// The DecodePlan invariants (decode_plan_check.hpp): checked by plan_decode's shape checks and, for every plan,
// again by decode_attention before anything is launched.
#include "decode_plan_check.hpp"

#include "align.hpp"
#include "attention_checks.hpp"
#include "decode_split.hpp"
#include "params.hpp"

namespace kvcompact::cuda::tq::detail {

namespace {
using kvcompact::cuda::detail::align256;

// The fused kernel's blocks per split: one per (KV head, head group of up to kDecodeGroup query heads).
std::uint64_t head_group_rows(const LayerLayout& layout, std::uint32_t q_heads) {
  return std::uint64_t{layout.kv_heads} * ((q_heads / layout.kv_heads + kDecodeGroup - 1) / kDecodeGroup);
}
}  // namespace

Status check_decode_shape(const LayerLayout& layout, const kvcompact::tq::QuantConfig& config, std::uint32_t q_heads) {
  KVC_TRY(check_plan_heads_and_mode(layout, config, q_heads, decode_supported(layout.head_dim, config), "decode"));
  if (layout.exact_window > kMaxWindow) {
    return make_error(ErrorCode::Unsupported, "exact window {} exceeds the CUDA decode limit {}", layout.exact_window,
                      kMaxWindow);
  }
  // The fused kernel's grid is (splits, kv_heads x head groups, sequences); the window and merge kernels' are
  // (q_heads, sequences) and sequences x q_heads blocks.
  const std::uint64_t grid_y = head_group_rows(layout, q_heads);
  if (grid_y > kMaxGridYZ || layout.sequences > kMaxGridYZ) {
    return make_error(ErrorCode::OutOfRange, "decode grid (kv heads x head groups {}, sequences {}) exceeds the CUDA "
                      "limit {}", grid_y, layout.sequences, kMaxGridYZ);
  }
  return ok_status();
}

DecodeWorkspace decode_workspace(const LayerLayout& layout, std::uint32_t q_heads, std::uint64_t splits) {
  const std::uint64_t parts = std::uint64_t{layout.sequences} * q_heads * (splits + 1);
  const std::uint64_t arrival_words = std::uint64_t{layout.sequences} * head_group_rows(layout, q_heads);
  DecodeWorkspace w;
  w.lse_offset = align256(parts * layout.head_dim * 4);
  w.arrivals_offset = w.lse_offset + align256(parts * 4);
  w.bytes = w.arrivals_offset + align256(arrival_words * 8);
  return w;
}

Status check_decode_plan(const DecodePlan& plan) {
  const LayerLayout& layout = plan.layout;
  KVC_TRY(check_decode_shape(layout, plan.config, plan.q_heads));
  // (Each message says "decode plan": the field was edited after plan_decode, which never makes such a plan.)
  if (plan.max_length > layout.capacity) {
    return make_error(ErrorCode::InvalidArgument, "decode plan's max_length {} exceeds the layout capacity {}",
                      plan.max_length, layout.capacity);
  }
  const std::uint32_t key_bits = plan.config.key_code_bits();
  if (plan.wide && !decode_has_wide(layout.head_dim, key_bits, plan.config.has_qjl())) {
    return make_error(ErrorCode::InvalidArgument,
                      "decode plan asks for the wide kernel, which has no instance for head_dim {} and this mode",
                      layout.head_dim);
  }
  const std::uint32_t tile = decode_tile_tokens(layout.head_dim, key_bits, plan.config.value_bits, plan.wide);
  if (plan.chunk == 0 || plan.chunk % tile != 0) {
    return make_error(ErrorCode::InvalidArgument, "decode plan's chunk {} is not a positive multiple of the kernel's "
                      "{}-token tile", plan.chunk, tile);
  }
  if (plan.splits == 0 || plan.splits > kMaxDecodeSplits) {
    return make_error(ErrorCode::InvalidArgument, "decode plan's splits {} is outside 1 … {}", plan.splits,
                      kMaxDecodeSplits);
  }
  if (std::uint64_t{plan.splits} * plan.chunk < plan.max_length) {
    return make_error(ErrorCode::InvalidArgument, "decode plan's {} splits of {} tokens do not cover its max_length {}",
                      plan.splits, plan.chunk, plan.max_length);
  }
  const std::uint64_t needed = decode_workspace(layout, plan.q_heads, plan.splits).bytes;
  if (plan.workspace_bytes < needed) {
    return make_error(ErrorCode::InvalidArgument, "decode plan's workspace_bytes {} is below the {} its fields need",
                      plan.workspace_bytes, needed);
  }
  return ok_status();
}

}  // namespace kvcompact::cuda::tq::detail
