// Internal: the plain parameter struct of the TurboQuant decode kernels and their launchers (encode:
// encode_params.hpp). Kernel translation units (.cu) include only this and tq_device.cuh, never the fmt-based
// error header (nvcc's front end cannot compile fmt's consteval format strings); host code (.cpp) validates
// arguments and maps CUDA errors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tq_device.cuh"

namespace kvcompact::cuda::tq::detail {

inline constexpr unsigned kDecodeThreads = 128;  // window and merge kernels (the fused kernel: decode_tile_tokens)
inline constexpr unsigned kDecodeGroup = 8;     // query heads per block (the MMA's N)
inline constexpr unsigned kDecodePackedGroup = 4;  // groups up to this size: hi and lo halves share the N columns
inline constexpr unsigned kMaxWindow = 8192;    // window scores live in shared memory
inline constexpr std::uint32_t kStatusLengthBeyondPlan = 1u;  // kDecodeLengthBeyondPlan (tq.hpp) for the kernels

struct DecodeParams {
  const std::uint8_t* layer;
  const Tables* tables;
  const float* queries;                // [seqs, q_heads, d]
  const std::uint32_t* lengths;        // [seqs]
  const std::uint32_t* window_begins;  // [seqs] or null
  const float* sinks;                  // [q_heads] or null
  float* output;                       // [seqs, q_heads, d]
  float* part_o;                       // [seqs, q_heads, splits + 1, d]
  float* part_lse;                     // [seqs, q_heads, splits + 1] (log2 domain)
  std::uint64_t key_codes, key_signs, key_norms, key_rho, value_codes, value_norms, window_keys, window_values;
  std::uint32_t head_dim, kv_heads, capacity, window, q_heads, group, head_groups, chunk, splits, seqs;
  // DecodePlan::max_length: a sequence whose device length exceeds it is not read and gets NaN outputs, and
  // kDecodeLengthBeyondPlan goes into *status when status is not null.
  std::uint32_t max_length;
  std::uint32_t* status;
  std::uint32_t tables_key_code_bits, tables_value_bits;  // select the kernel instance
  std::uint32_t tables_has_qjl;                           // sizes the shared memory (sign and ρ buffers)
  float scale_log2;  // softmax scale · log2(e)
  // The in-kernel merge (layouts without an exact window): one arrival word per (sequence, KV head, head group)
  // in the workspace (decode_merge.cuh, merge_if_last, says how they work).
  unsigned long long* arrivals;
  std::uint32_t merge_in_kernel;
  std::uint32_t wide;  // 1: the wide variant of the fused kernel (DecodePlan::wide)
};

// Shared memory of the fused kernel for (head_dim, key code bits, value bits, QJL); 0 when there is no kernel.
std::uint32_t decode_smem_bytes(std::uint32_t head_dim, std::uint32_t key_code_bits, std::uint32_t value_bits,
                                bool qjl);
// Whether the fused kernel has a wide variant for these shapes (4-bit keys, d = 128, mse modes: a 64 KB key table
// shared by one 16-warp block per multiprocessor, decode_shape.cuh, Shape).
bool decode_has_wide(std::uint32_t head_dim, std::uint32_t key_code_bits, bool qjl);
// A split's chunk is a multiple of this many tokens: a pipeline stage of the fused kernel (32 per warp: 128 or
// 256), times two for the wide variant (whose two halves take alternate stages).
std::uint32_t decode_tile_tokens(std::uint32_t head_dim, std::uint32_t key_code_bits, std::uint32_t value_bits,
                                 bool wide);
// Raises the kernel's dynamic shared-memory limit (host side, once per plan).
cudaError_t prepare_decode(std::uint32_t head_dim, std::uint32_t key_code_bits, std::uint32_t value_bits, bool qjl);
// Resident blocks of the fused kernel per multiprocessor for a GQA group size (occupancy calculator; 0 when there
// is no kernel).
int decode_blocks_per_sm(std::uint32_t head_dim, std::uint32_t key_code_bits, std::uint32_t value_bits, bool qjl,
                         std::uint32_t group, bool wide);
// The fused split kernel (which merges the splits itself when there is no exact window), else it, the exact-window
// kernel and the merge kernel, in that order on `stream`.
cudaError_t launch_decode(const DecodeParams& p, cudaStream_t stream);

}  // namespace kvcompact::cuda::tq::detail
