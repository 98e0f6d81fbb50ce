// The warpgroup prefill kernel's producer dequantisation (tq_prefill_wgmma.cu, head_dim 128) with the code width
// a compile-time constant: a staged tile's code bytes → an SW128 fp16 tile of α·centroids through a pair table.
//
// Why compile time: with the width a runtime value every group paid variable 64-bit shifts, a runtime row
// stride and two or three code loads plus a funnel shift; the producer's dequantisation was ≈ 28 instructions per
// group of 8 coordinates, and removing it altogether made the kernel 18 % faster while conflict-free lookups (the
// same instructions) gained nothing (docs/cuda-prefill-history.md, "Ablations, and the producer's dequantisation
// by code width"). Since then each thread takes quads of four consecutive groups (prefill_codes.hpp): one vector load per
// quad for 4- and 2-bit codes, every code at a compile-time bit offset, and a thread-to-quad mapping under which
// neither the loads nor the SW128 stores conflict in shared memory. Per group of 8 coordinates that is four
// (shift, mask) pairs, four pair-table lookups and one 16-byte store, plus a quarter of the quad's loads.
//
// Alignment: a token's codes are 16·bits bytes at head_dim 128, the layer is 16-byte aligned (prefill_attention
// checks) and every region starts at a multiple of 256 bytes (docs/formats.md), so a staged code region's first
// row starts 16-byte aligned in its staging buffer (staged_row0 − region = 0) and a quad of 4 groups sits at byte
// token · 16·bits + quad · 4·bits: 16-byte aligned for 4 bits, 8-byte for 2, 4-byte for the others.
#pragma once

#include <cstdint>

#include "prefill_codes.hpp"
#include "wgmma.cuh"

namespace kvcompact::cuda::tq::detail::prefill {

// Dequantises a staged 64-token tile (kTokens rows of 16·kBits code bytes from `codes`, 16-byte aligned) into an
// SW128 fp16 tile by the producer's kThreads threads: each takes one quad of four code groups (prefill_codes.hpp)
// of tokens slot.token + j · (kThreads / 4), so its loads and stores step by compile-time offsets and its codes
// sit at compile-time bit offsets.
template <unsigned kBits, unsigned kTokens, unsigned kThreads>
__device__ __forceinline__ void dequant_tile_fixed(unsigned pt, std::uint8_t* tile, const std::uint8_t* codes,
                                                   const std::uint32_t* pairs) {
  constexpr unsigned kRowBytes = 16 * kBits, kTokenStep = kThreads / kQuadGroups;
  static_assert(kThreads % kQuadGroups == 0 && kTokens % kTokenStep == 0, "whole rounds");
  const QuadSlot slot = quad_slot(pt);
  const std::uint8_t* first = codes + slot.token * kRowBytes + slot.quad * kQuadGroups * kBits;
#pragma unroll
  for (unsigned j = 0; j < kTokens / kTokenStep; ++j) {
    const CodeQuad<kBits> quad(first + j * kTokenStep * kRowBytes);
    const unsigned tt = slot.token + j * kTokenStep;
#pragma unroll
    for (unsigned g = 0; g < kQuadGroups; ++g) {
      *reinterpret_cast<uint4*>(tile + sw128_offset(tt, (kQuadGroups * slot.quad + g) * 8, kTokens)) =
          make_uint4(pairs[quad.pair(4 * g)], pairs[quad.pair(4 * g + 1)], pairs[quad.pair(4 * g + 2)],
                     pairs[quad.pair(4 * g + 3)]);
    }
  }
}

}  // namespace kvcompact::cuda::tq::detail::prefill
