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

// The status bits of a request with a NaN / inf coordinate and with a norm beyond float32 (kEncodeNonFinite,
// kEncodeNormOverflow of kvcompact/cuda/tq.hpp): the row's record is zeroed.
inline constexpr std::uint32_t kStatusNonFinite = 1u;
inline constexpr std::uint32_t kStatusNormOverflow = 2u;
// The status bit of a request rejected for ending beyond EncodeParams::length_limit (kEncodeBeyondLimit of
// kvcompact/cuda/tq.hpp, which the kernels do not include; tq_codec.cpp checks that the two agree).
inline constexpr std::uint32_t kStatusBeyondLimit = 4u;
// The status bit of a request whose checked position was not the device length (kEncodeStalePosition).
inline constexpr std::uint32_t kStatusStalePosition = 8u;

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
  // Appending at the device lengths (DeviceLengths): when set, a request's position is device_lengths[seq] and
  // requests ending beyond length_limit write nothing (kEncodeBeyondLimit); the fast kernel then always runs its
  // batched instance (the single-request one reads its position from the parameter).
  // With check_positions set, the request's own position is kept and device_lengths only checks it: a request
  // whose position is not device_lengths[seq] writes nothing (kStatusStalePosition); length_limit is not used.
  const std::uint32_t* device_lengths;
  std::uint32_t length_limit;
  std::uint32_t check_positions;
};

// The request part of one fast-kernel encode: a launch encodes up to kEncodeBatchMax requests of one layer and
// one input dtype (EncodeParams holds the layer's part; its request fields are not read by the fast kernel).
// Steps are numbered request after request; first_step is set by the launcher. A kernel parameter, not device
// memory: a batched launch needs no upload and can be captured in a CUDA graph.
inline constexpr unsigned kEncodeBatchMax = 32;
struct EncodeSegment {
  const void* keys;    // [rows, kv_heads, head_dim]
  const void* values;  // [rows, kv_heads, head_dim]
  std::uint32_t* status;
  std::uint32_t seq, position, rows;
  std::uint32_t first_step;
};
template <unsigned N>
struct EncodeSegments {
  std::uint32_t count;        // 1 .. N
  std::uint32_t total_steps;  // Σ steps of the requests (< 2^31)
  EncodeSegment segment[N];
};
// A batched launch's parameter; a single request's launch passes EncodeSegments<1> (a kernel's parameters are
// copied at every launch: 1.3 KB cost the single-request launches ≈ 1 %, docs/cuda-encode.md).
using EncodeBatch = EncodeSegments<kEncodeBatchMax>;

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

// Steps of the fast kernel for `rows` rows (a warp step is 32·32/head_dim rows of one KV head and kind).
std::uint64_t fast_encode_steps(std::uint32_t rows, std::uint32_t head_dim, std::uint32_t kv_heads);

// One fast-kernel launch for `count` (1 .. kEncodeBatchMax) requests of the layer and input dtype of `p`: every
// request must take the fast path (encode_path of `p` with its fields) and their steps must total < 2^31
// (cudaErrorInvalidValue otherwise). Each request's verdict goes to its own status word. With p.device_lengths
// set, the segments' positions are not read (each request appends at device_lengths[seq]).
cudaError_t launch_encode_batch(const EncodeParams& p, const EncodeSegment* segments, std::uint32_t count,
                                cudaStream_t stream);

}  // namespace kvcompact::cuda::tq::detail
