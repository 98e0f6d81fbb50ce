// Chunked-prefill attention over the packed TurboQuant layer layout, flash-attention-2 style: one block per
// (query tile, KV head, batch entry). The tile's rows are query tokens × the KV head's GQA group (row r =
// token r / heads_per_block, head r % heads_per_block), rotated once into the codec's space and kept in
// shared memory as fp16 hi + lo parts in mma fragment order. 32-token tiles of packed keys / values are
// copied with cp.async (double-buffered), dequantised ONCE per block into fp16 shared-memory tiles (centroids
// ·α; QJL signs as ±1), then S = Q·Kᵀ and O += P·V run on tensor cores (mma.sync m16n8k16, ldmatrix) with an
// fp32 online softmax. Per-token key norms (and ρ for QJL) scale the fp32 scores; value norms enter P relative
// to the block's running maximum. The epilogue applies R⁻¹ once per row and adds the exact-window rows in
// fp32 and the sink by log-sum-exp. Host side: tq_prefill.cpp; docs/cuda-prefill.md describes it.
#include <cuda_fp16.h>

#include <cstdint>

#include "prefill_device.cuh"
#include "prefill_params.hpp"

namespace kvcompact::cuda::tq::detail {

namespace {

using namespace prefill;
constexpr unsigned kBN = 32;  // key / value tokens per pipeline tile

// Warps per block (16 query rows each) of the head_dim-128 instances; overridable at compile time for tuning.
#ifndef KVC_PREFILL_WARPS_128
#define KVC_PREFILL_WARPS_128 8
#endif
#ifndef KVC_PREFILL_WARPS_128_QJL
#define KVC_PREFILL_WARPS_128_QJL 4
#endif

template <int D, bool QJL>
struct Cfg {
  // Rows of a block: 16 per warp. Fewer warps where the per-block shared memory would otherwise allow only one
  // resident block (head_dim 128 with QJL); head_dim 256 runs one 4-warp block per multiprocessor.
  static constexpr unsigned kWarps =
      D == 256 ? 4u : (D == 128 ? (QJL ? KVC_PREFILL_WARPS_128_QJL : KVC_PREFILL_WARPS_128) : 8u);
  static constexpr unsigned kThreads = kWarps * 32u;
  static constexpr unsigned kRows = kWarps * 16u;
  static constexpr unsigned kNT = kBN / 8;    // n-tiles of S per tile
  static constexpr unsigned kKS = D / 16;     // k-steps of S
  static constexpr unsigned kRowBytes = 2u * D + 16u;  // fp16 tile row: +16 bytes keeps ldmatrix conflict-free
  static constexpr unsigned qsplit = kRows * D * 2u;    // one fp16 query array (hi or lo)
  // Query fragments: hi + lo of q_rot (and of q_jl for QJL keys); reused by the epilogue rows.
  static constexpr unsigned q_area = cmax(qsplit * 2u * (QJL ? 2u : 1u), kRows * D * 4u);
  static constexpr unsigned tile = kBN * kRowBytes;
  static constexpr unsigned tiles = tile * (QJL ? 3u : 2u);  // key codes, (signs), values
  static constexpr unsigned stage = StageLayout<D, QJL, kBN>::bytes;  // one staged tile of packed bytes
  // kscale, sscale, vfac [kBN]; rowfac_c, rowfac_s, row_m, row_l, row_limit [kRows]; two 32-entry fp16 lookup
  // tables, two 64-entry pair tables (half2 of two coordinates) and the 16-entry sign table (uint2); misc
  // (running value-norm maximum R, rescale ratio).
  static constexpr unsigned small = 4u * (3u * kBN + 5u * kRows) + 2u * 64u + 2u * 256u + 128u + 16u;
  static constexpr unsigned total = q_area + tiles + 2u * stage + small;
  // Two resident blocks when their shared memory fits (228 KB per multiprocessor, 1 KB reserved per block);
  // the register limit of __launch_bounds__ follows.
  static constexpr unsigned kMinBlocks = (kWarps <= 8 && 2u * (total + 1024u) <= 228u * 1024u) ? 2u : 1u;
  static_assert(total <= 227u * 1024u, "shared memory of one block");
};

__device__ inline void mma16816(float (&d)[4], const uint4& a, std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

__device__ inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Index of the 32-bit word holding element (row r, column j, j even) of a [rows, D] fp16 matrix stored in the
// A-fragment order of mma.m16n8k16: [warp][k-step][lane][4 registers].
template <int D>
__device__ inline unsigned frag_word(unsigned r, unsigned j) {
  const unsigned w = r >> 4, rr = r & 15u, kk = j >> 4, jj = j & 15u;
  const unsigned lane = (rr & 7u) * 4u + ((jj & 7u) >> 1);
  const unsigned reg = (rr >> 3) + 2u * (jj >> 3);
  return ((w * (D / 16) + kk) * 32u + lane) * 4u + reg;
}

template <int D, bool QJL, bool SPLITP>
__global__ void __launch_bounds__(Cfg<D, QJL>::kThreads, Cfg<D, QJL>::kMinBlocks) prefill_kernel(PrefillParams p) {
  using C = Cfg<D, QJL>;
  constexpr unsigned kThreads = C::kThreads, kRows = C::kRows, kNT = C::kNT, kKS = C::kKS;
  constexpr unsigned RB = C::kRowBytes;
  extern __shared__ __align__(16) std::uint8_t smem[];
  std::uint32_t* qhi = reinterpret_cast<std::uint32_t*>(smem);
  std::uint32_t* qlo = qhi + C::qsplit / 4u;
  std::uint32_t* jhi = qlo + C::qsplit / 4u;
  std::uint32_t* jlo = jhi + C::qsplit / 4u;
  float* obuf = reinterpret_cast<float*>(smem);  // epilogue rows [kRows][D], after the main loop
  std::uint8_t* kt = smem + C::q_area;
  std::uint8_t* kst = kt + C::tile;  // QJL only
  std::uint8_t* vt = kt + C::tile * (QJL ? 2u : 1u);
  std::uint8_t* stage0 = kt + C::tiles;
  float* kscale = reinterpret_cast<float*>(stage0 + 2u * C::stage);
  float* sscale = kscale + kBN;
  float* vfac = sscale + kBN;
  float* rowfac_c = vfac + kBN;
  float* rowfac_s = rowfac_c + kRows;
  float* row_m = rowfac_s + kRows;
  float* row_l = row_m + kRows;
  std::uint32_t* row_limit = reinterpret_cast<std::uint32_t*>(row_l + kRows);
  unsigned short* lut_k = reinterpret_cast<unsigned short*>(row_limit + kRows);
  unsigned short* lut_v = lut_k + 32;
  std::uint32_t* pair_k = reinterpret_cast<std::uint32_t*>(lut_v + 32);
  std::uint32_t* pair_v = pair_k + 64;
  uint2* lut_s = reinterpret_cast<uint2*>(pair_v + 64);
  float* misc = reinterpret_cast<float*>(lut_s + 16);

  const Tables& t = *p.tables;
  const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const unsigned g = lane >> 2, c = lane & 3u;

  BlockRange blk;
  if (!blk.init(p, kBN)) return;
  const std::uint32_t kend = blk.kend, ntiles = blk.ntiles;
  const std::uint64_t slot0 = blk.slot0;

  // First tile's bytes in flight while the queries are prepared.
  if (ntiles > 0) load_tile<D, QJL, kBN, kThreads>(p, stage0, slot0, min(kBN, kend));
  cp_async_commit();

  for (unsigned r = tid; r < kRows; r += kThreads) row_limit[r] = blk.row_limit(r, p);
  fill_luts(Luts{lut_k, lut_v, pair_k, pair_v, lut_s}, t, p, tid);
  if (tid == 0) {
    misc[0] = 0.0f;  // running maximum R of the value norms seen
    misc[1] = 1.0f;  // rescale R_old / R_new of the current tile
  }

  // Query rows, scattered into fragment order.
  prepare_queries<D, QJL, C::kWarps, kRows>(
      p, t, blk, rowfac_c, rowfac_s,
      [&](int part, unsigned r, unsigned j, std::uint32_t h, std::uint32_t l) {
        const unsigned wi = frag_word<D>(r, j);
        (part == 0 ? qhi : jhi)[wi] = h;
        (part == 0 ? qlo : jlo)[wi] = l;
      });
  __syncthreads();

  const unsigned ra = warp * 16u + g, rb = ra + 8u;
  const std::uint32_t lim_a = row_limit[ra], lim_b = row_limit[rb];
  const float fc_a = rowfac_c[ra], fc_b = rowfac_c[rb];
  float fs_a = 0.0f, fs_b = 0.0f;
  if constexpr (QJL) {
    fs_a = rowfac_s[ra];
    fs_b = rowfac_s[rb];
  }
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  float o[D / 8][4];
#pragma unroll
  for (unsigned i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  for (std::uint32_t it = 0; it < ntiles; ++it) {
    const std::uint32_t t0 = it * kBN;
    const std::uint32_t cnt = min(kBN, kend - t0);
    if (it + 1 < ntiles) {
      load_tile<D, QJL, kBN, kThreads>(p, stage0 + ((it + 1u) & 1u) * C::stage, slot0 + t0 + kBN, min(kBN, kend - t0 - kBN));
    }
    cp_async_commit();
    cp_async_wait1();
    __syncthreads();

    // ---- dequantise the tile once into fp16 shared-memory tiles ----
    {
      const Stage<D, QJL, kBN> s(stage0 + (it & 1u) * C::stage);
      const std::uint64_t first_slot = slot0 + t0;
      const std::uint32_t kc_shift = static_cast<std::uint32_t>(staged_row0(s.kc, p.layer + p.key_codes, first_slot, p.kc_bytes) - s.kc);
      const std::uint32_t vc_shift = static_cast<std::uint32_t>(staged_row0(s.vc, p.layer + p.value_codes, first_slot, p.vc_bytes) - s.vc);
      const std::uint8_t* ks = QJL ? staged_row0(s.ks, p.layer + p.key_signs, first_slot, p.ks_bytes) : nullptr;
      constexpr unsigned kGroups = kBN * (D / 8);
      for (unsigned gi = tid; gi < kGroups; gi += kThreads) {
        const unsigned tt = gi / (D / 8), gg = gi % (D / 8);
        *reinterpret_cast<uint4*>(kt + tt * RB + gg * 16u) = dequant_group(
            s.kc, kc_shift + tt * p.kc_bytes + gg * p.key_code_bits, p.key_code_bits, lut_k, pair_k);
        *reinterpret_cast<uint4*>(vt + tt * RB + gg * 16u) = dequant_group(
            s.vc, vc_shift + tt * p.vc_bytes + gg * p.value_bits, p.value_bits, lut_v, pair_v);
        if constexpr (QJL) {
          const std::uint32_t byte = ks[tt * p.ks_bytes + gg];
          const uint2 lo = lut_s[byte & 15u], hi = lut_s[byte >> 4];
          *reinterpret_cast<uint4*>(kst + tt * RB + gg * 16u) = make_uint4(lo.x, lo.y, hi.x, hi.y);
        }
      }
      if (warp == 0) {
        // Per-token factors (one token per lane): key norm, key norm · ρ, value norm relative to R.
        const bool valid = lane < cnt;
        const float* kn = reinterpret_cast<const float*>(staged_row0(s.kn, p.layer + p.key_norms, first_slot, 4u));
        const float* vn = reinterpret_cast<const float*>(staged_row0(s.vn, p.layer + p.value_norms, first_slot, 4u));
        const float nk = valid ? kn[lane] : 0.0f;
        const float nv = valid ? vn[lane] : 0.0f;
        kscale[lane] = nk;
        if constexpr (QJL) {
          const unsigned short* kr =
              reinterpret_cast<const unsigned short*>(staged_row0(s.kr, p.layer + p.key_rho, first_slot, 2u));
          sscale[lane] = valid ? nk * __half2float(__ushort_as_half(kr[lane])) : 0.0f;
        }
        float tmax = nv;
        for (int o2 = 16; o2 > 0; o2 >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o2));
        const float r_old = misc[0];
        const float r_new = fmaxf(r_old, tmax);
        vfac[lane] = r_new > 0.0f ? nv / r_new * kPScale : 0.0f;
        __syncwarp();
        if (lane == 0) {
          misc[0] = r_new;
          misc[1] = r_old > 0.0f ? r_old / r_new : 1.0f;
        }
      }
    }
    __syncthreads();

    // ---- S = Q·Kᵀ on tensor cores (query hi + lo), then the masked online softmax ----
    float sc[kNT][4], ss[kNT][4];
#pragma unroll
    for (unsigned n = 0; n < kNT; ++n) {
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
      ss[n][0] = ss[n][1] = ss[n][2] = ss[n][3] = 0.0f;
    }
#pragma unroll
    for (unsigned kk = 0; kk < kKS; ++kk) {
      const uint4 ah = reinterpret_cast<const uint4*>(qhi)[(warp * kKS + kk) * 32u + lane];
      const uint4 al = reinterpret_cast<const uint4*>(qlo)[(warp * kKS + kk) * 32u + lane];
      std::uint32_t b[kNT / 2][4];
#pragma unroll
      for (unsigned np = 0; np < kNT / 2; ++np) {
        ldmatrix_x4(b[np], kt + (np * 16u + (lane >> 4) * 8u + (lane & 7u)) * RB + (kk * 16u + ((lane >> 3) & 1u) * 8u) * 2u);
      }
#pragma unroll
      for (unsigned np = 0; np < kNT / 2; ++np) {
        mma16816(sc[2 * np], ah, b[np][0], b[np][1]);
        mma16816(sc[2 * np + 1], ah, b[np][2], b[np][3]);
      }
#pragma unroll
      for (unsigned np = 0; np < kNT / 2; ++np) {
        mma16816(sc[2 * np], al, b[np][0], b[np][1]);
        mma16816(sc[2 * np + 1], al, b[np][2], b[np][3]);
      }
      if constexpr (QJL) {
        const uint4 jh = reinterpret_cast<const uint4*>(jhi)[(warp * kKS + kk) * 32u + lane];
        const uint4 jl = reinterpret_cast<const uint4*>(jlo)[(warp * kKS + kk) * 32u + lane];
#pragma unroll
        for (unsigned np = 0; np < kNT / 2; ++np) {
          ldmatrix_x4(b[np], kst + (np * 16u + (lane >> 4) * 8u + (lane & 7u)) * RB + (kk * 16u + ((lane >> 3) & 1u) * 8u) * 2u);
        }
#pragma unroll
        for (unsigned np = 0; np < kNT / 2; ++np) {
          mma16816(ss[2 * np], jh, b[np][0], b[np][1]);
          mma16816(ss[2 * np + 1], jh, b[np][2], b[np][3]);
        }
#pragma unroll
        for (unsigned np = 0; np < kNT / 2; ++np) {
          mma16816(ss[2 * np], jl, b[np][0], b[np][1]);
          mma16816(ss[2 * np + 1], jl, b[np][2], b[np][3]);
        }
      }
    }

    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (unsigned n = 0; n < kNT; ++n) {
#pragma unroll
      for (unsigned e = 0; e < 4; ++e) {
        const unsigned tt = n * 8u + 2u * c + (e & 1u);
        const bool row_b = e >= 2;
        float s = sc[n][e] * kscale[tt] * (row_b ? fc_b : fc_a);
        if constexpr (QJL) s += ss[n][e] * sscale[tt] * (row_b ? fs_b : fs_a);
        s = t0 + tt < (row_b ? lim_b : lim_a) ? s : -INFINITY;
        sc[n][e] = s;
        if (row_b) {
          mx_b = fmaxf(mx_b, s);
        } else {
          mx_a = fmaxf(mx_a, s);
        }
      }
    }
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o2));
    }
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    const float use_a = mn_a == -INFINITY ? 0.0f : mn_a, use_b = mn_b == -INFINITY ? 0.0f : mn_b;
    const float ratio = misc[1];
    const float al_a = exp2f(m_a - use_a), al_b = exp2f(m_b - use_b);
    m_a = mn_a;
    m_b = mn_b;
    l_a *= al_a;
    l_b *= al_b;
    const float ro_a = al_a * ratio, ro_b = al_b * ratio;
    // Once the running maxima settle (most tiles of a long sequence) no row of the warp needs a rescale.
    if (__any_sync(0xffffffffu, ro_a != 1.0f || ro_b != 1.0f)) {
#pragma unroll
      for (unsigned i = 0; i < D / 8; ++i) {
        o[i][0] *= ro_a;
        o[i][1] *= ro_a;
        o[i][2] *= ro_b;
        o[i][3] *= ro_b;
      }
    }
    // P' = p · n_v / R · 2^15 as fp16 A fragments (hi, and lo when SPLITP); l sums the unscaled p.
    std::uint32_t ph[kNT][2], pl[kNT][2];
#pragma unroll
    for (unsigned n = 0; n < kNT; ++n) {
      const unsigned tt = n * 8u + 2u * c;
      const float v0 = vfac[tt], v1 = vfac[tt + 1];
      const float p0 = fast_exp2(sc[n][0] - use_a), p1 = fast_exp2(sc[n][1] - use_a);
      const float p2 = fast_exp2(sc[n][2] - use_b), p3 = fast_exp2(sc[n][3] - use_b);
      l_a += p0 + p1;
      l_b += p2 + p3;
      if constexpr (SPLITP) {
        split_pair(p0 * v0, p1 * v1, ph[n][0], pl[n][0]);
        split_pair(p2 * v0, p3 * v1, ph[n][1], pl[n][1]);
      } else {
        ph[n][0] = half2_bits(__floats2half2_rn(p0 * v0, p1 * v1));
        ph[n][1] = half2_bits(__floats2half2_rn(p2 * v0, p3 * v1));
        pl[n][0] = pl[n][1] = 0u;
      }
    }

