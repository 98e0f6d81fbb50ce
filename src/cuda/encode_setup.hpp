// Internal, host only: the encode kernels' parameters for one append (the layer regions, the codec's widths,
// the request). encode_append (tq_codec.cpp) and the encode benchmark, which calls the general kernel
// directly for comparison, build them the same way.
#pragma once

#include <cstdint>

#include "encode_params.hpp"
#include "kvcompact/cuda/tq.hpp"

namespace kvcompact::cuda::tq::detail {

// dtype_code: 0 f32, 1 f16, 2 bf16 (EncodeParams::dtype).
inline EncodeParams make_encode_params(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                                       const EncodeRequest& request, std::uint32_t dtype_code) {
  EncodeParams p{};
  p.layer = static_cast<std::uint8_t*>(layer_data);
  p.tables = static_cast<const Tables*>(codec.tables());
  p.keys = request.keys;
  p.values = request.values;
  p.status = request.status;
  p.key_codes_offset = layout.key_codes_offset;
  p.key_signs_offset = layout.key_signs_offset;
  p.key_norms_offset = layout.key_norms_offset;
  p.key_residual_norms_offset = layout.key_residual_norms_offset;
  p.value_codes_offset = layout.value_codes_offset;
  p.value_norms_offset = layout.value_norms_offset;
  p.window_keys_offset = layout.window_keys_offset;
  p.window_values_offset = layout.window_values_offset;
  p.key_code_bits = codec.config().key_code_bits();
  p.value_bits = codec.config().value_bits;
  p.has_qjl = codec.config().has_qjl() ? 1u : 0u;
  p.norm_correction = codec.config().norm_correction ? 1u : 0u;
  p.key_code_bytes = layout.token.key_codes;
  p.sign_bytes = layout.token.key_signs;
  p.value_code_bytes = layout.token.value_codes;
  p.head_dim = layout.head_dim;
  p.kv_heads = layout.kv_heads;
  p.capacity = layout.capacity;
  p.window = layout.exact_window;
  p.seq = request.seq;
  p.position = request.position;
  p.rows = request.rows;
  p.dtype = dtype_code;
  return p;
}

}  // namespace kvcompact::cuda::tq::detail
