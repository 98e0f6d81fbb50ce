// Chunked-prefill attention on warpgroup MMAs (wgmma, sm_90a) for head_dim 128 with MSE keys (no QJL): the same
// contract and the same numbers as prefill_kernel (tq_prefill.cu) — fp16 hi + lo queries, fp16 α·centroid
// tiles, P' = p · n_v / R · 2^15 as fp16 hi (+ lo with HiLo), fp32 accumulation — with the tensor-core work on
// wgmma instead of mma.sync:
//   three warpgroups, each owning 64 of the block's 192 query rows (48 tokens x a GQA group of 4); the queries
//   (hi and lo) sit once in shared memory in the SW128 layout (wgmma.cuh), 64-token key and value tiles are
//   dequantised once per block into SW128 fp16 tiles (double-buffered, 4 pair-table lookups per 8 coordinates),
//   S = Q_hi·Kᵀ + Q_lo·Kᵀ reads both from shared memory (16 m64n64k16), and O += P'·V takes P' from registers
//   (the S accumulators turned into A fragments) and V MN-major (8 or 16 m64n64k16).
// Per tile: barrier → S of tile i issued → the next tile's keys dequantised while S runs → softmax → P'·V issued →
// the next tile's values dequantised while P'·V runs. Packed bytes are copied with cp.async two tiles ahead.
// docs/cuda-prefill.md describes both kernels; prefill_device.cuh holds their shared pieces.
#include <cuda_fp16.h>

#include <cstdint>

#include "wgmma.cuh"
#include "prefill_device.cuh"
#include "prefill_params.hpp"

