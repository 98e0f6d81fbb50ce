// DeepSeek-V4 lightning indexer on the GPU, query preparation: Hadamard + FP4 of each indexer query head, bit for
// bit the CPU's prepare_indexer_query, then the head as integer codes at its lowest-bit exponent for the score
// kernel's tensor cores (indexer_scores.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels_device.cuh"
#include "kernels_params.hpp"
#include "pdl.cuh"

namespace kvcompact::cuda::dsv4::detail {

namespace {

constexpr int kNoBit = 100000;  // "no non-zero value" sentinel for the lowest-bit minimum

// CPU fp4 rounding (core dtypes f32_to_fp4_e2m1 on a clamped value): nearest of {0, .5, 1, 1.5, 2, 3, 4, 6},
// ties to the even code; the sign is kept (-0 for small negatives); NaN becomes +0.
__device__ __forceinline__ float round_e2m1(float x) {
  if (x != x) return 0.0f;
  const float a = fabsf(x);
  float r;
  if (a <= 0.25f) r = 0.0f;
  else if (a < 0.75f) r = 0.5f;
  else if (a <= 1.25f) r = 1.0f;
  else if (a < 1.75f) r = 1.5f;
  else if (a <= 2.5f) r = 2.0f;
  else if (a < 3.5f) r = 3.0f;
  else if (a <= 5.0f) r = 4.0f;
  else r = 6.0f;
  return copysignf(r, x);
}

// fp_sim.cpp pow2_ceil_scale.
__device__ __forceinline__ float pow2_ceil_scale(float amax, float amax_floor, float inv_max) {
  const float r = __fmul_rn(fmaxf(amax, amax_floor), inv_max);
  const std::uint32_t bits = __float_as_uint(r);
  const int e = static_cast<int>((bits >> 23) & 0xFFu) - 127 + ((bits & 0x7FFFFFu) != 0 ? 1 : 0);
  return __uint_as_float(static_cast<std::uint32_t>(e + 127) << 23);
}

// v / 2^f as an integer when it is one of magnitude <= 127 (f <= lowbit_exponent(v)); else returns 128.
__device__ __forceinline__ int int_at_exponent(float v, int f) {
  if (v == 0.0f) return 0;
  const std::uint32_t bits = __float_as_uint(v);
  const std::uint32_t ex = (bits >> 23) & 0xFFu;
  std::uint32_t mant = bits & 0x7FFFFFu;
  int base = -149;
  if (ex != 0) {
    mant |= 0x800000u;
    base = static_cast<int>(ex) - 150;
  }
  const int d = base - f;
  std::uint32_t mag;
  if (d >= 0) {
    if (d > 7 || (static_cast<std::uint64_t>(mant) << d) > 127u) return 128;
    mag = mant << d;
  } else {
    if (-d > 31) return 0;
    mag = mant >> (-d);
  }
  if (mag > 127u) return 128;
  return (bits & 0x80000000u) ? -static_cast<int>(mag) : static_cast<int>(mag);
}

__device__ __forceinline__ int warp_min(int v, unsigned mask = 0xFFFFFFFFu) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(mask, v, o));
  return v;
}

