// DeepSeek-V4 config: presets match the reference table, a real-shaped config.json parses to the preset
// (same fingerprint), and every malformed config is rejected with its own typed error.
#include "kvcompact/dsv4/config.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "golden_dir.hpp"

namespace kvcompact::dsv4 {
namespace {

std::string golden_path(const std::string& name) {
  return (testing_support::golden_dir() / "dsv4" / name).string();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Dsv4Config, FlashPresetMatchesReference) {
  auto c = preset_config("deepseek-v4-flash");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->num_hidden_layers, 43u);
  ASSERT_EQ(c->compress_ratios.size(), 43u);
  EXPECT_EQ(c->count_layers_with_ratio(0), 2u);
  EXPECT_EQ(c->count_layers_with_ratio(4), 21u);
  EXPECT_EQ(c->count_layers_with_ratio(128), 20u);
  EXPECT_EQ(c->compress_ratios[0], 0u);
  EXPECT_EQ(c->compress_ratios[1], 0u);
  EXPECT_EQ(c->compress_ratios[2], 4u);
  EXPECT_EQ(c->compress_ratios[3], 128u);
  EXPECT_EQ(c->compress_ratios[42], 4u);
  EXPECT_EQ(c->index_topk, 512u);
  EXPECT_EQ(c->max_position_embeddings, 1048576u);
  EXPECT_EQ(c->compress_rope_theta, 160000.0);
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_EQ(c->rope_scaling->factor, 16.0);
  EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 65536u);
  EXPECT_TRUE(c->validate().ok());
}

TEST(Dsv4Config, ProPresetMatchesReference) {
  auto c = preset_config("deepseek-v4-pro");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->num_hidden_layers, 61u);
  EXPECT_EQ(c->count_layers_with_ratio(0), 0u);
  EXPECT_EQ(c->count_layers_with_ratio(4), 30u);
  EXPECT_EQ(c->count_layers_with_ratio(128), 31u);
  EXPECT_EQ(c->compress_ratios[0], 128u);
  EXPECT_EQ(c->compress_ratios[1], 128u);
  EXPECT_EQ(c->compress_ratios[2], 4u);
  EXPECT_EQ(c->compress_ratios[60], 4u);
  EXPECT_EQ(c->index_topk, 1024u);
  EXPECT_NE(c->fingerprint(), preset_config("deepseek-v4-flash")->fingerprint());
}

TEST(Dsv4Config, UnknownPresetIsInvalidArgument) {
  auto c = preset_config("deepseek-v5");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::InvalidArgument);
}

TEST(Dsv4Config, ConfigJsonParsesToThePresetDroppingTheMtpLayer) {
  auto c = load_config_file(golden_path("deepseek-v4-flash.config.json"));
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  auto preset = preset_config("deepseek-v4-flash");
  EXPECT_EQ(c->compress_ratios, preset->compress_ratios);
  EXPECT_EQ(c->fingerprint(), preset->fingerprint());  // the name is not fingerprinted
  EXPECT_EQ(c->hidden_size, 4096u);
  auto resolved = resolve_model(golden_path("deepseek-v4-flash.config.json"));
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(resolved->fingerprint(), preset->fingerprint());
  EXPECT_EQ(resolve_model("deepseek-v4-pro")->num_hidden_layers, 61u);
  // Neither a preset nor a file (a misspelt preset): Io, naming the presets; a directory is named as such.
  const auto misspelt = resolve_model("deepseek-v4-flsh");
  ASSERT_FALSE(misspelt.ok());
  EXPECT_EQ(misspelt.error().code, ErrorCode::Io);
  EXPECT_NE(misspelt.error().message.find("deepseek-v4-flash"), std::string::npos) << misspelt.error().message;
  const auto directory = resolve_model(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.error().code, ErrorCode::Io);
  EXPECT_NE(directory.error().message.find("is a directory"), std::string::npos) << directory.error().message;
}

