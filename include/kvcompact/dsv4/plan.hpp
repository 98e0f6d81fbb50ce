// DeepSeek-V4 cache plan: the seed system's exact per-layer layout (attention rows with zero-copy
// window / compressed views, indexer rows, compressor states) for a context length and a storage
// choice, sized with checked arithmetic; plus the pure step / prefill arithmetic of the protocol.
// Nothing here allocates cache memory: a 1M-context plan is arithmetic only.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kvcompact/core/error.hpp"
#include "kvcompact/dsv4/config.hpp"
#include "kvcompact/dsv4/storage.hpp"

namespace kvcompact::dsv4 {

struct StorageConfig {
  RowStorage attention = RowStorage::Bf16;      // window and compressed rows
  IndexerStorage indexer = IndexerStorage::Bf16;
  static StorageConfig bf16() { return {}; }
  // The serving-stack FP8 layout: 584 B attention rows, 132 B FP8 indexer rows.
  static StorageConfig fp8() { return {RowStorage::Fp8, IndexerStorage::Fp8}; }
  bool operator==(const StorageConfig&) const = default;
};

enum class LayerKind : std::uint8_t { Window = 0, Csa = 4, Hca = 128 };  // by compress ratio m
const char* layer_kind_name(LayerKind kind);  // "window" / "csa" / "hca"

// One layer's buffers. Shapes follow the seed: attention_kv [window_rows + compressed_rows, 512] whose
// first window_rows rows are the window view and the rest the compressed view (compressed_offset ==
// window_bytes); indexer_kv [indexer_rows, 128] (m = 4 only); main compressor kv/score states F32
// [1, state_rows, state_cols] each (m != 0); indexer compressor kv/score states F32 [1, 8, 256] each
// (m = 4 only). Rows are stored as the plan's StorageConfig says (row strides below).
struct LayerPlan {
  std::uint32_t layer = 0;
  std::uint32_t ratio = 0;  // m
  std::uint32_t coff = 0;   // 2 for m = 4, 1 for m = 128, 0 for m = 0
  LayerKind kind = LayerKind::Window;

  std::uint64_t window_rows = 0;      // min(context, 128)
  std::uint64_t compressed_rows = 0;  // context / m (0 when m = 0)
  std::uint64_t attention_rows = 0;   // window_rows + compressed_rows
  std::uint64_t attention_row_bytes = 0;
  std::uint64_t attention_bytes = 0;
  std::uint64_t window_offset = 0;  // always 0
  std::uint64_t window_bytes = 0;
  std::uint64_t compressed_offset = 0;  // == window_bytes
  std::uint64_t compressed_bytes = 0;

  std::uint64_t indexer_rows = 0;  // context / 4 for m = 4
  std::uint64_t indexer_row_bytes = 0;
  std::uint64_t indexer_bytes = 0;

  std::uint64_t state_rows = 0;   // coff * m
  std::uint64_t state_cols = 0;   // coff * 512
  std::uint64_t state_bytes = 0;  // one buffer (kv or score); two are resident
  std::uint64_t indexer_state_rows = 0;   // 8 for m = 4
  std::uint64_t indexer_state_cols = 0;   // 256 for m = 4
  std::uint64_t indexer_state_bytes = 0;  // one buffer; two are resident

  std::uint64_t resident_bytes = 0;  // attention + indexer + 2 states + 2 indexer states
};

struct CachePlan {
  ModelConfig model;
  std::uint64_t model_fingerprint = 0;
  std::uint64_t context = 0;
  StorageConfig storage;
  std::uint64_t window_capacity = 0;  // min(context, 128)
  std::vector<LayerPlan> layers;
  std::uint64_t total_bytes = 0;

  // Two plans are the same plan when model, context and storage agree (the model's name is ignored).
  bool same_as(const CachePlan& other) const {
    return model_fingerprint == other.model_fingerprint && context == other.context && storage == other.storage;
  }
};

// Validation in the seed's order: context 0 -> EmptyContext; context > max_position_embeddings ->
// ContextBound{expected = bound, actual = context}; then ModelConfig::validate (SlidingWindow,
// LayerCount, CompressionRatio, ...); sizes that overflow 64 bits -> Overflow.
Result<CachePlan> plan_cache(const ModelConfig& model, std::uint64_t context, StorageConfig storage = {});

// Bytes per token for a long context (window amortised away): sum over layers of
// attention_row_bytes / m (+ indexer_row_bytes / 4 for m = 4). Flash: 6880 (bf16), 3850.25 (fp8).
double long_context_bytes_per_token(const ModelConfig& model, StorageConfig storage);
// An uncompressed cache of the same dims: every token of every layer keeps its 512-wide bf16 row.
Result<std::uint64_t> uncompressed_bytes(const ModelConfig& model, std::uint64_t context);

// ---- Step protocol arithmetic (pure; Deepseek4Cache::plan_next_step adds the poison check) ---------

struct LayerStepPlan {
  std::uint32_t ratio = 0;
  std::uint64_t compressed_valid_after = 0;               // floor(n / m), 0 for m = 0
  std::optional<std::uint64_t> compressed_write_slot;     // floor(n / m) - 1 exactly when n % m == 0
  std::uint64_t indexer_valid_after = 0;                  // = compressed fields for m = 4, else 0 / none
  std::optional<std::uint64_t> indexer_write_slot;
  std::uint64_t state_write_row = 0;  // (coff - 1) * m + p % m: the compressor state row this token fills
};

// Decode step for the token at `position` p (n = p + 1, cap = min(context, 128)).
struct StepPlan {
  std::uint64_t position = 0;
  std::uint64_t window_write_slot = 0;      // p % cap
  std::uint64_t window_valid_after = 0;     // min(n, cap)
  std::uint64_t window_start_position = 0;  // n - window_valid_after: window slot of position q is q % cap
  std::vector<LayerStepPlan> layers;
};

struct LayerPrefillPlan {
  std::uint32_t ratio = 0;
  std::uint64_t compressed_write_start = 0;  // floor(s / m)
  std::uint64_t compressed_count = 0;        // floor(e / m) - floor(s / m)
  std::uint64_t compressed_valid_after = 0;  // floor(e / m)
  std::uint64_t indexer_write_start = 0;     // = compressed fields for m = 4, else 0
  std::uint64_t indexer_count = 0;
  std::uint64_t indexer_valid_after = 0;
};

// Prefill of `count` tokens starting at `start` s (e = s + count). Window rows go to slot q % cap for
// each position q in [s, e); when count > cap only the last cap of them survive.
struct PrefillPlan {
  std::uint64_t start = 0;
  std::uint64_t count = 0;
  std::uint64_t end = 0;
  std::uint64_t window_write_start = 0;     // s % cap
  std::uint64_t window_valid_after = 0;     // min(e, cap)
  std::uint64_t window_start_position = 0;  // e - window_valid_after
  std::vector<LayerPrefillPlan> layers;
};

// position >= context -> ContextExhausted.
Result<StepPlan> plan_step_at(const CachePlan& plan, std::uint64_t position);
// count 0 -> EmptyPrefill; start + count > context (or overflow) -> ContextBound.
Result<PrefillPlan> plan_prefill_at(const CachePlan& plan, std::uint64_t start, std::uint64_t count);

}  // namespace kvcompact::dsv4
