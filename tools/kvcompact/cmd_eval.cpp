// `kvcompact eval`: runs the TurboQuant evaluation (tq/eval.hpp) and prints a table, JSON or CSV on stdout,
// progress lines on stderr. The default finishes in well under a minute on two cores; --quick is a smoke run.
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "kvcompact/core/parallel.hpp"
#include "kvcompact/tq/eval.hpp"

namespace kvcompact::cli {
namespace {

struct EvalCliOptions {
  std::vector<std::uint32_t> contexts;
  std::string modes;  // ';'-separated (mode strings contain commas)
  bool modes_given = false;
  std::uint32_t head_dim = 128;
  std::uint32_t kv_heads = 2;
  std::uint32_t q_heads = 8;
  std::uint64_t seed = 0;
  std::uint32_t threads = 0;
  std::uint32_t mse_vectors = tq::EvalOptions{}.mse_vectors;
  std::uint32_t ip_pairs = tq::EvalOptions{}.ip_pairs;
  bool quick = false;
  bool json = false;
  bool csv = false;
  bool quiet = false;
};

std::vector<std::string> split_modes(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ';')) {
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int run_eval_command(const EvalCliOptions& cli) {
  if (cli.threads > 0) set_num_threads(cli.threads);
  tq::EvalOptions options;
  options.contexts = cli.contexts;
  options.modes = split_modes(cli.modes);
  if (cli.modes_given && options.modes.empty()) {
    std::fprintf(stderr,
                 "kvcompact eval: InvalidArgument: --modes '%s' names no mode (omit it for the built-in list)\n",
                 cli.modes.c_str());
    return 1;
  }
  options.head_dim = cli.head_dim;
  options.kv_heads = cli.kv_heads;
  options.q_heads = cli.q_heads;
  options.seed = cli.seed;
  options.mse_vectors = cli.mse_vectors;
  options.ip_pairs = cli.ip_pairs;
  options.threads = cli.threads;
  options.quick = cli.quick;
  const auto start = std::chrono::steady_clock::now();
  if (!cli.quiet) {
    options.progress = [start](std::string_view line) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "[%6.1fs] %.*s\n", s, static_cast<int>(line.size()), line.data());
    };
  }
  auto report = tq::run_eval(options);
  if (!report.ok()) {
    std::fprintf(stderr, "kvcompact eval: %s\n", report.error().to_string().c_str());
    return 1;
  }
  const std::string text = cli.json  ? tq::format_eval_json(*report)
                           : cli.csv ? tq::format_eval_csv(*report)
                                     : tq::format_eval_table(*report);
  std::fputs(text.c_str(), stdout);
  return 0;
}

const CommandRegistration registration{"eval", [](CLI::App& app, int& exit_code) {
  auto options = std::make_shared<EvalCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "Evaluate TurboQuant modes: bits, codec statistics vs theory, attention fidelity and speed");
  cmd->add_option("--contexts", options->contexts, "context lengths (default 1024 8192 32768; quick: 1024 4096)")
      ->delimiter(',');
  CLI::Option* modes = cmd->add_option("--modes", options->modes,
                  "modes separated by ';', e.g. \"seed;k=prod4,v=mse4;k=mse4,v=mse4,nc,w=128\" (default: a built-in list)");
  cmd->add_option("--head-dim", options->head_dim, "head dimension (multiple of 16, 16..1024)")->capture_default_str();
  cmd->add_option("--kv-heads", options->kv_heads, "KV heads of the synthetic layer")->capture_default_str();
  cmd->add_option("--q-heads", options->q_heads, "query heads (a multiple of --kv-heads)")->capture_default_str();
  cmd->add_option("--seed", options->seed, "data and rotation seed")
      ->check(CLI::Validator(  // (an unsigned option would take -1 as 2^64 - 1)
          [](std::string& value) { return value.find('-') != std::string::npos ? "must not be negative" : ""; },
          "", "non-negative"))
      ->capture_default_str();
  cmd->add_option("--mse-vectors", options->mse_vectors,
                  "random unit vectors per mode for D_mse (standard errors shrink as 1/sqrt; quick: at most 1000)")
      ->capture_default_str();
  cmd->add_option("--ip-pairs", options->ip_pairs,
                  "random (query, key) pairs per mode for the inner-product slope and variance (quick: at most 4000)")
      ->capture_default_str();
  cmd->add_option("--threads", options->threads, "worker threads, at most 1024 (0: KVCOMPACT_NUM_THREADS or all cores)")
      ->capture_default_str();
  cmd->add_flag("--quick", options->quick, "smaller contexts and sample counts (a smoke run)");
  auto* json = cmd->add_flag("--json", options->json, "print JSON instead of the table");
  cmd->add_flag("--csv", options->csv, "print CSV (one row per mode and context)")->excludes(json);
  cmd->add_flag("-q,--quiet", options->quiet, "no progress lines on stderr");
  cmd->callback([options, modes, &exit_code] {
    options->modes_given = modes->count() > 0;
    exit_code = run_eval_command(*options);
  });
}};

}  // namespace
}  // namespace kvcompact::cli
