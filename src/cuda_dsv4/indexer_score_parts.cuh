// Device pieces of the indexer's score kernels (indexer_scores.cu: mma.sync on BF16 and MXFP4 rows;
// indexer_scores_wgmma.cu: warpgroup MMAs on FP8 rows): the exact scalar path for rows off the tensor cores'
// grid (both kernels), and the scale part of the FP8 rows' tensor-core check. See docs/cuda-dsv4-kernels.md for
// the exactness argument.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "indexer_rows16.cuh"
#include "kernels_device.cuh"
#include "kernels_params.hpp"

namespace kvcompact::cuda::dsv4::detail {

// The CPU's float32 dot product (math_dot.hpp dot_f32, n = 128: eight accumulators, then a fixed tree) of a
// query head with a stored row, decoded value by value exactly as decode_indexer_row does.
__device__ inline float cpu_dot128_row(const float* a, const std::uint8_t* row, std::uint32_t storage) {
  float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (unsigned i = 0; i < 128; i += 8) {
#pragma unroll
    for (unsigned j = 0; j < 8; ++j) s[j] = __fadd_rn(s[j], __fmul_rn(a[i + j], indexer_value(row, storage, i + j)));
  }
  return __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[1]), __fadd_rn(s[2], s[3])),
                   __fadd_rn(__fadd_rn(s[4], s[5]), __fadd_rn(s[6], s[7])));
}

// A token's query in the workspace (written by indexer_prepare.cu) and its head weights.
struct ScoreToken {
  const std::int8_t* qi;  // [64 heads][128] integer codes c, the head's values c 2^fq
  const float* qf;        // [64 heads][128] the query as floats (the scalar path's)
  const int* fq;          // [64 heads] the codes' exponents
  const int* qok;         // [64 heads] whether the head is on the integer grid
  const float* w;         // [heads]
};
__device__ __forceinline__ ScoreToken score_token(const ScoreParams& p, unsigned token) {
  const std::uint64_t t = token;
  return ScoreToken{reinterpret_cast<const std::int8_t*>(p.ws + p.layout.qi) + t * kIndexerMaxHeads * kIndexerDim,
                    reinterpret_cast<const float*>(p.ws + p.layout.qf) + t * kIndexerMaxHeads * kIndexerDim,
                    reinterpret_cast<const int*>(p.ws + p.layout.fq) + t * kIndexerMaxHeads,
                    reinterpret_cast<const int*>(p.ws + p.layout.info) + t * kIndexerMaxHeads, p.weights + t * p.heads};
}
// w_h 2^fq_h, the factor of the tensor-core paths' terms.
__device__ __forceinline__ float weight_times_2fq(const ScoreToken& t, unsigned h) {
  return __fmul_rn(t.w[h], pow2f(t.fq[h]));
}

// The token's checks, gathered in shared memory over its heads: reset by one thread, then (after a barrier)
// add_head by the thread of each head.
struct TokenChecks {
  int q_ok;              // every head on the grid, with w_h 2^fq_h exact
  int fq_min, fq_max;    // over the heads: the query's exponents
  int wq_emin, wq_emax;  // over the heads with w_h 2^fq_h != 0: floor(log2 |w_h 2^fq_h|), min and max + 1
  __device__ __forceinline__ void reset() {
    q_ok = 1;
    fq_min = 1 << 20;
    fq_max = -(1 << 20);
    wq_emin = 1 << 20;
    wq_emax = -(1 << 20);
  }
  __device__ __forceinline__ void add_head(const ScoreToken& t, unsigned h) {
    if (t.qok[h] == 0) atomicAnd(&q_ok, 0);
    // The epilogue multiplies by w_h * 2^fq_h, which must be exact (not subnormal, not overflowed).
    if (__fmul_rn(weight_times_2fq(t, h), pow2f(-t.fq[h])) != t.w[h]) atomicAnd(&q_ok, 0);
    atomicMin(&fq_min, t.fq[h]);
    atomicMax(&fq_max, t.fq[h]);
    const float wq = weight_times_2fq(t, h);
    if (wq != 0.0f) {
      // floor(log2 |wq|) for a normal wq; an exactly representable subnormal one gives -127, which fails the
      // row checks (conservative).
      const int e = static_cast<int>((__float_as_uint(wq) >> 23) & 0xFFu) - 127;
      atomicMin(&wq_emin, e);
      atomicMax(&wq_emax, e + 1);
    }
  }
};

// The token's exponent ranges that the tensor-core paths' checks need (set in each kernel's prologue).
struct ScoreExponents {
  int fq_min, fq_max;    // over the heads: the query's exponents 2^fq
  int wq_emin, wq_emax;  // over the heads with w_h 2^fq_h != 0: floor(log2 |w_h 2^fq_h|), min and max + 1
};

