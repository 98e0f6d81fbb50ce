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

// The warpgroup-MMA kernel (tq_prefill_wgmma.cu, sm_90a): head_dim 128; 192 rows per block for MSE keys, 128
// for QJL keys.
bool prefill_wgmma_supported(std::uint32_t head_dim, bool qjl);
std::uint32_t prefill_wgmma_block_rows(bool qjl);
cudaError_t prepare_prefill_wgmma(bool qjl, bool split_p);
int prefill_wgmma_blocks_per_sm(bool qjl, bool split_p);
cudaError_t launch_prefill_wgmma(const PrefillParams& p, cudaStream_t stream);
// Floats of one split's partial in the workspace (block rows x d outputs, then the rows' maxima and sums).
std::uint32_t prefill_wgmma_partial_floats(bool qjl);

}  // namespace kvcompact::cuda::tq::detail
