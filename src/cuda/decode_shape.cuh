// Internal to the fused decode kernel (tq_decode.cu): its tuning constants and Shape, the compile-time layout of
// one instance — warps, m-tiles and tokens per stage, the stage's code and norm buffers, the lookup tables and the
// epilogue's merge area in shared memory. Included by tq_decode.cu only (an anonymous namespace: one translation
// unit's kernels).
#pragma once

#include <cstdint>

#include "decode_coords.hpp"
#include "params.hpp"

namespace kvcompact::cuda::tq::detail {

namespace {

// 16-token m-tiles per warp and stage of the narrow kernel (Shape::mt; the wide variant keeps 2).
#ifndef KVC_DECODE_MT
#define KVC_DECODE_MT 2
#endif
// Pipeline depth: with several blocks per multiprocessor, two stages keep enough bytes in flight (the bulk
// copies need no issuing threads), and the smaller buffers let more blocks be resident.
constexpr unsigned kStages = 2;
constexpr unsigned kThreads = kDecodeThreads;  // the window and merge kernels; the fused kernel: Shape::threads
constexpr unsigned kGroup = kDecodeGroup;
// 4-bit keys look a whole code byte (two coordinates) up in a 256-entry half2 table replicated kKeyCopies
// times (entry e, copy k at word e·kKeyCopies + k; lane l reads copy l mod kKeyCopies): one byte permute and
// one IMAD address a pair instead of two shift + LOP3 pairs and a byte permute. Fewer copies mean less shared
// memory but bank conflicts between the lanes that share a copy (32 / kKeyCopies lanes, random entries).
// 2-bit keys likewise look a code byte (four coordinates) up as one uint2 of a 256-entry table with 16 copies:
// a 64-bit load is served per half-warp, whose 16 lanes then own 16 distinct copies (conflict-free, 32 KB).
#ifndef KVC_DECODE_KEY_COPIES
#define KVC_DECODE_KEY_COPIES 32
#endif
constexpr unsigned kKeyCopies = KVC_DECODE_KEY_COPIES;
constexpr unsigned kQuadCopies = 16;
static_assert(kKeyCopies >= 4 && kKeyCopies <= 32 && (kKeyCopies & (kKeyCopies - 1)) == 0,
              "a power of two from 4 (an entry fills whole 16-byte stores) to 32");


// Shapes with a wide variant of the fused kernel (Shape::wide_keys).
constexpr bool has_wide_variant(int d, int key_code_bits) { return key_code_bits == 4 && d == 128; }

template <int D, int CB, int VB, bool WIDE = false>
struct Shape {
  static constexpr bool pair_keys = CB == 1 || CB == 3, pair_values = VB <= 3, byte_keys = CB == 4, quad_keys = CB == 2;
  // The wide variant (WIDE, 4-bit keys, d = 128): 256-byte code-byte entries, so that a lookup's address is one
  // byte permute (wide_byte_entry) instead of a permute and a multiply-add (64 instructions fewer per warp and
  // tile). The table is then 64 KB, which leaves room for one block per multiprocessor only; so the block is two
  // halves of 8 warps, each with its own stages, barriers and tiles (half h takes tiles h, h + 2, …), that share
  // the tables and query fragments: one table fill and one query preparation for 16 warps. plan_decode takes it
  // when its blocks and the narrow kernel's fit in one wave (docs/tq-decode-history.md, rounds 10, 11).
  static constexpr bool wide_keys = WIDE && has_wide_variant(D, CB);
  static constexpr unsigned halves = wide_keys ? 2u : 1u;
  // Warps per half: 8 for 2- and 4-bit keys, whose code-byte table is then shared by twice the warps
  // (2 blocks = 16 warps per SM instead of 3 × 4), else 4. Each warp takes warp_tokens tokens of a stage.
  static constexpr int mt = wide_keys ? 2 : KVC_DECODE_MT;     // 16-token m-tiles per warp and stage
  static constexpr unsigned warp_tokens = 16u * mt;            // tokens per warp and stage
  static constexpr unsigned half_warps = byte_keys || quad_keys ? 8u : 4u, warps = half_warps * halves,
                            threads = 32u * warps, half_threads = 32u * half_warps, tile = warp_tokens * half_warps;
  // Key table entry stride in bytes (4-bit keys: kKeyCopies half2 copies, or 256 for the wide table).
  static constexpr unsigned key_stride = wide_keys ? 256u : 4u * kKeyCopies;
  static constexpr unsigned kc_bpt = D * CB / 8, ks_bpt = D / 8, vc_bpt = D * VB / 8;
  static constexpr unsigned kc = round16(tile * kc_bpt + 32), ks = round16(tile * ks_bpt + 32);
  static constexpr unsigned kn = round16(tile * 4 + 32), kr = round16(tile * 2 + 32);
  static constexpr unsigned vc = round16(tile * vc_bpt + 32), vn = round16(tile * 4 + 32);
  // A stage holds key codes, [signs], key norms, [ρ], value codes, value norms; the bracketed buffers only
  // with QJL (prod modes), so mse modes need less shared memory and fit more blocks per multiprocessor.
  __host__ __device__ static constexpr unsigned stage(bool qjl) { return kc + kn + vc + vn + (qjl ? ks + kr : 0u); }
  static constexpr unsigned prologue = 2 * kGroup * D * 4;
  // The epilogue's per-warp outputs: rows of merge_row floats, a lane group's D/8 slice shifted by its index g
  // (merge_at in the kernel): 2·(D + 12) ≡ 24 (mod 32) puts lane column c's rows 8 banks apart (24c mod 32) and the
  // shift makes g·(D/8 + 1) ≡ g (mod 8), so a warp's stores hit 32 (PACK: 16) distinct banks. (D + 20 would do
  // too, but ptxas then spent 64 more instructions in the seed kernel's main loop.)
  static constexpr unsigned merge_row = D + 12;
  static constexpr unsigned merge = warps * (kGroup * merge_row + 2 * kGroup) * 4;
  // The query scratch of the prologue sits behind stage 0 (which is already being filled), so the area holds
  // max(all stages, stage 0 + prologue scratch, the epilogue's merge of the warps).
  __host__ __device__ static constexpr unsigned max3(unsigned a, unsigned b, unsigned c) {
    return a > b ? (a > c ? a : c) : (b > c ? b : c);
  }
  // Half h's stage s at (h · kStages + s) · stage; the prologue's scratch in half 0's last stage (whose copies
  // are issued after the prologue), inside it when there are two halves.
  __host__ __device__ static constexpr unsigned main_area(bool qjl) {
    return max3(halves * kStages * stage(qjl), (kStages - 1) * stage(qjl) + prologue, merge);
  }
  static_assert(halves == 1 || prologue <= kc + kn + vc + vn, "the prologue's scratch fits in one stage");
  // Lookup tables are replicated once per lane (entry e of lane l at word 32e + l, so bank l): any mix of
  // indices across a warp is one shared-memory wavefront. Keys: 2- and 4-bit codes a code byte at a time
  // (kQuadCopies / kKeyCopies above), 1- and 3-bit codes a pair of coordinates (2^(2b) entries), 5-bit codes
  // single coordinates paired with a byte permute. Values: pairs up to 3 bits, single 4-bit coordinates;
  // 2-bit values need no table in shared memory (dequant2 reads register tables).
  static constexpr unsigned lut_k = quad_keys   ? 256u * 8u * kQuadCopies
                                    : byte_keys ? 256u * key_stride
                                                : (pair_keys ? (1u << (2 * CB)) : (1u << CB)) * 128u;
  static constexpr unsigned lut_v = VB == 2 ? 0u : (pair_values ? (1u << (2 * VB)) : (1u << VB)) * 128u;
  static constexpr unsigned lut_s = 16 * 8;
  // Query B fragments (uint4: fp16 hi and lo parts) per k-step and lane: the code part, then (QJL only) the
  // QJL part, last in shared memory so that mse modes do not reserve the second half.
  static constexpr unsigned qfrag_entries = (D / 16) * 32, qscale = kGroup * 2 * 4;
  __host__ __device__ static constexpr unsigned qfrag(bool qjl) { return qfrag_entries * 16 * (qjl ? 2u : 1u); }
  static constexpr unsigned bars = 8 * kStages * halves;  // one mbarrier per stage and half (a multiple of 16)
  static constexpr unsigned tables = lut_k + lut_v + lut_s + qscale + bars;
  __host__ __device__ static constexpr unsigned total(bool qjl) { return main_area(qjl) + tables + qfrag(qjl); }
  // Per-lane slices of a token row: key codes and signs of coordinates [c·D/4, (c+1)·D/4) (lane c = lane % 4),
  // value codes of coordinates [g·D/8, (g+1)·D/8) (g = lane / 4).
  static constexpr unsigned slice_k = D * CB / 32, slice_s = D / 32, slice_v = D * VB / 64;
  // Key rows that are multiples of 16 bytes are 16-byte aligned in the stage: regions start at multiples of 256
  // bytes of a 16-byte aligned layer (decode_attention checks it), so the copy's shift sh_kc is 0.
  static constexpr bool key_rows_a16 = kc_bpt % 16 == 0 && slice_k % 16 == 0;
};

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
