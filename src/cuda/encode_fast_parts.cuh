// Internal to the encode kernels (tq_encode.cu): the fast kernel's pieces — its register layout (Fast), the
// quantiser and centroid tables in shared memory, the butterflies, the cp.async input ring, the signs, the exact
// division of extreme rows and the per-kind tails that quantise, pack and write a step's records
// (docs/cuda-encode.md). Included by tq_encode.cu only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "encode_common.cuh"
#include "encode_params.hpp"
#include "input_widen.cuh"
#include "kvcompact/tq/normalise.hpp"

namespace kvcompact::cuda::tq::detail {

namespace ktq = kvcompact::tq;

namespace {

// ---------------------------------------------------------------------------------------------------------
// Fast kernel.
//
// Lane t (of G = D/32 lanes per row) holds register m = 8i + k (i < 4, k < 8) = coordinate 8(G·i + t) + k:
// four chunks of 8 consecutive coordinates, chunk c = G·i + t. A chunk is one 16-byte load of bf16 / f16
// (two of f32), one code group (cb bytes at c·cb) and one sign byte. Butterfly stride 2^s is register
// bit s for s < 3, lane bit s − 3 for s < 3 + log2 G, register bit s − log2 G otherwise.

template <unsigned D>
struct Fast {
  static constexpr unsigned G = D / 32;        // lanes per row
  static constexpr unsigned R = 32 / G;        // rows per warp step
  static constexpr unsigned LG = G == 2 ? 1 : G == 4 ? 2 : 3;
  static constexpr unsigned kStages = 5 + LG;  // log2 D
};

// Per-block tables in shared memory (both kinds: a warp's kind changes from step to step).
struct FastTables {
  // Per code, both at an 8-byte stride (a code word, the shared-memory address of c2[kind][code], reaches the
  // centroid at a constant offset; 16 codes × 8 bytes cover the 32 banks once, so lanes never conflict).
  double c2[2][32];           // RN(c_k · c_k) in float64 (the CPU's per-term rounding of Σ c²)
  float centroids[2][32][2];  // [kind][code][0] = c_k in float32 (the QJL residual), [1] unused
  float thresholds[2][32];    // EncodeQuantiser::thresholds
  // EncodeQuantiser::cells with `below` replaced by the code's word: the shared-memory address of
  // c2[kind][below] where the kind reads it (norm correction or QJL), else 8 · below (code_word_base).
  CellEntry cells[2][kMaxCellEntries];
  float cell_a[2], cell_c[2], cell_scale[2];
  // cell_code's biased addresses of cells[kind], read back from here: computed in place, ptxas splits the bias
  // off again (one more add per lookup).
  std::uint32_t cells_biased[2];
};

// From a code word (the address of c2[kind][code]) to centroids[kind][code][0].
constexpr unsigned kCentroidOffset = offsetof(FastTables, centroids) - offsetof(FastTables, c2);
static_assert(sizeof(FastTables::c2[0]) == sizeof(FastTables::centroids[0]), "the same stride per kind");

constexpr unsigned kStageBytes = 128 * 5;  // R rows × D/8 chunks × ≤ 5 code bytes = 128·cb per warp step

// y ← H·y on the lane-distributed row (no signs, no scale): the CPU's butterflies, same operands, same order.
template <unsigned D>
__device__ __forceinline__ void fast_butterflies(float (&y)[32], unsigned t) {
  using F = Fast<D>;
#pragma unroll
  for (unsigned s = 0; s < F::kStages; ++s) {
    if (s < 3 || s >= 3 + F::LG) {
      const unsigned rs = s < 3 ? (1u << s) : (8u << (s - 3 - F::LG));
#pragma unroll
      for (unsigned m = 0; m < 32; ++m) {
        if ((m & rs) == 0) {
          const float a = y[m];
          const float b = y[m | rs];
          y[m] = __fadd_rn(a, b);
          y[m | rs] = __fsub_rn(a, b);
        }
      }
    } else {
      // Partner lanes differ in bit u: the lower one holds a (coordinate j), the upper one c (j + stride).
      // Lower: a + c = fma(+1, a, c); upper: a − c = fma(−1, c, a). One rounding each, as on the CPU.
      const unsigned u = 1u << (s - 3);
      const float sg = (t & u) ? -1.0f : 1.0f;
#pragma unroll
      for (unsigned m = 0; m < 32; ++m) {
        const float partner = __shfl_xor_sync(0xffffffffu, y[m], u);
        y[m] = __fmaf_rn(sg, y[m], partner);
      }
    }
  }
}

// v · (±1): a sign flip, exact like the CPU's multiplication by ±1.0f.
__device__ __forceinline__ float flip(float v, std::uint32_t mask, unsigned m) {
  return __uint_as_float(__float_as_uint(v) ^ (((mask >> m) & 1u) << 31));
}

template <unsigned DT>
struct RawOf {
  static constexpr unsigned kVecs = DT == 0 ? 8 : 4;  // uint4 per lane per row
};

// Input value of register m (k = m % 8 within chunk i = m / 8), as float, no sign applied.
template <unsigned DT>
__device__ __forceinline__ float raw_value(const uint4 (&raw)[RawOf<DT>::kVecs], unsigned m) {
  const unsigned i = m >> 3, k = m & 7u;
  if constexpr (DT == 0) {
    const uint4 v = raw[2 * i + (k >> 2)];
    const unsigned w = (k & 3u) == 0 ? v.x : (k & 3u) == 1 ? v.y : (k & 3u) == 2 ? v.z : v.w;
    return __uint_as_float(w);
  } else {
    const uint4 v = raw[i];
    const unsigned q = k >> 1;
    const unsigned w = q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
    const unsigned bits = (k & 1u) ? (w >> 16) : (w & 0xffffu);
    if constexpr (DT == 1) return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    return __uint_as_float(bits << 16);
  }
}

// Stages of the per-warp input ring in shared memory: cp.async copies run two warp steps ahead of the math.
constexpr unsigned kRingStages = 3;

template <unsigned DT>
constexpr std::size_t fast_ring_bytes() {
  return std::size_t{kEncodeFastWarps} * kRingStages * RawOf<DT>::kVecs * 32u * 16u;
}

// One 16-byte copy of the ring: destination and source as a register plus a constant byte offset (immediates
// of the instruction, so the copies of a step share one address computation).
template <unsigned kDst, unsigned kSrc>
__device__ __forceinline__ void ring_copy(unsigned dst, const uint4* src, unsigned src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0+%3], [%1+%4], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes),
               "n"(kDst), "n"(kSrc)
               : "memory");
}

