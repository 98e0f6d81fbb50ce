// The row check of the FP8 indexer rows' tensor-core path (indexer_scores_wgmma.cu), on the stored e4m3 codes,
// four per 32-bit word. Plain constexpr C++ so that the host tests can run it over every code.
//
// Why a fixed threshold suffices. The encoder (dsv4/storage.cpp encode_indexer_row, and the GPU compressor's
// emission, byte for byte) scales a row by 2^k with amax / 2^k in (224, 448]. A model row is on the FP4 grid
// (values with at most two significant bits), and the only such values in (224, 448] are 256 and 384: the
// largest code of every model row has exponent E = 8. The general 16-bit check (indexer_rows16.cuh) asks for
// at most two significant bits and every nonzero magnitude >= 2^(E - 6), which for E = 8 is exactly:
//   every code is 0, or its magnitude is at least 4 (e4m3 byte 0x48) with the two low mantissa bits clear.
// That condition alone, whatever the row's real largest value, makes every value a multiple of 2 below 2^9, which
// is all the exactness argument of the MMA needs (the general check's bounds with E = 8:
// docs/cuda-dsv4-kernels.md), so the kernel checks it without finding the row's largest and smallest values. It
// accepts the same encoder rows as the general check (an all-zero row, exact at any exponent, is then bounded as
// if E were 8), and sends the rest (rows whose largest code is below 256, which the encoder does not write for
// a nonzero FP4-grid row, and rows off the grid) to the scalar path.
//
// Per word, four instructions for four codes (m = the magnitudes, 7 bits per byte, so no add below carries
// into the next byte):
//   at_least = m + 0x3B  bit 7: m >= 0x45;  bits 0-1: (m - 1) mod 4
//   nonzero  = m + 0x7C  bit 7: m >= 4;     bits 0-1: m mod 4
//   failures |= nonzero & ~at_least
// A byte's bit 7 of the result is set for 4 <= m < 0x45 (too small), its bits 0-1 are nonzero exactly when
// m mod 4 != 0 (for m mod 4 = 1, 2, 3 the pair (at_least, nonzero) is (00, 01), (01, 10), (10, 11): some bit
// has at_least 0 and nonzero 1; for m mod 4 = 0 it is (11, 00)); m = 1, 2, 3 fail by their low bits, and
// 0x45 <= m < 0x48 too. So a row is on the path when no bit of kFp8GridFailMask is set in the OR over its words.
#pragma once

#include <cstdint>

namespace kvcompact::cuda::dsv4::detail {

inline constexpr std::uint32_t kFp8GridFailMask = 0x83838383u;
// The exponent E of the largest code that the check implies for the exactness bounds (fp8_row_scale_check).
inline constexpr int kFp8GridTopExponent = 8;

// failures | the failure bits of the four e4m3 codes in word (see above).
constexpr std::uint32_t fp8_grid_failures(std::uint32_t failures, std::uint32_t word) {
  const std::uint32_t m = word & 0x7F7F7F7Fu;
  const std::uint32_t at_least = m + 0x3B3B3B3Bu, nonzero = m + 0x7C7C7C7Cu;
  return failures | (nonzero & ~at_least);
}

// The condition itself, for one code (the tests' reference).
constexpr bool fp8_code_on_grid(std::uint8_t code) {
  const unsigned m = code & 0x7Fu;
  return m == 0 || (m >= 0x48u && (m & 3u) == 0);
}

}  // namespace kvcompact::cuda::dsv4::detail
