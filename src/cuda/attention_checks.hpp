// Host-side pieces shared by decode_attention and prefill_attention (tq_decode.cpp, tq_prefill.cpp): the
// argument checks both make before a launch, and the layer-region offsets both parameter structs carry.
#pragma once

#include <cstdint>

#include "kvcompact/core/error.hpp"
#include "kvcompact/cuda/tq.hpp"

namespace kvcompact::cuda::tq::detail {

// CUDA's limits on a grid's dimensions (x; y and z), which the attention plans' launches must respect.
inline constexpr std::uint64_t kMaxGridX = 2147483647;
inline constexpr std::uint64_t kMaxGridYZ = 65535;

// The plan checks decode and prefill share: q_heads a positive multiple of kv_heads (InvalidArgument), and a
// kernel for the head_dim and mode (`supported`; Unsupported otherwise, naming `what` and the kernels' range).
Status check_plan_heads_and_mode(const LayerLayout& layout, const kvcompact::tq::QuantConfig& config,
                                 std::uint32_t q_heads, bool supported, const char* what);
// Mismatch unless the codec's head_dim and mode are the plan's.
Status check_codec_matches_plan(const DeviceCodec& codec, const LayerLayout& layout,
                                const kvcompact::tq::QuantConfig& config);
// The launch-independent arguments: the layer is 16-byte aligned (the kernels copy 16-byte chunks of its
// regions), window_begins is given when the layout has an exact window, the scale is finite.
Status check_attention_inputs(const LayerLayout& layout, const void* layer_data, const std::uint32_t* window_begins,
                              float scale);

// Byte offsets of the layer's regions, as every attention kernel's parameter struct names them.
template <typename Params>
void set_region_offsets(Params& p, const LayerLayout& layout) {
  p.key_codes = layout.key_codes_offset;
  p.key_signs = layout.key_signs_offset;
  p.key_norms = layout.key_norms_offset;
  p.key_rho = layout.key_residual_norms_offset;
  p.value_codes = layout.value_codes_offset;
  p.value_norms = layout.value_norms_offset;
  p.window_keys = layout.window_keys_offset;
  p.window_values = layout.window_values_offset;
}

}  // namespace kvcompact::cuda::tq::detail