template <unsigned D, unsigned DT, unsigned... V>
__device__ __forceinline__ void ring_copies(unsigned dst, const uint4* row, unsigned src_bytes,
                                            std::integer_sequence<unsigned, V...>) {
  using F = Fast<D>;
  // Vector v of the lane: f32: chunk c = G·(v/2) + t is 8 floats = vectors 2c, 2c + 1 of the row; bf16 / f16:
  // chunk c = G·v + t, one vector. `row` points at the lane's first vector (t or 2t).
  (ring_copy<V * 32 * 16, 16 * (DT == 0 ? 2 * F::G * (V >> 1) + (V & 1u) : F::G * V)>(dst, row, src_bytes), ...);
}

// Issues the copies of one warp step into `ring` (this lane's vectors at [v·32 + lane]: conflict-free reads),
// zero-filled for rows past the end (which copy nothing from the start of the tensor); then commits them as one
// group (possibly empty).
template <unsigned D, unsigned DT>
__device__ __forceinline__ void fast_issue(uint4* ring, const void* src, std::uint64_t row_index, unsigned t,
                                           unsigned lane, bool valid) {
  const uint4* row =
      static_cast<const uint4*>(src) + (valid ? row_index * (D / (DT == 0 ? 4 : 8)) + (DT == 0 ? 2 : 1) * t : 0);
  ring_copies<D, DT>(static_cast<unsigned>(__cvta_generic_to_shared(ring + lane)), row, valid ? 16u : 0u,
                     std::make_integer_sequence<unsigned, RawOf<DT>::kVecs>{});
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Copies `bytes` (a multiple of 8) from the warp's staging area to global memory (8-byte aligned).
__device__ __forceinline__ void copy_out(std::uint8_t* dst, const std::uint8_t* stage, unsigned bytes, unsigned lane) {
  if (((reinterpret_cast<std::uintptr_t>(dst) | bytes) & 15u) == 0) {
    for (unsigned w = lane; w < bytes / 16; w += 32)
      reinterpret_cast<uint4*>(dst)[w] = reinterpret_cast<const uint4*>(stage)[w];
  } else {
    for (unsigned w = lane; w < bytes / 8; w += 32)
      reinterpret_cast<uint2*>(dst)[w] = reinterpret_cast<const uint2*>(stage)[w];
  }
}

// A lane's main-rotation signs. bf16 / f16: packed-word masks per chunk i (bit 15 / 31 = sign of the lower /
// upper coordinate of a word), read from shared memory every step; f32: one register, bit m = the sign of the
// coordinate in register m (so the f32 instances need no mask array in shared memory, which lets two blocks
// with their twice-as-large input rings fit on a multiprocessor).
struct MainSigns {
  uint4 pairs[4];
  std::uint32_t bits;
};

// Input value of register m with the rotation sign applied: for bf16 / f16 the packed word XOR its pair mask,
// then widened exactly; for f32 the sign bit flipped.
template <unsigned DT>
__device__ __forceinline__ float signed_value(const uint4 (&raw)[RawOf<DT>::kVecs], const MainSigns& signs, unsigned m) {
  const unsigned i = m >> 3, k = m & 7u, q = k >> 1;
  if constexpr (DT == 0) {
    return flip(raw_value<DT>(raw, m), signs.bits, m);
  } else {
    const uint4 pv = signs.pairs[i];
    const unsigned mask = q == 0 ? pv.x : q == 1 ? pv.y : q == 2 ? pv.z : pv.w;
    const uint4 v = raw[i];
    const unsigned w = (q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w) ^ mask;
    if constexpr (DT == 1) {
      return __half2float(__ushort_as_half(static_cast<unsigned short>((k & 1u) ? (w >> 16) : (w & 0xffffu))));
    }
    return __uint_as_float((k & 1u) ? (w & 0xffff0000u) : (w << 16));
  }
}

struct Row32 {
  float v[32];
};

// u = RN32(RN64(x / ‖x‖)) for one coordinate, out of line (one copy of the float64 division's code).
__device__ __noinline__ float divide_f64(float x, double norm) { return ktq::unit_coordinate_f64(x, norm); }

// A lane's 32 coordinates of u = RN32(RN64(x / ‖x‖)), recomputed from the input ring: the codec's form for rows
// whose norm lies outside [kProductNormMin, kProductNormMax] (normalise.hpp). Out of line: never model data.
template <unsigned DT>
__device__ __noinline__ Row32 divide_exact(const uint4* cur, const uint4* pair_masks, std::uint32_t main_mask,
                                           unsigned lane, double norm) {
  uint4 raw[RawOf<DT>::kVecs];
  for (unsigned v = 0; v < RawOf<DT>::kVecs; ++v) raw[v] = cur[v * 32 + lane];
  MainSigns signs;
  signs.bits = main_mask;
  if constexpr (DT != 0) {
    for (unsigned i = 0; i < 4; ++i) signs.pairs[i] = pair_masks[i * kEncodeFastWarps * 32];
  }
  Row32 out;
#pragma unroll
  for (unsigned m = 0; m < 32; ++m) out.v[m] = divide_f64(signed_value<DT>(raw, signs, m), norm);
  return out;
}

// A lane's 32 coordinates of u for the rows the product does not normalise: zeros for rows that encode as a
// zero record (non-finite, overflowing or zero norm), else divide_exact. Out of line: never model data.
template <unsigned DT>
__device__ __noinline__ Row32 rare_unit_row(const uint4* cur, const uint4* pair_masks, std::uint32_t main_mask,
                                            unsigned lane, double norm, bool good) {
  if (good) return divide_exact<DT>(cur, pair_masks, main_mask, lane, norm);
  Row32 zero;
#pragma unroll
  for (unsigned m = 0; m < 32; ++m) zero.v[m] = 0.0f;
  return zero;
}

// The window ring stores the input widened to f32; an f16 NaN keeps its payload as the CPU's f16_to_f32 does.
template <unsigned DT>
__device__ __forceinline__ float window_value(const uint4 (&raw)[RawOf<DT>::kVecs], unsigned m) {
  if constexpr (DT == 1) {
    const uint4 v = raw[m >> 3];
    const unsigned q = (m & 7u) >> 1;
    const unsigned w = q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
    const unsigned h = (m & 1u) ? (w >> 16) : (w & 0xffffu);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) {
      return __uint_as_float(((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13));
    }
  }
  return raw_value<DT>(raw, m);
}

// The code of y for 3 bits and more (encode_quantiser.hpp): u = sat(fma(y, a, c)); fma.rm(u, 2^bits, 2^23) is
// ⌊u · 2^bits⌋ + 2^23 exactly, so its bits are 0x4B000000 + the cell; code = below + (y ≥ threshold), returned as
// its code word (FastTables::cells: 8 · code + the kind's code_word_base).
// `cells_biased` = the shared-memory address of the cell entries − 8 · 0x4B000000 (mod 2^32), so that the
// entry's address is one multiply-add of the float's bits.
__device__ __forceinline__ std::uint32_t cell_code_word(float y, std::uint32_t cells_biased, float ca, float cc, float cs) {
  float u, f;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(u) : "f"(y), "f"(ca), "f"(cc));
  asm("fma.rm.f32 %0, %1, %2, %3;" : "=f"(f) : "f"(u), "f"(cs), "f"(0x1p23f));
  std::uint32_t threshold, code;
  asm("ld.shared.v2.u32 {%0, %1}, [%2];"
      : "=r"(threshold), "=r"(code)
      : "r"(__float_as_uint(f) * 8u + cells_biased));
  // word = the word of `below`, advanced by one 8-byte code entry where y ≥ threshold (NaN thresholds never): a
  // compare and a predicated add in place (the plain `below + (y ≥ t ? 1 : 0)` compiled to an add, a compare
  // and a predicated move).
  asm("{\n\t.reg .pred p;\n\tsetp.ge.f32 p, %1, %2;\n\t@p add.u32 %0, %0, 8;\n\t}"
      : "+r"(code)
      : "f"(y), "f"(__uint_as_float(threshold)));
  return code;
}

