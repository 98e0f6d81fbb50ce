// Element types of KV data (f32, bf16, IEEE half, OCP fp8 E4M3FN, fp4 E2M1) and their scalar conversions.
// The per-element conversions are constexpr inline so row loops compile to straight-line code; every
// encoder rounds to nearest, ties to even. Saturation and NaN rules are listed per function and in docs/core.md.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/core/error.hpp"

namespace kvcompact {

enum class DType : std::uint8_t { F32, F16, BF16, F8E4M3, F4E2M1 };

// "f32", "f16", "bf16", "fp8_e4m3", "fp4_e2m1"; "unknown" for a value outside the enum (e.g. a corrupt byte).
std::string_view dtype_name(DType type);

// Inverse of dtype_name (exact, case-sensitive); InvalidArgument naming the text and the accepted names.
Result<DType> parse_dtype(std::string_view name);

// Storage bits of one element: 32, 16, 16, 8, 4. A value outside the enum is a bug (asserts).
constexpr std::uint32_t dtype_bits(DType type) {
  switch (type) {
    case DType::F32: return 32;
    case DType::F16: return 16;
    case DType::BF16: return 16;
    case DType::F8E4M3: return 8;
    case DType::F4E2M1: return 4;
  }
  KVC_ASSERT(false, "dtype_bits: DType value outside the enum");
  return 0;
}

namespace detail {

// v >> s rounded to nearest, ties to even; 1 <= s <= 31.
constexpr std::uint32_t shift_right_rne(std::uint32_t v, unsigned s) {
  const std::uint32_t q = v >> s;
  const std::uint32_t rem = v & ((1u << s) - 1u);
  const std::uint32_t half = 1u << (s - 1u);
  return q + static_cast<std::uint32_t>(rem > half || (rem == half && (q & 1u) != 0));
}

// Code (without sign) of the minifloat with MANT mantissa bits and exponent bias BIAS nearest to the
// non-negative float whose bits are `a`. The caller has already handled NaN, inf and values that
// overflow or saturate, so `a` is finite and the result fits the format's finite codes.
// Working on the bits means the rounding carry walks from mantissa into exponent by itself.
template <unsigned MANT, unsigned BIAS>
constexpr std::uint32_t encode_minifloat_magnitude(std::uint32_t a) {
  constexpr std::uint32_t kMinNormalBits = (127u - BIAS + 1u) << 23;
  if (a >= kMinNormalBits) {
    // Re-bias the exponent in place, then drop the low mantissa bits with rounding.
    return shift_right_rne(a - ((127u - BIAS) << 23), 23u - MANT);
  }
  const std::uint32_t e = a >> 23;
  if (e == 0) return 0;  // zero and f32 subnormals are far below half the smallest target subnormal
  // Target subnormal quantum is 2^(1-BIAS-MANT); value / quantum = m24 * 2^(e - 151 + BIAS + MANT).
  const unsigned s = 151u - BIAS - MANT - e;
  if (s > 24u) return 0;  // value < quantum / 2
  const std::uint32_t m24 = (a & 0x7FFFFFu) | 0x800000u;
  return shift_right_rne(m24, s);
}

}  // namespace detail

// ---- bfloat16 -------------------------------------------------------------------------------------
// Rounds to nearest even; values at or beyond max + half an ulp become +-inf (IEEE overflow).
// NaN stays NaN with its sign and top payload bits, and is made quiet.
constexpr std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// Exact widening: the bf16 bits become the top half of the float (a signalling NaN is not quietened).
constexpr float bf16_to_f32(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

// ---- IEEE binary16 ----------------------------------------------------------------------------------
// Full IEEE half: subnormals, +-inf at or beyond 65520 (max 65504 + half an ulp), NaN kept as a quiet NaN
// with its sign and top payload bits.
constexpr std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520.0f, or inf
  return static_cast<std::uint16_t>(sign | detail::encode_minifloat_magnitude<10, 15>(a));
}

// Exact; subnormals are normalised, NaN comes back as a quiet NaN with the same sign.
constexpr float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu;
  std::uint32_t m = h & 0x3FFu;
  if (e == 0x1Fu) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13) | (m != 0 ? 0x400000u : 0u));
  if (e != 0) return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return std::bit_cast<float>(sign);
  // Subnormal m * 2^-24: move the leading one up to the implicit-bit position (bit 10).
  const unsigned shift = static_cast<unsigned>(std::countl_zero(m)) - 21u;
  m = (m << shift) & 0x3FFu;
  return std::bit_cast<float>(sign | ((113u - shift) << 23) | (m << 13));
}