    // ---- O += P'·V on tensor cores (values in rotated space) ----
#pragma unroll
    for (unsigned j = 0; j < kBN / 16; ++j) {
      const uint4 ahp = make_uint4(ph[2 * j][0], ph[2 * j][1], ph[2 * j + 1][0], ph[2 * j + 1][1]);
      const uint4 alp = make_uint4(pl[2 * j][0], pl[2 * j][1], pl[2 * j + 1][0], pl[2 * j + 1][1]);
#pragma unroll
      for (unsigned dn = 0; dn < D / 16; ++dn) {
        std::uint32_t b[4];
        ldmatrix_x4_trans(b, vt + (j * 16u + ((lane >> 3) & 1u) * 8u + (lane & 7u)) * RB + (dn * 16u + (lane >> 4) * 8u) * 2u);
        mma16816(o[2 * dn], ahp, b[0], b[1]);
        mma16816(o[2 * dn + 1], ahp, b[2], b[3]);
        if constexpr (SPLITP) {
          mma16816(o[2 * dn], alp, b[0], b[1]);
          mma16816(o[2 * dn + 1], alp, b[2], b[3]);
        }
      }
    }
  }

  // ---- epilogue: rows to shared memory, R⁻¹, exact window and sink, output ----
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, o2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, o2);
  }
  __syncthreads();  // every warp is done with the query fragments that obuf overwrites
  {
    const float fr = misc[0] / (kPScale * t.value_lut_scale);  // undo R, 2^15 and the value centroids' α
#pragma unroll
    for (unsigned i = 0; i < D / 8; ++i) {
      const unsigned col = i * 8u + 2u * c;
      *reinterpret_cast<float2*>(obuf + ra * D + col) = make_float2(o[i][0] * fr, o[i][1] * fr);
      *reinterpret_cast<float2*>(obuf + rb * D + col) = make_float2(o[i][2] * fr, o[i][3] * fr);
    }
    if (c == 0) {
      row_m[ra] = m_a;
      row_l[ra] = l_a;
      row_m[rb] = m_b;
      row_l[rb] = l_b;
    }
  }
  __syncthreads();

  finish_rows<D, C::kWarps, kRows>(p, t, blk, obuf, row_m, row_l);
}

