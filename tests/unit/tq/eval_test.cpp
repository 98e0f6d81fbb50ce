// The eval engine on a small configuration: storage numbers are exact, codec statistics agree with the
// theory within their sampling error, attention fidelity is sane (exact window modes are no worse), the
// renderings carry every mode and context, and bad options are typed errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kvcompact/tq/eval.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::tq {
namespace {

EvalOptions small_options(std::uint64_t seed) {
  EvalOptions options;
  options.contexts = {300, 130};  // unsorted on purpose
  options.modes = {"seed", "k=mse4,v=mse3,nc", "k=prod4,v=mse4,w=64", "k=mse3,v=mse2"};  // the last: exact theories
  options.head_dim = 64;
  options.kv_heads = 2;
  options.q_heads = 8;
  options.query_rows = 4;
  options.ip_pairs = 40000;
  options.mse_vectors = 40000;
  options.seed = seed;
  options.min_timing_ms = 1.0;
  return options;
}

// How far a statistic may sit from its theory: 5 standard errors (a chance failure once in 1.7 million
// checks) plus 10⁻⁶ relative (float rounding in the codec) where the theory is an exact expectation; where it
// is an approximation (norm correction, QJL keys) also the approximation's own bias, which shrinks as 1/d.
// Measured with 400 000 vectors and 800 000 pairs for every default mode (`kvcompact eval --contexts 256
// --head-dim D --mse-vectors 400000 --ip-pairs 800000 --json`, d = 64 and 128): D_mse and ip var*d sit
// 1.3–2.8/d below their theories (relative), QJL slopes 0.05–0.25/d above 1 (√(π/2) is the Gaussian limit
// of E|u|·√d for a coordinate u of a random unit vector), norm-corrected slopes within 0.03/d; the exact
// theories within 2.9 standard errors.
constexpr double kRelativeBiasTimesD = 3.5;  // the approximations' allowance: 3.5/d relative (D_mse, ip var*d)
constexpr double kSlopeBiasTimesD = 0.5;     // and 0.5/d absolute (ip slope)

// allowance: the approximation's bias (absolute), counted only where the theory is not exact.
void expect_on_theory(const char* what, double measured, double standard_error, double theory, bool exact,
                      double allowance) {
  const double bound = 5.0 * standard_error + 1e-6 * std::abs(theory) + (exact ? 0.0 : allowance);
  EXPECT_LE(std::abs(measured - theory), bound)
      << what << ": " << measured << " ± " << standard_error << " against " << (exact ? "exact" : "approximate")
      << " theory " << theory << " (" << (measured - theory) / standard_error << " standard errors)";
}

TEST(TqEval, SmallRunAgreesWithTheory) {
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::uint32_t progress_lines = 0;
  EvalOptions options = small_options(seed);
  options.progress = [&](std::string_view) { ++progress_lines; };
  auto report = run_eval(options);
  ASSERT_TRUE(report.ok()) << report.error().to_string();
  EXPECT_GT(progress_lines, 5u);
  ASSERT_EQ(report->modes.size(), 4u);
  EXPECT_EQ(report->contexts, (std::vector<std::uint32_t>{130, 300}));

  // Storage at d = 64: seed keys 16 B codes + 8 B signs + 4 B norm + 2 B residual = 30 B, values 16 + 4 = 20 B.
  const EvalModeResult& seed_mode = report->modes[0];
  EXPECT_EQ(seed_mode.mode, "k=prod3,v=mse2");
  EXPECT_DOUBLE_EQ(seed_mode.key_bits, 30.0 * 8 / 64);
  EXPECT_DOUBLE_EQ(seed_mode.value_bits, 20.0 * 8 / 64);
  EXPECT_EQ(seed_mode.bytes_per_token_head, 50u);
  EXPECT_EQ(seed_mode.bf16_bytes_per_token_head, 256u);
  EXPECT_DOUBLE_EQ(seed_mode.compression, 256.0 / 50.0);
  EXPECT_EQ(report->modes[2].window_bytes_per_head, 64u * 2 * 64 * 4);

  for (const EvalModeResult& m : report->modes) {
    SCOPED_TRACE(m.mode);
    EXPECT_EQ(m.key_theory_exact, !m.config.has_qjl() && !m.config.norm_correction);
    EXPECT_EQ(m.value_theory_exact, !m.config.norm_correction);
    // Standard errors are positive and as small as these sample sizes make them (a broken, inflated one would
    // loosen every bound below): measured ≈ 0.5 % of D_mse, ≈ 1.5 % of the variance, ≈ 0.003 of the slope.
    for (double relative_se :
         {m.key_dmse_se / m.key_dmse, m.value_dmse_se / m.value_dmse, m.ip_var_d_se / m.ip_var_d}) {
      EXPECT_GT(relative_se, 0.0);
      EXPECT_LT(relative_se, 0.04);
    }
    EXPECT_GT(m.ip_slope_se, 0.0);
    EXPECT_LT(m.ip_slope_se, 0.01);
    const double d = report->head_dim;
    expect_on_theory("K D_mse", m.key_dmse, m.key_dmse_se, m.key_dmse_theory, m.key_theory_exact,
                     kRelativeBiasTimesD / d * m.key_dmse_theory);
    expect_on_theory("V D_mse", m.value_dmse, m.value_dmse_se, m.value_dmse_theory, m.value_theory_exact,
                     kRelativeBiasTimesD / d * m.value_dmse_theory);
    expect_on_theory("ip var*d", m.ip_var_d, m.ip_var_d_se, m.ip_var_d_theory, m.key_theory_exact,
                     kRelativeBiasTimesD / d * m.ip_var_d_theory);
    expect_on_theory("ip slope", m.ip_slope, m.ip_slope_se, m.ip_slope_theory, m.key_theory_exact,
                     kSlopeBiasTimesD / d);
    EXPECT_EQ(m.ip_var_d_table >= 0, m.config.has_qjl());
    ASSERT_EQ(m.contexts.size(), 2u);
    for (const EvalContextResult& c : m.contexts) {
      EXPECT_GT(c.rel_error_mean, 0.0);
      EXPECT_TRUE(std::isfinite(c.rel_error_mean));
      EXPECT_GE(c.rel_error_max, c.rel_error_mean);
      EXPECT_GE(c.top8_overlap, 0.0);
      EXPECT_LE(c.top8_overlap, 1.0);
      EXPECT_GT(c.fast_us, 0.0);
      EXPECT_GT(c.exact_us, 0.0);
      EXPECT_DOUBLE_EQ(c.speedup, c.exact_us / c.fast_us);
      EXPECT_GT(c.fast_cpu_us, 0.0);
      EXPECT_GT(c.exact_cpu_us, 0.0);
      EXPECT_DOUBLE_EQ(c.cpu_speedup, c.exact_cpu_us / c.fast_cpu_us);
    }
  }
  // 4-bit keys and values beat the seed's 3-bit keys / 2-bit values on attention output.
  for (std::size_t c = 0; c < 2; ++c) {
    EXPECT_LT(report->modes[1].contexts[c].rel_error_mean, report->modes[0].contexts[c].rel_error_mean);
  }

  const std::string table = format_eval_table(*report);
  const std::string json = format_eval_json(*report);
  const std::string csv = format_eval_csv(*report);
  for (const EvalModeResult& m : report->modes) {
    EXPECT_NE(table.find(m.mode), std::string::npos);
    EXPECT_NE(json.find("\"" + m.mode + "\""), std::string::npos);
  }
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(std::count(json.begin(), json.end(), '{'), std::count(json.begin(), json.end(), '}'));
  EXPECT_EQ(std::count(json.begin(), json.end(), '['), std::count(json.begin(), json.end(), ']'));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 4 * 2);  // header + modes × contexts
  // Mode names contain commas, so CSV quotes them.
  EXPECT_NE(csv.find("\"k=prod3,v=mse2\",130,"), std::string::npos);
}

TEST(TqEval, RejectsBadOptions) {
  EvalOptions options = small_options(1);
  options.modes = {"k=prod9,v=mse2"};
  EXPECT_FALSE(run_eval(options).ok());
  options = small_options(1);
  options.q_heads = 3;
  EXPECT_EQ(run_eval(options).error().code, ErrorCode::InvalidArgument);
  options = small_options(1);
  options.contexts = {0, 128};
  EXPECT_EQ(run_eval(options).error().code, ErrorCode::InvalidArgument);
  options = small_options(1);
  options.head_dim = 100;
  EXPECT_FALSE(run_eval(options).ok());
  // An exact window longer than every context: refused up front, naming the mode.
  options = small_options(1);
  options.contexts = {64};
  options.modes = {"k=mse4,v=mse3,w=128"};
  const auto windowed = run_eval(options);
  ASSERT_FALSE(windowed.ok());
  EXPECT_EQ(windowed.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(windowed.error().message.find("k=mse4,v=mse3,w=128"), std::string::npos) << windowed.error().message;
}

}  // namespace
}  // namespace kvcompact::tq
