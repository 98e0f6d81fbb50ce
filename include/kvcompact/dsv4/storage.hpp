// Byte layouts of one cached DeepSeek-V4 row: attention rows (window and compressed, 512 dims) as BF16
// (1024 B) or FP8 (584 B), indexer rows (128 dims) as BF16 (256 B), FP8 (132 B) or MXFP4 (68 B).
// This header is the single source of truth for those bytes; docs/deepseek-v4.md describes them in prose.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kvcompact/core/error.hpp"
#include "kvcompact/dsv4/config.hpp"

namespace kvcompact::dsv4 {

enum class RowStorage : std::uint8_t { Bf16 = 0, Fp8 = 1 };
enum class IndexerStorage : std::uint8_t { Bf16 = 0, Fp8 = 1, Mxfp4 = 2 };

std::string_view row_storage_name(RowStorage s);          // "bf16" / "fp8"
std::string_view indexer_storage_name(IndexerStorage s);  // "bf16" / "fp8" / "mxfp4"
Result<RowStorage> parse_row_storage(std::string_view name);
Result<IndexerStorage> parse_indexer_storage(std::string_view name);

// ---- Attention row (window and compressed rows), 512 dims ------------------------------------------
// Bf16: 512 x bf16 little-endian, dim i at bytes [2i, 2i+2).                              = 1024 B
// Fp8:  [0, 448)    e4m3 code of dim i (i < 448) at byte i, value = e4m3(code) * 2^(scale_b - 127)
//                   with b = i / 64;
//       [448, 576)  bf16 little-endian of dim 448 + k at bytes [448 + 2k, 450 + 2k), k < 64;
//       [576, 583)  7 ue8m0 scale bytes, block b (dims [64b, 64b + 64)) at byte 576 + b;
//       [583]       pad, written 0.                                                         = 584 B
// The model rounds dims [0, 448) of every window and compressed row to e4m3 in blocks of 64 with
// power-of-two scales, so a row it produced is stored by Fp8 without loss.
inline constexpr std::size_t kAttentionRowBytesBf16 = 2 * kHeadDim;  // 1024
inline constexpr std::size_t kFp8BlockDims = 64;
inline constexpr std::size_t kFp8Blocks = kNopeDims / kFp8BlockDims;  // 7
inline constexpr std::size_t kFp8NopeOffset = 0;
inline constexpr std::size_t kFp8RopeOffset = kNopeDims;                   // 448
inline constexpr std::size_t kFp8ScaleOffset = kFp8RopeOffset + 2 * kRopeDims;  // 576
inline constexpr std::size_t kFp8PadOffset = kFp8ScaleOffset + kFp8Blocks;     // 583
inline constexpr std::size_t kAttentionRowBytesFp8 = kFp8PadOffset + 1;        // 584
static_assert(kAttentionRowBytesFp8 == 584);
static_assert(kNopeDims % kFp8BlockDims == 0);

// ---- Indexer row, 128 dims ----------------------------------------------------------------------------
// Bf16:  128 x bf16 little-endian.                                                           = 256 B
// Fp8:   [0, 128) e4m3 code of dim i; [128, 132) scale as f32 little-endian (always a power of two
//        chosen as 2^ceil(log2(amax / 448)); value = e4m3(code) * scale.                     = 132 B
// Mxfp4: [0, 64) e2m1 codes, dim 2k in the low nibble and dim 2k + 1 in the high nibble of byte k;
//        [64, 68) 4 ue8m0 scale bytes, block b (dims [32b, 32b + 32)) at byte 64 + b.        = 68 B
// The model rounds indexer rows to e2m1 in blocks of 32 with power-of-two scales, so Mxfp4 stores
// them without loss; Fp8 stores them without loss when the row's blocks fit e4m3's range under one
// scale (true unless the block scales differ by more than ~2^14), otherwise it rounds.
inline constexpr std::size_t kIndexerRowBytesBf16 = 2 * kIndexerHeadDim;  // 256
inline constexpr std::size_t kIndexerFp8ScaleOffset = kIndexerHeadDim;    // 128
inline constexpr std::size_t kIndexerRowBytesFp8 = kIndexerHeadDim + 4;   // 132
inline constexpr std::size_t kFp4BlockDims = 32;
inline constexpr std::size_t kFp4Blocks = kIndexerHeadDim / kFp4BlockDims;  // 4
inline constexpr std::size_t kMxfp4ScaleOffset = kIndexerHeadDim / 2;       // 64
inline constexpr std::size_t kIndexerRowBytesMxfp4 = kMxfp4ScaleOffset + kFp4Blocks;  // 68
static_assert(kIndexerRowBytesMxfp4 == 68 && kIndexerRowBytesFp8 == 132);

constexpr std::size_t attention_row_bytes(RowStorage s) {
  return s == RowStorage::Bf16 ? kAttentionRowBytesBf16 : kAttentionRowBytesFp8;
}
constexpr std::size_t indexer_row_bytes(IndexerStorage s) {
  return s == IndexerStorage::Bf16 ? kIndexerRowBytesBf16
         : s == IndexerStorage::Fp8 ? kIndexerRowBytesFp8
                                    : kIndexerRowBytesMxfp4;
}

// Encode one row. `row` must hold 512 (attention) or 128 (indexer) floats and `out` exactly the row's
// byte size; otherwise InvalidArgument. NaN / inf inputs return NonFinite (nothing is written).
// Rows not already on the FP8 / FP4 grid are rounded: block scale 2^ceil(log2(amax / max_code)) (the
// finest power of two that holds the block's largest value; max_code 448 for e4m3, 6 for e2m1), then
// round to nearest even. A row already on any power-of-two-scaled grid of the same code is re-encoded
// at a scale no coarser than its own, so decode(encode(row)) == row bit for bit.
Status encode_attention_row(std::span<const float> row, RowStorage storage, std::span<std::uint8_t> out);
Status decode_attention_row(std::span<const std::uint8_t> bytes, RowStorage storage, std::span<float> row);
Status encode_indexer_row(std::span<const float> row, IndexerStorage storage, std::span<std::uint8_t> out);
Status decode_indexer_row(std::span<const std::uint8_t> bytes, IndexerStorage storage, std::span<float> row);

// The model's rounding, applied in place (the tests' source of "already simulated" rows): e4m3 in
// blocks of 64 over dims [0, 448) of a 512-wide row (dims [448, 512) are left alone), and e2m1 in
// blocks of 32 over a 128-wide row (no Hadamard here), with the model's power-of-two block scales —
// both delegate to fp_sim.hpp (fp8_block_sim / fp4_block_sim), the single definition of that rounding.
void simulate_fp8_attention_row(std::span<float> row512);
void simulate_fp4_indexer_row(std::span<float> row128);

}  // namespace kvcompact::dsv4
