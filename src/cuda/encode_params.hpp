// Internal: the plain parameter struct of the TurboQuant encode kernel and its launcher. Included by the
// kernel (.cu, no fmt) and by the host checks (tq_codec.cpp), which validate arguments and map CUDA errors.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tq_device.cuh"

namespace kvcompact::cuda::tq::detail {

inline constexpr unsigned kEncodeWarps = 4;

struct EncodeParams {
  std::uint8_t* layer;
  const Tables* tables;
  const void* keys;    // [rows, kv_heads, head_dim]
  const void* values;  // [rows, kv_heads, head_dim]
  std::uint32_t* status;
  std::uint64_t key_codes_offset, key_signs_offset, key_norms_offset, key_residual_norms_offset;
  std::uint64_t value_codes_offset, value_norms_offset, window_keys_offset, window_values_offset;
  std::uint32_t key_code_bytes, sign_bytes, value_code_bytes;
  std::uint32_t kv_heads, capacity, window;
  std::uint32_t seq, position, rows;
  std::uint32_t dtype;  // 0 f32, 1 f16, 2 bf16
};

// blocks × kEncodeWarps warps, one warp per (row, KV head, key-or-value) item.
cudaError_t launch_encode(const EncodeParams& p, unsigned blocks, std::size_t smem, cudaStream_t stream);

}  // namespace kvcompact::cuda::tq::detail
