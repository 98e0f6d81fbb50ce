// DeepSeek-V4 lightning indexer on the GPU: query preparation (Hadamard + FP4, bit for bit the CPU's
// prepare_indexer_query) and scores I[s] = sum_h w_h ReLU(q_h . k_s) with int8 tensor cores. The scores are
// bit-identical to the CPU fast path (indexer_scores): FP4-grid values are small integers times a power of
// two, so every q_h . k_s is exact in int32 here and exact in the CPU's float32 sums; the head sum then runs
// in the CPU's order with IEEE round-to-nearest multiplies and adds (no FMA contraction). Rows or queries
// that are not on such a grid take an exact scalar emulation of the CPU's arithmetic instead.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels_device.cuh"
#include "kernels_params.hpp"

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

// One block per token, 8 warps; warp w prepares heads w, w + 8, ... (64 padded heads).
__global__ void __launch_bounds__(256) prepare_kernel(PrepareParams p) {
  __shared__ float buf[8][kIndexerDim];
  __shared__ int s_ok, s_min, s_max;
  const unsigned token = blockIdx.x;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    s_ok = 1;
    s_min = kNoBit;
    s_max = -kNoBit;
  }
  __syncthreads();
  float* qf_all = reinterpret_cast<float*>(p.ws + p.layout.qf);
  std::int8_t* qi_all = reinterpret_cast<std::int8_t*>(p.ws + p.layout.qi);
  int* fq_all = reinterpret_cast<int*>(p.ws + p.layout.fq);
  for (unsigned h = warp; h < kIndexerMaxHeads; h += 8) {
    const std::uint64_t row = static_cast<std::uint64_t>(token) * kIndexerMaxHeads + h;
    float* qf = qf_all + row * kIndexerDim;
    std::int8_t* qi = qi_all + row * kIndexerDim;
    if (h >= p.heads) {
      for (unsigned i = lane; i < kIndexerDim; i += 32) {
        qf[i] = 0.0f;
        qi[i] = 0;
      }
      if (lane == 0) fq_all[row] = 0;
      continue;
    }
    const float* src = p.q + (static_cast<std::uint64_t>(token) * p.heads + h) * kIndexerDim;
    float* x = buf[warp];
    for (unsigned i = lane; i < kIndexerDim; i += 32) x[i] = src[i];
    __syncwarp();
    if (!p.already_prepared) {
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
      for (unsigned i = lane; i < kIndexerDim; i += 32) x[i] = __fmul_rn(x[i], p.hadamard_scale);
      __syncwarp();
      // fp4_block_sim: blocks of 32 = 8 lanes x 4 values.
      float v[4];
      float amax = 0.0f;
      for (int k = 0; k < 4; ++k) {
        v[k] = x[lane * 4 + k];
        amax = fmaxf(amax, fabsf(v[k]));
      }
      for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
      const float s = pow2_ceil_scale(amax, 6.0f * 0x1p-126f, 1.0f / 6.0f);
      const float inv_s = 1.0f / s;
      for (int k = 0; k < 4; ++k) {
        const float q = fminf(fmaxf(__fmul_rn(v[k], inv_s), -6.0f), 6.0f);
        v[k] = __fmul_rn(round_e2m1(q), s);
      }
      __syncwarp();
      for (int k = 0; k < 4; ++k) x[lane * 4 + k] = v[k];
      __syncwarp();
    }
    float v[4];
    int lb = kNoBit;
    for (int k = 0; k < 4; ++k) {
      v[k] = x[lane * 4 + k];
      if (v[k] != 0.0f && isfinite(v[k])) lb = min(lb, lowbit_exponent(v[k]));
    }
    bool ok = true;
    for (int k = 0; k < 4; ++k) ok = ok && isfinite(v[k]);
    const int f_raw = warp_min(lb);
    const bool nonzero = f_raw != kNoBit;
    const int f = nonzero ? f_raw : 0;  // an all-zero head has integers 0 at any exponent
    std::uint32_t packed = 0;
    for (int k = 0; k < 4; ++k) {
      const int iv = isfinite(v[k]) ? int_at_exponent(v[k], f) : 128;
      if (iv > 127 || iv < -127) ok = false;
      packed |= (static_cast<std::uint32_t>(iv) & 0xFFu) << (8 * k);
    }
    ok = ok && f >= -126 && f <= 100;
    ok = __all_sync(0xFFFFFFFFu, ok);
    for (int k = 0; k < 4; ++k) qf[lane * 4 + k] = v[k];
    reinterpret_cast<std::uint32_t*>(qi)[lane] = packed;
    if (lane == 0) {
      fq_all[row] = f;
      if (!ok) atomicAnd(&s_ok, 0);
      if (nonzero) {
        atomicMin(&s_min, f);
        atomicMax(&s_max, f);
      }
    }
    __syncwarp();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int* info = reinterpret_cast<int*>(p.ws + p.layout.info) + token * 4;
    info[0] = s_ok;
    info[1] = s_min == kNoBit ? 0 : s_min;
    info[2] = s_max == -kNoBit ? 0 : s_max;
    info[3] = 0;
  }
}

