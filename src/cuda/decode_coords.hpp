// Internal: the coordinate orders of the fused decode kernel's MMAs and the register dequantisation of 2-bit
// codes (tq_decode.cu). Host-compilable (plain C++ when not built by nvcc), so the index math is unit-tested
// on the CPU (tests/cuda/decode_coords_test.cpp), where CI runs it.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KVC_HD __host__ __device__
#else
#define KVC_HD
#endif

namespace kvcompact::cuda::tq::detail {

// PTX prmt.b32 in its default mode (CUDA's __byte_perm): byte i of the result is byte (s >> 4i) & 7 of the
// eight bytes {y:x} (selector values below 8 only; the sign-replicate bit is never used here).
KVC_HD inline std::uint32_t byte_perm(std::uint32_t x, std::uint32_t y, std::uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const std::uint64_t xy = (static_cast<std::uint64_t>(y) << 32) | x;
  std::uint32_t r = 0;
  for (unsigned i = 0; i < 4; ++i) r |= static_cast<std::uint32_t>((xy >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  return r;
#endif
}

// 2-bit values are dequantised from registers, not shared memory: the four fp16 centroids' low bytes in one
// register and high bytes in another. From a word of sixteen codes (code i at bits 2i),
// n = (w >> 2j) & 0x33333333 holds codes j, j + 2, ..., j + 14 in its nibbles; a byte permute of each table by
// n's low four nibbles gives four low / high bytes, and a third permute interleaves two of them into a half2:
// (j, j + 2) or (j + 4, j + 6) (then n >> 16 for j + 8 ... j + 14). That fixes the coordinate order of
// value_first below.
// Nibble selector of codes j + 2i (i = 0..3), from the low (upper = false) or high eight codes of the word.
KVC_HD inline std::uint32_t nibble_codes(std::uint32_t w, unsigned j, bool upper) {
  const std::uint32_t n = (w >> (2 * j)) & 0x33333333u;
  return upper ? n >> 16 : n;
}
// half2 (as raw bits, low half first) of the codes in nibbles 0, 1 (second = false) or 2, 3 (second = true).
KVC_HD inline std::uint32_t dequant2(std::uint32_t sel, bool second, std::uint32_t lo, std::uint32_t hi) {
  const std::uint32_t l = byte_perm(lo, lo, sel), h = byte_perm(hi, hi, sel);
  return byte_perm(l, h, second ? 0x7362 : 0x5140);
}

// Coordinate (inside a lane's key slice) of slot e ∈ {0, 1, 2, 3} of k-step kk of the score MMA: slots 0, 1 are
// the A fragment's a0 / a1 half2 and slots 2, 3 its a2 / a3. Any permutation works when the query's B fragment
// uses the same one; 4kk + e makes a lane's codes over all k-steps one contiguous slice, read in order.
template <int CB>
KVC_HD constexpr unsigned key_coord(unsigned kk, unsigned e) {
  return 4 * kk + e;
}
// 2- and 4-bit keys are looked up one code byte at a time (a code-byte table: 2-bit codes give slots 0..3 of
// k-step kk as one uint2 entry, 4-bit codes slots 0, 1 and 2, 3 as two half2 entries). The byte of the slice
// (word, byte inside the word) that holds slots `first_slot`, ... of k-step kk:
struct KeyByteSource {
  unsigned word, byte;
};
template <int CB>
KVC_HD constexpr KeyByteSource key_byte_source(unsigned kk, unsigned first_slot) {
  const unsigned bit = CB * key_coord<CB>(kk, first_slot);
  return {bit / 32, (bit % 32) / 8};
}
// Coordinates (inside a lane group's value slice of D / 8 coordinates) of rows g (value_first) and g + 8
// (value_first + value_second_offset) of output block jb of the P·V MMA. 2-bit values: block jb of a word's
// sixteen codes (w = jb / 8) uses j = (jb % 8) / 4 and pair q = jb % 4 of the nibble selector; a slice of eight
// codes (d = 64) uses j = jb / 2, q = jb % 2.
template <int D, int VB>
KVC_HD constexpr unsigned value_first(unsigned jb) {
  return VB != 2 ? 2 * jb : (D / 8 >= 16 ? 16 * (jb / 8) + (jb % 8) / 4 + 4 * (jb % 4) : jb / 2 + 4 * (jb % 2));
}
template <int VB>
KVC_HD constexpr unsigned value_second_offset() {
  return VB == 2 ? 2u : 1u;
}
// The dequant2 call of value block jb (2-bit values) for a lane group's slice: word, j, upper, second.
template <int D>
struct ValuePairSource {
  unsigned word, j;
  bool upper, second;
};
template <int D>
KVC_HD constexpr ValuePairSource<D> value_pair_source(unsigned jb) {
  constexpr bool wide = D / 8 >= 16;  // a lane group's slice has ≥ 16 codes (whole words)
  const unsigned q = wide ? jb % 4 : jb % 2;
  return {wide ? jb / 8 : 0u, wide ? (jb % 8) / 4 : jb / 2, q >= 2, (q % 2) != 0};
}

}  // namespace kvcompact::cuda::tq::detail

#undef KVC_HD