// Everything of one warp step after the main rotation's butterflies, for code bits CB, norm correction NC and
// the QJL residual: quantise (encode_quantiser.hpp: MSE kinds compare the unscaled y with thresholds, QJL keys
// take the ·1/√b first; 1–2 bits from registers, 3 and more by cell lookup), pack, Σc², the norm, the residual
// and ρ, the QJL rotation and its sign bits; records are staged in shared memory and written with wide
// stores. Templated so that the per-coordinate work has no branches.
struct TailArgs {
  const EncodeParams* p;
  const float* thr;
  const FastTables* tab;  // the cell tables (3 bits and more)
  const double* c2;
  const float (*centroids)[2];
  std::uint32_t code_word_base;  // FastTables::cells: the kind's shared address of c2[kind], or 0
  std::uint8_t* stage_codes;
  std::uint8_t* stage_signs;
  std::uint32_t* status;  // the request's status word, or null
  std::uint64_t slot0;
  double norm;
  float scale;
  float sign_threshold;  // Tables::qjl_sign_threshold
  std::uint32_t qjl_mask;
  unsigned lane, t, rr, rows_here, kind;
  bool good, valid;
};

template <unsigned D, unsigned CB, bool NC, bool QJL>
__device__ __forceinline__ void fast_tail(float (&y)[32], const TailArgs& a) {
  using F = Fast<D>;
  constexpr unsigned L = 1u << CB;
  const float b_mid = a.thr[L / 2 - 1];
  const float b_lo = CB == 2 ? a.thr[0] : 0.0f;
  const float b_hi = CB == 2 ? a.thr[2] : 0.0f;
  if constexpr (QJL) {
#pragma unroll
    for (unsigned m = 0; m < 32; ++m) y[m] = __fmul_rn(y[m], a.scale);  // the rotation's ·1/√b
  }
  std::uint32_t cells_biased = 0;
  float cell_a = 0.0f, cell_c = 0.0f, cell_scale = 0.0f;
  if constexpr (CB >= 3) {
    cells_biased = a.tab->cells_biased[a.kind];
    cell_a = a.tab->cell_a[a.kind];
    cell_c = a.tab->cell_c[a.kind];
    cell_scale = a.tab->cell_scale[a.kind];
  }
  double code_sqs[2] = {0.0, 0.0}, res_sqs[2] = {0.0, 0.0};  // two chains each (even and odd k), as ‖x‖²
  constexpr unsigned rec = (D / 8) * CB;
  std::uint8_t* row_stage = a.stage_codes + a.rr * rec;
  __syncwarp();  // the previous step's copy-out has read the staging area
#pragma unroll
  for (unsigned i = 0; i < 4; ++i) {
    std::uint32_t half[2] = {0, 0};
#pragma unroll
    for (unsigned k = 0; k < 8; ++k) {
      const unsigned m = 8 * i + k;
      const float v = y[m];
      double c2 = 0.0;
      float centroid = 0.0f;
      const unsigned shift = (k & 3u) * CB;  // of the code's field in its half of the group
      if constexpr (CB >= 3) {
        // The code word is 8 · code + code_word_base: (word / 8) << shift is one shift-add, the base's share
        // of the fields is removed once per half below, and the code's values are read at the word itself.
        const std::uint32_t word = cell_code_word(v, cells_biased, cell_a, cell_c, cell_scale);
        half[k >> 2] += shift >= 3 ? word << (shift - 3) : word >> (3 - shift);
        if constexpr (NC) asm("ld.shared.f64 %0, [%1];" : "=d"(c2) : "r"(word));
        if constexpr (QJL) asm("ld.shared.f32 %0, [%1+%2];" : "=f"(centroid) : "r"(word), "n"(kCentroidOffset));
      } else {
        const bool p1 = v >= b_mid;
        std::uint32_t idx = p1 ? L / 2 : 0u;
        if constexpr (CB == 2) idx += (v >= (p1 ? b_hi : b_lo)) ? 1u : 0u;
        half[k >> 2] += idx << shift;  // the fields are disjoint: + is | and compiles to one LEA
        if constexpr (NC) c2 = a.c2[idx];
        if constexpr (QJL) centroid = a.centroids[idx][0];
      }
      if constexpr (NC) code_sqs[k & 1] = __dadd_rn(code_sqs[k & 1], c2);
      if constexpr (QJL) {
        const float res = __fsub_rn(v, centroid);
        res_sqs[k & 1] = __fma_rn(static_cast<double>(res), static_cast<double>(res), res_sqs[k & 1]);  // exact square
        y[m] = res;
      }
    }
    if constexpr (CB >= 3) {
      // Σ_k (base/8) << (k·CB) over the four fields of each half (modulo 2^32, as the sums above).
      constexpr std::uint32_t fields = 1u + (1u << CB) + (1u << (2 * CB)) + (1u << (3 * CB));
      half[0] -= (a.code_word_base >> 3) * fields;
      half[1] -= (a.code_word_base >> 3) * fields;
    }
    const std::uint64_t word = a.good ? (static_cast<std::uint64_t>(half[1]) << (4 * CB)) | half[0] : 0u;
    std::uint8_t* dst = row_stage + (F::G * i + a.t) * CB;
    if constexpr (CB == 4) {
      *reinterpret_cast<std::uint32_t*>(dst) = static_cast<std::uint32_t>(word);
    } else if constexpr (CB == 2) {
      *reinterpret_cast<std::uint16_t*>(dst) = static_cast<std::uint16_t>(word);
    } else {
#pragma unroll
      for (unsigned b = 0; b < CB; ++b) dst[b] = static_cast<std::uint8_t>(word >> (8 * b));
    }
  }
  const EncodeParams& p = *a.p;
  double code_sq = __dadd_rn(code_sqs[0], code_sqs[1]);
  double res_sq = __dadd_rn(res_sqs[0], res_sqs[1]);
  if constexpr (NC) {
#pragma unroll
    for (unsigned u = 1; u < F::G; u <<= 1) code_sq = __dadd_rn(code_sq, __shfl_xor_sync(0xffffffffu, code_sq, u));
  }
  float stored = a.good ? __double2float_rn(a.norm) : 0.0f;
  if constexpr (NC) {
    if (a.good) stored = __double2float_rn(__ddiv_rn(a.norm, __dsqrt_rn(code_sq)));
    // ‖c‖ < 1 for most code vectors, so RN32(‖x‖ / ‖c‖) can be inf although ‖x‖ fits float32. The CPU codec
    // refuses such a row (OutOfRange): its record is zeroed and flagged as a norm beyond float32. Every lane of
    // the row holds the same code_sq, so each zeroes its own staged groups.
    if (isinf(stored)) {
      stored = 0.0f;
#pragma unroll
      for (unsigned i = 0; i < 4; ++i) {
#pragma unroll
        for (unsigned b = 0; b < CB; ++b) row_stage[(F::G * i + a.t) * CB + b] = 0;
      }
      if (a.valid && a.t == 0 && a.status != nullptr) atomicOr(a.status, kStatusNormOverflow);
    }
  }
  if (a.valid && a.t == 0) {
    reinterpret_cast<float*>(p.layer + (a.kind ? p.value_norms_offset : p.key_norms_offset))[a.slot0 + a.rr] = stored;
  }
  __syncwarp();
  copy_out(p.layer + (a.kind ? p.value_codes_offset : p.key_codes_offset) + a.slot0 * rec, a.stage_codes,
           a.rows_here * rec, a.lane);
  if constexpr (QJL) {
#pragma unroll
    for (unsigned u = 1; u < F::G; u <<= 1) res_sq = __dadd_rn(res_sq, __shfl_xor_sync(0xffffffffu, res_sq, u));
    if (a.valid && a.t == 0) {
      const std::uint16_t rho =
          a.good ? __half_as_ushort(__float2half_rn(__double2float_rn(__dsqrt_rn(res_sq)))) : std::uint16_t{0};
      reinterpret_cast<std::uint16_t*>(p.layer + p.key_residual_norms_offset)[a.slot0 + a.rr] = rho;
    }
#pragma unroll
    for (unsigned m = 0; m < 32; ++m) y[m] = flip(y[m], a.qjl_mask, m);
    fast_butterflies<D>(y, a.t);
#pragma unroll
    for (unsigned i = 0; i < 4; ++i) {
      std::uint32_t byte = 0;
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) byte |= (y[8 * i + k] >= a.sign_threshold ? 1u : 0u) << k;  // RN(y/√b) ≥ 0
      a.stage_signs[a.rr * (D / 8) + F::G * i + a.t] = static_cast<std::uint8_t>(a.good ? byte : 0u);
    }
    __syncwarp();
    copy_out(p.layer + p.key_signs_offset + a.slot0 * (D / 8), a.stage_signs, a.rows_here * (D / 8), a.lane);
  }
}