TEST(Dsv4Config, EachMalformedConfigHasItsOwnError) {
  struct Case {
    const char* file;
    ErrorCode code;
  };
  const Case cases[] = {
      {"bad_sliding_window.config.json", ErrorCode::SlidingWindow},
      {"bad_layer_count.config.json", ErrorCode::LayerCount},
      {"bad_ratio.config.json", ErrorCode::CompressionRatio},
      {"missing_head_dim.config.json", ErrorCode::MalformedConfig},
      {"wrong_type.config.json", ErrorCode::MalformedConfig},
      {"not_json.config.json", ErrorCode::MalformedConfig},
      {"bad_rope_scaling.config.json", ErrorCode::Unsupported},
  };
  for (const Case& c : cases) {
    auto r = load_config_file(golden_path(c.file));
    ASSERT_FALSE(r.ok()) << c.file;
    EXPECT_EQ(r.error().code, c.code) << c.file << ": " << r.error().to_string();
  }
  auto missing = load_config_file(golden_path("no_such_file.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::Io);
}

TEST(Dsv4Config, ErrorMessagesNameTheField) {
  auto r = parse_config_json(read_text(golden_path("missing_head_dim.config.json")));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("head_dim"), std::string::npos) << r.error().message;
  auto layer = load_config_file(golden_path("bad_layer_count.config.json"));
  EXPECT_EQ(layer.error().expected, 43);
  EXPECT_EQ(layer.error().actual, 42);
}

TEST(Dsv4Config, ValidateCatchesShapeAndScalarProblems) {
  auto base = *preset_config("deepseek-v4-flash");
  auto with = [&](auto edit) {
    ModelConfig c = base;
    edit(c);
    return c.validate();
  };
  EXPECT_EQ(with([](ModelConfig& c) { c.head_dim = 576; }).error().code, ErrorCode::Unsupported);
  EXPECT_EQ(with([](ModelConfig& c) { c.qk_rope_head_dim = 32; }).error().code, ErrorCode::Unsupported);
  EXPECT_EQ(with([](ModelConfig& c) { c.index_head_dim = 64; }).error().code, ErrorCode::Unsupported);
  EXPECT_EQ(with([](ModelConfig& c) { c.index_topk = 0; }).error().code, ErrorCode::MalformedConfig);
  EXPECT_EQ(with([](ModelConfig& c) { c.max_position_embeddings = 0; }).error().code, ErrorCode::MalformedConfig);
  EXPECT_EQ(with([](ModelConfig& c) { c.rope_theta = -1; }).error().code, ErrorCode::MalformedConfig);
  EXPECT_EQ(with([](ModelConfig& c) {
              c.num_hidden_layers = 0;
              c.compress_ratios.clear();
            }).error().code,
            ErrorCode::MalformedConfig);
  // Order: the sliding window is checked before the layer count.
  EXPECT_EQ(with([](ModelConfig& c) {
              c.sliding_window = 64;
              c.compress_ratios.pop_back();
            }).error().code,
            ErrorCode::SlidingWindow);
}

TEST(Dsv4Config, JsonEdgeCases) {
  std::string text = read_text(golden_path("deepseek-v4-flash.config.json"));
  ASSERT_TRUE(parse_config_json(text).ok());
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    return parse_config_json(t);
  };
  EXPECT_EQ(replace("\"sliding_window\": 128", "\"sliding_window\": -128").error().code, ErrorCode::MalformedConfig);
  EXPECT_EQ(replace("\"rope_theta\": 10000.0", "\"rope_theta\": \"x\"").error().code, ErrorCode::MalformedConfig);
  EXPECT_EQ(replace("\"compress_ratios\": [", "\"compress_ratios\": [-4,").error().code, ErrorCode::MalformedConfig);
  EXPECT_EQ(parse_config_json("[1, 2]").error().code, ErrorCode::MalformedConfig);
  // Integral floats are accepted for integer fields.
  EXPECT_TRUE(replace("\"sliding_window\": 128", "\"sliding_window\": 128.0").ok());
  EXPECT_EQ(replace("\"compress_ratios\": [", "\"compress_ratios\": [4.5,").error().code, ErrorCode::MalformedConfig);
  EXPECT_EQ(replace("\"compress_ratios\": [", "\"compress_ratios\": [\"4\",").error().code, ErrorCode::MalformedConfig);
  // A different YaRN factor is a different model.
  auto other = replace("\"factor\": 16", "\"factor\": 8");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->fingerprint(), preset_config("deepseek-v4-flash")->fingerprint());
}

}  // namespace
}  // namespace kvcompact::dsv4