using KernelFn = void (*)(PrefillParams);

KernelFn pick(std::uint32_t d, bool qjl, bool split_p, std::uint32_t* smem, std::uint32_t* threads,
              std::uint32_t* rows) {
#define KVC_PREFILL_CASE(DV, QV)                                                        \
  if (d == DV && qjl == QV) {                                                           \
    *smem = Cfg<DV, QV>::total;                                                         \
    *threads = Cfg<DV, QV>::kThreads;                                                   \
    *rows = Cfg<DV, QV>::kRows;                                                         \
    return split_p ? prefill_kernel<DV, QV, true> : prefill_kernel<DV, QV, false>;      \
  }
  KVC_PREFILL_CASE(64, false) KVC_PREFILL_CASE(64, true)
  KVC_PREFILL_CASE(128, false) KVC_PREFILL_CASE(128, true)
  KVC_PREFILL_CASE(256, false) KVC_PREFILL_CASE(256, true)
#undef KVC_PREFILL_CASE
  return nullptr;
}

}  // namespace

std::uint32_t prefill_block_rows(std::uint32_t head_dim, bool qjl) {
  std::uint32_t smem = 0, threads = 0, rows = 0;
  return pick(head_dim, qjl, true, &smem, &threads, &rows) != nullptr ? rows : 0u;
}

