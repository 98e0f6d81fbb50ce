// The warpgroup prefill kernel's producer dequantisation (tq_prefill_wgmma.cu, head_dim 128) with the code width
// a compile-time constant: a staged tile's code bytes → an SW128 fp16 tile of α·centroids through a pair table.
//
// Why compile time: with the width a runtime value every group paid variable 64-bit shifts, a runtime row
// stride and two or three code loads plus a funnel shift; the producer's dequantisation was ≈ 28 instructions per
// group of 8 coordinates, and removing it altogether made the kernel 18 % faster while conflict-free lookups (the
// same instructions) gained nothing (docs/cuda-prefill.md, "Ablations, and the producer's dequantisation by code
// width"). Here a 4-bit group is one load, four byte permutes and four address LEAs for the pairs, four lookups and
// one store.
//
// Alignment: a token's codes are 16·bits bytes at head_dim 128, the layer is 16-byte aligned (prefill_attention
// checks) and every region starts at a multiple of 256 bytes (docs/formats.md), so a staged code region's first
// row starts 16-byte aligned in its staging buffer (staged_row0 − region = 0) and a group of 8 codes sits at byte
// tt · 16·bits + gg · bits: 4-byte aligned for 4 bits, 2-byte for 2 bits; 3 and 5 bits take two words and a
// funnel shift whose amount is fixed per thread.
#pragma once

#include <cstdint>

#include "prefill_codes.hpp"
#include "wgmma.cuh"

namespace kvcompact::cuda::tq::detail::prefill {

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
