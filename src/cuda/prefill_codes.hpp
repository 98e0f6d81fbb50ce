// Internal: the warpgroup prefill producer's code arithmetic (prefill_dequant.cuh) — which four code groups of a
// staged tile a producer thread takes, how it loads them and which pair-table entries they look up.
// Host-compilable (plain C++ when not built by nvcc), so that it is unit-tested on the CPU against the codec's
// read_code (tests/cuda/prefill_codes_test.cpp).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KVC_CODES_HD __host__ __device__ __forceinline__
#else
#define KVC_CODES_HD inline
#endif

namespace kvcompact::cuda::tq::detail::prefill {

// At head_dim 128 a token's codes are 16 groups of 8 coordinates, 16·kBits bytes. A producer thread takes one
// *quad* — four consecutive groups, 4·kBits bytes, 4-byte aligned — of every 32nd token, so it loads its quad in
// kBits words (one 16-byte load for 4 bits, one 8-byte load for 2) and finds every code at a compile-time bit
// offset: no per-thread shifts. quad_slot says which quad (below).
constexpr unsigned kQuadGroups = 4;

struct QuadSlot {
  unsigned token;  // the first token (of 32) whose quad this thread takes
  unsigned quad;   // which quad of the row: groups 4 quad … 4 quad + 3
};
// Thread pt = 8 u + v (quarter-warp u, lane v) takes token 4 ⌊u/2⌋ + ⌊v/2⌋ (four consecutive tokens per quarter-warp)
// and quad 2 ((u + ⌊v/4⌋) mod 2) + v mod 2: in each quarter-warp the two even tokens take quads {0, 1} and {2, 3}, the
// two odd ones likewise. So neither side of the copy conflicts in shared memory:
//   - its 16-byte loads (4-bit codes: rows of 64 bytes) hit 8 distinct 16-byte bank slots, (token mod 2, quad);
//   - its 16-byte stores of a group g of the quad go to the SW128 chunk position (4 (quad mod 2) + g) XOR (token mod
//     8), distinct for four consecutive tokens and quads {0, 1} or {2, 3} (the two 64-column blocks share positions).
// (Measured on the H200: the plain mapping, quad pt % 4 of token pt / 4, whose stores conflict two ways, was 3.5 %
// slower in the Fast precision; docs/cuda-prefill.md.) The 3-bit and 2-bit loads of a warp are conflict-free too.
KVC_CODES_HD QuadSlot quad_slot(unsigned pt) {
  const unsigned u = pt / 8, v = pt % 8;
  return {4 * (u / 2) + v / 2, 2 * ((u + v / 4) % 2) + v % 2};
}

// A quad of code groups (32 coordinates, the first lowest) as kBits little-endian words.
template <unsigned kBits>
struct CodeQuad {
  static_assert(kBits >= 1 && kBits <= 5, "code widths 1..5");
  std::uint32_t w[kBits];

  // `quad`: the quad's first byte, 4-byte aligned (16-byte for 4 bits, 8-byte for 2: rows and quads are whole
  // multiples of that at head_dim 128, and the staged rows start 16-byte aligned: prefill_dequant.cuh).
  KVC_CODES_HD explicit CodeQuad(const std::uint8_t* quad) {
#ifdef __CUDA_ARCH__
    if constexpr (kBits == 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(quad);
      w[0] = v.x;
      w[1] = v.y;
      w[2] = v.z;
      w[3] = v.w;
    } else if constexpr (kBits == 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(quad);
      w[0] = v.x;
      w[1] = v.y;
    } else {
      load_words(quad);
    }
#else
    load_words(quad);
#endif
  }

  KVC_CODES_HD void load_words(const std::uint8_t* quad) {
    for (unsigned i = 0; i < kBits; ++i) w[i] = reinterpret_cast<const std::uint32_t*>(quad)[i];
  }

  // The pair-table entry of coordinates 2k, 2k + 1 of the quad (k < 16): the 2·kBits bits at 2k·kBits, i.e. code
  // of the higher coordinate · 2^kBits + code of the lower one. A pair that straddles two words (3 and 5 bits)
  // takes a funnel shift.
  KVC_CODES_HD std::uint32_t pair(unsigned k) const {
    constexpr std::uint32_t kMask = (1u << (2u * kBits)) - 1u;
    const unsigned bit = 2u * k * kBits, i = bit / 32u, off = bit % 32u;
    if (off + 2u * kBits <= 32u) return (w[i] >> off) & kMask;
    return ((w[i] >> off) | (w[i + 1] << (32u - off))) & kMask;
  }
};

}  // namespace kvcompact::cuda::tq::detail::prefill

#undef KVC_CODES_HD