// ---- fp8 E4M3FN (OCP) --------------------------------------------------------------------------------
// Bias 7, no infinities, NaN = 0x7F / 0xFF, largest finite 448, smallest subnormal 2^-9.
// Chosen rules: finite values beyond 448 and +-inf saturate to +-448 (0x7E / 0xFE) instead of becoming
// NaN, because a KV cache must never turn a large but real activation into NaN. NaN -> NaN (0x7F or 0xFF
// by sign).
constexpr std::uint8_t f32_to_fp8_e4m3(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint8_t>(sign | 0x7Fu);
  if (a >= 0x43E00000u) return static_cast<std::uint8_t>(sign | 0x7Eu);  // >= 448.0f, or inf
  return static_cast<std::uint8_t>(sign | detail::encode_minifloat_magnitude<3, 7>(a));
}

namespace detail {
constexpr float fp8_e4m3_decode_bits(std::uint8_t c) {
  const std::uint32_t sign = static_cast<std::uint32_t>(c & 0x80u) << 24;
  const std::uint32_t e = (c >> 3) & 0xFu;
  std::uint32_t m = c & 0x7u;
  if (e == 0xFu && m == 0x7u) return std::bit_cast<float>(sign | 0x7FC00000u);
  if (e != 0) return std::bit_cast<float>(sign | ((e + 120u) << 23) | (m << 20));
  if (m == 0) return std::bit_cast<float>(sign);
  const unsigned shift = static_cast<unsigned>(std::countl_zero(m)) - 28u;  // leading one to bit 3
  m = (m << shift) & 0x7u;
  return std::bit_cast<float>(sign | ((121u - shift) << 23) | (m << 20));
}

inline constexpr std::array<float, 256> kFp8E4M3ToF32 = [] {
  std::array<float, 256> table{};
  for (unsigned c = 0; c < 256; ++c) table[c] = fp8_e4m3_decode_bits(static_cast<std::uint8_t>(c));
  return table;
}();

inline constexpr std::array<float, 16> kFp4E2M1ToF32 = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
}  // namespace detail

// Exact; 0x7F / 0xFF decode to a quiet NaN of that sign.
constexpr float fp8_e4m3_to_f32(std::uint8_t code) { return detail::kFp8E4M3ToF32[code]; }

// ---- fp4 E2M1 -----------------------------------------------------------------------------------------
// Code: bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa; magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
// The result is in the low 4 bits. Chosen rules: |x| beyond 6 and +-inf saturate to +-6; NaN has no code
// in this format and becomes +0 (code 0x0) — callers that must notice NaN check for it before encoding.
constexpr std::uint8_t f32_to_fp4_e2m1(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 28) & 0x8u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0;
  if (a >= 0x40C00000u) return static_cast<std::uint8_t>(sign | 0x7u);  // >= 6.0f, or inf
  return static_cast<std::uint8_t>(sign | detail::encode_minifloat_magnitude<1, 1>(a));
}

// Exact. Only the low 4 bits of `code` are read, so a packed byte's high nibble may be passed as is
// after shifting (code >> 4) and the low nibble without masking.
constexpr float fp4_e2m1_to_f32(std::uint8_t code) { return detail::kFp4E2M1ToF32[code & 0xFu]; }

// ---- bulk row conversions -------------------------------------------------------------------------------
// Convert n elements of `src_type` (F32, F16, BF16 or F8E4M3; one element per 4/2/2/1 bytes, any alignment)
// to float. F4E2M1 is Unsupported here because its nibble packing belongs to the format that stores it.
// Buffers must not overlap. n == 0 is always ok; a null pointer with n > 0 is InvalidArgument.
Status convert_to_f32(DType src_type, const void* src, float* dst, std::size_t n);

// The reverse: n floats to `dst_type` (F32, F16, BF16 or F8E4M3) with the encoders above.
Status convert_from_f32(DType dst_type, const float* src, void* dst, std::size_t n);

}  // namespace kvcompact
