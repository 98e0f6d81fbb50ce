// The warpgroup prefill kernel's producer dequantisation (tq_prefill_wgmma.cu, head_dim 128) with the code width
// a compile-time constant: a staged tile's code bytes → an SW128 fp16 tile of α·centroids through a pair table.
//
// Why compile time: with the width a runtime value every group paid variable 64-bit shifts, a runtime row
// stride and two or three code loads plus a funnel shift; the producer's dequantisation was ≈ 28 instructions per
// group of 8 coordinates, and removing it altogether made the kernel 18 % faster while conflict-free lookups (the
// same instructions) gained nothing (docs/cuda-prefill.md, "Producer ablations"). Here a 4-bit group is one load,
// four byte permutes and four address LEAs for the pairs, four lookups and one store.
//
// Alignment: a token's codes are 16·bits bytes at head_dim 128, the layer is 16-byte aligned (prefill_attention
// checks) and every region starts at a multiple of 256 bytes (docs/formats.md), so a staged code region's first
// row starts 16-byte aligned in its staging buffer (staged_row0 − region = 0) and a group of 8 codes sits at byte
// tt · 16·bits + gg · bits: 4-byte aligned for 4 bits, 2-byte for 2 bits; 3 and 5 bits take two words and a
// funnel shift whose amount is fixed per thread.
#pragma once

#include <cstdint>

#include "wgmma.cuh"

namespace kvcompact::cuda::tq::detail::prefill {

// A thread's code groups: one group of 8 coordinates (8 · kBits bits, the first coordinate lowest) per token it
// handles, `at(step)` bytes past its first group (a multiple of 4 bytes: whole rows of 16·kBits bytes).
template <unsigned kBits>
struct CodeGroups {
  const std::uint8_t* first;  // the first group's byte (4-, 2- or 1-byte aligned for 4, 2 and 1 bits)
  std::uint32_t shift;        // 3 and 5 bits: the first group's bit offset in its aligned word (fixed per thread)

  __device__ __forceinline__ explicit CodeGroups(const std::uint8_t* group) {
    if constexpr (kBits == 3 || kBits == 5) {
      // (Stepping back by a byte count keeps the pointer's shared-memory provenance: loads stay LDS.)
      const std::uint32_t misalign = static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(group) & 3u);
      first = group - misalign;
      shift = 8u * misalign;
    } else {
      first = group;
      shift = 0;
    }
  }
  __device__ __forceinline__ std::uint64_t at(std::uint32_t step) const {
    if constexpr (kBits == 4) {
      return *reinterpret_cast<const std::uint32_t*>(first + step);
    } else if constexpr (kBits == 2) {
      return *reinterpret_cast<const unsigned short*>(first + step);
    } else if constexpr (kBits == 1) {
      return first[step];
    } else {  // 3 or 5 bits: the group spans at most two aligned words (3 + 5 bytes ≤ 8)
      const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(first + step);
      return (w[0] | (std::uint64_t{w[1]} << 32)) >> shift;
    }
  }
};

// The pair-table entries of a group's four coordinate pairs: pair k is the 2·kBits bits at 2k·kBits (entry = code
// of the higher coordinate · 2^kBits + code of the lower one). For 4 bits the pairs are the group's bytes, each
// taken by one byte permute (the table lookup's scaled address then costs one LEA).
template <unsigned kBits>
__device__ __forceinline__ void pair_entries(std::uint64_t bits, std::uint32_t (&e)[4]) {
  if constexpr (kBits == 4) {
    const std::uint32_t x = static_cast<std::uint32_t>(bits);
#pragma unroll
    for (unsigned k = 0; k < 4; ++k) e[k] = __byte_perm(x, 0u, 0x4440u + k);
  } else {
    constexpr std::uint64_t kMask = (std::uint64_t{1} << (2u * kBits)) - 1u;
#pragma unroll
    for (unsigned k = 0; k < 4; ++k) e[k] = static_cast<std::uint32_t>((bits >> (2u * k * kBits)) & kMask);
  }
}

// Dequantises a staged 64-token tile (kTokens rows of 16·kBits code bytes from `codes`, 16-byte aligned) into an
// SW128 fp16 tile by the producer's kThreads threads: thread pt takes groups gg = pt % 16 of tokens pt / 16 + j ·
// (kThreads / 16), so its loads and stores step by compile-time offsets.
template <unsigned kBits, unsigned kTokens, unsigned kThreads>
__device__ __forceinline__ void dequant_tile_fixed(unsigned pt, std::uint8_t* tile, const std::uint8_t* codes,
                                                   const std::uint32_t* pairs) {
  constexpr unsigned kD = 128, kGroups = kD / 8, kRowBytes = kD * kBits / 8;
  constexpr unsigned kTokenStep = kThreads / kGroups;
  static_assert(kThreads % kGroups == 0 && kTokens % kTokenStep == 0, "whole rounds");
  const unsigned gg = pt % kGroups, tt0 = pt / kGroups;
  const CodeGroups<kBits> groups(codes + tt0 * kRowBytes + gg * kBits);
#pragma unroll
  for (unsigned j = 0; j < kTokens / kTokenStep; ++j) {
    std::uint32_t e[4];
    pair_entries<kBits>(groups.at(j * kTokenStep * kRowBytes), e);
    *reinterpret_cast<uint4*>(tile + sw128_offset(tt0 + j * kTokenStep, gg * 8, kTokens)) =
        make_uint4(pairs[e[0]], pairs[e[1]], pairs[e[2]], pairs[e[3]]);
  }
}

}  // namespace kvcompact::cuda::tq::detail::prefill
