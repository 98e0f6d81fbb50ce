// Internal device helpers of the DeepSeek-V4 cache kernels: the scalar codes of core/dtypes.hpp (bf16, e4m3,
// e2m1, round to nearest even on the bits, saturating), the model's power-of-two block scale (fp_sim.hpp), the
// storage scale byte (storage.cpp) and whole-row rounding / encoding done by a block whose thread j owns dim j.
// Every float operation is an explicit _rn intrinsic so that nvcc cannot contract a multiply and an add into
// an FMA: the CPU (x86-64 baseline, no FMA) rounds each of them, and the results must agree bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cache_params.hpp"

namespace kvcompact::cuda::dsv4::detail {

inline constexpr float kFp8Max = 448.0f;
inline constexpr float kFp4Max = 6.0f;
inline constexpr float kFp8AmaxFloor = 1e-4f;
inline constexpr float kFp4AmaxFloor = 6.0f * 0x1p-126f;
inline constexpr unsigned kNope = 448;
inline constexpr unsigned kWidth = 512;

__device__ __forceinline__ std::uint32_t shift_right_rne(std::uint32_t v, unsigned s) {
  const std::uint32_t q = v >> s;
  const std::uint32_t rem = v & ((1u << s) - 1u);
  const std::uint32_t half = 1u << (s - 1u);
  return q + static_cast<std::uint32_t>(rem > half || (rem == half && (q & 1u) != 0));
}

template <unsigned MANT, unsigned BIAS>
__device__ __forceinline__ std::uint32_t encode_minifloat_magnitude(std::uint32_t a) {
  constexpr std::uint32_t kMinNormalBits = (127u - BIAS + 1u) << 23;
  if (a >= kMinNormalBits) return shift_right_rne(a - ((127u - BIAS) << 23), 23u - MANT);
  const std::uint32_t e = a >> 23;
  if (e == 0) return 0;
  const unsigned s = 151u - BIAS - MANT - e;
  if (s > 24u) return 0;
  const std::uint32_t m24 = (a & 0x7FFFFFu) | 0x800000u;
  return shift_right_rne(m24, s);
}

__device__ __forceinline__ std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t x = __float_as_uint(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ std::uint8_t f32_to_fp8_e4m3(float f) {
  const std::uint32_t x = __float_as_uint(f);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint8_t>(sign | 0x7Fu);
  if (a >= 0x43E00000u) return static_cast<std::uint8_t>(sign | 0x7Eu);
  return static_cast<std::uint8_t>(sign | encode_minifloat_magnitude<3, 7>(a));
}

__device__ __forceinline__ float fp8_e4m3_to_f32(std::uint8_t c) {
  const std::uint32_t sign = static_cast<std::uint32_t>(c & 0x80u) << 24;
  const std::uint32_t e = (c >> 3) & 0xFu;
  std::uint32_t m = c & 0x7u;
  if (e == 0xFu && m == 0x7u) return __uint_as_float(sign | 0x7FC00000u);
  if (e != 0) return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
  if (m == 0) return __uint_as_float(sign);
  const unsigned shift = static_cast<unsigned>(__clz(static_cast<int>(m))) - 28u;
  m = (m << shift) & 0x7u;
  return __uint_as_float(sign | ((121u - shift) << 23) | (m << 20));
}

__device__ __forceinline__ std::uint8_t f32_to_fp4_e2m1(float f) {
  const std::uint32_t x = __float_as_uint(f);
  const std::uint32_t sign = (x >> 28) & 0x8u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0;
  if (a >= 0x40C00000u) return static_cast<std::uint8_t>(sign | 0x7u);
  return static_cast<std::uint8_t>(sign | encode_minifloat_magnitude<1, 1>(a));
}

__device__ __forceinline__ float fp4_e2m1_to_f32(std::uint8_t code) {
  const std::uint32_t c = code & 0x7u;
  float v = 0.0f;
  switch (c) {
    case 0: v = 0.0f; break;
    case 1: v = 0.5f; break;
    case 2: v = 1.0f; break;
    case 3: v = 1.5f; break;
    case 4: v = 2.0f; break;
    case 5: v = 3.0f; break;
    case 6: v = 4.0f; break;
    default: v = 6.0f; break;
  }
  return (code & 0x8u) ? -v : v;
}

// fp_sim.hpp pow2_ceil_scale: 2^ceil(log2(float32(max(amax, floor) * float32(1 / max_code)))) from the bits.
__device__ __forceinline__ float pow2_ceil_scale(float amax, float amax_floor, float max_code) {
  const float inv_max = __fdiv_rn(1.0f, max_code);
  const float r = __fmul_rn(amax < amax_floor ? amax_floor : amax, inv_max);
  const std::uint32_t bits = __float_as_uint(r);
  const int e = static_cast<int>((bits >> 23) & 0xFFu) - 127 + ((bits & 0x7FFFFFu) != 0 ? 1 : 0);
  return __uint_as_float(static_cast<std::uint32_t>(e + 127) << 23);
}

// storage.cpp block_scale_byte: exponent of the smallest 2^e with amax / 2^e <= max_code, clamped to
// [-127, 127]; a zero block gets -127 (byte 0).
__device__ __forceinline__ int storage_scale_exp(float amax, double max_code) {
  if (!(amax > 0.0f)) return -127;
  const double q = static_cast<double>(amax) / max_code;
  int x = 0;
  const double f = frexp(q, &x);
  int e = (f == 0.5) ? x - 1 : x;
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return e;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

__device__ __forceinline__ float clampf(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }

// The model's FP8 rounding of a 512-wide row (blockDim 512, thread j holds dim j): e4m3 in blocks of 64 with
// power-of-two scales over dims [0, 448); the tail is returned unchanged. `scratch` holds 16 floats.
__device__ __forceinline__ float fp8_sim_main(float x, unsigned j, float* scratch) {
  const float a = warp_max(j < kNope ? fabsf(x) : 0.0f);
  if ((j & 31u) == 0) scratch[j >> 5] = a;
  __syncthreads();
  float out = x;
  if (j < kNope) {
    const unsigned b = j >> 6;
    const float amax = fmaxf(scratch[2 * b], scratch[2 * b + 1]);
    const float s = pow2_ceil_scale(amax, kFp8AmaxFloor, kFp8Max);
    const float inv_s = __fdiv_rn(1.0f, s);
    const float q = clampf(__fmul_rn(x, inv_s), -kFp8Max, kFp8Max);
    out = __fmul_rn(fp8_e4m3_to_f32(f32_to_fp8_e4m3(q)), s);
  }
  __syncthreads();
  return out;
}

// encode_attention_row (storage.hpp) of a 512-wide row into `out` (blockDim 512, thread j holds dim j).
__device__ __forceinline__ void encode_attention_row(std::uint8_t* out, float x, unsigned j, std::uint32_t storage,
                                                     float* scratch) {
  if (storage == kRowBf16) {
    *reinterpret_cast<std::uint16_t*>(out + 2 * j) = f32_to_bf16(x);
    return;
  }
  const float a = warp_max(j < kNope ? fabsf(x) : 0.0f);
  if ((j & 31u) == 0) scratch[j >> 5] = a;
  __syncthreads();
  if (j < kNope) {
    const unsigned b = j >> 6;
    const float amax = fmaxf(scratch[2 * b], scratch[2 * b + 1]);
    const int e = storage_scale_exp(amax, 448.0);
    out[j] = f32_to_fp8_e4m3(ldexpf(x, -e));
    if ((j & 63u) == 0) out[576 + b] = static_cast<std::uint8_t>(e + 127);
  } else {
    const std::uint16_t h = f32_to_bf16(x);
    out[448 + 2 * (j - kNope)] = static_cast<std::uint8_t>(h & 0xFFu);
    out[449 + 2 * (j - kNope)] = static_cast<std::uint8_t>(h >> 8);
  }
  if (j == 0) out[583] = 0;
  __syncthreads();
}

}  // namespace kvcompact::cuda::dsv4::detail