namespace kvcompact::cuda::tq::detail {

namespace {

using namespace prefill;

constexpr int D = 128;
// Warpgroups per block (each owns 64 query rows); overridable at compile time for tuning. Three (192 rows, 168
// registers, 12 warps per multiprocessor) ran 8-9 % faster than two on the H200 (docs/cuda-prefill.md).
#ifndef KVC_PREFILL_WGMMA_GROUPS
#define KVC_PREFILL_WGMMA_GROUPS 3
#endif
constexpr unsigned kGroups = KVC_PREFILL_WGMMA_GROUPS;
constexpr unsigned kThreads = 128 * kGroups;
constexpr unsigned kWarps = kThreads / 32;
constexpr unsigned kRows = 64 * kGroups;  // query rows per block
constexpr unsigned kBN = 64;     // key / value tokens per tile
constexpr unsigned kQBytes = kRows * D * 2;  // SW128: two column blocks of kRows rows x 128 bytes
constexpr unsigned kTileBytes = kBN * D * 2;  // SW128: two column blocks of 64 rows x 128 bytes
constexpr unsigned kQBlock = kRows * 128;     // bytes of one 64-column block of the queries
constexpr unsigned kTileBlock = kBN * 128;    // ... of a tile
using Staged = StageLayout<D, false, kBN>;

struct Smem {
  std::uint8_t qhi[kQBytes];  // 1024-byte aligned (the struct is placed so); with qlo, the epilogue rows after
  std::uint8_t qlo[kQBytes];  //   the main loop (128 x 128 floats)
  std::uint8_t k[2][kTileBytes];
  std::uint8_t v[2][kTileBytes];
  std::uint8_t stage[2][Staged::bytes];
  float kscale[2][kBN];  // key norms of a tile's tokens (0 past its end)
  float vfac[2][kBN];    // n_v / R · 2^15 (0 past its end)
  float ratio[2];        // R before / R after the tile (the accumulator's rescale)
  float r_final;         // R after the last tile
  float rowfac_c[kRows], rowfac_s[kRows], row_m[kRows], row_l[kRows];
  std::uint32_t row_limit[kRows];
  // Pair tables: entry (code of the higher coordinate) · 2^bits + (code of the lower one) → half2 of α·centroid,
  // for every code width (≤ 1024 entries at 5 bits), so a code group of 8 coordinates takes 4 lookups.
  std::uint32_t pair_k[1024], pair_v[256];
};
constexpr unsigned kSmemBytes = sizeof(Smem) + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "one block per multiprocessor");
static_assert(2 * kQBytes >= kRows * D * 4, "the epilogue rows fit in the query area");
static_assert(kWarps * 2 * D * 4 <= kTileBytes, "query preparation scratch fits in a tile buffer");
static_assert(Staged::bytes % 16 == 0, "staging buffers stay 16-byte aligned");

// Keys (or values) of one staged tile → the SW128 fp16 tile: chunk c = (token c / 16, group c % 16) goes to
// thread c % kThreads; a row's 8 chunks of one column block land on distinct banks.
__device__ __forceinline__ void dequant_tile(std::uint8_t* tile, const std::uint8_t* codes, std::uint32_t shift,
                                             std::uint32_t bytes_per_token, std::uint32_t bits,
                                             const std::uint32_t* pairs) {
  constexpr unsigned kChunks = kBN * (D / 8);
#pragma unroll
  for (unsigned j = 0; j < (kChunks + kThreads - 1) / kThreads; ++j) {
    const unsigned c = threadIdx.x + j * kThreads;
    if (kChunks % kThreads != 0 && c >= kChunks) break;
    const unsigned tt = c / 16, gg = c % 16;
    *reinterpret_cast<uint4*>(tile + sw128_offset(tt, gg * 8, kBN)) =
        dequant_group_by_pairs(codes, shift + tt * bytes_per_token + gg * bits, bits, pairs);
  }
}

// Copies the packed bytes of tokens [first, first + cnt) (cnt ≤ kBN) into a staging buffer: like load_tile, but a
// region's tile is at most 321 chunks of 16 bytes (5-bit keys: 64 x 80 bytes, plus the alignment), so each thread
// copies at most one chunk per region and needs no loop.
__device__ __forceinline__ void copy_region(std::uint8_t* dst, const std::uint8_t* region, std::uint64_t first,
                                            std::uint32_t cnt, std::uint32_t bpt) {
  const std::uintptr_t start = reinterpret_cast<std::uintptr_t>(region) + first * bpt;
  const std::uintptr_t aligned = start & ~static_cast<std::uintptr_t>(15);
  const std::uint32_t chunks = (static_cast<std::uint32_t>(start - aligned) + cnt * bpt + 15u) / 16u;
  if (threadIdx.x < chunks) cp_async16(dst + 16u * threadIdx.x, reinterpret_cast<const void*>(aligned + 16u * threadIdx.x));
}
static_assert((15 + kBN * (D * 5 / 8) + 15) / 16 <= kThreads, "one chunk per thread and region");
__device__ __forceinline__ void copy_tile(const PrefillParams& p, std::uint8_t* base, std::uint64_t first,
                                          std::uint32_t cnt) {
  const Stage<D, false, kBN> s(base);
  copy_region(s.kc, p.layer + p.key_codes, first, cnt, p.kc_bytes);
  copy_region(s.kn, p.layer + p.key_norms, first, cnt, 4u);
  copy_region(s.vc, p.layer + p.value_codes, first, cnt, p.vc_bytes);
  copy_region(s.vn, p.layer + p.value_norms, first, cnt, 4u);
}

// Fills a pair table for `bits`-bit codes (2^(2 bits) entries) with half2(α c[lo], α c[hi]).
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

template <bool SPLITP>
__global__ void __launch_bounds__(kThreads, 1) prefill_wgmma_kernel(PrefillParams p) {
  extern __shared__ std::uint8_t smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(
      smem_raw + ((1024u - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u));
  const Tables& t = *p.tables;
  const unsigned tid = threadIdx.x, lane = tid % 32, warp = tid / 32, x = tid / 128;
  const unsigned g = lane / 4, tig = lane % 4;
  BlockRange blk;
  if (!blk.init(p, kBN)) return;
  const std::uint32_t kend = blk.kend, ntiles = blk.ntiles;
  const std::uint64_t slot0 = blk.slot0;
  auto tile_tokens = [&](std::uint32_t i) { return min(kBN, kend - i * kBN); };

  // The first two tiles' bytes in flight while the queries are prepared (one commit group per tile, empty ones
  // included, so that "wait for all but the newest group" always means "the next tile is in").
  if (ntiles > 0) copy_tile(p, sm.stage[0], slot0, tile_tokens(0));
  cp_async_commit();
  if (ntiles > 1) copy_tile(p, sm.stage[1], slot0 + kBN, tile_tokens(1));
  cp_async_commit();
  for (unsigned r = tid; r < kRows; r += kThreads) sm.row_limit[r] = blk.row_limit(r, p);
  fill_pair_table(sm.pair_k, p.key_code_bits, t.key_lut_scale, t.key_centroids);
  fill_pair_table(sm.pair_v, p.value_bits, t.value_lut_scale, t.value_centroids);
  // A negative softmax scale is folded into the queries (fp16 negation is exact), so that every row factor is
  // positive and a row's largest score is its factor times its largest S · n_k.
  const std::uint32_t neg = p.scale_log2 < 0.0f ? 0x80008000u : 0u;
  prepare_queries<D, false, kWarps, kRows>(
      p, t, blk, reinterpret_cast<float*>(sm.k[0]), sm.rowfac_c, sm.rowfac_s,
      [&](int, unsigned r, unsigned j, std::uint32_t h, std::uint32_t l) {
        const unsigned off = sw128_offset(r, j, kRows);
        *reinterpret_cast<std::uint32_t*>(sm.qhi + off) = h ^ neg;
        *reinterpret_cast<std::uint32_t*>(sm.qlo + off) = l ^ neg;
      });

  // Per-token factors of a staged tile (two tokens per lane; zeros past the tile's end). Keys (warp 1): the
  // norms. Values (warp 0): n_v / R · 2^15 with R the running maximum of the value norms, kept in registers of
  // warp 0 (P' = p · n_v / R · 2^15 ≤ 2^15 for any norms).
  float r_run = 0.0f;
  auto key_factors = [&](const Stage<D, false, kBN>& s, unsigned buf, std::uint32_t i) {
    const float* kn = reinterpret_cast<const float*>(staged_row0(s.kn, p.layer + p.key_norms, slot0 + i * kBN, 4u));
    const std::uint32_t cnt = tile_tokens(i);
    sm.kscale[buf][lane] = lane < cnt ? kn[lane] : 0.0f;
    sm.kscale[buf][lane + 32] = lane + 32 < cnt ? kn[lane + 32] : 0.0f;
  };
  auto value_factors = [&](const Stage<D, false, kBN>& s, unsigned buf, std::uint32_t i) {
    const float* vn = reinterpret_cast<const float*>(staged_row0(s.vn, p.layer + p.value_norms, slot0 + i * kBN, 4u));
    const std::uint32_t cnt = tile_tokens(i);
    const float n0 = lane < cnt ? vn[lane] : 0.0f, n1 = lane + 32 < cnt ? vn[lane + 32] : 0.0f;
    float tmax = fmaxf(n0, n1);
    for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
    const float r_new = fmaxf(r_run, tmax);
    sm.vfac[buf][lane] = r_new > 0.0f ? n0 / r_new * kPScale : 0.0f;
    sm.vfac[buf][lane + 32] = r_new > 0.0f ? n1 / r_new * kPScale : 0.0f;
    if (lane == 0) {
      sm.ratio[buf] = r_run > 0.0f ? r_run / r_new : 1.0f;
      sm.r_final = r_new;
    }
    r_run = r_new;
  };
  // Tile i's keys (values) from its staging buffer into k (v)[i % 2], with their factors.
  auto dequant_keys = [&](std::uint32_t i) {
    const Stage<D, false, kBN> s(sm.stage[i & 1u]);
    dequant_tile(sm.k[i & 1u], s.kc, staged_row0(s.kc, p.layer + p.key_codes, slot0 + i * kBN, p.kc_bytes) - s.kc,
                 p.kc_bytes, p.key_code_bits, sm.pair_k);
    if (warp == 1) key_factors(s, i & 1u, i);
  };
  auto dequant_values = [&](std::uint32_t i) {
    const Stage<D, false, kBN> s(sm.stage[i & 1u]);
    dequant_tile(sm.v[i & 1u], s.vc, staged_row0(s.vc, p.layer + p.value_codes, slot0 + i * kBN, p.vc_bytes) - s.vc,
                 p.vc_bytes, p.value_bits, sm.pair_v);
    if (warp == 0) value_factors(s, i & 1u, i);
  };

  if (tid == 0) sm.r_final = 0.0f;
  cp_async_wait1();
  __syncthreads();  // tile 0's bytes, the tables and the queries are in; the query scratch (k[0]) is free
  if (ntiles > 0) {
    dequant_keys(0);
    dequant_values(0);
  }

  // This thread's rows (the accumulators' rows 16 w + g and + 8 of its warpgroup) are block rows ra and rb.
  const unsigned ra = warp * 16u + g, rb = ra + 8u;
  const std::uint32_t lim_a = sm.row_limit[ra], lim_b = sm.row_limit[rb];
  // Row factors (log2 units per unit of S · n_k); positive (the sign is in the queries) and not below the
  // smallest normal float, so that a masked −∞ times the factor stays −∞.
  const float fc_a = fmaxf(fabsf(sm.rowfac_c[ra]), 1.17549435e-38f), fc_b = fmaxf(fabsf(sm.rowfac_c[rb]), 1.17549435e-38f);

  const GmmaDesc desc_qhi = sw128_descriptor(sm.qhi + 64 * x * 128, 16, 1024);
  const GmmaDesc desc_qlo = sw128_descriptor(sm.qlo + 64 * x * 128, 16, 1024);
  const GmmaDesc desc_k = sw128_descriptor(sm.k[0], 16, 1024);    // k[1] is at(kTileBytes)
  const GmmaDesc desc_v = sw128_descriptor(sm.v[0], 8192, 1024);  // MN-major; v[1] is at(kTileBytes)
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  float o[2][32];  // dims 64 nb + 8 i + 2 tig (+1), the m64n64 accumulator layout
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[nb][i] = 0.0f;
  }

  for (std::uint32_t it = 0; it < ntiles; ++it) {
    const unsigned cur = it & 1u;
    const std::uint32_t t0 = it * kBN;
    cp_async_wait0();  // this thread's copies of tile it + 1
    fence_shared_for_async();
    __syncthreads();  // tile it is fp16 in k / v[cur]; tile it + 1's bytes are in; every warpgroup's P'·V of tile
                      // it - 1 is done, so k / v[cur ^ 1] and stage[cur] are free

    // ---- S = Q_hi Kᵀ + Q_lo Kᵀ (64 rows x 64 tokens per warpgroup), k-step s = dims 16 s ...
    float s[32];
    wgmma_fence();
#pragma unroll
    for (unsigned ks = 0; ks < D / 16; ++ks) {
      const unsigned qcol = (ks / 4) * kQBlock + (ks % 4) * 32, kcol = (ks / 4) * kTileBlock + (ks % 4) * 32;
      wgmma_m64n64k16_ss<0>(s, desc_qhi.at(qcol), desc_k.at(cur * kTileBytes + kcol), ks > 0);
    }
#pragma unroll
    for (unsigned ks = 0; ks < D / 16; ++ks) {
      const unsigned qcol = (ks / 4) * kQBlock + (ks % 4) * 32, kcol = (ks / 4) * kTileBlock + (ks % 4) * 32;
      wgmma_m64n64k16_ss<0>(s, desc_qlo.at(qcol), desc_k.at(cur * kTileBytes + kcol), true);
    }
    wgmma_commit();
    // While S runs: tile it + 2's bytes go into the staging buffer tile it used; tile it + 1's keys are widened.
    if (it + 2 < ntiles) copy_tile(p, sm.stage[cur], slot0 + t0 + 2 * kBN, tile_tokens(it + 2));
    cp_async_commit();
    if (it + 1 < ntiles) dequant_keys(it + 1);
    wgmma_wait<0>();

    // ---- masked online softmax (log2 units); columns 8 i + 2 tig (+1) are tile tokens. t = S · n_k here and
    // the row's score is fc · t: the row factor enters through the maximum and the exponent's FFMA.
#pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
      const float2 kn = *reinterpret_cast<const float2*>(&sm.kscale[cur][8 * i + 2 * tig]);
      s[4 * i] *= kn.x;
      s[4 * i + 1] *= kn.y;
      s[4 * i + 2] *= kn.x;
      s[4 * i + 3] *= kn.y;
    }
    // Only tiles that reach past a row's last visible key need the mask (the causal diagonal, the chunk's end).
    if (t0 + kBN > min(lim_a, lim_b)) {
#pragma unroll
      for (unsigned i = 0; i < 8; ++i) {
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
          const unsigned tt = 8 * i + 2 * tig + (e & 1u);
          if (t0 + tt >= (e >= 2 ? lim_b : lim_a)) s[4 * i + e] = -INFINITY;
        }
      }
    }
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
      mx_a = fmaxf(mx_a, fmaxf(s[4 * i], s[4 * i + 1]));
      mx_b = fmaxf(mx_b, fmaxf(s[4 * i + 2], s[4 * i + 3]));
    }
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o2));
    }
    const float mn_a = fmaxf(m_a, fc_a * mx_a), mn_b = fmaxf(m_b, fc_b * mx_b);
    const float use_a = mn_a == -INFINITY ? 0.0f : mn_a, use_b = mn_b == -INFINITY ? 0.0f : mn_b;
    const float al_a = exp2f(m_a - use_a), al_b = exp2f(m_b - use_b);
    m_a = mn_a;
    m_b = mn_b;
    const float ratio = sm.ratio[cur];
    const float ro_a = al_a * ratio, ro_b = al_b * ratio;
    // Once the running maxima settle (most tiles of a long sequence) no row of the warp needs a rescale.
    if (__any_sync(0xffffffffu, ro_a != 1.0f || ro_b != 1.0f)) scale_accumulator_rows(o, ro_a, ro_b);
    // P' = p · n_v / R · 2^15 in place of S; l sums the unscaled p.
    const float off_a = -use_a, off_b = -use_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
      const float2 vf = *reinterpret_cast<const float2*>(&sm.vfac[cur][8 * i + 2 * tig]);
      const float p0 = fast_exp2(fmaf(s[4 * i], fc_a, off_a)), p1 = fast_exp2(fmaf(s[4 * i + 1], fc_a, off_a));
      const float p2 = fast_exp2(fmaf(s[4 * i + 2], fc_b, off_b)), p3 = fast_exp2(fmaf(s[4 * i + 3], fc_b, off_b));
      sum_a += p0 + p1;
      sum_b += p2 + p3;
      s[4 * i] = p0 * vf.x;
      s[4 * i + 1] = p1 * vf.y;
      s[4 * i + 2] = p2 * vf.x;
      s[4 * i + 3] = p3 * vf.y;
    }
    l_a = l_a * al_a + sum_a;
    l_b = l_b * al_b + sum_b;
    std::uint32_t ph[4][4], pl[4][4];
