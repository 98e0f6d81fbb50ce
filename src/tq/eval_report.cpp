// Renderings of an EvalReport: aligned text tables for people, JSON and CSV for machines. JSON is written
// by hand (numbers and plain ASCII names only) so the library needs no JSON dependency.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvcompact/tq/eval.hpp"

namespace kvcompact::tq {

namespace {

// Columns are right-aligned except the first; widths fit the widest cell.
std::string render_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) out += "  ";
      out += c == 0 ? fmt::format("{:<{}}", cells[c], width[c]) : fmt::format("{:>{}}", cells[c], width[c]);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(header);
  std::size_t total = 0;
  for (std::size_t w : width) total += w;
  out += std::string(total + 2 * (width.size() - 1), '-') + "\n";
  for (const auto& r : rows) out += line(r);
  return out;
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{:.9g}", v);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(ch));
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

// "0.011423±0.000021 (=0.011450)": a sampled statistic, its standard error and its theory, marked = where the
// theory is an exact expectation (a gap of many standard errors is then a defect) and ~ where it is an
// approximation. Enough decimals (4 to 8) to show two digits of the standard error.
std::string against_theory(double measured, double standard_error, double theory, bool exact) {
  int decimals = 4;
  if (standard_error > 0 && std::isfinite(standard_error)) {
    decimals = std::clamp(1 - static_cast<int>(std::floor(std::log10(standard_error))), 4, 8);
  }
  return fmt::format("{:.{}f}±{:.{}f} ({}{:.{}f})", measured, decimals, standard_error, decimals, exact ? "=" : "~",
                     theory, decimals);
}

}  // namespace

std::string format_eval_table(const EvalReport& r) {
  std::string out = fmt::format(
      "kvcompact eval: head_dim {}, {} KV heads, {} query heads, seed {}, {} threads; D_mse over {} unit vectors, "
      "inner products over {} pairs\n\n",
      r.head_dim, r.kv_heads, r.q_heads, r.seed, r.threads, r.mse_vectors, r.ip_pairs);
  out += "Storage (bits per coordinate and bytes per token and KV head, norms included)\n";
  std::vector<std::vector<std::string>> rows;
  for (const EvalModeResult& m : r.modes) {
    rows.push_back({m.mode, fmt::format("{:.3f}", m.key_bits), fmt::format("{:.3f}", m.value_bits),
                    fmt::format("{}", m.bytes_per_token_head), fmt::format("{:.2f}x", m.compression)});
  }
  const std::uint32_t bf16 = r.modes.empty() ? 4 * r.head_dim : r.modes.front().bf16_bytes_per_token_head;
  out += render_table({"mode", "K bits", "V bits", "B/tok/head", fmt::format("vs bf16 {}B", bf16)}, rows);
  out += "\nCodec statistics of random unit vectors (measured ± standard error, theory in parentheses: = exact\n"
         "expectation, ~ approximation; ip var*d = d·E[(est − ⟨y,x⟩)²]; ref table = the reference's prod-key variance\n"
         "π/2·D_{b−1}, an iid-Gaussian-JL bound: the orthogonal Hadamard JL gives (π/2 − 1)·D_{b−1}, the theory)\n";
  rows.clear();
  for (const EvalModeResult& m : r.modes) {
    rows.push_back({m.mode, against_theory(m.key_dmse, m.key_dmse_se, m.key_dmse_theory, m.key_theory_exact),
                    against_theory(m.value_dmse, m.value_dmse_se, m.value_dmse_theory, m.value_theory_exact),
                    against_theory(m.ip_slope, m.ip_slope_se, m.ip_slope_theory, m.key_theory_exact),
                    against_theory(m.ip_var_d, m.ip_var_d_se, m.ip_var_d_theory, m.key_theory_exact),
                    m.ip_var_d_table < 0 ? std::string("-") : fmt::format("{:.4f}", m.ip_var_d_table)});
  }
  out += render_table({"mode", "K D_mse", "V D_mse", "ip slope", "ip var*d", "ref table"}, rows);
  out += "\nAttention vs exact fp32 attention on the original KV (decode queries at the end of each context;\n"
         "rel err = ‖out − exact‖/‖exact‖ per query head; top-8 = overlap of the 8 most attended positions;\n"
         "us = best wall time of one decode call, 1 row × all query heads; speedup = exact us / fast us;\n"
         "cpu = best process CPU time (us, all threads) of the same calls, steadier on a busy machine)\n";
  rows.clear();
  for (const EvalModeResult& m : r.modes) {
    for (const EvalContextResult& c : m.contexts) {
      rows.push_back({m.mode, fmt::format("{}", c.context), fmt::format("{:.4f}", c.rel_error_mean),
                      fmt::format("{:.4f}", c.rel_error_max), fmt::format("{:.3f}", c.top8_overlap),
                      fmt::format("{:.1f}", c.fast_us), fmt::format("{:.1f}", c.exact_us),
                      fmt::format("{:.2f}x", c.speedup), fmt::format("{:.1f}", c.fast_cpu_us),
                      fmt::format("{:.1f}", c.exact_cpu_us), fmt::format("{:.2f}x", c.cpu_speedup)});
    }
  }
  out += render_table({"mode", "context", "rel err", "max err", "top-8", "fast us", "exact us", "speedup",
                       "fast cpu", "exact cpu", "cpu ratio"},
                      rows);
  bool window = false;
  for (const EvalModeResult& m : r.modes) window = window || m.config.exact_window > 0;
  if (window) {
    out += "\nModes with w=W also keep the W most recent tokens in f32: a fixed 8·W·head_dim bytes per sequence "
           "and KV head, not included in B/tok/head.\n";
  }
  out += fmt::format("\nTotal {:.1f} s\n", r.seconds);
  return out;
}

