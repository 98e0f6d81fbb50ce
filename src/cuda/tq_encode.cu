// The TurboQuant encode kernels: f32 / bf16 / f16 rows -> packed records in the layer layout of
// tq::plan_layer_layout, byte-identical to LayerCodec::encode_key / encode_value (docs/cuda.md, "Encode";
// docs/cuda-encode.md describes the fast kernel). Host-side checks are in tq_codec.cpp.
//
// Fast kernel (head_dim 64, 128, 256; 16-byte aligned inputs): head_dim/32 lanes per row, 32 coordinates per
// lane in registers, one warp = 32·32/head_dim consecutive positions of one KV head and kind. Butterflies are
// register adds for strides inside a lane and __shfl_xor for strides across lanes; the row is normalised as the
// codec defines it (kvcompact/tq/normalise.hpp: one float product per coordinate). General kernel (every other
// head_dim): one warp per (row, KV head, key-or-value) item, the row in shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstddef>
#include <utility>

#include "encode_params.hpp"
#include "input_widen.cuh"
#include "pdl.cuh"
#include "kvcompact/tq/normalise.hpp"

namespace kvcompact::cuda::tq::detail {

namespace ktq = kvcompact::tq;

namespace {

constexpr float kFloatMax = 3.40282346638528859812e38f;

__device__ inline double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline std::uint32_t quantize(float y, const float* boundaries, std::uint32_t levels) {
  std::uint32_t index = 0;
  for (std::uint32_t step = levels >> 1; step > 0; step >>= 1) index += (y >= boundaries[index + step - 1]) ? step : 0u;
  return index;
}

// A request's verdict against its sequence's device length (EncodeParams::device_lengths set), shared by both
// kernels: with a position check (PositionCheck) it writes at its own position, or nothing when that is not the
// device length (kStatusStalePosition); otherwise (DeviceLengths) it writes at the device length, or nothing
// when it would end beyond the limit (kStatusBeyondLimit).
struct LengthVerdict {
  std::uint32_t first;    // the position of its first row
  std::uint32_t refusal;  // 0, or the status bit of a request that writes nothing
};
__device__ inline LengthVerdict length_verdict(const EncodeParams& p, std::uint32_t device_length,
                                               std::uint32_t position, std::uint32_t rows) {
  if (p.check_positions != 0) return {position, device_length != position ? kStatusStalePosition : 0u};
  const bool beyond = device_length > p.length_limit || rows > p.length_limit - device_length;
  return {device_length, beyond ? kStatusBeyondLimit : 0u};
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

// kBatched: the launch encodes several requests (batch.count > 1). The single-request instance reads its request
// at a fixed parameter offset and never looks one up: the lookups (indexed constant loads in every step) cost it
// 1–7 %, 4 % on average, in a same-run A/B (docs/cuda-encode.md, "Batched launches").
template <unsigned D, unsigned DT, bool NC, bool QJL, bool kBatched>
__global__ void __launch_bounds__(kEncodeFastWarps * 32, 2)
    encode_fast_kernel(EncodeParams p, const __grid_constant__ EncodeSegments<kBatched ? kEncodeBatchMax : 1> batch) {
  kvcompact::cuda::detail::wait_for_previous_grid();  // (launch_after_previous)
  using F = Fast<D>;
  __shared__ FastTables tab;
  __shared__ __align__(16) std::uint8_t stage_codes[kEncodeFastWarps][kStageBytes];
  __shared__ __align__(16) std::uint8_t stage_signs[kEncodeFastWarps][128];
  // [i][thread]: main-rotation sign pairs of chunk i (MainSigns; bf16 / f16 only)
  __shared__ uint4 pair_masks[DT == 0 ? 1 : 4][DT == 0 ? 1 : kEncodeFastWarps * 32];
  const Tables& gt = *p.tables;
  for (unsigned i = threadIdx.x; i < 32; i += blockDim.x) {
    const double ck = gt.key_centroids_f64[i], cv = gt.value_centroids_f64[i];
    tab.c2[0][i] = __dmul_rn(ck, ck);
    tab.c2[1][i] = __dmul_rn(cv, cv);
    tab.centroids[0][i][0] = gt.key_centroids[i];
    tab.centroids[1][i][0] = gt.value_centroids[i];
    tab.centroids[0][i][1] = tab.centroids[1][i][1] = 0.0f;
    tab.thresholds[0][i] = gt.key_quantiser.thresholds[i];
    tab.thresholds[1][i] = gt.value_quantiser.thresholds[i];
  }
  // Code words: a kind that reads its code entries (norm correction; QJL keys) gets their shared address as
  // the base, the others 0 (their fields then need no correction).
  // (Scalars, not an array indexed by kind: that would live in local memory.)
  const std::uint32_t key_word_base = NC || QJL ? static_cast<std::uint32_t>(__cvta_generic_to_shared(tab.c2[0])) : 0u;
  const std::uint32_t value_word_base = NC ? static_cast<std::uint32_t>(__cvta_generic_to_shared(tab.c2[1])) : 0u;
  for (unsigned i = threadIdx.x; i < 2 * kMaxCellEntries; i += blockDim.x) {
    const unsigned kind = i / kMaxCellEntries;
    CellEntry e = (kind ? gt.value_quantiser : gt.key_quantiser).cells[i % kMaxCellEntries];
    e.below = (kind ? value_word_base : key_word_base) + 8u * e.below;
    tab.cells[kind][i % kMaxCellEntries] = e;
  }
  if (threadIdx.x < 2) {
    const EncodeQuantiser& q = threadIdx.x ? gt.value_quantiser : gt.key_quantiser;
    tab.cell_a[threadIdx.x] = q.cell_a;
    tab.cell_c[threadIdx.x] = q.cell_c;
    tab.cell_scale[threadIdx.x] = q.cell_scale;
    tab.cells_biased[threadIdx.x] =
        static_cast<std::uint32_t>(__cvta_generic_to_shared(tab.cells[threadIdx.x])) - 8u * 0x4B000000u;
  }
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  const unsigned t = lane % F::G;   // lane within the row
  const unsigned rr = lane / F::G;  // row within the warp step
  // QJL sign mask: bit m = the coordinate held in register m has sign −1. Main signs: MainSigns.
  std::uint32_t qjl_mask = 0, main_mask = 0;
#pragma unroll
  for (unsigned i = 0; i < 4; ++i) {
    unsigned w[4];
#pragma unroll
    for (unsigned q = 0; q < 4; ++q) {
      const unsigned e = 8 * (F::G * i + t) + 2 * q;
      w[q] = (gt.main_signs[e] < 0.0f ? 0x8000u : 0u) | (gt.main_signs[e + 1] < 0.0f ? 0x80000000u : 0u);
    }
    if constexpr (DT != 0) pair_masks[i][threadIdx.x] = make_uint4(w[0], w[1], w[2], w[3]);
#pragma unroll
    for (unsigned k = 0; k < 8; ++k) {
      qjl_mask |= (gt.qjl_signs[8 * (F::G * i + t) + k] < 0.0f ? 1u : 0u) << (8 * i + k);
      main_mask |= (gt.main_signs[8 * (F::G * i + t) + k] < 0.0f ? 1u : 0u) << (8 * i + k);
    }
  }
  const float scale = gt.block_scale[0];
  const float sign_threshold = gt.qjl_sign_threshold;
  const std::uint32_t key_bits = gt.key_code_bits, value_bits = gt.value_bits;
  // The batched instance's requests' first positions and rows, read once per block: from the parameter, or at
  // the device lengths (DeviceLengths), where a request ending beyond the limit keeps 0 rows and so writes
  // nothing (block 0 reports it); with a position check (PositionCheck), a request whose position is not the
  // device length keeps 0 rows (kStatusStalePosition). The single-request instance reads its parameter.
  __shared__ std::uint32_t request_position[kBatched ? kEncodeBatchMax : 1], request_rows[kBatched ? kEncodeBatchMax : 1];
  if constexpr (kBatched) {
    if (threadIdx.x < batch.count) {
      const EncodeSegment& r = batch.segment[threadIdx.x];
      std::uint32_t position = r.position, rows = r.rows;
      if (p.device_lengths != nullptr) {
        const LengthVerdict v = length_verdict(p, p.device_lengths[r.seq], position, rows);
        position = v.first;
        if (v.refusal != 0) {
          rows = 0;
          if (blockIdx.x == 0 && r.status != nullptr) atomicOr(r.status, v.refusal);
        }
      }
      request_position[threadIdx.x] = position;
      request_rows[threadIdx.x] = rows;
    }
  }
  auto position_of = [&](std::uint32_t r) { return kBatched ? request_position[r] : batch.segment[0].position; };
  auto rows_of = [&](std::uint32_t r) { return kBatched ? request_rows[r] : batch.segment[0].rows; };
  __syncthreads();

  const std::uint32_t H = p.kv_heads;
  const std::uint32_t total = batch.total_steps;  // launcher guarantees < 2^31
  const std::uint32_t stride = gridDim.x * kEncodeFastWarps;
  std::uint32_t g = blockIdx.x * kEncodeFastWarps + warp;

  // Step g lies in request r (first_step[r] ≤ g < end); its local step pb · 2H + rem -> (position block pb,
  // kind, head): neighbouring warps read neighbouring heads of the same rows. A warp's steps advance by
  // `stride`, so it keeps (r, pb, rem) of its current step and of the step it prefetches and advances them
  // without a division while it stays in one request.
  struct Cursor {
    std::uint32_t g, pb, rem, r, end;
  };
  const std::uint32_t two_h = 2u * H, stride_pb = stride / two_h, stride_rem = stride % two_h;
  auto locate = [&](Cursor& c, std::uint32_t from) {
    if constexpr (!kBatched) {
      c.r = 0;
      c.end = total;
      c.pb = c.g / two_h;
      c.rem = c.g % two_h;
      return;
    }
    std::uint32_t r = from;
    while (r + 1 < batch.count && c.g >= batch.segment[r + 1].first_step) ++r;
    c.r = r;
    c.end = r + 1 < batch.count ? batch.segment[r + 1].first_step : total;
    const std::uint32_t local = c.g - batch.segment[r].first_step;
    c.pb = local / two_h;
    c.rem = local % two_h;
  };
  auto cursor_at = [&](std::uint32_t gg) {
    Cursor c{gg, 0, 0, 0, 0};
    locate(c, 0);
    return c;
  };
  auto advance = [&](Cursor& c) {
    c.g += stride;
    if (c.g < c.end) {
      c.pb += stride_pb;
      c.rem += stride_rem;
      if (c.rem >= two_h) {
        c.rem -= two_h;
        ++c.pb;
      }
    } else if (kBatched && c.g < total) {
      locate(c, c.r);  // the next request (past the last one the cursor is out of range and never read)
    }
  };

  extern __shared__ uint4 ring_all[];
  uint4* const ring = ring_all + warp * kRingStages * RawOf<DT>::kVecs * 32u;
  auto issue = [&](const Cursor& c, unsigned stage) {
    const bool in_range = c.g < total;
    const std::uint32_t kind = c.rem >= H ? 1u : 0u;
    const std::uint32_t head = c.rem - kind * H;
    const std::uint32_t row = c.pb * F::R + rr;
    const EncodeSegment& req = batch.segment[kBatched ? c.r : 0u];
    fast_issue<D, DT>(ring + stage * RawOf<DT>::kVecs * 32u, kind ? req.values : req.keys,
                      static_cast<std::uint64_t>(row) * H + head, t, lane, in_range && row < rows_of(c.r));
  };
  Cursor now = cursor_at(g);
  issue(now, 0);
  issue(cursor_at(g + stride), 1);
  Cursor ahead = cursor_at(g + 2 * stride);
  unsigned stage = 0;
  for (; now.g < total; advance(now), advance(ahead), stage = stage == kRingStages - 1 ? 0 : stage + 1) {
    // Opaque to the compiler: stops it hoisting 32 per-register sign words out of the loop (and spilling them).
    // (main_mask likewise, for f32 only: the 16-bit instances read their signs from pair_masks.)
    asm volatile("" : "+r"(qjl_mask));
    if constexpr (DT == 0) asm volatile("" : "+r"(main_mask));
    const EncodeSegment& req = batch.segment[kBatched ? now.r : 0u];
    const std::uint32_t pb = now.pb;
    const std::uint32_t kind = now.rem >= H ? 1u : 0u;
    const std::uint32_t head = now.rem - kind * H;
    const std::uint32_t row = pb * F::R + rr;
    const std::uint32_t rows = rows_of(now.r), first_position = position_of(now.r);
    const bool valid = row < rows;
    // (A batched request refused at the device length has 0 rows in every step of it.)
    const std::uint32_t rows_here = !kBatched || pb * F::R < rows ? min(F::R, rows - pb * F::R) : 0u;

    // Two steps ahead into the stage freed by the previous step; then this step's copies (issued two groups
    // ago) are complete. Each lane reads back only what it copied itself, so no barrier is needed.
    issue(ahead, stage == 0 ? kRingStages - 1 : stage - 1);
    asm volatile("cp.async.wait_group 2;\n" ::: "memory");
    const uint4* cur = ring + stage * RawOf<DT>::kVecs * 32u;
    uint4 raw[RawOf<DT>::kVecs];
#pragma unroll
    for (unsigned v = 0; v < RawOf<DT>::kVecs; ++v) raw[v] = cur[v * 32 + lane];
    MainSigns signs;
    signs.bits = main_mask;
    if constexpr (DT != 0) {
#pragma unroll
      for (unsigned i = 0; i < 4; ++i) signs.pairs[i] = pair_masks[i][threadIdx.x];
    }

    const std::uint32_t position = first_position + row;
    const std::uint64_t slot0 =
        (static_cast<std::uint64_t>(req.seq) * H + head) * p.capacity + first_position + pb * F::R;

    // Exact window: the f32 row to ring slot position mod W (only the last W rows of the append).
    if (p.window > 0 && valid && row + p.window >= rows) {
      const std::uint64_t wrow = (static_cast<std::uint64_t>(req.seq) * H + head) * p.window + position % p.window;
      float4* dst = reinterpret_cast<float4*>(p.layer + (kind ? p.window_values_offset : p.window_keys_offset)) +
                    wrow * (D / 4);
#pragma unroll
      for (unsigned i = 0; i < 4; ++i) {
        const unsigned c = F::G * i + t;
        float v[8];
#pragma unroll
        for (unsigned k = 0; k < 8; ++k) v[k] = window_value<DT>(raw, 8 * i + k);
        dst[2 * c] = make_float4(v[0], v[1], v[2], v[3]);
        dst[2 * c + 1] = make_float4(v[4], v[5], v[6], v[7]);
      }
    }

    // x·signs (exact) and the lane's part of Σx² in float64 (squares of floats are exact in float64).
    float y[32];
    // Two chains (even and odd registers), added at the end: half the dependent float64 latency per step.
    double sums[2] = {0.0, 0.0};
#pragma unroll
    for (unsigned m = 0; m < 32; ++m) {
      const float x = signed_value<DT>(raw, signs, m);
      y[m] = x;
      sums[m & 1] = __fma_rn(static_cast<double>(x), static_cast<double>(x), sums[m & 1]);
    }
    double sum = __dadd_rn(sums[0], sums[1]);
#pragma unroll
    for (unsigned u = 1; u < F::G; u <<= 1) sum = __dadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, u));
    // Non-finite input makes Σx² inf or NaN; finite floats cannot overflow it (1024 · 3.4e38² < 1.8e308).
    const bool finite = sum <= 1.79769313486231570815e308;
    const double norm = __dsqrt_rn(sum);
    const bool overflow = finite && norm > static_cast<double>(kFloatMax);
    const bool good = finite && !overflow && norm != 0.0;
    if (valid && t == 0 && req.status != nullptr && (!finite || overflow)) {
      atomicOr(req.status, !finite ? kStatusNonFinite : kStatusNormOverflow);
    }

    // u = RN32(x · RN32(1/‖x‖)), the codec's normalisation (normalise.hpp); rows of extreme norm divide in
    // float64 instead, out of line.
    if (good && ktq::normalises_by_product(norm)) {
      const float r = ktq::unit_reciprocal(norm);
#pragma unroll
      for (unsigned m = 0; m < 32; ++m) y[m] = ktq::unit_coordinate(y[m], r);
    } else {
      // Out of line, zeros included: inlined, the zeroing of y was hoisted into every step.
      const Row32 rare = rare_unit_row<DT>(cur, &pair_masks[0][threadIdx.x], main_mask, lane, norm, good);
#pragma unroll
      for (unsigned m = 0; m < 32; ++m) y[m] = rare.v[m];
    }

    fast_butterflies<D>(y, t);  // (the ·1/√b: only QJL keys need it, in fast_tail)

    TailArgs a;
    a.p = &p;
    a.thr = tab.thresholds[kind];
    a.tab = &tab;
    a.c2 = tab.c2[kind];
    a.centroids = tab.centroids[kind];
    a.code_word_base = kind ? value_word_base : key_word_base;
    a.stage_codes = stage_codes[warp];
    a.stage_signs = stage_signs[warp];
    a.status = req.status;
    a.slot0 = slot0;
    a.norm = norm;
    a.scale = scale;
    a.sign_threshold = sign_threshold;
    a.qjl_mask = qjl_mask;
    a.lane = lane;
    a.t = t;
    a.rr = rr;
    a.rows_here = rows_here;
    a.kind = kind;
    a.good = good;
    a.valid = valid;
    fast_tail_dispatch<D, NC, QJL>(y, a, kind ? value_bits : key_bits, kind == 0);
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Every instance needs more dynamic shared memory than a kernel gets without opting in (48 KB less its static
// shared memory; the 16-bit inputs' ring alone is 48 KB). prepare_encode opts the codec's instances in once per
// codec: the attribute belongs to the function in the current context, so it is set where the codec's tables are
// allocated, not on every append.

// Devices whose resident-block count each kernel instance remembers; a higher ordinal asks the runtime per call.
constexpr int kRememberedDevices = 64;

// How many blocks of this instance run at once on the current device (SMs × blocks per SM): the persistent
// grid's size. Asked of the runtime once per instance and device, not per append: the occupancy query costs
// microseconds of host time, and a benchmark's event-timed append (or a user's decode step) would wait for it
// with the GPU idle. The answer depends only on the kernel and the device, so caching it changes no launch.
template <unsigned D, unsigned DT, bool NC, bool QJL, bool kBatched>
cudaError_t fast_resident_blocks(std::uint32_t& resident) {
  static std::atomic<std::uint32_t> remembered[kRememberedDevices];  // 0: not asked yet on that device
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool remembers = device >= 0 && device < kRememberedDevices;
  if (remembers) {
    resident = remembered[device].load(std::memory_order_acquire);
    if (resident != 0) return cudaSuccess;
  }
  int sms = 0, per_sm = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, encode_fast_kernel<D, DT, NC, QJL, kBatched>,
                                                        kEncodeFastWarps * 32, fast_ring_bytes<DT>());
  }
  if (err != cudaSuccess) return err;
  resident = static_cast<std::uint32_t>(sms > 0 ? sms : 1) * static_cast<std::uint32_t>(per_sm > 0 ? per_sm : 1);
  if (remembers) remembered[device].store(resident, std::memory_order_release);  // racing stores write one value
  return cudaSuccess;
}

template <unsigned D, unsigned DT, bool NC, bool QJL, bool kBatched, unsigned N>
cudaError_t launch_fast_instance(const EncodeParams& p, const EncodeSegments<N>& batch, cudaStream_t stream) {
  std::uint32_t resident = 0;
  const cudaError_t err = fast_resident_blocks<D, DT, NC, QJL, kBatched>(resident);
  if (err != cudaSuccess) return err;
  const std::uint32_t wanted = (batch.total_steps + kEncodeFastWarps - 1) / kEncodeFastWarps;
  const std::uint32_t blocks = wanted < resident ? wanted : resident;
  // Its launch overlaps the tail of the kernel before it on the stream (the previous layer's decode in a step).
  const cudaError_t launched = kvcompact::cuda::detail::launch_after_previous(
      encode_fast_kernel<D, DT, NC, QJL, kBatched>, dim3(blocks), dim3(kEncodeFastWarps * 32), fast_ring_bytes<DT>(),
      stream, p, batch);
  return launched != cudaSuccess ? launched : cudaGetLastError();
}

// The dispatch from the parameters' head_dim, dtype and family to an instance; N = 1: the single-request one.
template <unsigned D, unsigned DT, unsigned N>
cudaError_t launch_fast_family(const EncodeParams& p, const EncodeSegments<N>& batch, cudaStream_t stream) {
  constexpr bool kBatched = N > 1;
  if (p.has_qjl != 0) {
    return p.norm_correction != 0 ? launch_fast_instance<D, DT, true, true, kBatched>(p, batch, stream)
                                  : launch_fast_instance<D, DT, false, true, kBatched>(p, batch, stream);
  }
  return p.norm_correction != 0 ? launch_fast_instance<D, DT, true, false, kBatched>(p, batch, stream)
                                : launch_fast_instance<D, DT, false, false, kBatched>(p, batch, stream);
}

template <unsigned D, unsigned N>
cudaError_t launch_fast_dtype(const EncodeParams& p, const EncodeSegments<N>& batch, cudaStream_t stream) {
  if (p.dtype == 0) return launch_fast_family<D, 0>(p, batch, stream);
  if (p.dtype == 1) return launch_fast_family<D, 1>(p, batch, stream);
  return launch_fast_family<D, 2>(p, batch, stream);
}

template <unsigned N>
cudaError_t launch_fast_segments(const EncodeParams& p, const EncodeSegments<N>& batch, cudaStream_t stream) {
  if (p.head_dim == 64) return launch_fast_dtype<64>(p, batch, stream);
  if (p.head_dim == 128) return launch_fast_dtype<128>(p, batch, stream);
  return launch_fast_dtype<256>(p, batch, stream);
}

// Copies the requests into the launch's parameter and numbers their steps; false when they total 2^31 or more.
template <unsigned N>
bool number_steps(const EncodeParams& p, const EncodeSegment* segments, std::uint32_t count, EncodeSegments<N>& batch) {
  batch.count = count;
  std::uint64_t steps = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    batch.segment[i] = segments[i];
    batch.segment[i].first_step = static_cast<std::uint32_t>(steps);
    steps += fast_encode_steps(segments[i].rows, p.head_dim, p.kv_heads);
    if (steps >= (1ull << 31)) return false;
  }
  batch.total_steps = static_cast<std::uint32_t>(steps);
  return true;
}

template <unsigned D, unsigned DT>
cudaError_t prepare_fast_dtype(bool has_qjl, bool norm_correction) {
  const auto set_one = [](auto kernel) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(fast_ring_bytes<DT>()));
  };
  const auto set = [&](auto single, auto batched) {  // both instances of a family
    const cudaError_t err = set_one(single);
    return err != cudaSuccess ? err : set_one(batched);
  };
  if (has_qjl) {
    return norm_correction ? set(encode_fast_kernel<D, DT, true, true, false>, encode_fast_kernel<D, DT, true, true, true>)
                           : set(encode_fast_kernel<D, DT, false, true, false>, encode_fast_kernel<D, DT, false, true, true>);
  }
  return norm_correction ? set(encode_fast_kernel<D, DT, true, false, false>, encode_fast_kernel<D, DT, true, false, true>)
                         : set(encode_fast_kernel<D, DT, false, false, false>, encode_fast_kernel<D, DT, false, false, true>);
}

