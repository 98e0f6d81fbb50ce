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
  options.modes = {"seed", "k=mse4,v=mse3,nc", "k=prod4,v=mse4,w=64"};
  options.head_dim = 64;
  options.kv_heads = 2;
  options.q_heads = 8;
  options.query_rows = 4;
  options.ip_pairs = 10000;
  options.mse_vectors = 2000;
  options.seed = seed;
  options.min_timing_ms = 1.0;
  return options;
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
  ASSERT_EQ(report->modes.size(), 3u);
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
    // Sampling errors here are ≲ 1 % (D_mse), ≲ 2 % (variance), ≲ 0.003 (slope); the theory's Gaussian
    // approximations add a few per cent at d = 64.
    EXPECT_NEAR(m.key_dmse / m.key_dmse_theory, 1.0, 0.08);
    EXPECT_NEAR(m.value_dmse / m.value_dmse_theory, 1.0, 0.08);
    EXPECT_NEAR(m.ip_slope, m.ip_slope_theory, 0.02);
    EXPECT_NEAR(m.ip_var_d / m.ip_var_d_theory, 1.0, 0.12);
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
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 3 * 2);  // header + modes × contexts
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
