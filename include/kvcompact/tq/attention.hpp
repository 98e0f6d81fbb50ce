// CPU attention over a TurboQuant layer (the fast float32 path) and exact dense fp32 attention (the
// baseline the fast path is timed against). Both are causal, GQA, chunked over the sequence with a
// log-sum-exp merge (flash-decoding on the CPU), multithreaded through core/parallel.hpp.
#pragma once

#include <cstdint>
#include <span>

#include "kvcompact/core/error.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/layout.hpp"

namespace kvcompact::tq {

// One sequence's queries. Query row i sits at position first_position + i and sees key positions
// [0, first_position + i] (causal); first_position + rows must not exceed the sequence's length.
struct AttentionRequest {
  std::uint32_t seq = 0;
  std::uint32_t first_position = 0;
  std::uint32_t rows = 0;
  const float* queries = nullptr;  // [rows, q_heads, head_dim]
  float* output = nullptr;         // [rows, q_heads, head_dim]
};

struct AttentionOptions {
  std::uint32_t q_heads = 0;    // a multiple of kv_heads; query head h reads kv head h / (q_heads / kv_heads)
  float scale = 0.0f;           // softmax scale; 0 means 1/√head_dim
  const float* sinks = nullptr;  // [q_heads] sink logits (e^sink joins the softmax denominator only), or null
  std::uint32_t threads = 0;    // worker threads; 0 = core/parallel.hpp's num_threads()
  // Key chunking (flash-decoding). 0: automatic — split only when the (request, kv head, row block)
  // groups alone cannot keep the threads busy, into chunks of ≥ 1024 tokens. Otherwise every group's keys
  // are split into chunks of this many tokens. A tuning and testing knob: results agree up to rounding.
  std::uint32_t chunk_tokens = 0;
};

// Read-only view of one attention layer's storage: what the CPU kernels see. TurboQuantCache builds it;
// tests and tools can build one over their own buffer laid out by plan_layer_layout.
struct LayerView {
  const LayerLayout* layout = nullptr;
  const LayerCodec* codec = nullptr;
  const std::uint8_t* data = nullptr;           // [layout->total_bytes]
  const std::uint32_t* lengths = nullptr;       // [layout->sequences] tokens stored per sequence
  const std::uint32_t* window_begins = nullptr;  // [layout->sequences] first position the window ring may hold
};

// First position whose exact (f32) row is in the window ring: max(window_begin, length − W), or length
// when there is no window. Positions in [exact_window_begin, length) use the exact rows.
std::uint32_t exact_window_begin(std::uint32_t length, std::uint32_t window_begin, std::uint32_t exact_window);

// The window start after truncating a sequence of `length` tokens to `position` (< length): the ring held
// [max(window_begin, length − W), length); of those the positions below `position` survive, and positions
// appended from `position` on refill the ring. So the valid rows start at that old begin when it is below
// `position`, else at `position` (nothing survives). Every TurboQuant cache (CPU and GPU) truncates by it.
std::uint32_t window_begin_after_truncate(std::uint32_t length, std::uint32_t window_begin, std::uint32_t exact_window,
                                          std::uint32_t position);

// Checks shapes and positions of a batch (q_heads a positive multiple of kv_heads, seq in range,
// first_position + rows ≤ length, non-null pointers, finite scale); InvalidArgument / OutOfRange otherwise.
Status validate_attention(const LayerView& layer, std::span<const AttentionRequest> requests,
                          const AttentionOptions& options);

// validate_attention's per-request checks alone (sequence in range, rows within the sequence's length,
// non-null queries / output), for callers that keep the lengths themselves (the GPU cache).
Status validate_requests(std::uint32_t sequences, const std::uint32_t* lengths,
                         std::span<const AttentionRequest> requests);

// The fast path: writes every request's output. Scores keys from the packed records (centroid lookups,
// QJL signs), accumulates values in rotated space and rotates back once per (row, head).
Status attention_cpu(const LayerView& layer, std::span<const AttentionRequest> requests,
                     const AttentionOptions& options);

// Dense keys / values of one sequence for the exact baseline.
struct DenseAttentionRequest {
  std::uint32_t length = 0;  // keys / values rows stored; first_position + rows ≤ length
  std::uint32_t first_position = 0;
  std::uint32_t rows = 0;
  const float* keys = nullptr;     // [length, kv_heads, head_dim]
  const float* values = nullptr;   // [length, kv_heads, head_dim]
  const float* queries = nullptr;  // [rows, q_heads, head_dim]
  float* output = nullptr;         // [rows, q_heads, head_dim]
};

// Exact fp32 attention over dense f32 KV with the same semantics, schedule and threading as
// attention_cpu: the baseline its speed is measured against.
Status dense_attention_f32(std::uint32_t head_dim, std::uint32_t kv_heads,
                           std::span<const DenseAttentionRequest> requests, const AttentionOptions& options);

}  // namespace kvcompact::tq