#pragma unroll
    for (unsigned ks = 0; ks < kBN / 16; ++ks) p_fragment<SPLITP>(s, ks, ph[ks], pl[ks]);

    // ---- O += P'·V: V MN-major (rows = tokens), k-step = tokens 16 ks ..., n-block nb = dims 64 nb ...
    wgmma_fence();
#pragma unroll
    for (unsigned ks = 0; ks < kBN / 16; ++ks) {
#pragma unroll
      for (unsigned nb = 0; nb < 2; ++nb) {
        const GmmaDesc vd = desc_v.at(cur * kTileBytes + nb * kTileBlock + ks * 16 * 128);
        wgmma_m64n64k16_rs<1>(o[nb], ph[ks], vd, true);
        if constexpr (SPLITP) wgmma_m64n64k16_rs<1>(o[nb], pl[ks], vd, true);
      }
    }
    wgmma_commit();
    // While P'·V runs: tile it + 1's values are widened.
    if (it + 1 < ntiles) dequant_values(it + 1);
    wgmma_wait<0>();
  }

  // ---- epilogue: rows to shared memory (over the queries), then R⁻¹, exact window, sink, output
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, o2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, o2);
  }
  __syncthreads();  // every warpgroup's MMAs are done with the queries that obuf overwrites; r_final is final
  float* obuf = reinterpret_cast<float*>(sm.qhi);
  {
    const float fr = sm.r_final / (kPScale * t.value_lut_scale);  // undo R, 2^15 and the value centroids' α
#pragma unroll
    for (unsigned nb = 0; nb < 2; ++nb) {
#pragma unroll
      for (unsigned i = 0; i < 8; ++i) {
        const unsigned col = 64 * nb + 8 * i + 2 * tig;
        *reinterpret_cast<float2*>(obuf + ra * D + col) = make_float2(o[nb][4 * i] * fr, o[nb][4 * i + 1] * fr);
        *reinterpret_cast<float2*>(obuf + rb * D + col) = make_float2(o[nb][4 * i + 2] * fr, o[nb][4 * i + 3] * fr);
      }
    }
    if (tig == 0) {
      sm.row_m[ra] = m_a;
      sm.row_l[ra] = l_a;
      sm.row_m[rb] = m_b;
      sm.row_l[rb] = l_b;
    }
  }
  __syncthreads();
  finish_rows<D, kWarps, kRows>(p, t, blk, obuf, sm.row_m, sm.row_l);
}

}  // namespace

bool prefill_wgmma_supported(std::uint32_t head_dim, bool qjl) { return head_dim == D && !qjl; }
std::uint32_t prefill_wgmma_block_rows() { return kRows; }

cudaError_t prepare_prefill_wgmma(bool split_p) {
  return cudaFuncSetAttribute(split_p ? prefill_wgmma_kernel<true> : prefill_wgmma_kernel<false>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
}

int prefill_wgmma_blocks_per_sm(bool split_p) {
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &blocks, split_p ? prefill_wgmma_kernel<true> : prefill_wgmma_kernel<false>, kThreads, kSmemBytes) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return blocks;
}

cudaError_t launch_prefill_wgmma(const PrefillParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.tiles == 0) return cudaSuccess;
  const dim3 grid(p.tiles, p.kv_heads * p.head_groups, p.batch);
  (p.split_p != 0 ? prefill_wgmma_kernel<true> : prefill_wgmma_kernel<false>)<<<grid, kThreads, kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::tq::detail
