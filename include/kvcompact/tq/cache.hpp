// TurboQuantCache: the CPU TurboQuant KV cache of a whole model — packed 2–5-bit keys and values per
// attention layer, any number of sequences with independent lengths, an optional exact window of recent
// tokens, truncation (speculative-decoding rollback), per-layer snapshots, and batched attention.
// docs/tq-cache.md describes the semantics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/core/error.hpp"
#include "kvcompact/tq/attention.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/config.hpp"
#include "kvcompact/tq/layout.hpp"

namespace kvcompact::tq {

struct CacheShape {
  std::uint32_t head_dim = 0;
  // One entry per model layer: its KV heads, 0 for a layer without attention (it stores nothing but
  // still counts in the layer index that seeds the rotations).
  std::vector<std::uint32_t> kv_heads;
  std::uint32_t sequences = 1;
  std::uint32_t capacity = 0;  // positions per sequence
};

// The checks every cache (CPU or GPU) makes before planning its layers: the config, head_dim, at least one
// layer, sequences and capacity > 0. Both caches call it, so they reject a bad shape with the same error.
Status validate_cache_shape(const CacheShape& shape, const QuantConfig& config);

// One (layer, sequence) taken out of a cache: everything needed to put it back, in any cache with the
// same head_dim, kv_heads, config (modes, seed, window) and layer index. Packed regions are head-major,
// time-major inside a head: region[(head · length + position) · bytes_per_token + byte], with the
// per-token byte counts of `token` (LayerLayout's TokenBytes); norms are little-endian f32, residual
// norms f16. The exact window holds positions [window_begin, length) as f32 rows.
struct LayerSnapshot {
  std::uint32_t layer_index = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t kv_heads = 0;  // 0: a layer without attention (all regions empty)
  QuantConfig config{};
  TokenBytes token{};
  std::uint32_t length = 0;

  std::vector<std::uint8_t> key_codes;           // [kv_heads, length, token.key_codes]
  std::vector<std::uint8_t> key_signs;           // [kv_heads, length, token.key_signs]
  std::vector<std::uint8_t> key_norms;           // [kv_heads, length, 4]
  std::vector<std::uint8_t> key_residual_norms;  // [kv_heads, length, token.key_residual_norm]
  std::vector<std::uint8_t> value_codes;         // [kv_heads, length, token.value_codes]
  std::vector<std::uint8_t> value_norms;         // [kv_heads, length, 4]

  std::uint32_t window_begin = 0;     // length − window_begin ≤ config.exact_window
  std::vector<float> window_keys;     // [kv_heads, length − window_begin, head_dim]
  std::vector<float> window_values;   // [kv_heads, length − window_begin, head_dim]
};

class TurboQuantCache {
 public:
  // Validates the config and head_dim, plans every attention layer's buffer (checked sizes) and zeroes it.
  static Result<TurboQuantCache> create(const CacheShape& shape, const QuantConfig& config);

  TurboQuantCache(TurboQuantCache&&) noexcept;
  TurboQuantCache& operator=(TurboQuantCache&&) noexcept;
  ~TurboQuantCache();

  const QuantConfig& config() const { return config_; }
  std::uint32_t num_layers() const { return static_cast<std::uint32_t>(layers_.size()); }
  std::uint32_t head_dim() const { return head_dim_; }
  std::uint32_t sequences() const { return sequences_; }
  std::uint32_t capacity() const { return capacity_; }
  std::uint32_t kv_heads(std::uint32_t layer) const;  // 0 for non-attention or out-of-range layers
  // Tokens stored for (layer, seq); 0 for non-attention or out-of-range indices.
  std::uint32_t length(std::uint32_t layer, std::uint32_t seq) const;
  // Bytes of one attention layer's buffer (0 for a non-attention layer), and of all layers.
  std::uint64_t layer_bytes(std::uint32_t layer) const;
  std::uint64_t total_bytes() const;
  const LayerLayout* layout(std::uint32_t layer) const;  // null for non-attention layers
  const LayerCodec* codec(std::uint32_t layer) const;    // null for non-attention layers
  LayerView view(std::uint32_t layer) const;             // for attention_cpu / attention_oracle

  // Appends `rows` tokens at `position` of (layer, seq). keys / values are [rows, kv_heads, head_dim]
  // in `dtype` (F32, BF16 or F16). position must equal length(layer, seq) (OutOfRange with expected /
  // actual otherwise) and position + rows ≤ capacity (CapacityExceeded). NaN / inf anywhere → NonFinite;
  // on any error nothing is stored.
  Status append(std::uint32_t layer, std::uint32_t seq, std::uint32_t position, std::uint32_t rows, DType dtype,
                const void* keys, const void* values);

  // Batched causal attention for one layer (see AttentionRequest); the fast float32 path.
  Status attention(std::uint32_t layer, std::span<const AttentionRequest> requests,
                   const AttentionOptions& options) const;

  // Rolls every layer of `seq` back to at most `position` tokens (speculative-decoding rollback). Layers
  // already shorter keep their length. The exact window keeps the rows still in its ring.
  Status truncate(std::uint32_t seq, std::uint32_t position);
  // Same, for one layer.
  Status truncate_layer(std::uint32_t layer, std::uint32_t seq, std::uint32_t position);
  // Empties `seq` in every layer / every sequence.
  Status reset(std::uint32_t seq);
  void reset_all();

  // Copies (layer, seq) out; restore puts a snapshot back into (layer, seq), replacing what was there.
  // restore checks layer index, head_dim, kv_heads, config and every region size (Mismatch / Truncated /
  // CapacityExceeded) before touching the cache.
  Result<LayerSnapshot> snapshot(std::uint32_t layer, std::uint32_t seq) const;
  Status restore(std::uint32_t layer, std::uint32_t seq, const LayerSnapshot& snapshot);

 private:
  struct Layer;
  TurboQuantCache() = default;
  Status check_layer_seq(std::uint32_t layer, std::uint32_t seq, bool need_attention) const;

  QuantConfig config_{};
  std::uint32_t head_dim_ = 0;
  std::uint32_t sequences_ = 0;
  std::uint32_t capacity_ = 0;
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace kvcompact::tq
