// Internal device helpers of the DeepSeek-V4 kernels: row decoders that mirror the CPU storage decoders
// (storage.cpp / core dtypes) value for value, the token's row arithmetic, and the mma.sync wrappers.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels_params.hpp"

namespace kvcompact::cuda::dsv4::detail {

__device__ __forceinline__ float bf16_bits_to_f32(std::uint32_t b16) { return __uint_as_float(b16 << 16); }

// OCP E4M3FN decode, as core/dtypes.hpp's fp8_e4m3_decode_bits (exact).
__device__ __forceinline__ float e4m3_to_f32(std::uint32_t c) {
  const std::uint32_t sign = (c & 0x80u) << 24;
  const std::uint32_t e = (c >> 3) & 0xFu;
  std::uint32_t m = c & 0x7u;
  if (e == 0xFu && m == 0x7u) return __uint_as_float(sign | 0x7FC00000u);
  if (e != 0) return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
  if (m == 0) return __uint_as_float(sign);
  const unsigned shift = static_cast<unsigned>(__clz(m)) - 28u;
  m = (m << shift) & 0x7u;
  return __uint_as_float(sign | ((121u - shift) << 23) | (m << 20));
}

__device__ __forceinline__ float e2m1_to_f32(std::uint32_t nibble) {
  constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMag[nibble & 7u];
  return (nibble & 8u) ? -m : m;
}

// Load 4 bytes from a 4-byte aligned address.
__device__ __forceinline__ std::uint32_t ld_u32(const std::uint8_t* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

// Indexer row value of dim d (exactly decode_indexer_row of storage.cpp).
__device__ __forceinline__ float indexer_value(const std::uint8_t* row, std::uint32_t storage, std::uint32_t d) {
  if (storage == kIdxBf16) {
    const std::uint32_t lo = row[2 * d], hi = row[2 * d + 1];
    return bf16_bits_to_f32(lo | (hi << 8));
  }
  if (storage == kIdxFp8) {
    const float scale = __uint_as_float(ld_u32(row + kIndexerDim));
    return __fmul_rn(e4m3_to_f32(row[d]), scale);
  }
  const int e = static_cast<int>(row[64 + d / 32]) - 127;
  const std::uint32_t byte = row[d / 2];
  const std::uint32_t nib = (d % 2 == 0) ? (byte & 0xFu) : (byte >> 4);
  return ldexpf(e2m1_to_f32(nib), e);
}

// Exponent of the lowest set bit of a finite non-zero float's value (v = odd * 2^result).
__device__ __forceinline__ int lowbit_exponent(float v) {
  const std::uint32_t bits = __float_as_uint(v) & 0x7FFFFFFFu;
  const std::uint32_t ex = bits >> 23;
  std::uint32_t mant = bits & 0x7FFFFFu;
  int base;
  if (ex == 0) {
    base = -149;
  } else {
    mant |= 0x800000u;
    base = static_cast<int>(ex) - 150;
  }
  return base + (__ffs(static_cast<int>(mant)) - 1);
}

// 2^e as a float, e clamped to the normal range [-126, 127] (callers that need e in range check it themselves;
// the clamp only keeps the bits a valid power of two).
__device__ __forceinline__ float pow2f(int e) {
  return __uint_as_float(static_cast<std::uint32_t>(min(max(e, -126), 127) + 127) << 23);
}

// Rows of a token: window count min(t + 1, 128), then the compressed rows of the layer.
__device__ __forceinline__ std::uint32_t window_count(std::int64_t t) {
  return static_cast<std::uint32_t>(t + 1 < kWindow ? t + 1 : kWindow);
}
// The compressed rows a token at position t >= 0 sees at ratio 0, 4 or 128 (the only ratios sparse_attention
// takes): shifts, not a 64-bit division, which would be a long software routine at the start of every block.
__device__ __forceinline__ std::uint64_t visible_rows(std::int64_t t, std::uint32_t ratio) {
  const auto n = static_cast<std::uint64_t>(t + 1);
  return ratio == 4 ? n >> 2 : ratio == 128 ? n >> 7 : 0u;
}
// The compressed rows of a token's attention list (ratio 4: at most topk), in 64 bits for the bound check below,
// and as the 32-bit count of a list within its bound.
__device__ __forceinline__ std::uint64_t compressed_rows(std::int64_t t, std::uint32_t ratio, std::uint32_t topk) {
  const std::uint64_t vis = visible_rows(t, ratio);
  return ratio == 4 && vis > topk ? topk : vis;
}
__device__ __forceinline__ std::uint32_t compressed_count(std::int64_t t, std::uint32_t ratio, std::uint32_t topk) {
  return static_cast<std::uint32_t>(compressed_rows(t, ratio, topk));
}

// Whether a token's (t + 1) / ratio visible rows exceed its call's host-side bound (max_visible, max_rows; the
// attention's list adds its window: attention_rows_beyond_bound below). Positions live in device memory, so the
// host cannot check them: a token beyond its call's bound (or with a negative position) reads and writes nothing
// past the bound, and its outputs say so (NaN scores and outputs, kTopkBeyondBound indices). Counted in 64 bits,
// so that a huge position cannot wrap to a small count.
__device__ __forceinline__ bool rows_beyond_bound(std::int64_t t, std::uint32_t ratio, std::uint32_t bound) {
  return t < 0 || static_cast<std::uint64_t>(t + 1) / ratio > bound;
}
// The same for the attention's list: the window's rows, then the compressed ones (ratio 4: at most topk; ratio 0,
// 4 or 128).
__device__ __forceinline__ bool attention_rows_beyond_bound(std::int64_t t, std::uint32_t ratio, std::uint32_t topk,
                                                            std::uint32_t bound) {
  if (t < 0) return true;
  const std::uint64_t window = t + 1 < kWindow ? static_cast<std::uint64_t>(t + 1) : kWindow;  // (window_count in 64 bits)
  return window + compressed_rows(t, ratio, topk) > bound;
}
__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7FC00000); }