template <unsigned D>
cudaError_t prepare_fast(bool has_qjl, bool norm_correction) {
  cudaError_t err = prepare_fast_dtype<D, 0>(has_qjl, norm_correction);
  if (err == cudaSuccess) err = prepare_fast_dtype<D, 1>(has_qjl, norm_correction);
  if (err == cudaSuccess) err = prepare_fast_dtype<D, 2>(has_qjl, norm_correction);
  return err;
}

std::uint64_t fast_steps(const EncodeParams& p) { return fast_encode_steps(p.rows, p.head_dim, p.kv_heads); }

}  // namespace

std::uint64_t fast_encode_steps(std::uint32_t rows, std::uint32_t head_dim, std::uint32_t kv_heads) {
  const std::uint64_t rows_per_step = 1024u / head_dim;
  return (rows + rows_per_step - 1) / rows_per_step * 2u * kv_heads;
}

EncodePath encode_path(const EncodeParams& p) {
  const bool dim = p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256;
  const bool aligned = ((reinterpret_cast<std::uintptr_t>(p.keys) | reinterpret_cast<std::uintptr_t>(p.values) |
                         reinterpret_cast<std::uintptr_t>(p.layer)) & 15u) == 0;
  const bool bits = p.key_code_bits >= 1 && p.key_code_bits <= 5 && p.value_bits >= 1 && p.value_bits <= 5;
  return dim && aligned && bits && p.dtype <= 2 && fast_steps(p) < (1ull << 31) ? EncodePath::Fast : EncodePath::General;
}

