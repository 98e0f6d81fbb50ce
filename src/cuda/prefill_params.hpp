// Internal: the plain parameter struct of the TurboQuant chunked-prefill attention kernel and its launcher
// (tq_prefill.cu). Shared by the kernel translation unit and the host side (tq_prefill.cpp), which validates
// every argument and maps CUDA errors; nothing here includes the fmt-based error header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tq_device.cuh"

namespace kvcompact::cuda::tq::detail {

// PrefillArgs::status bits, for the kernels (tq_prefill.hpp has the public names; tq_prefill.cpp checks they agree).
inline constexpr std::uint32_t kStatusBadSequence = 1u;
inline constexpr std::uint32_t kStatusRowsBeyondPlan = 2u;
inline constexpr std::uint32_t kStatusPositionBeyondLength = 4u;
inline constexpr std::uint32_t kStatusKeysBeyondPlan = 8u;

struct PrefillParams {
  const std::uint8_t* layer;
  const Tables* tables;
  const float* queries;                  // [total_rows, q_heads, d]; entry i starts at row Σ_{j<i} rows[j]
  float* output;                         // same shape
  const float* sinks;                    // [q_heads] or null
  const std::uint32_t* seqs;             // [batch] cache sequence per entry, or null (entry i = sequence i)
  const std::uint32_t* first_positions;  // [batch]
  const std::uint32_t* rows;             // [batch]
  const std::uint32_t* lengths;          // [layout sequences]
  const std::uint32_t* window_begins;    // [layout sequences] or null
  std::uint64_t key_codes, key_signs, key_norms, key_rho, value_codes, value_norms, window_keys, window_values;
  std::uint32_t head_dim, kv_heads, sequences, capacity, window, q_heads, group;
  std::uint32_t heads_per_block;   // query heads of one KV head handled by one block (≤ rows of a block)
  std::uint32_t tokens_per_block;  // query tokens per block
  std::uint32_t head_groups;       // blocks along the GQA group (group > rows of a block only)
  std::uint32_t tiles;             // query tiles of one entry (grid x = tiles · key_splits)
  std::uint32_t batch;
  std::uint32_t max_rows;  // PrefillPlan::max_rows: an entry's rows past it are not computed (flagged)
  // Or null: the kStatus* flags above, of broken device preconditions (PrefillArgs), are OR-ed in.
  std::uint32_t* status;
  // Split over the keys (warpgroup kernel only; 1 = none): the blocks of one query tile each take a contiguous
  // part of its key tiles and write a partial (kRows x d output rows, then the rows' maxima and sums) to
  // `partials` at [(unit · key_splits + split)], unit = (entry · grid y + y) · tiles + tile; the last of them to
  // count itself in `counters[unit]` (zeroed before the launch) merges them in split order and finishes the rows.
  std::uint32_t key_splits;
  float* partials;
  std::uint32_t* counters;
  std::uint32_t key_code_bits, value_bits, qjl, split_p;
  std::uint32_t wgmma;  // 1: the warpgroup-MMA kernel (tq_prefill_wgmma.cu), 0: the mma.sync one (tq_prefill.cu)
  // Folded keys (warpgroup kernel; prefill_fold.cu): the fold pass writes every key tile an entry's blocks read —
  // α·k̂ (QJL keys: k̂ = c + ρ·qjl_scale·R_j⁻¹σ; MSE keys: k̂ = c) as an fp16 tile and an e4m3 tile of the cross
  // terms (folded_tile_bytes below) — at folded_keys + ((entry · kv_heads + kvh) · fold_tiles + tile) ·
  // folded_tile_bytes(qjl), and the kernel copies those instead of dequantising the key codes. Null otherwise.
  std::uint8_t* folded_keys;
  std::uint32_t fold_tiles;  // key tiles per (entry, KV head) in folded_keys: ⌈max_length / 64⌉
  std::uint32_t kc_bytes, ks_bytes, vc_bytes;  // packed bytes per token of key codes, key signs, value codes
  float scale_log2;  // softmax scale · log2(e)
};

// Query rows (query tokens × heads of the GQA group) one block handles for this head_dim / mode; 0 when
// there is no kernel (head_dim other than 64, 128, 256).
std::uint32_t prefill_block_rows(std::uint32_t head_dim, bool qjl);
// Dynamic shared memory of that kernel instance; 0 when there is none.
std::uint32_t prefill_smem_bytes(std::uint32_t head_dim, bool qjl);
// Raises the kernel's dynamic shared-memory limit (host side, once per plan).
cudaError_t prepare_prefill(std::uint32_t head_dim, bool qjl, bool split_p);
// Resident blocks per multiprocessor (occupancy calculator; 0 when there is no kernel).
int prefill_blocks_per_sm(std::uint32_t head_dim, bool qjl, bool split_p);
// The fused prefill kernel on `stream` (p.wgmma picks which); grid (tiles, kv_heads · head_groups, batch).
cudaError_t launch_prefill(const PrefillParams& p, cudaStream_t stream);

// The warpgroup-MMA kernel (tq_prefill_wgmma.cu, sm_90a): head_dim 128; 192 rows per block for MSE keys and
// folded QJL keys, 128 for QJL keys read from their codes and signs (qjl_block: the two-consumer instance).
bool prefill_wgmma_supported(std::uint32_t head_dim, bool qjl);
std::uint32_t prefill_wgmma_block_rows(bool qjl_block);
cudaError_t prepare_prefill_wgmma(bool qjl_block, bool split_p, int fold);
int prefill_wgmma_blocks_per_sm(bool qjl_block, bool split_p, int fold);
cudaError_t launch_prefill_wgmma(const PrefillParams& p, cudaStream_t stream);
// Floats of one split's partial in the workspace (block rows x d outputs, then the rows' maxima and sums).
std::uint32_t prefill_wgmma_partial_floats(bool qjl_block);
// Where the warpgroup kernel's key tiles come from: the producer dequantises the codes (kFoldNone), or the fold
// pass has written them (prefill_fold.cu) for QJL keys (kFoldQjl) or MSE keys (kFoldMse).
inline constexpr int kFoldNone = 0, kFoldQjl = 1, kFoldMse = 2;
// One folded key tile (64 tokens): the SW128 fp16 tile of K_hi = fp16(α·k̂), then an SW128 e4m3 tile for the
// S product's cross terms, run as one FP8 product (docs/cuda-prefill.md, "Folded keys"):
// - QJL keys: [K_lo · kFoldKloScale | K_hi · kFoldKhiScale] (K_lo = α·k̂ − K_hi; 256 codes per token, laid out as
//   an fp16 tile of 128 columns) against the queries' [Q_hi · kFoldQhiScale | Q_lo · kFoldQloScale]:
//   Q_hi·K_lo + Q_lo·K_hi;
// - MSE keys (K_hi = fp16(α·c), the producer's table value): [K_hi · kFoldKhiScale] (128 codes per token, an fp16
//   tile of 64 columns) against [Q_lo · kFoldQloScale]: Q_lo·K_hi, which the unfolded kernel runs in fp16.
// The scales are powers of two with every product scaled by kFoldCrossScale (exact); they keep every operand
// inside e4m3's range for queries scaled to 2^10 and |α·k̂| ≤ 112 (satfinite clamps beyond).
inline constexpr std::uint32_t kFoldedHalfTileBytes = 64u * 128u * 2u;
inline constexpr std::uint32_t folded_fp8_tile_bytes(bool qjl) { return qjl ? kFoldedHalfTileBytes : kFoldedHalfTileBytes / 2u; }
inline constexpr std::uint32_t folded_tile_bytes(bool qjl) { return kFoldedHalfTileBytes + folded_fp8_tile_bytes(qjl); }
inline constexpr float kFoldQhiScale = 0.25f, kFoldQloScale = 256.0f, kFoldKloScale = 4096.0f, kFoldKhiScale = 4.0f;
inline constexpr float kFoldCrossScale = 1024.0f;
static_assert(kFoldQhiScale * kFoldKloScale == kFoldCrossScale && kFoldQloScale * kFoldKhiScale == kFoldCrossScale,
              "both cross products in the same units");
// The pass that writes the tiles (prefill_fold.cu; grid (fold_tiles, kv_heads, batch), before the prefill kernel
// on the same stream).
cudaError_t launch_fold_keys(const PrefillParams& p, cudaStream_t stream);

}  // namespace kvcompact::cuda::tq::detail