std::uint32_t prefill_smem_bytes(std::uint32_t head_dim, bool qjl) {
  std::uint32_t smem = 0, threads = 0, rows = 0;
  return pick(head_dim, qjl, true, &smem, &threads, &rows) != nullptr ? smem : 0u;
}

cudaError_t prepare_prefill(std::uint32_t head_dim, bool qjl, bool split_p) {
  std::uint32_t smem = 0, threads = 0, rows = 0;
  const KernelFn fn = pick(head_dim, qjl, split_p, &smem, &threads, &rows);
  if (fn == nullptr) return cudaErrorInvalidValue;
  return cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
}

int prefill_blocks_per_sm(std::uint32_t head_dim, bool qjl, bool split_p) {
  std::uint32_t smem = 0, threads = 0, rows = 0;
  const KernelFn fn = pick(head_dim, qjl, split_p, &smem, &threads, &rows);
  int blocks = 0;
  if (fn == nullptr ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, static_cast<int>(threads), smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return blocks;
}

cudaError_t launch_prefill(const PrefillParams& p, cudaStream_t stream) {
  if (p.wgmma != 0) return launch_prefill_wgmma(p, stream);
  std::uint32_t smem = 0, threads = 0, rows = 0;
  const KernelFn fn = pick(p.head_dim, p.qjl != 0, p.split_p != 0, &smem, &threads, &rows);
  if (fn == nullptr) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.tiles == 0) return cudaSuccess;
  const dim3 grid(p.tiles, p.kv_heads * p.head_groups, p.batch);
  fn<<<grid, threads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::tq::detail