cudaError_t prepare_encode(std::uint32_t head_dim, bool has_qjl, bool norm_correction) {
  if (head_dim == 64) return prepare_fast<64>(has_qjl, norm_correction);
  if (head_dim == 128) return prepare_fast<128>(has_qjl, norm_correction);
  if (head_dim == 256) return prepare_fast<256>(has_qjl, norm_correction);
  return cudaSuccess;  // the general kernel sizes its shared memory per launch
}

cudaError_t launch_encode(const EncodeParams& p, cudaStream_t stream, bool force_general) {
  if (p.rows == 0 || p.kv_heads == 0) return cudaSuccess;  // nothing to encode (and no empty grid to launch)
  if (!force_general && encode_path(p) == EncodePath::Fast) {
    const EncodeSegment one{p.keys, p.values, p.status, p.seq, p.position, p.rows, 0};
    return launch_encode_batch(p, &one, 1, stream);
  }
  const std::uint64_t items = static_cast<std::uint64_t>(p.rows) * p.kv_heads * 2u;
  const std::uint64_t blocks = (items + kEncodeWarps - 1) / kEncodeWarps;
  if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;
  const std::size_t smem = sizeof(float) * 2u * kEncodeWarps * p.head_dim;
  if (smem > 48u * 1024u) {
    const cudaError_t err =
        cudaFuncSetAttribute(encode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const cudaError_t launched = kvcompact::cuda::detail::launch_after_previous(
      encode_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kEncodeWarps * 32), smem, stream, p);
  return launched != cudaSuccess ? launched : cudaGetLastError();
}

cudaError_t launch_encode_batch(const EncodeParams& p, const EncodeSegment* segments, std::uint32_t count,
                                cudaStream_t stream) {
  if (count == 0 || count > kEncodeBatchMax) return cudaErrorInvalidValue;
  if (count == 1 && p.device_lengths == nullptr) {  // (only the batched instance reads the device lengths)
    EncodeSegments<1> one;
    if (!number_steps(p, segments, 1, one)) return cudaErrorInvalidValue;
    return one.total_steps == 0 ? cudaSuccess : launch_fast_segments(p, one, stream);
  }
  EncodeBatch batch{};
  if (!number_steps(p, segments, count, batch)) return cudaErrorInvalidValue;
  return batch.total_steps == 0 ? cudaSuccess : launch_fast_segments(p, batch, stream);  // 0: only empty requests
}

}  // namespace kvcompact::cuda::tq::detail