// The CPU's float32 dot product (math_dot.hpp dot_f32, n = 128): eight accumulators, then a fixed tree.
__device__ __forceinline__ float cpu_dot128(const float* a, const float* b) {
  float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = 0; i < 128; i += 8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j] = __fadd_rn(s[j], __fmul_rn(a[i + j], b[i + j]));
  }
  return __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[1]), __fadd_rn(s[2], s[3])),
                   __fadd_rn(__fadd_rn(s[4], s[5]), __fadd_rn(s[6], s[7])));
}

constexpr unsigned kKiStride = 144;  // bytes per key row in shared memory (conflict-free B fragments)
constexpr unsigned kPStride = kScoreTileRows + 1;

// Block: 4 warps (warp w: heads 16w .. 16w + 15), tiles of 64 key rows of one token.
__global__ void __launch_bounds__(kScoreThreads) score_kernel(ScoreParams p) {
  __shared__ __align__(16) std::uint8_t ki[kScoreTileRows * kKiStride];
  __shared__ float ps[kIndexerMaxHeads * kPStride];
  __shared__ float rowf[kIndexerDim];
  __shared__ int fk[kScoreTileRows];
  __shared__ int rok[kScoreTileRows];
  const unsigned token = blockIdx.y;
  const TokenRowsDev desc = p.tokens[token];
  const std::uint32_t visible = static_cast<std::uint32_t>((desc.position + 1) / 4);
  const std::uint32_t tiles = (visible + kScoreTileRows - 1) / kScoreTileRows;
  if (blockIdx.x >= tiles) return;
  const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tig = lane % 4;
  const std::int8_t* qi = reinterpret_cast<const std::int8_t*>(p.ws + p.layout.qi) +
                          static_cast<std::uint64_t>(token) * kIndexerMaxHeads * kIndexerDim;
  const float* qf = reinterpret_cast<const float*>(p.ws + p.layout.qf) +
                    static_cast<std::uint64_t>(token) * kIndexerMaxHeads * kIndexerDim;
  const int* fq = reinterpret_cast<const int*>(p.ws + p.layout.fq) + static_cast<std::uint64_t>(token) * kIndexerMaxHeads;
  const int* info = reinterpret_cast<const int*>(p.ws + p.layout.info) + token * 4;
  const bool q_ok = info[0] != 0;
  const int fq_min = info[1], fq_max = info[2];
  const float* w = p.weights + static_cast<std::uint64_t>(token) * p.heads;

  // A fragments (16 heads x 128 dims as 4 k-steps of 32) stay in registers for every tile.
  std::uint32_t a[4][4];
  const unsigned ha = warp * 16 + g, hb = ha + 8;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const unsigned col = ks * 32 + tig * 4;
    a[ks][0] = *reinterpret_cast<const std::uint32_t*>(qi + ha * kIndexerDim + col);
    a[ks][1] = *reinterpret_cast<const std::uint32_t*>(qi + hb * kIndexerDim + col);
    a[ks][2] = *reinterpret_cast<const std::uint32_t*>(qi + ha * kIndexerDim + col + 16);
    a[ks][3] = *reinterpret_cast<const std::uint32_t*>(qi + hb * kIndexerDim + col + 16);
  }
  const float sqa = pow2f(min(max(fq[ha], -126), 127)), sqb = pow2f(min(max(fq[hb], -126), 127));
  const float wa = ha < p.heads ? w[ha] : 0.0f, wb = hb < p.heads ? w[hb] : 0.0f;

  for (std::uint32_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const std::uint32_t row0 = tile * kScoreTileRows;
    const std::uint32_t nrows = min(kScoreTileRows, visible - row0);
    // ---- decode: two threads per key row, 64 dims each, to integers at the row's lowest-bit exponent.
    {
      const unsigned r = tid / 2, half = tid % 2;
      float v[64];
      if (r < nrows) {
        const std::uint8_t* row = desc.indexer_rows + static_cast<std::uint64_t>(row0 + r) * p.row_bytes;
        if (p.storage == kIdxBf16) {
#pragma unroll
          for (int k = 0; k < 32; ++k) {
            const std::uint32_t wd = ld_u32(row + half * 128 + 4 * k);
            v[2 * k] = bf16_bits_to_f32(wd & 0xFFFFu);
            v[2 * k + 1] = bf16_bits_to_f32(wd >> 16);
          }
        } else if (p.storage == kIdxFp8) {
          const float scale = __uint_as_float(ld_u32(row + kIndexerDim));
#pragma unroll
          for (int k = 0; k < 16; ++k) {
            const std::uint32_t wd = ld_u32(row + half * 64 + 4 * k);
#pragma unroll
            for (int b = 0; b < 4; ++b) v[4 * k + b] = __fmul_rn(e4m3_to_f32((wd >> (8 * b)) & 0xFFu), scale);
          }
        } else {
          const std::uint32_t sw = ld_u32(row + 64);
          const int e0 = static_cast<int>((sw >> (16 * half)) & 0xFFu) - 127;
          const int e1 = static_cast<int>((sw >> (16 * half + 8)) & 0xFFu) - 127;
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const std::uint32_t wd = ld_u32(row + half * 32 + 4 * k);
#pragma unroll
            for (int b = 0; b < 8; ++b) v[8 * k + b] = ldexpf(e2m1_to_f32((wd >> (4 * b)) & 0xFu), k < 4 ? e0 : e1);
          }
        }
      } else {
#pragma unroll
        for (int k = 0; k < 64; ++k) v[k] = 0.0f;
      }
      int lb = kNoBit;
      bool finite = true;
#pragma unroll
      for (int k = 0; k < 64; ++k) {
        finite = finite && isfinite(v[k]);
        if (v[k] != 0.0f && isfinite(v[k])) lb = min(lb, lowbit_exponent(v[k]));
      }
      lb = min(lb, __shfl_xor_sync(0xFFFFFFFFu, lb, 1));
      const int f = lb == kNoBit ? 0 : lb;
      bool ok = finite;
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        std::uint32_t packed = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int iv = isfinite(v[4 * k + b]) ? int_at_exponent(v[4 * k + b], f) : 128;
          ok = ok && iv <= 127 && iv >= -127;
          packed |= (static_cast<std::uint32_t>(iv) & 0xFFu) << (8 * b);
        }
        *reinterpret_cast<std::uint32_t*>(ki + r * kKiStride + half * 64 + 4 * k) = packed;
      }
      const bool other = __shfl_xor_sync(0xFFFFFFFFu, ok ? 1 : 0, 1) != 0;
      ok = ok && other;
      // Exactness of I * 2^fq * 2^fk (see the file comment): exponents in range, products above 2^-149.
      ok = ok && f >= -126 && f <= 100 && fq_min + f >= -149 && fq_max + f <= 100;
      if (half == 0) {
        fk[r] = f;
        rok[r] = ok ? 1 : 0;
      }
    }
    __syncthreads();
    // ---- int8 MMA: 8 groups of 8 rows; dots exact, then w_h * ReLU(dot) into ps[head][row].
