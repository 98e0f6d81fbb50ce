// End-to-end tests of the kvcompact binary: inspect verifies real and damaged files, plan reports
// errors with its exit code, eval --quick emits machine-readable output.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "kvcompact/dsv4/anchor_image.hpp"
#include "kvcompact/dsv4/cache.hpp"
#include "kvcompact/tq/snapshot_blob.hpp"
#include "test_seed.hpp"

namespace kvcompact {
namespace {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs the binary; stderr joins the output unless `keep_stderr_out` (then it is discarded), or `redirects`
// replaces both rules (e.g. "2>&1 >/dev/full": stderr captured, stdout elsewhere).
CommandResult run_cli(const std::string& args, bool keep_stderr_out = false, const std::string& redirects = "") {
  const std::string command = std::string(KVCOMPACT_CLI) + " " + args + " " +
                              (!redirects.empty() ? redirects : keep_stderr_out ? "2>/dev/null" : "2>&1");
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) result.output += buffer.data();
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::filesystem::path temp_file(const std::string& name, const std::vector<std::uint8_t>& bytes) {
  auto path = std::filesystem::temp_directory_path() /
              ("kvcompact_cli_" + std::to_string(std::random_device{}()) + "_" + name);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::vector<std::uint8_t> sample_key_blob() {
  tq::CacheShape shape;
  shape.head_dim = 64;
  shape.kv_heads = {2};
  shape.capacity = 16;
  auto cache = tq::TurboQuantCache::create(shape, tq::QuantConfig::seed_system(11)).value();
  std::vector<float> rows(5 * 2 * 64);
  std::mt19937 rng(static_cast<std::mt19937::result_type>(kvcompact::testing_support::fresh_seed()));  // (replayable)
  std::normal_distribution<float> normal;
  for (auto& x : rows) x = normal(rng);
  EXPECT_TRUE(cache.append(0, 0, 0, 5, DType::F32, rows.data(), rows.data()).ok());
  return tq::snapshot_layer_blobs(cache, 0, 0).value().keys;
}

TEST(Cli, InspectVerifiesBlobsAndRejectsDamage) {
  auto blob = sample_key_blob();
  auto good = temp_file("good.kvcb", blob);
  auto result = run_cli("inspect " + good.string());
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("prod3"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("verification      OK"), std::string::npos) << result.output;

  blob[blob.size() / 2] ^= 0x40;
  auto bad = temp_file("bad.kvcb", blob);
  result = run_cli("inspect " + bad.string());
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("FAILED"), std::string::npos) << result.output;

  auto junk = temp_file("junk.bin", {1, 2, 3});
  EXPECT_EQ(run_cli("inspect " + junk.string()).exit_code, 1);
  EXPECT_EQ(run_cli("inspect /nonexistent/kvcompact/file").exit_code, 1);
  EXPECT_EQ(run_cli("inspect").exit_code, 2);
  for (const auto& p : {good, bad, junk}) std::filesystem::remove(p);
}

TEST(Cli, InspectVerifiesDeepseekAnchorImages) {
  auto model = dsv4::resolve_model("deepseek-v4-flash").value();
  auto cache = dsv4::Deepseek4Cache::create(model, 256).value();
  std::vector<std::uint32_t> ledger;
  for (std::uint32_t t = 0; t < 9; ++t) {
    auto step = cache.plan_next_step();
    ASSERT_TRUE(step.ok());
    ASSERT_TRUE(cache.commit_step(step->position).ok());
    ledger.push_back(1000 + t);
  }
  auto image = dsv4::encode_anchor_image(cache, ledger).value();
  auto good = temp_file("good.image", image);
  auto result = run_cli("inspect " + good.string());
  EXPECT_EQ(result.exit_code, 0) << result.output;
  image[image.size() - 20] ^= 0x01;
  auto bad = temp_file("bad.image", image);
  result = run_cli("inspect " + bad.string());
  EXPECT_EQ(result.exit_code, 1) << result.output;
  std::filesystem::remove(good);
  std::filesystem::remove(bad);
}

TEST(Cli, PlanReportsTheReferenceFootprintAndClearErrors) {
  auto result = run_cli("plan --model deepseek-v4-flash --context 1048576 --json");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto json = nlohmann::json::parse(result.output, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << result.output;
  // The reference footprint (docs/deepseek-v4.md): V4-Flash, bf16 rows, 1M tokens.
  EXPECT_EQ(json.value("total_bytes", std::uint64_t{0}), 7232045056ull) << result.output;
  EXPECT_EQ(json.value("long_context_bytes_per_token", 0.0), 6880.0) << result.output;
  EXPECT_EQ(json.value("layers", 0), 43) << result.output;
  result = run_cli("plan --model deepseek-v4-flash --context 0");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("EmptyContext"), std::string::npos) << result.output;
  result = run_cli("plan --model deepseek-v4-pro --context 2000000");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("ContextBound"), std::string::npos) << result.output;
  result = run_cli("plan --model /nonexistent/config.json --context 10");
  EXPECT_EQ(result.exit_code, 1) << result.output;
}

TEST(Cli, EvalQuickEmitsJsonAndCsv) {
  auto result = run_cli("eval --quick --json", true);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto json = nlohmann::json::parse(result.output, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << result.output.substr(0, 2000);
  for (const auto& mode : json["modes"]) {  // every codec statistic comes with its standard error
    for (const char* key : {"key_dmse_se", "value_dmse_se", "ip_slope_se", "ip_var_d_se"}) {
      ASSERT_TRUE(mode[key].is_number()) << key;
      EXPECT_GT(mode[key].get<double>(), 0.0) << key;
    }
    EXPECT_TRUE(mode["key_theory_exact"].is_boolean());
  }
  result = run_cli("eval --quick --csv --modes seed", true);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("k=prod3,v=mse2"), std::string::npos) << result.output;
  EXPECT_NE(run_cli("eval --modes k=prod9,v=mse2").exit_code, 0);
  // The sample sizes reach the report.
  result = run_cli("eval --quick --json --modes seed --contexts 64 --mse-vectors 50 --ip-pairs 60", true);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  json = nlohmann::json::parse(result.output, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << result.output.substr(0, 2000);
  EXPECT_EQ(json["mse_vectors"], 50);
  EXPECT_EQ(json["ip_pairs"], 60);
}

// Inputs that used to abort the tool, run the wrong thing or report success: each is now an error with a message.
TEST(Cli, BadInputsAndFailedWritesAreErrors) {
  const auto dir = std::filesystem::temp_directory_path();
  auto result = run_cli("inspect " + dir.string());
  EXPECT_EQ(result.exit_code, 1) << result.output;  // (an uncaught std::ios_failure: exit 134)
  EXPECT_NE(result.output.find("is a directory"), std::string::npos) << result.output;
  result = run_cli("eval --quick -q --modes ';;'");
  EXPECT_EQ(result.exit_code, 1) << result.output;  // (ran the built-in list)
  EXPECT_NE(result.output.find("names no mode"), std::string::npos) << result.output;
  result = run_cli("eval --quick -q --modes seed --seed -1");
  EXPECT_EQ(result.exit_code, 2) << result.output;  // (ran with seed 2^64 - 1)
  EXPECT_NE(result.output.find("must not be negative"), std::string::npos) << result.output;
  result = run_cli("eval --quick -q --modes seed --mse-vectors 1");
  EXPECT_EQ(result.exit_code, 1) << result.output;  // (no standard error from one sample)
  EXPECT_NE(result.output.find("mse_vectors ≥ 2"), std::string::npos) << result.output;
  if (std::filesystem::exists("/dev/full")) {
    result = run_cli("plan --model deepseek-v4-flash --context 100 --json", false, "2>&1 >/dev/full");
    EXPECT_EQ(result.exit_code, 1) << result.output;  // (exit 0 with nothing written)
    EXPECT_NE(result.output.find("writing the output failed"), std::string::npos) << result.output;
  }
}

}  // namespace
}  // namespace kvcompact
