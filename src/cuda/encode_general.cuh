// Internal to the encode kernels (tq_encode.cu): the general kernel, for every head_dim the fast kernel does not
// take (multiples of 16 up to 1024) and for misaligned inputs — one warp per (row, KV head, key-or-value) item,
// the rotated row and the residual in shared memory. Included by tq_encode.cu only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "encode_common.cuh"
#include "encode_params.hpp"
#include "input_widen.cuh"
#include "pdl.cuh"
#include "kvcompact/tq/normalise.hpp"

namespace kvcompact::cuda::tq::detail {

namespace ktq = kvcompact::tq;

namespace {

__device__ inline double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline std::uint32_t quantize(float y, const float* boundaries, std::uint32_t levels) {
  std::uint32_t index = 0;
  for (std::uint32_t step = levels >> 1; step > 0; step >>= 1) index += (y >= boundaries[index + step - 1]) ? step : 0u;
  return index;
}

// ---------------------------------------------------------------------------------------------------------
// General kernel: one warp encodes one (row, KV head, key-or-value) item; shared memory holds the rotated row
// and the residual.
__global__ void __launch_bounds__(kEncodeWarps * 32) encode_kernel(EncodeParams p) {
  kvcompact::cuda::detail::wait_for_previous_grid();  // (launch_after_previous)
  extern __shared__ float smem[];
  const Tables& t = *p.tables;
  const unsigned d = t.head_dim;
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  const std::uint64_t item = static_cast<std::uint64_t>(blockIdx.x) * kEncodeWarps + warp;
  const std::uint64_t items = static_cast<std::uint64_t>(p.rows) * p.kv_heads * 2u;
  if (item >= items) return;
  const bool is_value = item & 1u;
  const std::uint32_t head = static_cast<std::uint32_t>((item >> 1) % p.kv_heads);
  const std::uint32_t row = static_cast<std::uint32_t>((item >> 1) / p.kv_heads);
  float* y = smem + warp * 2u * d;
  float* r = y + d;

  // At the device length (DeviceLengths): every warp reads it; a request ending beyond the limit writes nothing.
  // With a position check (PositionCheck), a position that is not the device length writes nothing.
  std::uint32_t first = p.position;
  if (p.device_lengths != nullptr) {
    const LengthVerdict v = length_verdict(p, p.device_lengths[p.seq], first, p.rows);
    if (v.refusal != 0) {
      if (item == 0 && lane == 0 && p.status != nullptr) atomicOr(p.status, v.refusal);
      return;
    }
    first = v.first;
  }
  const void* src = is_value ? p.values : p.keys;
  const std::uint64_t src_base = (static_cast<std::uint64_t>(row) * p.kv_heads + head) * d;
  const std::uint32_t position = first + row;
  const std::uint64_t slot = (static_cast<std::uint64_t>(p.seq) * p.kv_heads + head) * p.capacity + position;

  double sum = 0.0;
  bool finite = true;
  for (unsigned j = lane; j < d; j += 32) {
    const float v = load_input(src, src_base + j, p.dtype);
    finite = finite && isfinite(v);
    y[j] = v;
    sum += static_cast<double>(v) * static_cast<double>(v);
  }
  // Rows of one append that share a ring slot: only the last W rows are written (no write-write race).
  if (p.window > 0 && row + p.window >= p.rows) {
    const std::uint64_t wrow = (static_cast<std::uint64_t>(p.seq) * p.kv_heads + head) * p.window + position % p.window;
    float* dst = reinterpret_cast<float*>(p.layer + (is_value ? p.window_values_offset : p.window_keys_offset)) + wrow * d;
    for (unsigned j = lane; j < d; j += 32) dst[j] = y[j];
  }
  finite = __all_sync(0xffffffffu, finite);
  const double norm = sqrt(warp_sum(sum));
  const bool overflow = finite && norm > static_cast<double>(kFloatMax);

  const unsigned cbits = is_value ? t.value_bits : t.key_code_bits;
  const std::uint32_t code_bytes = is_value ? p.value_code_bytes : p.key_code_bytes;
  std::uint8_t* codes = p.layer + (is_value ? p.value_codes_offset : p.key_codes_offset) + slot * code_bytes;
  float* norm_out = reinterpret_cast<float*>(p.layer + (is_value ? p.value_norms_offset : p.key_norms_offset)) + slot;
  const bool qjl = !is_value && t.has_qjl;
  std::uint8_t* signs = p.layer + p.key_signs_offset + slot * p.sign_bytes;
  std::uint16_t* rho_out = reinterpret_cast<std::uint16_t*>(p.layer + p.key_residual_norms_offset) + slot;

  if (!finite || overflow || norm == 0.0) {
    // Zero record (a zero vector decodes to exactly 0; bad input is flagged in the status word).
    for (unsigned i = lane; i < code_bytes; i += 32) codes[i] = 0;
    if (qjl) {
      for (unsigned i = lane; i < p.sign_bytes; i += 32) signs[i] = 0;
      if (lane == 0) *rho_out = 0;
    }
    if (lane == 0) {
      *norm_out = 0.0f;
      if (p.status != nullptr && (!finite || overflow)) {
        atomicOr(p.status, !finite ? kStatusNonFinite : kStatusNormOverflow);
      }
    }
    return;
  }
  __syncwarp();
  if (ktq::normalises_by_product(norm)) {
    const float r = ktq::unit_reciprocal(norm);
    for (unsigned j = lane; j < d; j += 32) y[j] = ktq::unit_coordinate(y[j], r);
  } else {
    for (unsigned j = lane; j < d; j += 32) y[j] = ktq::unit_coordinate_f64(y[j], norm);
  }
  __syncwarp();
  warp_rotate_forward(y, t, t.main_signs, lane);

  const float* boundaries = is_value ? t.value_boundaries : t.key_boundaries;
  const float* centroids = is_value ? t.value_centroids : t.key_centroids;
  const double* centroids64 = is_value ? t.value_centroids_f64 : t.key_centroids_f64;
  const std::uint32_t levels = 1u << cbits;
  double code_norm_sq = 0.0;
  double residual_sq = 0.0;
  // Lane per group of 8 coordinates: a group's codes fill exactly `cbits` bytes.
  for (unsigned g = lane; g < d / 8; g += 32) {
    std::uint64_t word = 0;
    for (unsigned k = 0; k < 8; ++k) {
      const unsigned j = 8 * g + k;
      const std::uint32_t code = quantize(y[j], boundaries, levels);
      word |= static_cast<std::uint64_t>(code) << (k * cbits);
      // c·c rounded to float64, then added (the CPU's two roundings; no FMA contraction).
      code_norm_sq = __dadd_rn(code_norm_sq, __dmul_rn(centroids64[code], centroids64[code]));
      const float res = __fsub_rn(y[j], centroids[code]);
      r[j] = res;
      residual_sq = __fma_rn(static_cast<double>(res), static_cast<double>(res), residual_sq);  // square exact
    }
    for (unsigned b = 0; b < cbits; ++b) codes[g * cbits + b] = static_cast<std::uint8_t>(word >> (8 * b));
  }
  code_norm_sq = warp_sum(code_norm_sq);  // the same on every lane
  float stored = __double2float_rn(norm);
  if (t.norm_correction) {
    stored = __double2float_rn(__ddiv_rn(norm, __dsqrt_rn(code_norm_sq)));
    // ‖c‖ < 1 for most code vectors, so RN32(‖x‖ / ‖c‖) can be inf although ‖x‖ fits float32: the CPU codec
    // refuses such a row (OutOfRange); zeroed and flagged as a norm beyond float32. (Norm correction never
    // comes with QJL keys, so there are no signs or ρ to zero.)
    if (isinf(stored)) {
      __syncwarp();  // every lane's code bytes are written before they are zeroed
      for (unsigned i = lane; i < code_bytes; i += 32) codes[i] = 0;
      stored = 0.0f;
      if (lane == 0 && p.status != nullptr) atomicOr(p.status, kStatusNormOverflow);
    }
  }
  if (lane == 0) *norm_out = stored;
  if (!qjl) return;
  residual_sq = warp_sum(residual_sq);
  if (lane == 0) *rho_out = __half_as_ushort(__float2half_rn(__double2float_rn(__dsqrt_rn(residual_sq))));
  __syncwarp();
  warp_rotate_forward(r, t, t.qjl_signs, lane);
  for (unsigned g = lane; g < d / 8; g += 32) {
    unsigned byte = 0;
    for (unsigned k = 0; k < 8; ++k) byte |= (r[8 * g + k] >= 0.0f ? 1u : 0u) << k;
    signs[g] = static_cast<std::uint8_t>(byte);
  }
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
