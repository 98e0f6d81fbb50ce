// DeepSeek-V4 config: presets, config.json parsing (nlohmann-json stays private to this file) and the
// canonical fingerprint that ties snapshots and anchor images to one model shape.
#include "kvcompact/dsv4/config.hpp"

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvcompact/core/checksum.hpp"

namespace kvcompact::dsv4 {

namespace {

using Json = nlohmann::json;

std::vector<std::uint32_t> flash_ratios() {
  // 0, 0, then 4 / 128 alternating over layers 2..41, then a final 4: 21 x 4, 20 x 128.
  std::vector<std::uint32_t> r = {0, 0};
  for (int i = 2; i < 42; ++i) r.push_back(i % 2 == 0 ? 4u : 128u);
  r.push_back(4);
  return r;
}

std::vector<std::uint32_t> pro_ratios() {
  // 128, 128, then 4 / 128 alternating, ending on 4: 30 x 4, 31 x 128.
  std::vector<std::uint32_t> r = {128, 128};
  for (int i = 2; i < 61; ++i) r.push_back(i % 2 == 0 ? 4u : 128u);
  return r;
}

ModelConfig flash_config() {
  ModelConfig c;
  c.name = "deepseek-v4-flash";
  c.num_hidden_layers = 43;
  c.compress_ratios = flash_ratios();
  c.index_n_heads = 64;
  c.index_topk = 512;
  c.rope_scaling = YarnScaling{};
  c.num_attention_heads = 64;
  c.hidden_size = 4096;
  return c;
}

ModelConfig pro_config() {
  ModelConfig c = flash_config();
  c.name = "deepseek-v4-pro";
  c.num_hidden_layers = 61;
  c.compress_ratios = pro_ratios();
  c.index_topk = 1024;
  c.num_attention_heads = 128;
  c.hidden_size = 7168;
  return c;
}

// Little-endian canonical encoder for the fingerprint.
struct CanonicalWriter {
  std::vector<std::uint8_t> bytes;
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void f64(double v) { u64(std::bit_cast<std::uint64_t>(v)); }
  void str(const std::string& s) {
    u64(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
};

// Field readers: each names the field in its error so a user can fix the file.
Result<std::uint64_t> read_uint(const Json& j, const char* field, std::uint64_t max_value) {
  auto it = j.find(field);
  if (it == j.end()) return make_error(ErrorCode::MalformedConfig, "config field '{}' is missing", field);
  if (!it->is_number_integer()) {
    // Accept integral floats (some exporters write 128.0).
    if (it->is_number_float()) {
      double d = it->get<double>();
      if (std::isfinite(d) && d >= 0 && d == std::floor(d) && d <= static_cast<double>(max_value)) {
        return static_cast<std::uint64_t>(d);
      }
    }
    return make_error(ErrorCode::MalformedConfig, "config field '{}' must be a non-negative integer, got {}",
                      field, it->dump());
  }
  if (it->is_number_unsigned()) {
    std::uint64_t v = it->get<std::uint64_t>();
    if (v > max_value) {
      return make_error(ErrorCode::MalformedConfig, "config field '{}' = {} exceeds {}", field, v, max_value);
    }
    return v;
  }
  return make_error(ErrorCode::MalformedConfig, "config field '{}' must be non-negative, got {}", field,
                    it->get<std::int64_t>());
}

Result<std::uint32_t> read_u32(const Json& j, const char* field) {
  KVC_ASSIGN_OR_RETURN(std::uint64_t v, read_uint(j, field, std::numeric_limits<std::uint32_t>::max()));
  return static_cast<std::uint32_t>(v);
}

Result<double> read_positive_double(const Json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return make_error(ErrorCode::MalformedConfig, "config field '{}' is missing", field);
  if (!it->is_number()) {
    return make_error(ErrorCode::MalformedConfig, "config field '{}' must be a number, got {}", field, it->dump());
  }
  double v = it->get<double>();
  if (!std::isfinite(v) || v <= 0) {
    return make_error(ErrorCode::MalformedConfig, "config field '{}' must be finite and > 0, got {}", field, v);
  }
  return v;
}

Result<YarnScaling> read_rope_scaling(const Json& j) {
  if (!j.is_object()) {
    return make_error(ErrorCode::MalformedConfig, "config field 'rope_scaling' must be an object, got {}", j.dump());
  }
  YarnScaling y;
  auto type_it = j.find("type");
  if (type_it == j.end()) type_it = j.find("rope_type");
  if (type_it == j.end() || !type_it->is_string()) {
    return make_error(ErrorCode::MalformedConfig, "rope_scaling needs a string 'type' (or 'rope_type')");
  }
  y.type = type_it->get<std::string>();
  if (y.type != "yarn") {
    return make_error(ErrorCode::Unsupported, "rope_scaling type '{}' is not supported (DeepSeek-V4 uses 'yarn')",
                      y.type);
  }
  KVC_ASSIGN_OR_RETURN(y.factor, read_positive_double(j, "factor"));
  KVC_ASSIGN_OR_RETURN(y.original_max_position_embeddings,
                       read_uint(j, "original_max_position_embeddings", std::uint64_t{1} << 40));
  if (y.original_max_position_embeddings == 0) {
    return make_error(ErrorCode::MalformedConfig, "rope_scaling.original_max_position_embeddings must be > 0");
  }
  KVC_ASSIGN_OR_RETURN(y.beta_fast, read_positive_double(j, "beta_fast"));
  KVC_ASSIGN_OR_RETURN(y.beta_slow, read_positive_double(j, "beta_slow"));
  return y;
}

}  // namespace

Status ModelConfig::validate() const {
  if (sliding_window != kSlidingWindow) {
    return make_error(ErrorCode::SlidingWindow, "sliding_window {} is not supported: the cache needs {}",
                      sliding_window, kSlidingWindow);
  }
  if (compress_ratios.size() != num_hidden_layers) {
    Error e = make_error(ErrorCode::LayerCount, "{} compress_ratios for {} layers", compress_ratios.size(),
                         num_hidden_layers);
    e.expected = num_hidden_layers;
    e.actual = static_cast<std::int64_t>(compress_ratios.size());
    return e;
  }
  for (std::size_t i = 0; i < compress_ratios.size(); ++i) {
    std::uint32_t m = compress_ratios[i];
    if (m != 0 && m != 4 && m != 128) {
      return make_error(ErrorCode::CompressionRatio, "layer {} has compress ratio {}; expected 0, 4 or 128", i, m);
    }
  }
  if (num_hidden_layers == 0) return make_error(ErrorCode::MalformedConfig, "num_hidden_layers is 0");
  if (head_dim != kHeadDim) {
    return make_error(ErrorCode::Unsupported, "head_dim {} is not supported: DeepSeek-V4 caches use {}", head_dim,
                      kHeadDim);
  }
  if (qk_rope_head_dim != kRopeDims) {
    return make_error(ErrorCode::Unsupported, "qk_rope_head_dim {} is not supported: DeepSeek-V4 caches use {}",
                      qk_rope_head_dim, kRopeDims);
  }
  if (count_layers_with_ratio(4) > 0) {
    if (index_head_dim != kIndexerHeadDim) {
      return make_error(ErrorCode::Unsupported, "index_head_dim {} is not supported: the indexer rows are {} wide",
                        index_head_dim, kIndexerHeadDim);
    }
    if (index_n_heads == 0 || index_topk == 0) {
      return make_error(ErrorCode::MalformedConfig, "index_n_heads {} and index_topk {} must be > 0", index_n_heads,
                        index_topk);
    }
  }
  if (max_position_embeddings == 0) return make_error(ErrorCode::MalformedConfig, "max_position_embeddings is 0");
  if (!std::isfinite(rope_theta) || rope_theta <= 0 || !std::isfinite(compress_rope_theta) ||
      compress_rope_theta <= 0) {
    return make_error(ErrorCode::MalformedConfig, "rope_theta {} and compress_rope_theta {} must be finite and > 0",
                      rope_theta, compress_rope_theta);
  }
  return ok_status();
}

std::uint64_t ModelConfig::fingerprint() const {
  CanonicalWriter w;
  w.bytes.insert(w.bytes.end(), {'D', 'S', 'V', '4', 'C', 'F', 'G', '1'});
  w.u32(num_hidden_layers);
  w.u32(head_dim);
  w.u32(qk_rope_head_dim);
  w.u32(sliding_window);
  w.u64(compress_ratios.size());
  for (std::uint32_t m : compress_ratios) w.u32(m);
  w.u32(index_n_heads);
  w.u32(index_head_dim);
  w.u32(index_topk);
  w.u64(max_position_embeddings);
  w.f64(rope_theta);
  w.f64(compress_rope_theta);
  w.u32(rope_scaling.has_value() ? 1u : 0u);
  if (rope_scaling) {
    w.str(rope_scaling->type);
    w.f64(rope_scaling->factor);
    w.u64(rope_scaling->original_max_position_embeddings);
    w.f64(rope_scaling->beta_fast);
    w.f64(rope_scaling->beta_slow);
  }
  return xxh64(w.bytes);
}

std::uint32_t ModelConfig::count_layers_with_ratio(std::uint32_t ratio) const {
  std::uint32_t n = 0;
  for (std::uint32_t m : compress_ratios) n += (m == ratio) ? 1u : 0u;
  return n;
}

std::vector<std::string> preset_names() { return {"deepseek-v4-flash", "deepseek-v4-pro"}; }

Result<ModelConfig> preset_config(std::string_view name) {
  if (name == "deepseek-v4-flash") return flash_config();
  if (name == "deepseek-v4-pro") return pro_config();
  return make_error(ErrorCode::InvalidArgument, "unknown model preset '{}' (known: deepseek-v4-flash, deepseek-v4-pro)",
                    name);
}

Result<ModelConfig> parse_config_json(std::string_view json_text, std::string name) {
  Json j = Json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(ErrorCode::MalformedConfig, "{} is not valid JSON", name);
  if (!j.is_object()) return make_error(ErrorCode::MalformedConfig, "{} is not a JSON object", name);

  ModelConfig c;
  c.name = std::move(name);
  KVC_ASSIGN_OR_RETURN(c.num_hidden_layers, read_u32(j, "num_hidden_layers"));
  KVC_ASSIGN_OR_RETURN(c.head_dim, read_u32(j, "head_dim"));
  KVC_ASSIGN_OR_RETURN(c.qk_rope_head_dim, read_u32(j, "qk_rope_head_dim"));
  KVC_ASSIGN_OR_RETURN(c.sliding_window, read_u32(j, "sliding_window"));
  KVC_ASSIGN_OR_RETURN(c.index_n_heads, read_u32(j, "index_n_heads"));
  KVC_ASSIGN_OR_RETURN(c.index_head_dim, read_u32(j, "index_head_dim"));
  KVC_ASSIGN_OR_RETURN(c.index_topk, read_u32(j, "index_topk"));
  KVC_ASSIGN_OR_RETURN(c.max_position_embeddings, read_uint(j, "max_position_embeddings", std::uint64_t{1} << 40));
  KVC_ASSIGN_OR_RETURN(c.rope_theta, read_positive_double(j, "rope_theta"));
  KVC_ASSIGN_OR_RETURN(c.compress_rope_theta, read_positive_double(j, "compress_rope_theta"));
  if (j.contains("num_attention_heads")) {
    KVC_ASSIGN_OR_RETURN(c.num_attention_heads, read_u32(j, "num_attention_heads"));
  }
  if (j.contains("hidden_size")) {
    KVC_ASSIGN_OR_RETURN(c.hidden_size, read_u32(j, "hidden_size"));
  }
  std::uint32_t mtp_layers = 0;
  if (j.contains("num_nextn_predict_layers")) {
    KVC_ASSIGN_OR_RETURN(mtp_layers, read_u32(j, "num_nextn_predict_layers"));
  }

  auto scaling = j.find("rope_scaling");
  if (scaling != j.end() && !scaling->is_null()) {
    KVC_ASSIGN_OR_RETURN(YarnScaling y, read_rope_scaling(*scaling));
    c.rope_scaling = std::move(y);
  }

  auto ratios = j.find("compress_ratios");
  if (ratios == j.end()) return make_error(ErrorCode::MalformedConfig, "config field 'compress_ratios' is missing");
  if (!ratios->is_array()) {
    return make_error(ErrorCode::MalformedConfig, "config field 'compress_ratios' must be an array, got {}",
                      ratios->dump());
  }
  for (std::size_t i = 0; i < ratios->size(); ++i) {
    const Json item = {{"ratio", (*ratios)[i]}};
    auto m = read_u32(item, "ratio");
    if (!m.ok()) {
      return make_error(ErrorCode::MalformedConfig, "compress_ratios[{}] must be a non-negative integer, got {}", i,
                        (*ratios)[i].dump());
    }
    c.compress_ratios.push_back(*m);
  }
  // The trailing MTP layer(s) are served by a separate window-only cache: drop them when the file lists
  // them after the main layers.
  if (mtp_layers > 0 && c.compress_ratios.size() == std::uint64_t{c.num_hidden_layers} + mtp_layers) {
    c.compress_ratios.resize(c.num_hidden_layers);
  }
  KVC_TRY(c.validate());
  return c;
}

Result<ModelConfig> load_config_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return make_error(ErrorCode::Io, "config file '{}' is a directory", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::Io, "cannot open config file '{}'", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::Io, "cannot read config file '{}'", path);
  return parse_config_json(text.str(), path);
}

Result<ModelConfig> resolve_model(std::string_view preset_or_path) {
  for (const std::string& name : preset_names()) {
    if (preset_or_path == name) return preset_config(name);
  }
  auto loaded = load_config_file(std::string(preset_or_path));
  if (!loaded.ok() && loaded.error().code == ErrorCode::Io) {
    // Neither a preset nor a readable file: name the presets too (a misspelt preset reads as a missing file).
    Error e = std::move(loaded).error();
    std::string presets;
    for (const std::string& name : preset_names()) presets += (presets.empty() ? "" : ", ") + name;
    e.message += fmt::format(" (and it is not a preset: {})", presets);
    return e;
  }
  return loaded;
}

}  // namespace kvcompact::dsv4
