// The `kvcompact eval` engine as a library call: for each TurboQuant mode, storage cost, codec statistics
// against theory (D_mse, inner-product slope and error variance), attention fidelity against exact
// attention on synthetic KV with realistic structure, and the fast path's speed against exact fp32
// attention measured in the same run. The CLI only parses options and prints; docs/tq-cache.md explains
// every column.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kvcompact/core/error.hpp"
#include "kvcompact/tq/config.hpp"

namespace kvcompact::tq {

struct EvalOptions {
  std::vector<std::uint32_t> contexts;  // empty: {1024, 8192, 32768} ({1024, 4096} with quick)
  std::vector<std::string> modes;       // preset or mode strings; empty: default_eval_modes()
  std::uint32_t head_dim = 128;
  std::uint32_t kv_heads = 2;
  std::uint32_t q_heads = 8;     // GQA group q_heads / kv_heads
  std::uint32_t query_rows = 8;  // fidelity queries per context: the last query_rows positions
  std::uint32_t ip_pairs = 20000;    // inner-product (query, key) pairs per mode (≥ 2)
  std::uint32_t mse_vectors = 10000;  // random unit vectors per mode for D_mse (≥ 2)
  std::uint64_t seed = 0;        // data and rotation seed
  std::uint32_t threads = 0;     // attention threads (0 = the pool's size)
  bool quick = false;            // smoke run: contexts 1K / 4K, ≤ 4000 pairs, ≤ 1000 vectors, 5 ms timings
  double min_timing_ms = 60.0;   // each timing pair repeats until this much time has passed (and ≥ 5 runs)
  std::function<void(std::string_view)> progress;  // one line per step, or empty
};

// Fidelity and speed at one context length (decode queries at the end of the context).
struct EvalContextResult {
  std::uint32_t context = 0;
  double rel_error_mean = 0.0;  // mean over (query row, head) of ‖out − exact‖ / ‖exact‖
  double rel_error_max = 0.0;
  double top8_overlap = 0.0;    // mean |top-8 positions by quantised logits ∩ by exact logits| / 8
  // Best time of one decode call (1 row at the last position, all query heads), timed alternately:
  double fast_us = 0.0;         // the fast packed path
  double exact_us = 0.0;        // exact fp32 attention over the original f32 KV, same threads
  double speedup = 0.0;         // exact_us / fast_us (> 1: the packed path is faster)
  // The same calls' best process CPU time (all threads): the work done, robust on a busy machine.
  double fast_cpu_us = 0.0;
  double exact_cpu_us = 0.0;
  double cpu_speedup = 0.0;     // exact_cpu_us / fast_cpu_us
};

struct EvalModeResult {
  std::string mode;  // QuantConfig::name()
  QuantConfig config{};
  double key_bits = 0.0;    // stored bits per key coordinate, norms included
  double value_bits = 0.0;  // stored bits per value coordinate, norms included
  std::uint32_t bytes_per_token_head = 0;  // key + value bytes of one token of one KV head
  std::uint32_t bf16_bytes_per_token_head = 0;  // 4·head_dim (bf16 K + V)
  double compression = 0.0;  // bf16 bytes / packed bytes
  std::uint64_t window_bytes_per_head = 0;  // fixed cost of the exact window per sequence and KV head

  // Sampled codec statistics, each with its standard error (_se) and its theory (docs/tq-cache.md, "Columns":
  // exact for plain mse codes, an approximation with norm correction or QJL keys; theory_exact says which).
  // key_dmse: E‖x − x̂‖² of unit keys (explicit dequantisation); value_dmse: the same for values; ip_slope: the
  // least-squares slope of the estimate against ⟨y, x⟩; ip_var_d: d · E[(estimate − ⟨y, x⟩)²], unit x and y.
  double key_dmse = 0.0, key_dmse_se = 0.0, key_dmse_theory = 0.0;
  double value_dmse = 0.0, value_dmse_se = 0.0, value_dmse_theory = 0.0;
  double ip_slope = 0.0, ip_slope_se = 0.0, ip_slope_theory = 0.0;
  double ip_var_d = 0.0, ip_var_d_se = 0.0, ip_var_d_theory = 0.0;
  bool key_theory_exact = false;    // the key columns' theories (D_mse, slope, var) are exact expectations
  bool value_theory_exact = false;  // the value D_mse theory is
  double ip_var_d_table = -1.0;  // prod keys: π/2 · D_{b−1}, the reference table's constant; −1 otherwise

  std::vector<EvalContextResult> contexts;
};

struct EvalReport {
  std::uint32_t head_dim = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t q_heads = 0;
  std::uint32_t query_rows = 0;
  std::uint32_t ip_pairs = 0;
  std::uint32_t mse_vectors = 0;
  std::uint64_t seed = 0;
  std::uint32_t threads = 0;  // threads the attention calls used
  std::vector<std::uint32_t> contexts;
  std::vector<EvalModeResult> modes;
  double seconds = 0.0;  // wall time of the whole evaluation
};

// The default mode list (preset names and mode strings accepted by QuantConfig::parse).
std::vector<std::string> default_eval_modes();

// Runs the evaluation. Errors: an unparsable mode, a bad head_dim / head counts / context.
Result<EvalReport> run_eval(const EvalOptions& options);

// Renderings: an aligned text table, JSON (one object), CSV (one row per mode and context).
std::string format_eval_table(const EvalReport& report);
std::string format_eval_json(const EvalReport& report);
std::string format_eval_csv(const EvalReport& report);

}  // namespace kvcompact::tq
