// Device helpers of the indexer's 16-bit tensor-core paths (indexer_scores.cu, indexer_scores_wgmma.cu): the two
// row formats, the row check that makes their MMAs exact (BF16 rows; FP8 rows take the equivalent fixed grid check
// of fp8_grid_check.hpp on their codes), the query codes as 16-bit pairs, and the bf16 MMA.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels_device.cuh"

namespace kvcompact::cuda::dsv4::detail {

// 16-bit float formats of key rows fed to the tensor cores (f32 accumulation): BF16 rows as stored, FP8 rows
// widened to f16 (exactly: e4m3 values are f16 values).
struct Bf16Bits {
  static constexpr int kMantissa = 7, kBias = 127, kMinE = -120, kMaxE = 100;
};
struct F16Bits {
  static constexpr int kMantissa = 10, kBias = 15, kMinE = -8, kMaxE = 15;
};

// The row check for the tensor-core path: every value has at most two significant bits (mantissa bits below the
// top one clear: the FP4 grid of the model's rows) and every nonzero magnitude is at least 2^(E-6), where
// E = floor(log2 amax) is normal and in [kMinE, kMaxE]. Then every value is a multiple of 2^(E-7) below 2^(E+1) in
// magnitude; with integer query codes |c| <= 127 each product c x is a multiple of 2^(E-7) below 2^(E+8), and
// every partial sum of the 128 products a multiple of 2^(E-7) below 2^(E+15): 22 significant bits, exact in f32
// with two bits to spare. The tensor core's products are exact and its f32 accumulation, which aligns the addends
// to the largest and keeps f32 width, then drops no set bit, so the MMA gives q.k / 2^fq (over the row scale for
// FP8) exactly. (The tests check every score's bits against the CPU, with rows that fill the 22 bits.) Per word of
// two values this costs three and a half instructions: the magnitude bits (one mask); the largest and the smallest
// nonzero magnitude by 16-bit integer max / min (non-negative bit patterns order as their values; NaN and infinity
// lie above every finite one), the latter on magnitude + 0x7FFF, which sends 0 to the top (0x7FFF as a signed
// 16-bit lane) and carries into no other lane (magnitudes are below 0x8000); and one three-input OR per two words,
// masked to the low mantissa bits once at the end. The check runs in three steps, so that a kernel can spread a
// row over several lanes and finish it in one: row_check_parts over a lane's words, merged across the lanes that
// hold the row (RowCheckParts::merge, shuffled), then row_check_finish, which returns E (0 for an all-zero row)
// and clears ok when the row fails. row_check_16bit does all three for a row split over two lanes.
struct RowCheckParts {
  int amax;                // the largest magnitude's bits
  int smin;                // the smallest nonzero magnitude's bits - 0x8001 (0x7FFF: none)
  std::uint32_t low_bits;  // the OR of the values' low mantissa bits
  __device__ __forceinline__ void merge(const RowCheckParts& o) {
    amax = max(amax, o.amax);
    smin = min(smin, o.smin);
    low_bits |= o.low_bits;
  }
  __device__ __forceinline__ RowCheckParts from_lane_xor(unsigned apart) const {
    return RowCheckParts{__shfl_xor_sync(0xFFFFFFFFu, amax, apart), __shfl_xor_sync(0xFFFFFFFFu, smin, apart),
                         __shfl_xor_sync(0xFFFFFFFFu, low_bits, apart)};
  }
};

template <typename Format, int kWords>
__device__ __forceinline__ RowCheckParts row_check_parts(const std::uint32_t (&words)[kWords]) {
  static_assert(kWords % 4 == 0, "two accumulators of word pairs");
  constexpr std::uint32_t kLow = (1u << (Format::kMantissa - 1)) - 1u, kLowMask = kLow | (kLow << 16);
  std::uint32_t largest[2] = {0u, 0u}, smallest[2] = {0x7FFF7FFFu, 0x7FFF7FFFu}, any_bits = 0u;
#pragma unroll
  for (int k = 0; k < kWords; k += 2) {
    const std::uint32_t m0 = words[k] & 0x7FFF7FFFu, m1 = words[k + 1] & 0x7FFF7FFFu;
    largest[k / 2 % 2] = __vimax3_s16x2(m0, m1, largest[k / 2 % 2]);
    smallest[k / 2 % 2] = __vimin3_s16x2(m0 + 0x7FFF7FFFu, m1 + 0x7FFF7FFFu, smallest[k / 2 % 2]);
    any_bits |= words[k] | words[k + 1];  // (one three-input OR; the mask is applied once, below)
  }
  const std::uint32_t l2 = __vimax3_s16x2(largest[0], largest[1], largest[1]);
  const std::uint32_t s2 = __vimin3_s16x2(smallest[0], smallest[1], smallest[1]);
  return RowCheckParts{max(static_cast<int>(l2 & 0xFFFFu), static_cast<int>(l2 >> 16)),
                       min(static_cast<int>(static_cast<std::int16_t>(s2 & 0xFFFFu)),
                           static_cast<int>(static_cast<std::int16_t>(s2 >> 16))),
                       any_bits & kLowMask};
}

template <typename Format>
__device__ __forceinline__ int row_check_finish(const RowCheckParts& c, bool& ok) {
  if (c.amax == 0) return 0;  // all zeros: exact at any exponent
  constexpr int kExpAll = (0x7FFF >> Format::kMantissa);  // exponent field of infinity and NaN
  const int ex = c.amax >> Format::kMantissa;              // biased exponent; 0: subnormal
  const int e = ex - Format::kBias;
  const int smallest_nonzero = c.smin + 0x8001;  // (smin is not 0x7FFF: some value is nonzero)
  ok = ok && ex != 0 && ex != kExpAll && e >= Format::kMinE && e <= Format::kMaxE && c.low_bits == 0u &&
       smallest_nonzero >= ((e - 6 + Format::kBias) << Format::kMantissa);
  return e;
}

// The whole check of a row split over two lanes: this lane's 32 words, the partner lane (lane ^ 1) the rest.
template <typename Format>
__device__ __forceinline__ int row_check_16bit(const std::uint32_t (&words)[32], bool& ok) {
  RowCheckParts c = row_check_parts<Format>(words);
  c.merge(c.from_lane_xor(1));
  return row_check_finish<Format>(c, ok);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two int8 query codes (the bytes of pair; exact in bf16 and f16: |c| <= 127) as a 16-bit pair, the low byte's
// in the low half, without conversion instructions (at batch 1 a block scores one or two tiles, and 64 int-to-
// float conversions per thread on the quarter-rate conversion pipe were a visible part of that):
// - bf16: the float bits 0x4B400000 + c are 1.5 * 2^23 + c; minus 1.5 * 2^23 that is c exactly, and the high
//   half of c's float bits is c's bf16 (c has at most 7 significant bits).
// - f16: f16 bits 0x6600 + c (per 16-bit lane, c sign-extended; no carry crosses lanes) are 1536 + c, exact in
//   f16 (ulp 1 on [1024, 2048)); one packed subtract of 1536 leaves c.
template <typename Format>
__device__ __forceinline__ std::uint32_t codes_to_16bit_pair(std::uint32_t pair) {
  // (Not __byte_perm's sign-replicating selectors: it ignores the top bit of each selector nibble.)
  const int lo = static_cast<std::int8_t>(pair & 0xFFu), hi = static_cast<std::int8_t>((pair >> 8) & 0xFFu);
  if constexpr (Format::kMantissa == Bf16Bits::kMantissa) {
    const float flo = __fsub_rn(__int_as_float(0x4B400000 + lo), 12582912.0f);
    const float fhi = __fsub_rn(__int_as_float(0x4B400000 + hi), 12582912.0f);
    return __byte_perm(__float_as_uint(flo), __float_as_uint(fhi), 0x7632u);
  } else {
    const std::uint32_t lanes = (static_cast<std::uint32_t>(lo) & 0xFFFFu) | (static_cast<std::uint32_t>(hi) << 16);
    const std::uint32_t biased = __viaddmax_s16x2(lanes, 0x66006600u, 0x80008000u);  // per-lane add (max is a no-op)
    const __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&biased), __half2half2(__ushort_as_half(0x6600u)));
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

}  // namespace kvcompact::cuda::dsv4::detail
