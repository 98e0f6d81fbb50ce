// Device pieces shared by the two chunked-prefill attention kernels (tq_prefill.cu: mma.sync, every head_dim and
// mode; tq_prefill_wgmma.cu: warpgroup MMAs for head_dim 128 with MSE keys): the block's coordinates, staging of
// packed tiles with cp.async, dequantisation of 8-coordinate code groups through fp16 lookup tables, the query
// preparation (rotation, scaling, fp16 hi / lo split) and the epilogue (R⁻¹, exact window, sink, output).
// docs/cuda-prefill.md describes both kernels.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "exact_window.cuh"
#include "prefill_params.hpp"
#include "region_span.hpp"

namespace kvcompact::cuda::tq::detail::prefill {

constexpr float kLog2e = 1.4426950408889634f;
// Queries are scaled to max |x| = 2^10 before the fp16 hi / lo split (so lo parts stay normal numbers);
// P' = p · n_v / R · 2^15 ∈ [0, 2^15] (fp16 max is 65504). Both scales are divided out in fp32.
constexpr float kQScale = 1024.0f;
constexpr float kPScale = 32768.0f;

constexpr unsigned cmax(unsigned a, unsigned b) { return a > b ? a : b; }

// Staging of one tile's packed bytes (kTokens tokens), sized for the widest mode (5-bit key codes, 4-bit
// values); each region keeps room for the 16-byte chunk alignment at both ends.
template <int D, bool QJL, unsigned kTokens>
struct StageLayout {
  static constexpr unsigned kc = round16(kTokens * (D * 5u / 8u) + 32u);
  static constexpr unsigned ks = round16(kTokens * (D / 8u) + 32u);
  static constexpr unsigned kn = round16(kTokens * 4u + 32u);
  static constexpr unsigned kr = round16(kTokens * 2u + 32u);
  static constexpr unsigned vc = round16(kTokens * (D / 2u) + 32u);
  static constexpr unsigned vn = round16(kTokens * 4u + 32u);
  static constexpr unsigned bytes = kc + ks + kn + kr + vc + vn;
};

// Region pointers of one staged tile.
template <int D, bool QJL, unsigned kTokens>
struct Stage {
  std::uint8_t *kc, *ks, *kn, *kr, *vc, *vn;
  __device__ explicit Stage(std::uint8_t* base) {
    using L = StageLayout<D, QJL, kTokens>;
    kc = base;
    ks = kc + L::kc;
    kn = ks + L::ks;
    kr = kn + L::kn;
    vc = kr + L::kr;
    vn = vc + L::vc;
  }
};

__device__ inline void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ inline void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ inline void cp_async_wait0() { asm volatile("cp.async.wait_group 0;\n" ::); }

// 2^x for x ≤ 0 (or −∞ → 0) with one ex2.approx (relative error ≈ 2⁻²²), the softmax weights' hot path.
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ inline std::uint32_t half2_bits(__half2 h) { return *reinterpret_cast<const std::uint32_t*>(&h); }

// Two floats as e4m3 codes (round to nearest, saturating: folded keys' cross terms), `lo` in the low byte.
__device__ inline std::uint16_t e4m3x2_of(float lo, float hi) {
  std::uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// fp16 hi part of (a, b) and the fp16 rounding of the remainders.
__device__ inline void split_pair(float a, float b, std::uint32_t& hi, std::uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  hi = half2_bits(h);
  lo = half2_bits(__floats2half2_rn(a - hf.x, b - hf.y));
}

// One region's tokens [t0, t0 + cnt) as 16-byte cp.async chunks covering them (up to 15 bytes past the last
// record: inside the next region or the layer buffer's documented slack).
template <unsigned kThreads>
__device__ inline void stage_region(std::uint8_t* dst, const std::uint8_t* region, std::uint64_t first,
                                    std::uint32_t cnt, std::uint32_t bpt) {
  if (bpt == 0) return;
  const std::uintptr_t start = reinterpret_cast<std::uintptr_t>(region) + first * bpt;
  const std::uintptr_t aligned = start & ~static_cast<std::uintptr_t>(15);
  const std::uint32_t bytes = static_cast<std::uint32_t>(start - aligned) + cnt * bpt;
  const std::uint32_t chunks = (bytes + 15u) / 16u;
  for (std::uint32_t i = threadIdx.x; i < chunks; i += kThreads) {
    cp_async16(dst + 16u * i, reinterpret_cast<const void*>(aligned + 16u * i));
  }
}
__device__ inline const std::uint8_t* staged_row0(const std::uint8_t* dst, const std::uint8_t* region,
                                                  std::uint64_t first, std::uint32_t bpt) {
  const std::uintptr_t start = reinterpret_cast<std::uintptr_t>(region) + first * bpt;
  return dst + (start & 15u);
}

// Copies the packed bytes of tokens [first, first + cnt) (slots of the layer) into a staging buffer.
template <int D, bool QJL, unsigned kTokens, unsigned kThreads>
__device__ inline void load_tile(const PrefillParams& p, std::uint8_t* base, std::uint64_t first, std::uint32_t cnt) {
  const Stage<D, QJL, kTokens> s(base);
  stage_region<kThreads>(s.kc, p.layer + p.key_codes, first, cnt, p.kc_bytes);
  if constexpr (QJL) {
    stage_region<kThreads>(s.ks, p.layer + p.key_signs, first, cnt, p.ks_bytes);
    stage_region<kThreads>(s.kr, p.layer + p.key_rho, first, cnt, 2u);
  }
  stage_region<kThreads>(s.kn, p.layer + p.key_norms, first, cnt, 4u);
  stage_region<kThreads>(s.vc, p.layer + p.value_codes, first, cnt, p.vc_bytes);
  stage_region<kThreads>(s.vn, p.layer + p.value_norms, first, cnt, 4u);
}

// The 32 (five = false) or 40 bits at byte offset `off` of a 4-byte-aligned shared-memory region: two or three
// aligned word loads and funnel shifts instead of one load per byte (stage regions keep ≥ 16 bytes of room
// past their data, so the extra word is inside the region).
__device__ inline std::uint64_t load_bits(const std::uint8_t* base, std::uint32_t off, bool five) {
  const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(base + (off & ~3u));
  const std::uint32_t sh = 8u * (off & 3u);
  const std::uint32_t lo = __funnelshift_r(w[0], w[1], sh);
  const std::uint32_t hi = five ? __funnelshift_r(w[1], w[2], sh) : 0u;
  return static_cast<std::uint64_t>(lo) | (static_cast<std::uint64_t>(hi) << 32);
}

// Codes of 8 coordinates (a byte-aligned group of `bits` bytes at byte offset `off`) → 8 fp16 centroids. Code
// widths ≤ 3 look a pair of coordinates up at once (≤ 64-entry half2 table), 4 and 5 bits single coordinates.
__device__ inline uint4 dequant_group(const std::uint8_t* base, std::uint32_t off, std::uint32_t bits,
                                      const unsigned short* lut, const std::uint32_t* lut_pair) {
  const std::uint64_t w = load_bits(base, off, bits == 5);
  std::uint32_t out[4];
  if (bits <= 3) {
    const std::uint32_t pmask = (1u << (2u * bits)) - 1u;
#pragma unroll
    for (unsigned k = 0; k < 4; ++k) out[k] = lut_pair[static_cast<std::uint32_t>(w >> (2u * k * bits)) & pmask];
  } else {
    const std::uint32_t mask = (1u << bits) - 1u;
#pragma unroll
    for (unsigned k = 0; k < 4; ++k) {
      const std::uint32_t i0 = static_cast<std::uint32_t>(w >> ((2u * k) * bits)) & mask;
      const std::uint32_t i1 = static_cast<std::uint32_t>(w >> ((2u * k + 1u) * bits)) & mask;
      out[k] = static_cast<std::uint32_t>(lut[i0]) | (static_cast<std::uint32_t>(lut[i1]) << 16);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// fp16 ±1 of a sign bit (bit 1 ⇔ +1 = 0x3C00, bit 0 ⇔ −1 = 0xBC00).
__device__ inline std::uint32_t sign_half(std::uint32_t bit) { return 0xBC00u ^ (bit << 15); }

// The fp16 lookup tables of a block: α·centroid per code (keys, values), half2 pairs of two coordinates' codes
// (widths ≤ 3), and four fp16 ±1 per sign nibble. Filled by the block's first 64 threads.
struct Luts {
  unsigned short* key;       // [32]
  unsigned short* value;     // [32]
  std::uint32_t* key_pair;   // [64]
  std::uint32_t* value_pair; // [64]
  uint2* sign;               // [16]
};
__device__ inline void fill_luts(const Luts& l, const Tables& t, const PrefillParams& p, unsigned tid) {
  if (tid < 32) {
    l.key[tid] = __half_as_ushort(__float2half_rn(t.key_lut_scale * t.key_centroids[tid]));
    l.value[tid] = __half_as_ushort(__float2half_rn(t.value_lut_scale * t.value_centroids[tid]));
  }
  if (tid < 64) {
    // Pair tables (used for code widths ≤ 3 only): entry e = (code of the higher coordinate) · 2^bits + (code
    // of the lower one); the lower coordinate is the low half.
    const std::uint32_t cb = min(p.key_code_bits, 3u), vb = min(p.value_bits, 3u);
    const std::uint32_t ek0 = tid & ((1u << cb) - 1u), ek1 = (tid >> cb) & ((1u << cb) - 1u);
    const std::uint32_t ev0 = tid & ((1u << vb) - 1u), ev1 = (tid >> vb) & ((1u << vb) - 1u);
    l.key_pair[tid] = half2_bits(__floats2half2_rn(t.key_lut_scale * t.key_centroids[ek0],
                                                   t.key_lut_scale * t.key_centroids[ek1]));
    l.value_pair[tid] = half2_bits(__floats2half2_rn(t.value_lut_scale * t.value_centroids[ev0],
                                                     t.value_lut_scale * t.value_centroids[ev1]));
  }
  if (tid < 16) {
    l.sign[tid] = make_uint2(sign_half(tid & 1u) | (sign_half((tid >> 1) & 1u) << 16),
                             sign_half((tid >> 2) & 1u) | (sign_half((tid >> 3) & 1u) << 16));
  }
}

// Where sequence `seq`'s packed records end — the exact window's begin; keys below it are read from the codes —
// with its stored length clamped to the capacity in `length` (0 for a sequence index out of range, `bad`). Shared
// by the kernels' blocks (BlockRange) and the fold pass (prefill_fold.cu).
__device__ inline std::uint32_t packed_end(const PrefillParams& p, std::uint32_t seq, bool bad, std::uint32_t& length) {
  // Clamping to the capacity keeps every read inside the layer buffer even for lengths the caller got wrong;
  // the rows at positions not below it are NaN (finish_rows).
  length = bad ? 0u : min(p.lengths[seq], p.capacity);
  const std::uint32_t wb = p.window_begins != nullptr ? p.window_begins[seq] : 0u;
  return exact_begin(length, wb, p.window);
}

// The block's place: batch entry, sequence, KV head, its query tokens and the key range they see.
struct BlockRange {
  std::uint32_t entry, kvh, hg, seq, nrows, tok0, first, length, eb, ntok, kend, hb, ntiles;
  std::uint64_t row_base, slot0;
  bool bad_sequence;  // the device sequence index is out of range: no key is read, every row is NaN
  // Folded keys only: the block's rows need keys past the plan's folded tiles (a device length and chunk beyond
  // max_length): no key is read, every row is NaN (kStatusKeysBeyondPlan).
  bool keys_beyond_plan;
  // False when the block has nothing to do (no rows left for its tile). Broken device preconditions are flagged
  // in p.status (PrefillArgs).
  __device__ bool init(const PrefillParams& p, unsigned tile_tokens) {
    entry = blockIdx.z;
    kvh = blockIdx.y / p.head_groups;
    hg = blockIdx.y % p.head_groups;
    seq = p.seqs != nullptr ? p.seqs[entry] : entry;
    nrows = p.rows[entry];
    if (nrows > p.max_rows) {  // rows past max_rows are not computed (the grid has tiles for max_rows only)
      if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && p.status != nullptr) {
        atomicOr(p.status, kStatusRowsBeyondPlan);
      }
      nrows = p.max_rows;  // (the last tile would otherwise take some of them)
    }
    tok0 = blockIdx.x / p.key_splits * p.tokens_per_block;  // the blocks of a tile's key splits are adjacent
    if (tok0 >= nrows) return false;
    row_base = 0;
    for (std::uint32_t e = 0; e < entry; ++e) row_base += p.rows[e];
    first = p.first_positions[entry];
    bad_sequence = seq >= p.sequences;
    if (bad_sequence) seq = 0;  // (its keys are not read: length 0 below)
    eb = packed_end(p, seq, bad_sequence, length);
    ntok = min(p.tokens_per_block, nrows - tok0);
    const std::uint64_t last_end = static_cast<std::uint64_t>(first) + tok0 + ntok;  // exclusive, block's rows
    kend = static_cast<std::uint32_t>(min(last_end, static_cast<std::uint64_t>(eb)));
    hb = p.heads_per_block;
    slot0 = (static_cast<std::uint64_t>(seq) * p.kv_heads + kvh) * p.capacity;
    keys_beyond_plan = p.folded_keys != nullptr && kend > std::uint64_t{p.fold_tiles} * tile_tokens;
    if (keys_beyond_plan) kend = 0;
    ntiles = (kend + tile_tokens - 1u) / tile_tokens;
    return true;
  }
  // Block row r: query token r / hb of the tile, head r % hb of the group; false past the chunk or the group.
  __device__ bool row_valid(unsigned r, const PrefillParams& p) const {
    return r / hb < ntok && hg * hb + r % hb < p.group;
  }
  // Keys row r sees (positions below it): min(its position + 1, kend), 0 for an invalid row.
  __device__ std::uint32_t row_limit(unsigned r, const PrefillParams& p) const {
    const std::uint64_t pos1 = static_cast<std::uint64_t>(first) + tok0 + r / hb + 1u;
    return row_valid(r, p) ? static_cast<std::uint32_t>(min(pos1, static_cast<std::uint64_t>(kend))) : 0u;
  }
};

// Query preparation: one warp per row; q_rot = R_p q (and q_jl = R_j q_rot), scaled to max |x| = 2^10, split
// into fp16 hi + lo and handed to store(part, row, column j (even), hi, lo) as half2 pairs of columns j, j + 1.
// rowfac_c / rowfac_s get the per-row factors that undo the scaling (with 1/α of the key table, and √(π/2d) for
// the QJL part). A warp holds a row's coordinate lane + 32i in register i and rotates it there
// (rotate_forward_in_registers: the operations of warp_rotate_forward in its order, so the same bits); the rows of
// kBatch of its rows are loaded before any is rotated, so their global-memory latencies overlap.
// kSharedScale (QJL only): the QJL part is scaled by the code part's factor times α·√(π/2d) (the key table's α
// and the QJL scale) instead of its own, and rowfac_s is not written: the warpgroup kernel adds both parts'
// products into one accumulator, its sign tiles holding ±ρ (exact in fp16). |q_jl| ≤ ‖q_rot‖₂ ≤ √d · max |q_rot|
// and α·√(π/2d) < 1 for d ≥ 8 (α < 2), so the part stays below 2¹⁰·√d in fp16.
template <int D, bool QJL, unsigned kWarps, unsigned kRows, bool kSharedScale = false, typename Store>
__device__ inline void prepare_queries(const PrefillParams& p, const Tables& t, const BlockRange& b,
                                       float* rowfac_c, float* rowfac_s, Store&& store) {
  static_assert(QJL || !kSharedScale, "a shared scale needs the QJL part");
  constexpr int R = D / 32;
  constexpr unsigned kBatch = D <= 128 ? 4u : 2u;  // rows whose loads are in flight together (R registers each)
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  float main_sign[R], qjl_sign[R];
  load_lane_signs<D>(main_sign, t.main_signs, lane);
  if constexpr (QJL) load_lane_signs<D>(qjl_sign, t.qjl_signs, lane);
  const float rotation_scale = t.block_scale[0];
  const float key_lut_scale = t.key_lut_scale, qjl_scale = t.qjl_scale;
  for (unsigned r0 = warp; r0 < kRows; r0 += kBatch * kWarps) {
    float q[kBatch][R];
#pragma unroll
    for (unsigned k = 0; k < kBatch; ++k) {
      const unsigned r = r0 + k * kWarps;
      const bool valid = r < kRows && b.row_valid(r, p);
      const float* src = p.queries;
      if (valid) {
        const std::uint32_t qh = b.kvh * p.group + b.hg * b.hb + r % b.hb;
        src = p.queries + ((b.row_base + b.tok0 + r / b.hb) * p.q_heads + qh) * D;
      }
#pragma unroll
      for (int i = 0; i < R; ++i) q[k][i] = valid ? src[lane + 32 * i] : 0.0f;
    }
#pragma unroll
    for (unsigned k = 0; k < kBatch; ++k) {
      const unsigned r = r0 + k * kWarps;
      if (r >= kRows) break;
      const bool valid = b.row_valid(r, p);
      float v[R], vj[R];
#pragma unroll
      for (int i = 0; i < R; ++i) v[i] = q[k][i];
      if (valid) rotate_forward_in_registers<D>(v, main_sign, rotation_scale, lane);
      if constexpr (QJL) {
#pragma unroll
        for (int i = 0; i < R; ++i) vj[i] = v[i];
        if (valid) rotate_forward_in_registers<D>(vj, qjl_sign, rotation_scale, lane);
      }
      float code_sc = 1.0f;
#pragma unroll
      for (int part = 0; part < (QJL ? 2 : 1); ++part) {
        float* x = part == 0 ? v : vj;
        float sc = code_sc;
        if (part == 0 || !kSharedScale) {
          float mx = 0.0f;
#pragma unroll
          for (int i = 0; i < R; ++i) mx = fmaxf(mx, fabsf(x[i]));
          for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
          sc = mx > 0.0f ? mx : 1.0f;
          code_sc = sc;
        }
        const float f = kQScale / sc * (kSharedScale && part == 1 ? key_lut_scale * qjl_scale : 1.0f);
        // Columns j, j + 1 (j even) sit in lanes j and j + 1: the even lane stores registers 0, 2, …, the odd
        // lane 1, 3, …, each with its neighbour's value.
#pragma unroll
        for (int i = 0; i < R; ++i) {
          const float other = __shfl_xor_sync(0xffffffffu, x[i], 1);
          if ((lane & 1u) == static_cast<unsigned>(i & 1)) {
            const bool even = (lane & 1u) == 0u;
            std::uint32_t h, l;
            split_pair((even ? x[i] : other) * f, (even ? other : x[i]) * f, h, l);
            store(part, r, (lane & ~1u) + 32u * i, h, l);
          }
        }
        if (lane == 0) {
          if (part == 0) {
            rowfac_c[r] = sc / kQScale * p.scale_log2 / key_lut_scale;
          } else if (!kSharedScale) {
            rowfac_s[r] = sc / kQScale * p.scale_log2 * qjl_scale;
          }
        }
      }
    }
  }
}

// Epilogue: obuf holds the block's rows [kRows][D] in rotated space, already divided by R·2^15·α_v, with their
// running max row_m (log2 units) and sum row_l. Each warp applies R_p⁻¹ once per row, computes the exact-window
// part of the row in fp32 from the f32 ring rows ([exact begin, min(pos + 1, length)), online softmax over a
// warp), and combines main part, window part and sink by log-sum-exp into the output.
template <int D, unsigned kWarps, unsigned kRows>
__device__ inline void finish_rows(const PrefillParams& p, const Tables& t, const BlockRange& b, float* obuf,
                                   const float* row_m, const float* row_l) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const float* wkeys = reinterpret_cast<const float*>(p.layer + p.window_keys);
  const float* wvals = reinterpret_cast<const float*>(p.layer + p.window_values);
  const std::uint64_t ring0 = (static_cast<std::uint64_t>(b.seq) * p.kv_heads + b.kvh) * p.window;
  float main_sign[D / 32];
  load_lane_signs<D>(main_sign, t.main_signs, lane);
  const float rotation_scale = t.block_scale[0];
  for (unsigned r = warp; r < kRows; r += kWarps) {
    const std::uint32_t tl = r / b.hb, hl = r % b.hb;
    if (!b.row_valid(r, p)) continue;
    const std::uint32_t qh = b.kvh * p.group + b.hg * b.hb + hl;
    const std::uint64_t grow = b.row_base + b.tok0 + tl;
    const std::uint64_t pos = static_cast<std::uint64_t>(b.first) + b.tok0 + tl;
    if (b.bad_sequence || b.keys_beyond_plan || pos >= b.length) {  // a broken device precondition: loud, not short
      float* out = p.output + (grow * p.q_heads + qh) * D;
      for (unsigned j = lane; j < D; j += 32) out[j] = __int_as_float(0x7fc00000);
      if (lane == 0 && p.status != nullptr) {
        atomicOr(p.status, b.bad_sequence       ? kStatusBadSequence
                           : b.keys_beyond_plan ? kStatusKeysBeyondPlan
                                                : kStatusPositionBeyondLength);
      }
      continue;
    }
    // R_p⁻¹ in registers (the operations of warp_rotate_inverse in its order): coordinate lane + 32i in x[i].
    float x[D / 32];
#pragma unroll
    for (unsigned i = 0; i < D / 32; ++i) x[i] = obuf[r * D + lane + 32u * i];
    rotate_inverse_in_registers<D>(x, main_sign, rotation_scale, lane);
    const float mm = row_m[r], lm = row_l[r];
    float mw = -INFINITY, lw = 0.0f;
    float accw[D / 32];
    float qv[D / 32];
#pragma unroll
    for (unsigned i = 0; i < D / 32; ++i) accw[i] = qv[i] = 0.0f;
    const std::uint64_t wend = min(pos + 1u, static_cast<std::uint64_t>(b.length));
    if (p.window > 0 && b.eb < wend) {
      const float* q = p.queries + (grow * p.q_heads + qh) * D;
#pragma unroll
      for (unsigned i = 0; i < D / 32; ++i) qv[i] = q[lane + 32u * i];
      for (std::uint32_t tp = b.eb; tp < wend; ++tp) {
        const std::uint64_t wrow = (ring0 + tp % p.window) * D;
        float s = 0.0f;
#pragma unroll
        for (unsigned i = 0; i < D / 32; ++i) s += qv[i] * wkeys[wrow + lane + 32u * i];
        for (int o2 = 16; o2 > 0; o2 >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o2);
        s *= p.scale_log2;
        const float mn = fmaxf(mw, s);
        const float a = exp2f(mw - mn), pp = exp2f(s - mn);
        lw = lw * a + pp;
#pragma unroll
        for (unsigned i = 0; i < D / 32; ++i) accw[i] = accw[i] * a + pp * wvals[wrow + lane + 32u * i];
        mw = mn;
      }
    }
    const float sink = p.sinks != nullptr ? p.sinks[qh] * kLog2e : -INFINITY;
    const float mt = fmaxf(fmaxf(mm, mw), sink);
    float* out = p.output + (grow * p.q_heads + qh) * D;
    if (mt == -INFINITY) {
      for (unsigned j = lane; j < D; j += 32) out[j] = 0.0f;
      continue;
    }
    const float wm = exp2f(mm - mt), ww = exp2f(mw - mt);
    const float denom = lm * wm + lw * ww + exp2f(sink - mt);
    const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
#pragma unroll
    for (unsigned i = 0; i < D / 32; ++i) {
      const unsigned j = lane + 32u * i;
      out[j] = (x[i] * wm + accw[i] * ww) * inv;
    }
    __syncwarp();
  }
}

}  // namespace kvcompact::cuda::tq::detail::prefill