// The check of an FP8 key row for the f16 tensor-core path, after the row's grid check (fp8_grid_check.hpp: every
// code 0 or a multiple of 2 below 2^9, as for a largest code of exponent e = kFp8GridTopExponent = 8, which the
// kernel passes as e): returns the scale's exponent k and clears ok unless the scale and the exponents below allow it.
// The scale must be a positive normal power of two 2^k: the CPU's values e4m3 * 2^k are then exact (multiples of
// 2^(e - 7 + k) below 2^(e + 1 + k)), its dot too (products multiples of 2^(fq + e - 7 + k), partial sums below
// 2^(fq + e + 15 + k)), and the MMA gives I = q.k / (2^fq 2^k). The terms fl((w 2^fq) max(I, 0)) times 2^k (on
// the head sum) are the CPU's bits when every term and partial sum is normal in both scales: terms lie in
// [2^(wq_emin + e - 7), 2^(wq_emax + e + 15)), sums of 64 below 2^(wq_emax + e + 21). As bounds, set once per
// token (Fp8ScaleBounds):
//   e - 7 + k >= -149, fq_min + e - 7 + k >= -149    <=>  e + k >= max(-142, -142 - fq_min)
//   e + 1 + k <= 127,  fq_max + e + 15 + k <= 126    <=>  e + k <= min(126, 111 - fq_max)
//   wq_emin + e - 7 + min(k, 0) >= -126              <=>  e + min(k, 0) >= -119 - wq_emin
//   wq_emax + e + 21 + max(k, 0) <= 127              <=>  e + max(k, 0) <= 106 - wq_emax
struct Fp8ScaleBounds {
  int sum_min, sum_max;  // of e + k
  int low_min, high_max;  // of e + min(k, 0) and e + max(k, 0)
  __device__ __forceinline__ explicit Fp8ScaleBounds(const ScoreExponents& x)
      : sum_min(max(-142, -142 - x.fq_min)),
        sum_max(min(126, 111 - x.fq_max)),
        low_min(-119 - x.wq_emin),
        high_max(106 - x.wq_emax) {}
};
__device__ __forceinline__ int fp8_row_scale_check(int e, std::uint32_t scale_bits, const Fp8ScaleBounds& b,
                                                   bool& ok) {
  const int field = static_cast<int>((scale_bits >> 23) & 0xFFu), k = field - 127;  // normal: field in [1, 254]
  ok = ok && (scale_bits & 0x807FFFFFu) == 0u && field != 0 && field != 255 && e + k >= b.sum_min &&
       e + k <= b.sum_max && e + min(k, 0) >= b.low_min && e + max(k, 0) <= b.high_max;
  return k;
}

// A token whose visible rows exceed the call's max_visible (rows_beyond_bound): its score row is NaN over
// [0, max_visible), written by the token's blocks (grid x) together; nothing past max_visible is read or written.
__device__ __forceinline__ void write_beyond_bound_scores(const ScoreParams& p, unsigned token) {
  float* row = p.scores + static_cast<std::uint64_t>(token) * p.score_stride;
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < p.max_visible; i += gridDim.x * blockDim.x) {
    row[i] = quiet_nan();
  }
}

// The exact scalar path for rows off the tensor cores' grid (rows or a query off the integer grid: the CPU's own
// arithmetic), one warp per row: the score p.scores[token][row] of the token's stored row `row`. Lane l holds the
// terms of heads l (a = 0) and l + 32 (a = 1), zero past the last head, and the CPU's head tree
// (dsv4/indexer_head_sum.hpp) runs on shuffles: the pairs (lanes 1 apart), the two m (16 apart), g (2, 4, 8
// apart), then a; then + 0.
__device__ __forceinline__ void score_scalar_row(const ScoreParams& p, const std::uint8_t* token_rows, unsigned token,
                                                 std::uint32_t row, unsigned lane, const float* qf, const float* w) {
  const std::uint8_t* rp = token_rows + static_cast<std::uint64_t>(row) * p.row_bytes;
  // (One copy of the dot's emulation for both heads, not unrolled: it is long, and only flagged rows run it.)
  float t0 = 0.0f, t1 = 0.0f;
#pragma unroll 1
  for (unsigned a = 0; a < 2; ++a) {
    const unsigned h = lane + 32 * a;
    float t = 0.0f;
    if (h < p.heads) {
      const float dot = cpu_dot128_row(qf + h * kIndexerDim, rp, p.storage);
      t = __fmul_rn(w[h], dot < 0.0f ? 0.0f : dot);
    }
    (a == 0 ? t0 : t1) = t;
  }
  constexpr unsigned kLanesApart[5] = {1, 16, 2, 4, 8};
#pragma unroll
  for (unsigned j = 0; j < 5; ++j) {
    t0 = __fadd_rn(t0, __shfl_xor_sync(0xFFFFFFFFu, t0, kLanesApart[j]));
    t1 = __fadd_rn(t1, __shfl_xor_sync(0xFFFFFFFFu, t1, kLanesApart[j]));
  }
  if (lane == 0) {
    p.scores[static_cast<std::uint64_t>(token) * p.score_stride + row] = __fadd_rn(__fadd_rn(t0, t1), 0.0f);
    if (p.fallback_rows != nullptr) atomicAdd(p.fallback_rows, 1ull);
  }
}

// The scalar path for one tile's flagged rows: tile rows flagged[i], i < nflagged, the tile starting at row0;
// warp w of the block's kScoreThreads / 32 takes entries w, w + 4, ...
__device__ __forceinline__ void score_flagged_rows(const ScoreParams& p, const std::uint8_t* token_rows,
                                                   unsigned token, std::uint32_t row0, const int* flagged,
                                                   int nflagged, unsigned warp, unsigned lane, const float* qf,
                                                   const float* w) {
  for (int i = static_cast<int>(warp); i < nflagged; i += kScoreThreads / 32) {
    score_scalar_row(p, token_rows, token, row0 + static_cast<std::uint32_t>(flagged[i]), lane, qf, w);
  }
}

}  // namespace kvcompact::cuda::dsv4::detail