// Grid (tokens, 64 / 16): one warp per head. Writes the prepared float query, its integer codes at the head's
// lowest-bit exponent fq, and a per-head flag (integer codes exact: |code| <= 127, fq in range).
__global__ void __launch_bounds__(kPrepareHeadsPerBlock * 32) prepare_kernel(PrepareParams p) {
  wait_for_previous_grid();
  __shared__ float buf[kPrepareHeadsPerBlock][kIndexerDim];
  const unsigned token = blockIdx.x;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned h = blockIdx.y * kPrepareHeadsPerBlock + warp;
  float* qf_all = reinterpret_cast<float*>(p.ws + p.layout.qf);
  std::int8_t* qi_all = reinterpret_cast<std::int8_t*>(p.ws + p.layout.qi);
  int* fq_all = reinterpret_cast<int*>(p.ws + p.layout.fq);
  int* ok_all = reinterpret_cast<int*>(p.ws + p.layout.info);
  const std::uint64_t row = static_cast<std::uint64_t>(token) * kIndexerMaxHeads + h;
  float* qf = qf_all + row * kIndexerDim;
  std::int8_t* qi = qi_all + row * kIndexerDim;
  if (h >= p.heads) {
    reinterpret_cast<float4*>(qf)[lane] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    reinterpret_cast<std::uint32_t*>(qi)[lane] = 0;
    if (lane == 0) {
      fq_all[row] = 0;
      ok_all[row] = 1;
    }
    return;
  }
  const float* src = p.q + (static_cast<std::uint64_t>(token) * p.heads + h) * kIndexerDim;
  float* x = buf[warp];
  const float4 in = *reinterpret_cast<const float4*>(src + lane * 4);
  float v[4] = {in.x, in.y, in.z, in.w};
  if (!p.already_prepared) {
    for (int k = 0; k < 4; ++k) x[lane * 4 + k] = v[k];
    __syncwarp();
    // fp_sim.cpp hadamard: butterflies of stride 1, 2, ..., 64 (pairs of one stage are disjoint), then one
    // multiply by float(1 / sqrt(128)).
    for (unsigned hs = 1; hs < kIndexerDim; hs *= 2) {
      for (unsigned pr = lane; pr < kIndexerDim / 2; pr += 32) {
        const unsigned i = (pr / hs) * 2 * hs + (pr % hs);
        const float a = x[i], b = x[i + hs];
        x[i] = __fadd_rn(a, b);
        x[i + hs] = __fsub_rn(a, b);
      }
      __syncwarp();
    }
    // fp4_block_sim: blocks of 32 = 8 lanes x 4 values.
    float amax = 0.0f;
    for (int k = 0; k < 4; ++k) {
      v[k] = __fmul_rn(x[lane * 4 + k], p.hadamard_scale);
      amax = fmaxf(amax, fabsf(v[k]));
    }
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    const float s = pow2_ceil_scale(amax, 6.0f * 0x1p-126f, 1.0f / 6.0f);
    const float inv_s = 1.0f / s;
    for (int k = 0; k < 4; ++k) {
      const float q = fminf(fmaxf(__fmul_rn(v[k], inv_s), -6.0f), 6.0f);
      v[k] = __fmul_rn(round_e2m1(q), s);
    }
  }
  int lb = kNoBit;
  bool ok = true;
  for (int k = 0; k < 4; ++k) {
    ok = ok && isfinite(v[k]);
    if (v[k] != 0.0f && isfinite(v[k])) lb = min(lb, lowbit_exponent(v[k]));
  }
  const int f_raw = warp_min(lb);
  const int f = f_raw != kNoBit ? f_raw : 0;  // an all-zero head has integers 0 at any exponent
  std::uint32_t packed = 0;
  for (int k = 0; k < 4; ++k) {
    const int iv = isfinite(v[k]) ? int_at_exponent(v[k], f) : 128;
    if (iv > 127 || iv < -127) ok = false;
    packed |= (static_cast<std::uint32_t>(iv) & 0xFFu) << (8 * k);
  }
  ok = ok && f >= -126 && f <= 100;
  ok = __all_sync(0xFFFFFFFFu, ok);
  reinterpret_cast<float4*>(qf)[lane] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<std::uint32_t*>(qi)[lane] = packed;
  if (lane == 0) {
    fq_all[row] = f;
    ok_all[row] = ok ? 1 : 0;
  }
}

}  // namespace

cudaError_t launch_prepare_queries(const PrepareParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  return launch_after_previous(prepare_kernel, dim3(p.tokens, kIndexerMaxHeads / kPrepareHeadsPerBlock),
                               dim3(kPrepareHeadsPerBlock * 32), 0, stream, p);
}

}  // namespace kvcompact::cuda::dsv4::detail
