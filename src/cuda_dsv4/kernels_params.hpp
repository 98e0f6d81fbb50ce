// Internal: plain parameter structs and launchers of the DeepSeek-V4 CUDA kernels (indexer scoring, top-k,
// sparse attention). Shared by the kernel files (.cu, no fmt / kvcompact error header) and the host files
// (.cpp) that validate arguments, size workspaces and map CUDA errors with KVC_CUDA_TRY.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/align.hpp"

namespace kvcompact::cuda::dsv4::detail {

// Mirror of the public TokenRows (dsv4_kernels.hpp); attention.cpp static_asserts the layouts agree.
struct TokenRowsDev {
  const std::uint8_t* window_ring;
  const std::uint8_t* chunk_rows;
  const std::uint8_t* compressed_rows;
  const std::uint8_t* indexer_rows;
  std::int64_t position;
  std::int64_t chunk_start;
  std::uint32_t ring_capacity;
  std::uint32_t reserved;
};

// Storage codes (values of kvcompact::dsv4::RowStorage / IndexerStorage).
inline constexpr std::uint32_t kRowBf16 = 0, kRowFp8 = 1;
inline constexpr std::uint32_t kIdxBf16 = 0, kIdxFp8 = 1, kIdxMxfp4 = 2;

inline constexpr std::uint32_t kIndexerDim = 128;
inline constexpr std::uint32_t kIndexerMaxHeads = 64;  // the MMA tile covers 64 heads (4 warps x 16)
inline constexpr std::uint32_t kHeadDim = 512;
inline constexpr std::uint32_t kWindow = 128;

// ---- indexer query preparation ------------------------------------------------------------------------
// Query workspace of `tokens` tokens (offsets in bytes from the workspace base):
//   qf   float [tokens, 64, 128]   prepared query (Hadamard + FP4), exactly the CPU's prepare_indexer_query
//   qi   int8  [tokens, 64, 128]   qf / 2^fq[head] as integers (|qi| <= 127), zero for padded heads
//   fq   int32 [tokens, 64]        per-head exponent
//   info int32 [tokens, 64]        per head: 1 when the integer codes are exact (always for FP4-grid queries)
struct QueryLayout {
  std::uint64_t qf, qi, fq, info, total;
};
inline QueryLayout query_layout(std::uint64_t tokens) {
  constexpr auto al = kvcompact::cuda::detail::align256;
  QueryLayout l{};
  l.qf = 0;
  l.qi = al(l.qf + tokens * kIndexerMaxHeads * kIndexerDim * 4);
  l.fq = al(l.qi + tokens * kIndexerMaxHeads * kIndexerDim);
  l.info = al(l.fq + tokens * kIndexerMaxHeads * 4);
  l.total = al(l.info + tokens * kIndexerMaxHeads * 4);
  return l;
}

struct PrepareParams {
  const float* q;  // [tokens, heads, 128]
  std::uint8_t* ws;
  QueryLayout layout;
  std::uint32_t tokens, heads;
  std::uint32_t already_prepared;  // 1: q is already Hadamard + FP4 rounded
  float hadamard_scale;            // float(1 / sqrt(128)) as the CPU computes it
};
cudaError_t launch_prepare_queries(const PrepareParams& p, cudaStream_t stream);

// ---- indexer scores -----------------------------------------------------------------------------------
inline constexpr std::uint32_t kScoreTileRows = 64;
inline constexpr std::uint32_t kScoreThreads = 128;
inline constexpr std::uint32_t kPrepareHeadsPerBlock = 16;  // one warp per head
struct ScoreParams {
  const TokenRowsDev* tokens;
  const float* weights;  // [tokens, heads]
  const std::uint8_t* ws;
  QueryLayout layout;
  float* scores;  // [tokens, score_stride]
  unsigned long long* fallback_rows;  // optional counter of rows scored by the exact scalar path
  std::uint32_t count, heads, storage, row_bytes, score_stride, blocks_per_token;
  std::uint32_t max_visible;  // the call's bound: a token with more visible rows gets NaN scores [0, max_visible)
};
struct ScoreKernelInfo {
  cudaError_t error = cudaSuccess;
  int blocks_per_sm = 0;  // resident score blocks per multiprocessor (registers and shared memory)
};
ScoreKernelInfo prepare_indexer_scores();  // sets the kernels' shared-memory limits, reads their occupancy
cudaError_t launch_indexer_scores(const ScoreParams& p, cudaStream_t stream);
// FP8 rows on warpgroup MMAs, the keys as the A operand (indexer_scores_wgmma.cu); launch_indexer_scores
// dispatches to it.
ScoreKernelInfo prepare_indexer_scores_fp8_wgmma();
cudaError_t launch_indexer_scores_fp8_wgmma(const ScoreParams& p, cudaStream_t stream);

// ---- top-k --------------------------------------------------------------------------------------------
inline constexpr std::uint32_t kTopkMaxK = 2048;  // the selected keys are held in shared memory
inline constexpr std::int32_t kTopkBeyondBound = -2;  // the public constant of the same name (dsv4_kernels.hpp)
struct TopkParams {
  const float* scores;  // [tokens, score_stride]
  const std::uint32_t* counts;  // [tokens] or null (then from positions)
  const TokenRowsDev* tokens;   // used when counts is null: (position + 1) / ratio
  std::int32_t* out;            // [tokens, out_stride]
  std::uint32_t count, score_stride, k, out_stride, ratio;
  std::uint32_t max_rows;  // the call's bound: a token with more rows gets kTopkBeyondBound in all k slots
};
// The block count per token follows from count and the device's multiprocessors.
cudaError_t launch_topk(const TopkParams& p, std::uint32_t multiprocessors, cudaStream_t stream);

// ---- sparse attention ---------------------------------------------------------------------------------
inline constexpr std::uint32_t kAttnTileRows = 64;
inline constexpr std::uint32_t kAttnHeadGroup = 16;   // heads per warp (the MMA's M); heads are a multiple
inline constexpr std::uint32_t kAttnBlockHeads = 64;  // most heads per block: each row tile is read once for them
inline constexpr std::uint32_t kAttnThreads = 512;    // 16 warps: 4 head groups x 4 row / dim quarters
inline constexpr std::uint32_t kAttnMaxSplits = 4096;
struct AttentionParams {
  const TokenRowsDev* tokens;
  const float* q;     // [count, heads, 512]
  const float* sink;  // [heads] or null (no sink)
  const std::int32_t* indices;  // [count, index_stride] (ratio 4)
  float* out;                   // [count, heads, 512]
  float* part_o;                // [count, heads, splits, 512]
  float* part_ml;               // [count, heads, splits, 2]  (max in log2 units, sum)
  float inv_freq[32];
  std::uint32_t count, heads, storage, row_bytes, ratio, index_stride, index_topk, splits, split_rows;
  std::uint32_t block_heads;  // heads per block: 16, 32 or kAttnBlockHeads (attention.cpp picks)
  std::uint32_t inverse_rope;
  // 1: one split per token and 64-head blocks (a prefill chunk): the warpgroup split kernel writes the output
  // itself (normalised, sink, inverse RoPE), no merge runs and part_o / part_ml are unused (attention.cpp's plan).
  std::uint32_t direct_output;
  float scale_log2;  // log2(e) / sqrt(512)
  // The call's bound: a token with more rows, or one of whose indices lies outside [-1, visible rows), reads no
  // row past it and gets NaN outputs.
  std::uint32_t max_rows;
};
cudaError_t prepare_attention();
cudaError_t launch_attention(const AttentionParams& p, cudaStream_t stream);
// The split kernel on warpgroup MMAs for 64-head blocks (attention_wgmma.cu).
cudaError_t prepare_attention_wgmma();
cudaError_t launch_attention_split_wgmma(const AttentionParams& p, cudaStream_t stream);
// The merge of the splits (attention_merge.cu), after either split kernel.
cudaError_t launch_attention_merge(const AttentionParams& p, cudaStream_t stream);

// ---- FP8 row decode self-test (tests/cuda_dsv4/fp8_decode_test.cpp) -----------------------------------
// The attention kernel's FP8 decode (e4m3x8_scaled_to_half8) against the scalar formula it replaced, for all
// 256 codes at all 8 byte positions of a piece and every block exponent e in [-127, 128].
struct Fp8DecodeSelftest {
  std::uint32_t mismatches;      // fp16 results whose bits differ, not counting NaN against NaN
  std::uint32_t nan_mismatches;  // both NaN, bit patterns differ
  // The first differing case, (e + 127) << 40 | code << 32 | fast bits << 16 | scalar bits; all ones if none.
  unsigned long long first;
};
// out: device memory; the launch resets it.
cudaError_t launch_fp8_decode_selftest(Fp8DecodeSelftest* out, cudaStream_t stream);

// ---- wgmma self-test (tests/cuda_dsv4/wgmma_test.cpp) -----------------------------------------------------------
// One warpgroup: s = q k^T (q, k: [64][128] fp16, row-major), o = p v (p: [64][64], v = k as [64 rows][128]),
// from SW128 shared-memory tiles with the given descriptor byte offsets (wgmma.cuh).
struct WgmmaSelftestArgs {
  const std::uint16_t* q;  // fp16 bit patterns
  const std::uint16_t* k;
  const std::uint16_t* p;
  float* s;  // [64][64]
  float* o;     // [64][128]
  float* o128;  // [64][128]: O again, as one m64n128k16 per k-step (B's two 64-column blocks in one descriptor)
  std::uint32_t kmajor_leading, kmajor_stride;    // Q, K and P descriptors
  std::uint32_t mnmajor_leading, mnmajor_stride;  // V descriptors
  std::uint32_t p_in_registers;                   // 1: P as register fragments (wgmma A from registers)
};
cudaError_t launch_wgmma_selftest(const WgmmaSelftestArgs& a, cudaStream_t stream);

}  // namespace kvcompact::cuda::dsv4::detail
