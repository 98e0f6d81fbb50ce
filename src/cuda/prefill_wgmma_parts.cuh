// Internal to the warpgroup prefill kernel (tq_prefill_wgmma.cu): its producer's pieces (the dequantisation by code
// width, the QJL sign tiles, the staging bulk copies, the pair tables), the P' fragments of the consumers and the
// key split's merge. Included by tq_prefill_wgmma.cu only, after prefill_wgmma_shape.cuh.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "bulk_copy.cuh"
#include "mbarrier.cuh"
#include "prefill_dequant.cuh"
#include "prefill_device.cuh"
#include "prefill_params.hpp"
#include "prefill_wgmma_shape.cuh"
#include "wgmma.cuh"

namespace kvcompact::cuda::tq::detail {

namespace {

// Keys (or values) of one staged tile → the SW128 fp16 tile, by the producer warpgroup (thread pt), with the code
// width as a compile-time constant (prefill_dequant.cuh; widths kMinBits..kMaxBits, a uniform branch per tile;
// plan_prefill admits only those: key codes of 1–5 bits, values of 2–4).
// `codes` is the staged region's first row (16-byte aligned at head_dim 128, as prefill_dequant.cuh explains).
template <unsigned kMinBits, unsigned kMaxBits>
__device__ __forceinline__ void dequant_tile(unsigned pt, std::uint8_t* tile, const std::uint8_t* codes,
                                             std::uint32_t bits, const std::uint32_t* pairs) {
  if constexpr (kMinBits <= kMaxBits) {
    if (bits == kMinBits) {
      dequant_tile_fixed<kMinBits, kBN, kProducerThreads>(pt, tile, codes, pairs);
    } else {
      dequant_tile<kMinBits + 1, kMaxBits>(pt, tile, codes, bits, pairs);
    }
  }
}

// QJL keys: the sign tile of one staged tile → SW128 fp16 ±ρ_t (ρ is stored as fp16, so the tile is exact; the
// queries carry α·√(π/2d)), by the producer warpgroup (thread pt), chunk c as in dequant_tile: a sign byte (8
// coordinates; bit set: σ = +1) becomes two nibble masks XORed into ρ_t. Tokens past `cnt` get ρ = 0.
// (Rounding ρ_t·α·√(π/2d) to fp16 here instead was measured: a per-token error of up to 2⁻¹¹ of the QJL term,
// which does not average out over the coordinates, gave 1.1–1.5·10⁻³ in the oracle tests of k=prod3.)
__device__ __forceinline__ void sign_tile(unsigned pt, std::uint8_t* tile, const std::uint8_t* signs,
                                          const unsigned short* rho, std::uint32_t bytes_per_token, std::uint32_t cnt,
                                          const uint2* masks) {
  constexpr unsigned kChunks = kBN * (D / 8);
#pragma unroll
  for (unsigned j = 0; j < kChunks / kProducerThreads; ++j) {
    const unsigned c = pt + j * kProducerThreads;
    const unsigned tt = c / 16, gg = c % 16;
    const std::uint32_t rr = (tt < cnt ? static_cast<std::uint32_t>(rho[tt]) : 0u) * 0x10001u;
    const std::uint32_t byte = signs[tt * bytes_per_token + gg];
    const uint2 lo = masks[byte & 15u], hi = masks[byte >> 4];
    *reinterpret_cast<uint4*>(tile + sw128_offset(tt, gg * 8, kBN)) =
        make_uint4(rr ^ lo.x, rr ^ lo.y, rr ^ hi.x, rr ^ hi.y);
  }
}

// Copies the packed bytes of tokens [first, first + cnt) of every region into a staging buffer: one bulk copy per
// region (region_copy's 16-byte chunks), issued by one producer thread and counted on the buffer's mbarrier.
// (Per-thread 16-byte cp.async, the form before, wrote shared memory at 3.5× its ideal wavefronts in the profile.)
// Folded keys (FOLDED) take no key codes: their tiles come from the fold pass (prefill_fold.cu).
template <bool QJL, bool FOLDED = false>
__device__ __forceinline__ void copy_tile(const PrefillParams& p, std::uint8_t* base, std::uint64_t first,
                                          std::uint32_t cnt, std::uint64_t* bar) {
  const Stage<D, QJL, kBN> s(base);
  RegionCopy kc{nullptr, 0u};
  if constexpr (!FOLDED) kc = region_copy(p.layer + p.key_codes, first, cnt, p.kc_bytes);
  const RegionCopy kn = region_copy(p.layer + p.key_norms, first, cnt, 4u);
  const RegionCopy vc = region_copy(p.layer + p.value_codes, first, cnt, p.vc_bytes);
  const RegionCopy vn = region_copy(p.layer + p.value_norms, first, cnt, 4u);
  RegionCopy ks{nullptr, 0u}, kr{nullptr, 0u};
  if constexpr (QJL) {
    ks = region_copy(p.layer + p.key_signs, first, cnt, p.ks_bytes);
    kr = region_copy(p.layer + p.key_rho, first, cnt, 2u);
  }
  mbar_arrive_expect_tx(bar, kc.bytes + ks.bytes + kr.bytes + kn.bytes + vc.bytes + vn.bytes);
  if constexpr (!FOLDED) bulk_copy(s.kc, kc.src, kc.bytes, bar);
  if constexpr (QJL) {
    bulk_copy(s.ks, ks.src, ks.bytes, bar);
    bulk_copy(s.kr, kr.src, kr.bytes, bar);
  }
  bulk_copy(s.kn, kn.src, kn.bytes, bar);
  bulk_copy(s.vc, vc.src, vc.bytes, bar);
  bulk_copy(s.vn, vn.src, vn.bytes, bar);
}

// A barrier among `threads` threads (whole warps) only.
__device__ __forceinline__ void named_barrier(unsigned id, unsigned threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Fills a pair table for `bits`-bit codes (2^(2 bits) entries) with half2(α c[lo], α c[hi]).
template <unsigned kThreads>
__device__ __forceinline__ void fill_pair_table(std::uint32_t* table, std::uint32_t bits, float alpha,
                                                const float* centroids) {
  const std::uint32_t mask = (1u << bits) - 1u;
  for (std::uint32_t e = threadIdx.x; e < (1u << (2u * bits)); e += kThreads) {
    table[e] = half2_bits(__floats2half2_rn(alpha * centroids[e & mask], alpha * centroids[(e >> bits) & mask]));
  }
}

// A fragment (wgmma.cuh: a[0] row g, cols 2 tig, +1; a[1] row g + 8; a[2], a[3] cols + 8) of P' for k-step ks
// (tokens 16 ks ...) from the S accumulator layout (pw[4 i ...]: columns 8 i + 2 tig, rows g / g + 8).
template <bool kSplit>
__device__ __forceinline__ void p_fragment(const float (&pw)[32], unsigned ks, std::uint32_t (&hi)[4],
                                           std::uint32_t (&lo)[4]) {
#pragma unroll
  for (unsigned h = 0; h < 2; ++h) {
    const unsigned i = 2 * ks + h;
    if constexpr (kSplit) {
      split_pair(pw[4 * i], pw[4 * i + 1], hi[2 * h], lo[2 * h]);
      split_pair(pw[4 * i + 2], pw[4 * i + 3], hi[2 * h + 1], lo[2 * h + 1]);
    } else {
      hi[2 * h] = half2_bits(__floats2half2_rn(pw[4 * i], pw[4 * i + 1]));
      hi[2 * h + 1] = half2_bits(__floats2half2_rn(pw[4 * i + 2], pw[4 * i + 3]));
      lo[2 * h] = lo[2 * h + 1] = 0u;
    }
  }
}

// Key splits, by the consumer threads after their rows (o · R / (2^15 α), the maxima m and sums l of the
// softmax in log2 units) are in obuf / row_m / row_l: writes them as this split's partial, counts the split in
// and returns false, except in the last split to finish, which merges every split's partial in split order
// (so the result does not depend on which finished last) into obuf / row_m / row_l and returns true.
template <typename W>
__device__ bool merge_key_splits(const PrefillParams& p, unsigned split, float* obuf, float* row_m, float* row_l,
                                 std::uint32_t& merge_flag) {
  constexpr unsigned kRows = W::kRows, kConsumerThreads = W::kConsumerThreads, kPartialFloats = W::kPartialFloats;
  const unsigned tid = threadIdx.x;
  const std::uint64_t unit = (static_cast<std::uint64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * p.tiles +
                             blockIdx.x / p.key_splits;
  float* const first = p.partials + unit * p.key_splits * kPartialFloats;
  {
    float* mine = first + split * kPartialFloats;
    for (unsigned i = tid; i < kRows * D / 4; i += kConsumerThreads) {
      __stcg(reinterpret_cast<float4*>(mine) + i, reinterpret_cast<const float4*>(obuf)[i]);
    }
    for (unsigned r = tid; r < kRows; r += kConsumerThreads) {
      __stcg(mine + kRows * D + r, row_m[r]);
      __stcg(mine + kRows * D + kRows + r, row_l[r]);
    }
    __threadfence();  // this thread's part of the partial is visible before the split is counted
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);
  if (tid == 0) merge_flag = atomicAdd(p.counters + unit, 1u) == p.key_splits - 1u ? 1u : 0u;
  named_barrier(kConsumerBarrier, kConsumerThreads);
  if (merge_flag == 0u) return false;
  __threadfence();  // every split's partial is visible (each was fenced before its count)
  // Row r: M = max over splits of m_s; weights 2^(m_s − M) (0 for a split that saw none of the row's keys).
  for (unsigned i = tid; i < kRows * D / 4; i += kConsumerThreads) {
    const unsigned r = i / (D / 4);
    float mmax = -INFINITY;
    for (unsigned s = 0; s < p.key_splits; ++s) mmax = fmaxf(mmax, __ldcg(first + s * kPartialFloats + kRows * D + r));
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (unsigned s = 0; s < p.key_splits; ++s) {
      const float ms = __ldcg(first + s * kPartialFloats + kRows * D + r);
      const float w = ms == -INFINITY ? 0.0f : exp2f(ms - mmax);
      const float4 v = __ldcg(reinterpret_cast<const float4*>(first + s * kPartialFloats) + i);
      acc.x = fmaf(w, v.x, acc.x);
      acc.y = fmaf(w, v.y, acc.y);
      acc.z = fmaf(w, v.z, acc.z);
      acc.w = fmaf(w, v.w, acc.w);
    }
    reinterpret_cast<float4*>(obuf)[i] = acc;
  }
  for (unsigned r = tid; r < kRows; r += kConsumerThreads) {
    float mmax = -INFINITY, sum = 0.0f;
    for (unsigned s = 0; s < p.key_splits; ++s) mmax = fmaxf(mmax, __ldcg(first + s * kPartialFloats + kRows * D + r));
    for (unsigned s = 0; s < p.key_splits; ++s) {
      const float ms = __ldcg(first + s * kPartialFloats + kRows * D + r);
      if (ms != -INFINITY) sum = fmaf(exp2f(ms - mmax), __ldcg(first + s * kPartialFloats + kRows * D + kRows + r), sum);
    }
    row_m[r] = mmax;
    row_l[r] = sum;
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);
  return true;
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