// mma.sync wrappers (sm_80+; fp16 with f32 accumulation, s8 with s32 accumulation).
__device__ __forceinline__ void mma_f16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_s8(int (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix x4: four 8x8 b16 matrices, row addresses (16-byte aligned) from lanes 0-7, 8-15, 16-23, 24-31;
// register i of lane l holds row l / 4, elements 2 (l % 4), 2 (l % 4) + 1 of matrix i.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem_row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ldmatrix x4 transposed: four 8x8 b16 matrices, row addresses from lanes 0-7, 8-15, 16-23, 24-31.
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem_row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ std::uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&h);
}

// Two e4m3 codes (the low 16 bits of pair) as the bits of a half2, the low byte's value in the low half. Exact:
// every e4m3 value (at most 4 significant bits, magnitude 0 or in [2^-9, 448]) is an fp16 value.
__device__ __forceinline__ std::uint32_t e4m3x2_to_half2_bits(std::uint32_t pair) {
  std::uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(pair & 0xFFFFu)));
  return h2;
}

// The same for the low or the high two codes of a 32-bit word: the conversion reads the 16-bit half in place
// (F2FP's .H1 operand), where e4m3x2_to_half2_bits(word >> 16) spends a shift on it.
template <bool kHigh>
__device__ __forceinline__ std::uint32_t e4m3x2_half_of_word_to_half2_bits(std::uint32_t word) {
  std::uint32_t h2;
  if constexpr (kHigh) {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(h2) : "r"(word));
  } else {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(h2) : "r"(word));
  }
  return h2;
}

