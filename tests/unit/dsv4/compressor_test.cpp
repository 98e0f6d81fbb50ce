// Compressor: the reference's worked example, pooling and finished rows against the formula oracle, the
// state against its closed form after every token count, and prefill in chunks of any sizes equal to
// token-by-token decode (state bits and emitted rows bit for bit).
#include "kvcompact/dsv4/compressor.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "kvcompact/dsv4/fp_sim.hpp"
#include "math_test_util.hpp"

namespace kvcompact::dsv4 {
namespace {

using testutil::close_to;
using testutil::same_bits;
using testutil::same_values;
using testutil::to_f64;

// Learned constants and a token history for one compressor.
struct Fixture {
  CompressorParams p;
  RopeFrequencies rope;
  std::vector<float> ape, norm, a, z;
  std::size_t tokens = 0;

  Fixture(testutil::Rng& rng, std::uint32_t ratio, CompressorBranch branch, std::size_t n_tokens) {
    p.ratio = ratio;
    p.overlap = ratio == 4;
    p.branch = branch;
    p.width = branch == CompressorBranch::Main ? kHeadDim : kIndexerHeadDim;
    rope = make_rope_frequencies(rope_config_for_ratio(ratio));
    ape = rng.normals(ratio * p.proj_width(), 0.5f);
    norm.resize(p.width);
    for (float& w : norm) w = rng.uniform(0.5f, 1.5f);
    p.ape = ape.data();
    p.norm_weight = norm.data();
    p.rope = &rope;
    tokens = n_tokens;
    a = rng.normals(n_tokens * p.proj_width());
    z = rng.normals(n_tokens * p.proj_width(), 2.0f);
  }
  std::vector<float> kv_state() const { return std::vector<float>(p.state_floats()); }
};

TEST(DsvCompressor, WorkedExampleRatio2Width1) {
  // Reference example: ratio 2 with the overlap, width 1, zero scores; projections per token
  // [overlap half, normal half] = [10,1], [20,3], [30,5], [40,7] -> rows 2.0 and 10.5.
  CompressorParams p;
  p.ratio = 2;
  p.overlap = true;
  p.width = 1;
  const std::vector<float> a = {10, 1, 20, 3, 30, 5, 40, 7};
  const std::vector<float> z(8, 0.0f);
  std::vector<float> kv(p.state_floats()), sc(p.state_floats());
  compressor_reset_state(p, kv.data(), sc.data());
  std::vector<float> rows;
  for (std::int64_t t = 0; t < 4; ++t) {
    float out = -1.0f;
    if (compressor_pool_step(p, kv.data(), sc.data(), t, &a[2 * t], &z[2 * t], &out)) rows.push_back(out);
  }
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_FLOAT_EQ(rows[0], 2.0f);
  EXPECT_FLOAT_EQ(rows[1], 10.5f);
  EXPECT_DOUBLE_EQ(compressor_pooled_f64(p, 0, a, z)[0], 2.0);
  EXPECT_DOUBLE_EQ(compressor_pooled_f64(p, 1, a, z)[0], 10.5);
}

// Finishing needs the model's row shape (eight-lane RMSNorm, RoPE on the last 64 dims): a worked example's width
// that pooling accepts is refused there instead of reading and writing outside the row.
TEST(DsvCompressorDeathTest, FinishRowRefusesWidthsItCannotFinish) {
  CompressorParams p;
  p.ratio = 2;
  p.overlap = true;
  p.width = 16;
  const std::vector<float> weight(16, 1.0f);
  const RopeFrequencies rope = make_rope_frequencies(rope_config_for_ratio(4));
  p.norm_weight = weight.data();
  p.rope = &rope;
  std::vector<float> row(16, 1.0f);
  EXPECT_DEATH(compressor_finish_row(p, 0, row.data()), "multiple of 8 in \\[64, 512\\]");
}

TEST(DsvCompressor, ResetAndEmissionCounts) {
  CompressorParams p;
  p.ratio = 4;
  std::vector<float> kv(p.state_floats(), 5.0f), sc(p.state_floats(), 5.0f);
  compressor_reset_state(p, kv.data(), sc.data());
  for (std::size_t i = 0; i < kv.size(); ++i) {
    ASSERT_EQ(kv[i], 0.0f);
    ASSERT_TRUE(std::isinf(sc[i]) && sc[i] < 0);
  }
  EXPECT_EQ(p.state_rows(), 8u);
  EXPECT_EQ(p.proj_width(), 1024u);
  EXPECT_EQ(compressor_rows_emitted(4, 0, 3), 0u);
  EXPECT_EQ(compressor_rows_emitted(4, 0, 4), 1u);
  EXPECT_EQ(compressor_rows_emitted(4, 3, 1), 1u);
  EXPECT_EQ(compressor_rows_emitted(4, 3, 6), 2u);
  EXPECT_EQ(compressor_rows_emitted(128, 127, 2), 1u);
  EXPECT_EQ(compressor_rows_emitted(128, 0, 127), 0u);
}

// Runs decode over the fixture's tokens; checks each emitted row against the oracle (pooled and finished
// rows within tolerance, the rounding decomposed exactly) and the state against the closed form.
void check_decode_against_oracle(Fixture& f, bool simulate) {
  f.p.simulate_rounding = simulate;
  std::vector<float> kv(f.p.state_floats()), sc(f.p.state_floats());
  std::vector<float> kv_ref(f.p.state_floats()), sc_ref(f.p.state_floats());
  compressor_reset_state(f.p, kv.data(), sc.data());
  std::vector<float> row(f.p.width), pre(f.p.width);
  CompressorParams no_round = f.p;
  no_round.simulate_rounding = false;
  std::int64_t emitted = 0;
  for (std::size_t t = 0; t < f.tokens; ++t) {
    const float* at = f.a.data() + t * f.p.proj_width();
    const float* zt = f.z.data() + t * f.p.proj_width();
    const bool done = compressor_decode_step(f.p, kv.data(), sc.data(), static_cast<std::int64_t>(t), at, zt, row.data());
    ASSERT_EQ(done, (t + 1) % f.p.ratio == 0) << "token " << t;
    compressor_state_f64(f.p, static_cast<std::int64_t>(t + 1), f.a, f.z, kv_ref.data(), sc_ref.data());
    ASSERT_TRUE(same_bits(kv, kv_ref)) << "kv state after token " << t;
    ASSERT_TRUE(same_bits(sc, sc_ref)) << "score state after token " << t;
    if (!done) continue;
    const std::int64_t g = emitted++;
    ASSERT_EQ(g, static_cast<std::int64_t>(t / f.p.ratio));
    // The finished row before rounding, within float tolerance of the oracle's.
    const std::vector<double> oracle_pre = compressor_row_f64(no_round, g, f.a, f.z);
    std::span<const float> hist_a(f.a.data(), (t + 1) * f.p.proj_width());
    std::span<const float> hist_z(f.z.data(), (t + 1) * f.p.proj_width());
    // Recompute the fast pre-rounding row from the pooled oracle history: pool with the fast path again.
    std::vector<float> kv2(f.p.state_floats()), sc2(f.p.state_floats());
    compressor_reset_state(no_round, kv2.data(), sc2.data());
    std::vector<float> scratch(f.p.width);
    for (std::size_t u = 0; u <= t; ++u) {
      if (compressor_decode_step(no_round, kv2.data(), sc2.data(), static_cast<std::int64_t>(u), hist_a.data() + u * f.p.proj_width(),
                                 hist_z.data() + u * f.p.proj_width(), scratch.data())) {
        pre = scratch;
      }
    }
    ASSERT_TRUE(close_to(pre, oracle_pre, 2e-6)) << "group " << g;
    if (!simulate) {
      ASSERT_TRUE(same_bits(row, pre));
      continue;
    }
    // The rounding applied to the fast pre-rounding row is exactly the oracle's rounding.
    std::vector<double> expect;
    if (f.p.branch == CompressorBranch::Main) {
      expect = to_f64(pre);
      simulate_main_row_f64(expect);
    } else {
      std::vector<float> rotated = pre;
      hadamard(rotated.data(), rotated.size());
      expect = to_f64(rotated);
      fp4_block_sim_f64(expect);
    }
    ASSERT_TRUE(same_values(row, expect)) << "group " << g;
  }
}

TEST(DsvCompressor, Ratio4MainMatchesOracle) {
  KVC_SEEDED(rng);
  Fixture f(rng, 4, CompressorBranch::Main, 14);
  check_decode_against_oracle(f, false);
  check_decode_against_oracle(f, true);
}

TEST(DsvCompressor, Ratio4IndexerMatchesOracle) {
  KVC_SEEDED(rng);
  Fixture f(rng, 4, CompressorBranch::Indexer, 14);
  check_decode_against_oracle(f, false);
  check_decode_against_oracle(f, true);
}

TEST(DsvCompressor, Ratio128MainMatchesOracle) {
  KVC_SEEDED(rng);
  Fixture f(rng, 128, CompressorBranch::Main, 259);
  check_decode_against_oracle(f, true);
}

TEST(DsvCompressor, OverlapUsesPreviousGroupFirstHalf) {
  // Scores that make one item dominate per feature: the pooled value is that item's value.
  KVC_SEEDED(rng);
  Fixture f(rng, 4, CompressorBranch::Main, 8);
  std::fill(f.ape.begin(), f.ape.end(), 0.0f);
  std::fill(f.z.begin(), f.z.end(), 0.0f);
  const std::size_t pw = f.p.proj_width();
  for (std::size_t j = 0; j < 512; ++j) f.z[1 * pw + j] = 60.0f;         // token 1, first half: dominates row 1
  for (std::size_t j = 0; j < 512; ++j) f.z[6 * pw + 512 + j] = 60.0f;   // token 6, second half: competes
  for (std::size_t j = 0; j < 256; ++j) f.z[6 * pw + 512 + j] = -60.0f;  // ...only for features >= 256
  const std::vector<double> r1 = compressor_pooled_f64(f.p, 1, f.a, f.z);
  for (std::size_t j = 0; j < 256; ++j) EXPECT_NEAR(r1[j], f.a[1 * pw + j], 1e-9);
  std::vector<float> kv(f.p.state_floats()), sc(f.p.state_floats()), out(512);
  compressor_reset_state(f.p, kv.data(), sc.data());
  std::vector<float> row1(512);
  for (std::int64_t t = 0; t < 8; ++t) {
    if (compressor_pool_step(f.p, kv.data(), sc.data(), t, f.a.data() + t * pw, f.z.data() + t * pw, out.data()) && t == 7) {
      row1 = out;
    }
  }
  EXPECT_TRUE(close_to(row1, r1, 1e-6));
  // Group 0 pools only the second halves of tokens 0..3 (the "previous" items have weight 0).
  const std::vector<double> r0 = compressor_pooled_f64(f.p, 0, f.a, f.z);
  for (std::size_t j = 0; j < 4; ++j) {
    double mean = 0.0;
    for (std::size_t t = 0; t < 4; ++t) mean += f.a[t * pw + 512 + j] / 4.0;
    EXPECT_NEAR(r0[j], mean, 1e-6);
  }
}

// Feeds the fixture's tokens as prefill chunks of the given sizes (cycled) and compares with decode.
void check_chunks_equal_decode(Fixture& f, const std::vector<std::size_t>& sizes) {
  const std::size_t pw = f.p.proj_width();
  std::vector<float> kv_d(f.p.state_floats()), sc_d(f.p.state_floats());
  std::vector<float> kv_p(f.p.state_floats()), sc_p(f.p.state_floats());
  compressor_reset_state(f.p, kv_d.data(), sc_d.data());
  compressor_reset_state(f.p, kv_p.data(), sc_p.data());
  std::vector<float> rows_d, row(f.p.width);
  for (std::size_t t = 0; t < f.tokens; ++t) {
    if (compressor_decode_step(f.p, kv_d.data(), sc_d.data(), static_cast<std::int64_t>(t), f.a.data() + t * pw,
                               f.z.data() + t * pw, row.data())) {
      rows_d.insert(rows_d.end(), row.begin(), row.end());
    }
  }
  std::vector<float> rows_p;
  std::size_t start = 0;
  for (std::size_t c = 0; start < f.tokens; ++c) {
    const std::size_t n = std::min(sizes[c % sizes.size()], f.tokens - start);
    const std::size_t expect = compressor_rows_emitted(f.p.ratio, static_cast<std::int64_t>(start), n);
    std::vector<float> out(std::max<std::size_t>(expect, 1) * f.p.width);
    const std::size_t got = compressor_prefill(f.p, kv_p.data(), sc_p.data(), static_cast<std::int64_t>(start), n,
                                               f.a.data() + start * pw, f.z.data() + start * pw, out.data());
    ASSERT_EQ(got, expect);
    rows_p.insert(rows_p.end(), out.begin(), out.begin() + static_cast<std::ptrdiff_t>(got * f.p.width));
    start += n;
  }
  EXPECT_TRUE(same_bits(kv_p, kv_d));
  EXPECT_TRUE(same_bits(sc_p, sc_d));
  EXPECT_TRUE(same_bits(rows_p, rows_d));
}

TEST(DsvCompressor, PrefillChunksEqualDecode) {
  KVC_SEEDED(rng);
  const std::vector<std::vector<std::size_t>> splits = {{1}, {3}, {127}, {128}, {129}, {5, 1, 127, 2, 130}};
  for (auto [m, branch] : {std::pair{4u, CompressorBranch::Main}, std::pair{4u, CompressorBranch::Indexer},
                           std::pair{128u, CompressorBranch::Main}}) {
    Fixture f(rng, m, branch, m == 4 ? 300 : 520);
    for (const auto& s : splits) {
      SCOPED_TRACE(::testing::Message() << "ratio " << m << " first chunk " << s[0]);
      check_chunks_equal_decode(f, s);
    }
    // Random chunk sizes.
    std::vector<std::size_t> random_sizes;
    for (int i = 0; i < 20; ++i) random_sizes.push_back(static_cast<std::size_t>(rng.integer(1, 200)));
    check_chunks_equal_decode(f, random_sizes);
  }
}

}  // namespace
}  // namespace kvcompact::dsv4