#pragma unroll 1
    for (unsigned ng = 0; ng < kScoreTileRows / 8; ++ng) {
      int acc[4] = {0, 0, 0, 0};
      const std::uint8_t* kb = ki + (ng * 8 + g) * kKiStride + tig * 4;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const std::uint32_t b0 = *reinterpret_cast<const std::uint32_t*>(kb + ks * 32);
        const std::uint32_t b1 = *reinterpret_cast<const std::uint32_t*>(kb + ks * 32 + 16);
        mma_s8(acc, a[ks], b0, b1);
      }
      const unsigned ra = ng * 8 + tig * 2, rb = ra + 1;
      const float ska = pow2f(min(max(fk[ra], -126), 127)), skb = pow2f(min(max(fk[rb], -126), 127));
      const float d[4] = {__fmul_rn(__fmul_rn(static_cast<float>(acc[0]), sqa), ska),
                          __fmul_rn(__fmul_rn(static_cast<float>(acc[1]), sqa), skb),
                          __fmul_rn(__fmul_rn(static_cast<float>(acc[2]), sqb), ska),
                          __fmul_rn(__fmul_rn(static_cast<float>(acc[3]), sqb), skb)};
      ps[ha * kPStride + ra] = __fmul_rn(wa, d[0] < 0.0f ? 0.0f : d[0]);
      ps[ha * kPStride + rb] = __fmul_rn(wa, d[1] < 0.0f ? 0.0f : d[1]);
      ps[hb * kPStride + ra] = __fmul_rn(wb, d[2] < 0.0f ? 0.0f : d[2]);
      ps[hb * kPStride + rb] = __fmul_rn(wb, d[3] < 0.0f ? 0.0f : d[3]);
    }
    __syncthreads();
    // ---- exact scalar path for rows (or a query) off the integer grid: the CPU's own arithmetic.
    for (unsigned r = 0; r < nrows; ++r) {
      if (q_ok && rok[r] != 0) continue;  // uniform: shared-memory flags
      const std::uint8_t* row = desc.indexer_rows + static_cast<std::uint64_t>(row0 + r) * p.row_bytes;
      rowf[tid] = indexer_value(row, p.storage, tid);
      __syncthreads();
      if (tid < p.heads) {
        const float dot = cpu_dot128(qf + tid * kIndexerDim, rowf);
        ps[tid * kPStride + r] = __fmul_rn(w[tid], dot < 0.0f ? 0.0f : dot);
      }
      if (tid == 0 && p.fallback_rows != nullptr) atomicAdd(p.fallback_rows, 1ull);
      __syncthreads();
    }
    // ---- head sum in the CPU's order: total = ((0 + p_0) + p_1) + ...
    if (tid < nrows) {
      float total = 0.0f;
      for (unsigned h = 0; h < p.heads; ++h) total = __fadd_rn(total, ps[h * kPStride + tid]);
      p.scores[static_cast<std::uint64_t>(token) * p.score_stride + row0 + tid] = total;
    }
    __syncthreads();
  }
}

}  // namespace

cudaError_t launch_prepare_queries(const PrepareParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  prepare_kernel<<<p.tokens, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_indexer_scores(const ScoreParams& p, cudaStream_t stream) {
  if (p.count == 0 || p.blocks_per_token == 0) return cudaSuccess;
  const dim3 grid(p.blocks_per_token, p.count);
  score_kernel<<<grid, kScoreThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::dsv4::detail