// Eight e4m3 codes (bytes of codes.x then codes.y, low byte first) times 2^e, rounded to fp16 value by value:
// four half2 words, code 2k in the low half of word k. The scalar reference of e4m3x8_scaled_to_half8, and its
// path for the rare exponents outside fp16; out of line, because a kernel that inlines it at every piece it
// decodes grows by thousands of instructions and stalls on instruction fetch (Nsight Compute, round 11).
static __device__ __noinline__ uint4 e4m3x8_scaled_to_half8_scalar(uint2 codes, int e) {
  float f[8];
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    f[b] = ldexpf(e4m3_to_f32((codes.x >> (8 * b)) & 0xFFu), e);
    f[4 + b] = ldexpf(e4m3_to_f32((codes.y >> (8 * b)) & 0xFFu), e);
  }
  return make_uint4(pack_half2(f[0], f[1]), pack_half2(f[2], f[3]), pack_half2(f[4], f[5]), pack_half2(f[6], f[7]));
}

// The same, bit for bit, for every e (e4m3x8_scaled_to_half8_scalar outside the fast range). Fast path for e in [-24, 15], where 2^e is an fp16 value (subnormal below -14): the codes
// convert exactly to fp16 and one mul.rn.f16x2 rounds x * 2^e to fp16. The scalar path also rounds that same
// real number once: with |x * 2^e| in [2^-33, 448 * 2^15] and 4 significant bits, ldexpf is exact in f32
// and only the cvt.rn to fp16 rounds. Both roundings are IEEE round-to-nearest-even with subnormals kept, so
// they agree on subnormal results, on underflow to zero (its sign the product's), on overflow to inf
// (|x * 2^e| >= 65520) and on -0 (-0 * 2^e = -0). The NaN codes 0x7F / 0xFF give NaN both ways; the bit
// pattern of that NaN is the hardware's, and the device self-test (fp8_decode_selftest.cu) checks it too.
// kHalvesInPlace: convert each word's high two codes in place (e4m3x2_half_of_word_to_half2_bits) instead of
// after a shift; the same bits. (The warpgroup attention kernel uses it: 56 shifts fewer in its SASS; in the
// mma.sync attention kernel ptxas then unrolls the decode differently and the kernel grows, so it keeps the shift.)
template <bool kHalvesInPlace = false>
__device__ __forceinline__ uint4 e4m3x8_scaled_to_half8(uint2 codes, int e) {
  if (e >= -24 && e <= 15) {
    const std::uint32_t p = e >= -14 ? static_cast<std::uint32_t>(e + 15) << 10 : 1u << (e + 24);
    const std::uint32_t p2 = p * 0x10001u;  // 2^e in both halves
    const __half2 s = *reinterpret_cast<const __half2*>(&p2);
    auto scaled = [&](std::uint32_t h) {
      const __half2 r = __hmul2_rn(*reinterpret_cast<const __half2*>(&h), s);
      return *reinterpret_cast<const std::uint32_t*>(&r);
    };
    if constexpr (kHalvesInPlace) {
      return make_uint4(scaled(e4m3x2_half_of_word_to_half2_bits<false>(codes.x)),
                        scaled(e4m3x2_half_of_word_to_half2_bits<true>(codes.x)),
                        scaled(e4m3x2_half_of_word_to_half2_bits<false>(codes.y)),
                        scaled(e4m3x2_half_of_word_to_half2_bits<true>(codes.y)));
    } else {
      return make_uint4(scaled(e4m3x2_to_half2_bits(codes.x)), scaled(e4m3x2_to_half2_bits(codes.x >> 16)),
                        scaled(e4m3x2_to_half2_bits(codes.y)), scaled(e4m3x2_to_half2_bits(codes.y >> 16)));
    }
  }
  // 2^e outside fp16 (blocks with amax below ~2^-16, and all-zero blocks, which carry e = -127).
  return e4m3x8_scaled_to_half8_scalar(codes, e);
}

// cp.async copies global -> shared without a register round trip (16 bytes: L2 only; 8 and 4: through L1).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
}
// The same, zero-filling the 16 bytes instead when bytes is 0 (gmem must still be a valid global address).
__device__ __forceinline__ void cp_async16_or_zero(void* smem, const void* gmem, unsigned bytes) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(a), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace kvcompact::cuda::dsv4::detail