// The tails of one mode family (NC: norm correction; QJL: prod keys): keys take the QJL tail in a QJL family,
// values (and the keys of the others) the norm-corrected or the plain one. A family's kernel instantiates only
// these, 4 or 8 tails instead of all 12, so that the code it runs lies closer together (cuda-encode.md, "Code
// size").
template <unsigned D, bool NC, bool QJL>
__device__ __forceinline__ void fast_tail_dispatch(float (&y)[32], const TailArgs& a, unsigned cb, bool key) {
  if constexpr (QJL) {
    if (key) {
      switch (cb) {
        case 1: fast_tail<D, 1, false, true>(y, a); break;
        case 2: fast_tail<D, 2, false, true>(y, a); break;
        case 3: fast_tail<D, 3, false, true>(y, a); break;
        default: fast_tail<D, 4, false, true>(y, a); break;
      }
      return;
    }
  }
  if constexpr (NC) {
    switch (cb) {
      case 2: fast_tail<D, 2, true, false>(y, a); break;
      case 3: fast_tail<D, 3, true, false>(y, a); break;
      case 4: fast_tail<D, 4, true, false>(y, a); break;
      default: fast_tail<D, 5, true, false>(y, a); break;
    }
  } else {
    switch (cb) {
      case 2: fast_tail<D, 2, false, false>(y, a); break;
      case 3: fast_tail<D, 3, false, false>(y, a); break;
      case 4: fast_tail<D, 4, false, false>(y, a); break;
      default: fast_tail<D, 5, false, false>(y, a); break;
    }
  }
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
