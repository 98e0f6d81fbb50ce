// Internal: the plain parameter struct of the TurboQuant encode kernels and their launcher. Included by the
// kernels (.cu, no fmt) and by the host checks (tq_codec.cpp), which validate arguments and map CUDA errors.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tq_device.cuh"

namespace kvcompact::cuda::tq::detail {

// General kernel: warps per block, one warp per (row, KV head, key-or-value) item.
inline constexpr unsigned kEncodeWarps = 4;
// Fast kernel (head_dim 64 / 128 / 256, 16-byte aligned inputs): warps per block; each warp encodes
// 32·32/head_dim rows of one KV head and kind per step, head_dim/32 lanes per row (docs/cuda-encode.md).
inline constexpr unsigned kEncodeFastWarps = 8;

struct EncodeParams {
  std::uint8_t* layer;
  const Tables* tables;
  const void* keys;    // [rows, kv_heads, head_dim]
  const void* values;  // [rows, kv_heads, head_dim]
  std::uint32_t* status;
  std::uint64_t key_codes_offset, key_signs_offset, key_norms_offset, key_residual_norms_offset;
  std::uint64_t value_codes_offset, value_norms_offset, window_keys_offset, window_values_offset;
  std::uint32_t key_code_bits, value_bits;  // code bits per coordinate (config), for the launcher
  std::uint32_t has_qjl, norm_correction;  // the mode's family (config): the fast kernel's instance holds its tails only
  std::uint32_t key_code_bytes, sign_bytes, value_code_bytes;
  std::uint32_t head_dim, kv_heads, capacity, window;
  std::uint32_t seq, position, rows;
  std::uint32_t dtype;  // 0 f32, 1 f16, 2 bf16
};

// Which kernel launch_encode would pick (for diagnostics and tests).
enum class EncodePath : std::uint32_t { General = 0, Fast = 1 };
EncodePath encode_path(const EncodeParams& p);

// Lets the fast kernels of a head_dim and mode family (has_qjl, norm_correction), every input dtype, use their
// shared-memory ring (more than the default dynamic limit). DeviceCodec::create calls it once per codec, so
// appends make no attribute call (the launcher also remembers each kernel's resident blocks per device).
cudaError_t prepare_encode(std::uint32_t head_dim, bool has_qjl, bool norm_correction);

// Picks the fast kernel when encode_path says so, the general one otherwise; sizes the grid itself.
// `force_general` runs the general kernel whatever the shape (the encode benchmark compares the two).
cudaError_t launch_encode(const EncodeParams& p, cudaStream_t stream, bool force_general = false);

}  // namespace kvcompact::cuda::tq::detail
