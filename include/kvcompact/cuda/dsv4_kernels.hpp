// CUDA kernels of the DeepSeek-V4 hybrid attention for one layer step, batched over tokens (decode: one
// token per sequence; prefill: a chunk of one sequence): lightning-indexer query preparation and scores
// (tensor cores, bit-identical to the CPU fast path), exact top-k with the CPU's tie-break, and sparse
// attention with the sink over window + compressed rows (fp16 tensor cores, split over rows + merge) with
// the inverse RoPE on the output tail. Every function works on device pointers to rows in the CPU storage
// layouts (kvcompact/dsv4/storage.hpp), allocates nothing (caller-provided workspaces) and only enqueues
// work on `stream` (a cudaStream_t; null = default stream), so it can be captured in a CUDA graph.
// Queries, outputs and workspaces must be 16-byte aligned (checked: InvalidArgument).
// No CUDA header is included here.
#pragma once

#include <array>
#include <cstdint>

#include "kvcompact/core/error.hpp"
#include "kvcompact/dsv4/storage.hpp"

namespace kvcompact::cuda::dsv4 {

using kvcompact::dsv4::IndexerStorage;
using kvcompact::dsv4::RowStorage;

// Where one token's rows live (all device pointers; an array of these lives in device memory). Every base
// pointer must be 16-byte aligned (the kernels load BF16 attention rows in 16-byte pieces, FP8 attention rows
// in 8-byte pieces, and copy indexer rows in 64-row tiles with 16-byte cp.async); DeviceBuffer allocations
// and offsets that are multiples of 64 rows satisfy this.
struct TokenRows {
  // Attention rows of the window ring: position p at slot p mod ring_capacity.
  const void* window_ring = nullptr;
  // Optional: attention rows of positions [chunk_start, position] in order (a prefill chunk's own rows,
  // which the ring may no longer hold); window positions >= chunk_start are read from here when non-null.
  const void* chunk_rows = nullptr;
  // Compressed attention rows (slot g = row g) of ratio-4 / ratio-128 layers.
  const void* compressed_rows = nullptr;
  // Indexer rows (slot g) of ratio-4 layers.
  const void* indexer_rows = nullptr;
  std::int64_t position = 0;     // absolute position t of the token
  std::int64_t chunk_start = 0;  // first position held by chunk_rows
  // min(context, 128): at least the window rows the ring serves (not checked on the device: "Row bounds" in
  // docs/cuda-dsv4-kernels.md says why).
  std::uint32_t ring_capacity = 128;
  std::uint32_t reserved = 0;
};

// Row bounds. Each call takes a host-side bound on its tokens' rows (IndexerScoreArgs::max_visible,
// TopkArgs::max_rows, AttentionArgs::max_rows) that sizes its grid and buffers, while the positions live in device
// memory, where the host cannot check them. A token whose rows exceed its call's bound (or whose position is
// negative) is answered, not read past: nothing beyond the bound is read or written, and its outputs say so —
// indexer_scores writes NaN over its score row's [0, max_visible), indexer_topk writes kTopkBeyondBound in all k
// slots, sparse_attention writes NaN outputs (also for a ratio-4 index outside [-1, visible rows), such as
// kTopkBeyondBound, which it does not read).
inline constexpr std::int32_t kTopkBeyondBound = -2;

// Tokens per indexer_scores / sparse_attention call (their grids' y dimension); larger batches or prefill
// chunks are split by the caller (InvalidArgument otherwise).
inline constexpr std::uint32_t kMaxTokensPerCall = 65535;

// ---- indexer ------------------------------------------------------------------------------------------
inline constexpr std::uint32_t kMaxIndexerHeads = 64;

// Bytes of the prepared-query workspace for `tokens` tokens (256-byte aligned pieces).
std::uint64_t indexer_query_workspace_bytes(std::uint32_t tokens);

// q: device float [tokens, heads, 128] (the model's indexer query with RoPE on dims [64, 128)).
// Unless `already_prepared`, applies the model's Hadamard + FP4 rounding exactly as the CPU's
// prepare_indexer_query (bit for bit), then stores integer codes for the tensor-core scorer.
// heads in [1, 64].
Status indexer_prepare_queries(const float* q, std::uint32_t tokens, std::uint32_t heads, bool already_prepared,
                               void* query_workspace, std::uint64_t workspace_bytes, void* stream);

struct IndexerScoreArgs {
  const TokenRows* tokens = nullptr;  // device [count]; visible rows = (position + 1) / 4 from indexer_rows
  std::uint32_t count = 0;
  std::uint32_t heads = 64;
  const float* weights = nullptr;  // device [count, heads] (already scaled by the model; signs kept)
  // Filled by indexer_prepare_queries for the same tokens, in the same order and with the same count (the
  // workspace's layout depends on the count). Its size is checked against indexer_query_workspace_bytes(count),
  // so a workspace sized for fewer tokens is an error rather than a read past its end; which count prepared it
  // is not recorded, so a same-sized workspace prepared for other tokens cannot be told apart.
  const void* query_workspace = nullptr;
  std::uint64_t query_workspace_bytes = 0;
  IndexerStorage storage = IndexerStorage::Bf16;
  std::uint32_t max_visible = 0;  // >= every token's visible row count (sizes the grid; "Row bounds" above)
  float* scores = nullptr;        // device [count, score_stride]; entries >= a token's visible count untouched
  std::uint32_t score_stride = 0;
  // Optional device counter: rows scored by the exact scalar path (off the integer grid; 0 for model data).
  unsigned long long* fallback_rows = nullptr;
};
// Scores bit-identical to kvcompact::dsv4::indexer_scores over the decoded rows.
Status indexer_scores(const IndexerScoreArgs& args, void* stream);

// ---- top-k --------------------------------------------------------------------------------------------
struct TopkArgs {
  const float* scores = nullptr;  // device [count, score_stride]
  std::uint32_t score_stride = 0;
  std::uint32_t count = 0;
  // Rows per token: counts (device [count]) when non-null, else (tokens[i].position + 1) / ratio.
  const std::uint32_t* counts = nullptr;
  const TokenRows* tokens = nullptr;
  std::uint32_t ratio = 4;
  std::uint32_t max_rows = 0;  // >= every token's row count ("Row bounds" above)
  std::uint32_t k = 512;       // index_topk, 1 .. 2048
  // device [count, out_stride]; k entries per token, -1 past min(k, rows) (kTopkBeyondBound: "Row bounds")
  std::int32_t* out = nullptr;
  std::uint32_t out_stride = 0;
};
// Largest row count one token may have for this k: 2^31 - 1 (int32 indices) for k in [1, 2048], else 0.
std::uint32_t topk_max_rows(std::uint32_t k);
// Workspace of indexer_topk: 0 bytes in this version (the selection needs none; the workspace argument may be
// null). Kept in the API so that callers size it the same way whatever a later version needs.
std::uint64_t topk_workspace_bytes(std::uint32_t count, std::uint32_t max_rows, std::uint32_t k);
// Same indices as kvcompact::dsv4::indexer_topk (higher score first, then lower index, NaN last).
Status indexer_topk(const TopkArgs& args, void* workspace, std::uint64_t workspace_bytes, void* stream);

// ---- sparse attention ---------------------------------------------------------------------------------
struct AttentionArgs {
  const TokenRows* tokens = nullptr;  // device [count]
  std::uint32_t count = 0;
  std::uint32_t heads = 64;    // multiple of 16, 16 .. 128
  const float* q = nullptr;    // device [count, heads, 512]
  const float* sink = nullptr;  // device [heads], or null for no sink
  RowStorage storage = RowStorage::Bf16;
  std::uint32_t ratio = 0;  // 0: window only; 4: window + indices; 128: window + all visible rows
  const std::int32_t* indices = nullptr;  // ratio 4: device [count, index_stride], the top-k output
  std::uint32_t index_stride = 0;
  std::uint32_t index_topk = 512;
  // RoPE frequencies of the layer (kvcompact::dsv4::RopeFrequencies::inv_freq); the inverse rotation at
  // the token's position is applied to dims [448, 512) of every output head when inverse_rope is set.
  std::array<float, 32> inv_freq{};
  bool inverse_rope = true;
  // >= every token's row count (min(t + 1, 128) + min(topk, (t + 1) / 4), or + (t + 1) / 128), at most
  // kMaxAttentionRows (Unsupported); "Row bounds" above.
  std::uint32_t max_rows = 0;
  float* out = nullptr;  // device [count, heads, 512]
};
inline constexpr std::uint32_t kMaxAttentionRows = 0x7FFFFFFF;
// The workspace of a call: the split partials, or 0 when every token's row list is one split of 64-head blocks
// (a prefill chunk of many tokens: the output is written directly). The workspace may be null when it is 0.
// The split plan follows the current device's multiprocessor count: size it with the device of the call
// current (a smaller workspace than that device's plan needs is refused, InvalidArgument).
std::uint64_t attention_workspace_bytes(std::uint32_t count, std::uint32_t heads, std::uint32_t max_rows);
Status sparse_attention(const AttentionArgs& args, void* workspace, std::uint64_t workspace_bytes, void* stream);

}  // namespace kvcompact::cuda::dsv4
