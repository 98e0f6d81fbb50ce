// `kvcompact plan`: sizes a DeepSeek-V4 hybrid cache for a model (preset or config.json) and a context:
// bytes per layer type, the total, and the per-token cost next to an uncompressed cache of the same dims.
// Arithmetic only — nothing is allocated, so a 1M-token plan is instant. --json for machines.
#include <charconv>
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "kvcompact/dsv4/plan.hpp"

namespace kvcompact::cli {
namespace {

struct PlanOptions {
  std::string model;
  std::string context;  // parsed here so "-5", "1e6" and 2^64 get a clear message
  std::string storage = "bf16";
  std::string indexer;  // empty: follows --storage
  bool json = false;
};

std::string human_bytes(std::uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.2f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

struct KindSummary {
  dsv4::LayerKind kind;
  std::uint32_t ratio = 0;
  std::uint32_t layers = 0;
  const dsv4::LayerPlan* example = nullptr;  // every layer of a kind has the same sizes
};

int fail(const Error& error) {
  std::fprintf(stderr, "kvcompact plan: %s\n", error.to_string().c_str());
  return 1;
}

Result<std::uint64_t> parse_context(const std::string& text) {
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return make_error(ErrorCode::InvalidArgument, "--context '{}' is not a non-negative integer that fits 64 bits",
                      text);
  }
  return value;
}

int run_plan(const PlanOptions& options) {
  auto parsed_context = parse_context(options.context);
  if (!parsed_context.ok()) return fail(parsed_context.error());
  const std::uint64_t context = *parsed_context;
  auto model = dsv4::resolve_model(options.model);
  if (!model.ok()) return fail(model.error());
  auto attention = dsv4::parse_row_storage(options.storage);
  if (!attention.ok()) return fail(attention.error());
  dsv4::StorageConfig storage = *attention == dsv4::RowStorage::Fp8 ? dsv4::StorageConfig::fp8()
                                                                     : dsv4::StorageConfig::bf16();
  if (!options.indexer.empty()) {
    auto indexer = dsv4::parse_indexer_storage(options.indexer);
    if (!indexer.ok()) return fail(indexer.error());
    storage.indexer = *indexer;
  }
  auto plan = dsv4::plan_cache(*model, context, storage);
  if (!plan.ok()) return fail(plan.error());
  auto uncompressed = dsv4::uncompressed_bytes(*model, context);
  if (!uncompressed.ok()) return fail(uncompressed.error());

  KindSummary kinds[3] = {{dsv4::LayerKind::Window, 0}, {dsv4::LayerKind::Csa, 4}, {dsv4::LayerKind::Hca, 128}};
  for (const dsv4::LayerPlan& l : plan->layers) {
    KindSummary& k = kinds[l.ratio == 0 ? 0 : (l.ratio == 4 ? 1 : 2)];
    ++k.layers;
    k.example = &l;
  }
  const double per_token = static_cast<double>(plan->total_bytes) / static_cast<double>(context);
  const double long_per_token = dsv4::long_context_bytes_per_token(*model, storage);
  const double uncompressed_per_token = static_cast<double>(model->num_hidden_layers) * dsv4::kAttentionRowBytesBf16;
  const double ratio = static_cast<double>(*uncompressed) / static_cast<double>(plan->total_bytes);

  if (options.json) {
    nlohmann::json j;
    j["model"] = model->name;
    j["fingerprint"] = fmt::format("{:016x}", plan->model_fingerprint);
    j["layers"] = model->num_hidden_layers;
    j["context"] = context;
    j["storage"] = {{"attention", std::string(dsv4::row_storage_name(storage.attention))},
                    {"indexer", std::string(dsv4::indexer_storage_name(storage.indexer))}};
    j["layer_types"] = nlohmann::json::array();
    for (const KindSummary& k : kinds) {
      if (k.layers == 0) continue;
      const dsv4::LayerPlan& l = *k.example;
      j["layer_types"].push_back({{"kind", dsv4::layer_kind_name(k.kind)},
                                  {"ratio", k.ratio},
                                  {"layers", k.layers},
                                  {"window_rows", l.window_rows},
                                  {"compressed_rows", l.compressed_rows},
                                  {"indexer_rows", l.indexer_rows},
                                  {"attention_row_bytes", l.attention_row_bytes},
                                  {"indexer_row_bytes", l.indexer_row_bytes},
                                  {"window_bytes", l.window_bytes},
                                  {"compressed_bytes", l.compressed_bytes},
                                  {"indexer_bytes", l.indexer_bytes},
                                  {"state_bytes", 2 * l.state_bytes + 2 * l.indexer_state_bytes},
                                  {"bytes_per_layer", l.resident_bytes},
                                  {"bytes", l.resident_bytes * k.layers}});
    }
    j["total_bytes"] = plan->total_bytes;
    j["bytes_per_token"] = per_token;
    j["long_context_bytes_per_token"] = long_per_token;
    j["uncompressed_bytes"] = *uncompressed;
    j["uncompressed_bytes_per_token"] = uncompressed_per_token;
    j["compression"] = ratio;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("model        %s (%u layers: %u window, %u csa m=4, %u hca m=128), fingerprint %016llx\n",
              model->name.c_str(), model->num_hidden_layers, kinds[0].layers, kinds[1].layers, kinds[2].layers,
              static_cast<unsigned long long>(plan->model_fingerprint));
  std::printf("context      %llu tokens (model bound %llu)\n", static_cast<unsigned long long>(context),
              static_cast<unsigned long long>(model->max_position_embeddings));
  std::printf("storage      attention rows %s (%llu B/row), indexer rows %s (%llu B/row)\n\n",
              std::string(dsv4::row_storage_name(storage.attention)).c_str(),
              static_cast<unsigned long long>(dsv4::attention_row_bytes(storage.attention)),
              std::string(dsv4::indexer_storage_name(storage.indexer)).c_str(),
              static_cast<unsigned long long>(dsv4::indexer_row_bytes(storage.indexer)));
  std::printf("%-12s %6s %14s %14s %14s %12s %16s %16s\n", "layer type", "layers", "window B", "compressed B",
              "indexer B", "states B", "per layer B", "all layers B");
  for (const KindSummary& k : kinds) {
    if (k.layers == 0) continue;
    const dsv4::LayerPlan& l = *k.example;
    std::string name = fmt::format("{} m={}", dsv4::layer_kind_name(k.kind), k.ratio);
    std::printf("%-12s %6u %14llu %14llu %14llu %12llu %16llu %16llu\n", name.c_str(), k.layers,
                static_cast<unsigned long long>(l.window_bytes), static_cast<unsigned long long>(l.compressed_bytes),
                static_cast<unsigned long long>(l.indexer_bytes),
                static_cast<unsigned long long>(2 * l.state_bytes + 2 * l.indexer_state_bytes),
                static_cast<unsigned long long>(l.resident_bytes),
                static_cast<unsigned long long>(l.resident_bytes * k.layers));
  }
  std::printf("%-12s %6u %14s %14s %14s %12s %16s %16llu  (%s)\n\n", "total", model->num_hidden_layers, "", "", "", "",
              "", static_cast<unsigned long long>(plan->total_bytes), human_bytes(plan->total_bytes).c_str());
  std::printf("per token    %.2f B at this context (%.2f B as the context grows)\n", per_token, long_per_token);
  std::printf("uncompressed %.0f B per token, %llu B in total (%s) for %u layers x 512 bf16 dims\n",
              uncompressed_per_token, static_cast<unsigned long long>(*uncompressed),
              human_bytes(*uncompressed).c_str(), model->num_hidden_layers);
  if (ratio >= 1.0) {
    std::printf("ratio        %.2fx smaller than uncompressed\n", ratio);
  } else {
    std::printf("ratio        %.2fx larger than uncompressed (window and compressor states dominate short contexts)\n",
                1.0 / ratio);
  }
  return 0;
}

const CommandRegistration registration{"plan", [](CLI::App& app, int& exit_code) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand("plan", "Size a DeepSeek-V4 hybrid cache for a model and a context length");
  cmd->add_option("--model", options->model, "deepseek-v4-flash, deepseek-v4-pro, or PATH/config.json")->required();
  cmd->add_option("--context", options->context, "context length in tokens")
      ->required()
      ->type_name("TOKENS");
  cmd->add_option("--storage", options->storage, "attention row storage: bf16 (1024 B) or fp8 (584 B)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  cmd->add_option("--indexer", options->indexer,
                  "indexer row storage: bf16 (256 B), fp8 (132 B) or mxfp4 (68 B); default follows --storage")
      ->check(CLI::IsMember({"bf16", "fp8", "mxfp4"}));
  cmd->add_flag("--json", options->json, "print JSON instead of a table");
  cmd->callback([options, &exit_code] { exit_code = run_plan(*options); });
}};

}  // namespace
}  // namespace kvcompact::cli