std::string format_eval_json(const EvalReport& r) {
  std::string out = "{\n";
  out += fmt::format("  \"head_dim\": {}, \"kv_heads\": {}, \"q_heads\": {}, \"query_rows\": {}, \"ip_pairs\": {}, "
                     "\"mse_vectors\": {}, \"seed\": {}, \"threads\": {}, \"seconds\": {},\n",
                     r.head_dim, r.kv_heads, r.q_heads, r.query_rows, r.ip_pairs, r.mse_vectors, r.seed, r.threads,
                     json_number(r.seconds));
  out += "  \"contexts\": [";
  for (std::size_t i = 0; i < r.contexts.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", r.contexts[i]);
  out += "],\n  \"modes\": [\n";
  for (std::size_t i = 0; i < r.modes.size(); ++i) {
    const EvalModeResult& m = r.modes[i];
    out += "    {";
    out += fmt::format("\"mode\": {}, \"key_bits\": {}, \"value_bits\": {}, \"bytes_per_token_head\": {}, "
                       "\"bf16_bytes_per_token_head\": {}, \"compression\": {}, \"window_bytes_per_head\": {}, ",
                       json_string(m.mode), json_number(m.key_bits), json_number(m.value_bits),
                       m.bytes_per_token_head, m.bf16_bytes_per_token_head, json_number(m.compression),
                       m.window_bytes_per_head);
    out += fmt::format("\"key_dmse\": {}, \"key_dmse_se\": {}, \"key_dmse_theory\": {}, \"value_dmse\": {}, "
                       "\"value_dmse_se\": {}, \"value_dmse_theory\": {}, \"ip_slope\": {}, \"ip_slope_se\": {}, "
                       "\"ip_slope_theory\": {}, \"ip_var_d\": {}, \"ip_var_d_se\": {}, \"ip_var_d_theory\": {}, "
                       "\"ip_var_d_table\": {}, \"key_theory_exact\": {}, \"value_theory_exact\": {}, ",
                       json_number(m.key_dmse), json_number(m.key_dmse_se), json_number(m.key_dmse_theory),
                       json_number(m.value_dmse), json_number(m.value_dmse_se), json_number(m.value_dmse_theory),
                       json_number(m.ip_slope), json_number(m.ip_slope_se), json_number(m.ip_slope_theory),
                       json_number(m.ip_var_d), json_number(m.ip_var_d_se), json_number(m.ip_var_d_theory),
                       m.ip_var_d_table < 0 ? std::string("null") : json_number(m.ip_var_d_table),
                       m.key_theory_exact, m.value_theory_exact);
    out += "\"contexts\": [";
    for (std::size_t k = 0; k < m.contexts.size(); ++k) {
      const EvalContextResult& c = m.contexts[k];
      out += fmt::format("{}{{\"context\": {}, \"rel_error_mean\": {}, \"rel_error_max\": {}, \"top8_overlap\": {}, "
                         "\"fast_us\": {}, \"exact_us\": {}, \"speedup\": {}, \"fast_cpu_us\": {}, "
                         "\"exact_cpu_us\": {}, \"cpu_speedup\": {}}}",
                         k ? ", " : "", c.context, json_number(c.rel_error_mean), json_number(c.rel_error_max),
                         json_number(c.top8_overlap), json_number(c.fast_us), json_number(c.exact_us),
                         json_number(c.speedup), json_number(c.fast_cpu_us), json_number(c.exact_cpu_us),
                         json_number(c.cpu_speedup));
    }
    out += fmt::format("]}}{}\n", i + 1 < r.modes.size() ? "," : "");
  }
  out += "  ]\n}\n";
  return out;
}

std::string format_eval_csv(const EvalReport& r) {
  std::string out =
      "mode,context,key_bits,value_bits,bytes_per_token_head,bf16_bytes_per_token_head,compression,"
      "key_dmse,key_dmse_se,key_dmse_theory,value_dmse,value_dmse_se,value_dmse_theory,ip_slope,ip_slope_se,"
      "ip_slope_theory,ip_var_d,ip_var_d_se,ip_var_d_theory,key_theory_exact,value_theory_exact,"
      "rel_error_mean,rel_error_max,top8_overlap,fast_us,exact_us,speedup,fast_cpu_us,exact_cpu_us,cpu_speedup\n";
  for (const EvalModeResult& m : r.modes) {
    // The columns after the context that every row of this mode repeats.
    const std::string mode_columns = fmt::format(
        // bits, bytes and compression; then each of the four statistics as value, standard error, theory
        "{:.6g},{:.6g},{},{},{:.6g},"
        "{:.6g},{:.3g},{:.6g},{:.6g},{:.3g},{:.6g},{:.6g},{:.3g},{:.6g},{:.6g},{:.3g},{:.6g},"
        "{:d},{:d}",
        m.key_bits, m.value_bits, m.bytes_per_token_head, m.bf16_bytes_per_token_head, m.compression, m.key_dmse,
        m.key_dmse_se, m.key_dmse_theory, m.value_dmse, m.value_dmse_se, m.value_dmse_theory, m.ip_slope,
        m.ip_slope_se, m.ip_slope_theory, m.ip_var_d, m.ip_var_d_se, m.ip_var_d_theory, m.key_theory_exact,
        m.value_theory_exact);
    for (const EvalContextResult& c : m.contexts) {
      out += fmt::format("{},{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g}\n", csv_field(m.mode),
                         c.context, mode_columns, c.rel_error_mean, c.rel_error_max, c.top8_overlap, c.fast_us,
                         c.exact_us, c.speedup, c.fast_cpu_us, c.exact_cpu_us, c.cpu_speedup);
    }
  }
  return out;
}

}  // namespace kvcompact::tq
