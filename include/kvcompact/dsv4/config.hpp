// DeepSeek-V4 model configuration as the hybrid cache needs it: the attention shape, the per-layer
// compress ratios, the indexer and the RoPE fields, parsed from a Hugging Face config.json or taken
// from a built-in preset (deepseek-v4-flash, deepseek-v4-pro; main layers only, no MTP layer).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvcompact/core/error.hpp"

namespace kvcompact::dsv4 {

// The only attention shape the released models use; the cache layouts are built for it.
inline constexpr std::uint32_t kHeadDim = 512;          // one K = V head, width d
inline constexpr std::uint32_t kRopeDims = 64;          // tail dims [448, 512) carry RoPE
inline constexpr std::uint32_t kNopeDims = kHeadDim - kRopeDims;  // 448
inline constexpr std::uint32_t kSlidingWindow = 128;
inline constexpr std::uint32_t kIndexerHeadDim = 128;   // width of an indexer key row

// YaRN context extension, used by the compressed (m = 4 / 128) layers' RoPE.
struct YarnScaling {
  std::string type = "yarn";
  double factor = 16.0;
  std::uint64_t original_max_position_embeddings = 65536;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool operator==(const YarnScaling&) const = default;
};

struct ModelConfig {
  std::string name;                       // preset name or the file it came from; not fingerprinted
  std::uint32_t num_hidden_layers = 0;    // main layers the cache plans (MTP layers excluded)
  std::uint32_t head_dim = kHeadDim;
  std::uint32_t qk_rope_head_dim = kRopeDims;
  std::uint32_t sliding_window = kSlidingWindow;
  std::vector<std::uint32_t> compress_ratios;  // one per main layer: 0, 4 or 128
  std::uint32_t index_n_heads = 64;
  std::uint32_t index_head_dim = kIndexerHeadDim;
  std::uint32_t index_topk = 512;
  std::uint64_t max_position_embeddings = 1u << 20;
  double rope_theta = 10000.0;            // m = 0 layers, no YaRN
  double compress_rope_theta = 160000.0;  // m = 4 / 128 layers, with rope_scaling
  std::optional<YarnScaling> rope_scaling;
  // Model-side fields the cache does not size with, kept for the CLI's report.
  std::uint32_t num_attention_heads = 0;
  std::uint32_t hidden_size = 0;

  // Structural checks that do not depend on a context length, in the seed's order:
  // sliding_window != 128 -> SlidingWindow; ratio count != layers -> LayerCount; a ratio outside
  // {0, 4, 128} -> CompressionRatio; then the shape checks (head_dim 512, rope dims 64, indexer dims)
  // -> Unsupported, and zero / non-finite scalars -> MalformedConfig.
  Status validate() const;

  // xxh64 over the canonical little-endian encoding of every field except `name` (see
  // docs/deepseek-v4.md); two configs with equal fingerprints plan identical caches.
  std::uint64_t fingerprint() const;

  // Ratio-specific counts used in reports.
  std::uint32_t count_layers_with_ratio(std::uint32_t ratio) const;

  bool operator==(const ModelConfig&) const = default;
};

// Built-in presets: "deepseek-v4-flash" (43 layers) and "deepseek-v4-pro" (61 layers).
Result<ModelConfig> preset_config(std::string_view name);
std::vector<std::string> preset_names();

// Parse the text of a config.json. Errors: MalformedConfig for bad JSON, a missing required field or
// a value of the wrong type / range (the message names the field); the structural errors of
// ModelConfig::validate for a well-formed but unsupported model. compress_ratios may carry trailing
// entries for num_nextn_predict_layers MTP layers; they are dropped.
Result<ModelConfig> parse_config_json(std::string_view json_text, std::string name = "config.json");

// Read and parse a file (Io when it cannot be read).
Result<ModelConfig> load_config_file(const std::string& path);

// A preset name, or else a path to a config.json.
Result<ModelConfig> resolve_model(std::string_view preset_or_path);

}  // namespace kvcompact::dsv4
