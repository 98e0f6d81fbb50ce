// CPU driver of one DeepSeek-V4 attention layer over a Deepseek4Cache: window write, compressor(s),
// lightning indexer and sparse attention for a span of consecutive tokens, reading and writing the cache's
// encoded rows and state buffers through its step protocol. Decode is the span of one token and prefill
// any longer span; both run the same per-token code, so any chunking of the same tokens gives the same
// states, rows and outputs bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "kvcompact/core/error.hpp"
#include "kvcompact/dsv4/attention.hpp"
#include "kvcompact/dsv4/cache.hpp"
#include "kvcompact/dsv4/compressor.hpp"
#include "kvcompact/dsv4/indexer.hpp"
#include "kvcompact/dsv4/rope.hpp"

namespace kvcompact::dsv4 {

// Learned per-layer constants (borrowed pointers).
struct LayerWeights {
  std::uint32_t heads = 0;                  // query heads H (64 / 128 in the released models)
  const float* attn_sink = nullptr;         // [H]
  const float* compressor_ape = nullptr;    // [m, coff*512]   (m != 0)
  const float* compressor_norm = nullptr;   // [512]           (m != 0)
  const float* indexer_ape = nullptr;       // [4, 256]        (m == 4)
  const float* indexer_norm = nullptr;      // [128]           (m == 4)
};

// The model's tensors for `count` consecutive tokens of one layer, token-major (borrowed pointers).
struct LayerInputs {
  const float* kv = nullptr;                // [count, 512] c_t: RMS-normalised, RoPE at t on [448, 512)
  const float* q = nullptr;                 // [count, H, 512] RMS-normalised heads, RoPE at t on the tails
  const float* compressor_kv = nullptr;     // [count, coff*512] a_t             (m != 0)
  const float* compressor_score = nullptr;  // [count, coff*512] z_t (no ape)    (m != 0)
  const float* indexer_kv = nullptr;        // [count, 256] indexer compressor a (m == 4)
  const float* indexer_score = nullptr;     // [count, 256] indexer compressor z (m == 4)
  const float* indexer_q = nullptr;         // [count, index_heads, 128] q^I with RoPE at t on [64, 128)
  const float* indexer_weights = nullptr;   // [count, index_heads], already scaled (may be negative)
  bool indexer_q_prepared = false;          // true: the caller already applied Hadamard + FP4 to q^I
};

// A runner owns reusable scratch: use one runner per thread (a cache is likewise driven by one thread).
class LayerRunner {
 public:
  // RoPE tables for the model's two regimes (rope_theta / compress_rope_theta with rope_scaling).
  explicit LayerRunner(const ModelConfig& model);

  // Called between the stages of run_layer ("window", "compressor", "attention"); an error
  // aborts the layer (cancellation, or fault injection in tests). Once the layer has written to the
  // cache, an abort poisons it.
  std::function<Status(std::string_view stage)> stage_hook;

  // Longer spans are worked in consecutive pieces of at most this many tokens (bounding the scratch to a
  // few MiB however long a prefill chunk is); any split gives the same results bit for bit. 0 counts as 1.
  std::uint64_t max_span_tokens = 2048;

  // The work of layer `layer` for the `count` tokens starting at cache.position(): no planning, no
  // commit (the caller commits once every layer has run; call it once per layer per step, since it
  // advances the layer's compressor state in place). out: [count, H, 512].
  // Errors before anything is written leave the cache as it was: Poisoned, EmptyPrefill, ContextBound,
  // InvalidArgument (a missing tensor, heads 0, layer out of range), NonFinite (NaN / inf in an input).
  // Any failure after the first write (including a non-finite output) poisons the cache.
  Status run_layer(Deepseek4Cache& cache, std::uint32_t layer, std::uint64_t count, const LayerWeights& weights,
                   const LayerInputs& inputs, float* out);

  // plan_next_step, every layer in order, commit_step. One LayerWeights / LayerInputs / output per layer.
  Status decode_step(Deepseek4Cache& cache, std::span<const LayerWeights> weights,
                     std::span<const LayerInputs> inputs, std::span<float* const> outputs);
  // plan_prefill(position, count), every layer, commit_prefill.
  Status prefill_chunk(Deepseek4Cache& cache, std::uint64_t count, std::span<const LayerWeights> weights,
                       std::span<const LayerInputs> inputs, std::span<float* const> outputs);

  const RopeFrequencies& rope_for_ratio(std::uint32_t ratio) const { return ratio == 0 ? rope_plain_ : rope_compressed_; }

 private:
  Status run_span(Deepseek4Cache& cache, std::uint32_t layer, std::uint64_t start, std::uint64_t count,
                  const LayerWeights& weights, const LayerInputs& inputs, float* out, bool& wrote);
  Status run_pieces(Deepseek4Cache& cache, std::uint32_t layer, std::uint64_t start, std::uint64_t count,
                    const LayerWeights& weights, const LayerInputs& inputs, float* out, bool& wrote);
  Status score_indexer_blocks(const Deepseek4Cache& cache, std::uint32_t layer, std::size_t visible,
                              const float* weights, std::size_t ih);
  Status run_all(Deepseek4Cache& cache, std::uint64_t count, std::span<const LayerWeights> weights,
                 std::span<const LayerInputs> inputs, std::span<float* const> outputs);

  ModelConfig model_;
  RopeFrequencies rope_plain_;
  RopeFrequencies rope_compressed_;
  // Scratch, grown to the largest span seen; nothing is allocated per token in steady state.
  std::vector<float> window_;        // decoded window rows for positions [first, end)
  std::vector<std::uint8_t> encoded_;  // the span's encoded window rows
  std::vector<float> emitted_;       // compressor output rows
  std::vector<std::uint8_t> row_bytes_;
  std::vector<float> compressed_;    // decoded compressed rows (all visible for m = 128, selected for m = 4)
  std::vector<float> index_q_;
  std::vector<float> index_keys_;    // a prefill span's decoded indexer rows
  std::vector<float> index_scores_;
  std::vector<std::int32_t> selected_;
  std::vector<const float*> rows_;
  TopkScratch topk_;
  AttentionScratch attention_;
};

}  // namespace kvcompact::dsv4
