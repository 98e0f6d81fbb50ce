// RoPE / YaRN: the correction range and frequency table against values derived here from the formulas,
// known rotations at small positions, inverse(forward(x)) = x, and the fast path against the oracle.
#include "kvcompact/dsv4/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "math_test_util.hpp"

namespace kvcompact::dsv4 {
namespace {

using testutil::close_to;
using testutil::to_f64;

TEST(DsvRope, RegimesByRatio) {
  const RopeConfig plain = rope_config_for_ratio(0);
  EXPECT_EQ(plain.theta, 10000.0);
  EXPECT_FALSE(plain.yarn);
  for (std::uint32_t m : {4u, 128u}) {
    const RopeConfig c = rope_config_for_ratio(m);
    EXPECT_EQ(c.theta, 160000.0);
    EXPECT_TRUE(c.yarn);
    EXPECT_EQ(c.factor, 16.0);
    EXPECT_EQ(c.original_length, 65536.0);
    EXPECT_EQ(c.beta_fast, 32.0);
    EXPECT_EQ(c.beta_slow, 1.0);
  }
}

TEST(DsvRope, FromModelConfigMatchesPreset) {
  auto model = preset_config("deepseek-v4-flash");
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  for (std::uint32_t m : {0u, 4u, 128u}) {
    const RopeConfig a = rope_config_for_layer(*model, m);
    const RopeConfig b = rope_config_for_ratio(m);
    EXPECT_EQ(a.theta, b.theta);
    EXPECT_EQ(a.yarn, b.yarn);
    if (a.yarn) {
      EXPECT_EQ(a.factor, b.factor);
      EXPECT_EQ(a.original_length, b.original_length);
    }
  }
}

TEST(DsvRope, YarnCorrectionRange) {
  // d(r) = 64 ln(65536 / (2 pi r)) / (2 ln 160000): d(32) = 15.45..., d(1) = 24.70...
  const double d32 = 64.0 * std::log(65536.0 / (2.0 * std::numbers::pi * 32.0)) / (2.0 * std::log(160000.0));
  const double d1 = 64.0 * std::log(65536.0 / (2.0 * std::numbers::pi * 1.0)) / (2.0 * std::log(160000.0));
  EXPECT_NEAR(d32, 15.454, 1e-3);
  EXPECT_NEAR(d1, 24.708, 1e-3);
  const YarnRange r = yarn_correction_range(rope_config_for_ratio(4));
  EXPECT_EQ(r.low, 15);
  EXPECT_EQ(r.high, 25);
  // Degenerate configs that validation accepts (any finite theta > 0, any beta > 0): theta = 1 makes d(r)
  // infinite, a beta of 1e-320 makes ln(L / (2 pi r)) infinite. The range saturates (no int conversion of an
  // infinity) and the frequency table stays finite.
  RopeConfig flat = rope_config_for_ratio(4);
  flat.theta = 1.0;
  const YarnRange f = yarn_correction_range(flat);
  EXPECT_EQ(f.low, 1 << 30);
  EXPECT_EQ(f.high, 63);
  RopeConfig tiny_beta = rope_config_for_ratio(4);
  tiny_beta.beta_slow = 1e-320;
  EXPECT_EQ(yarn_correction_range(tiny_beta).high, 63);
  for (const RopeConfig& c : {flat, tiny_beta}) {
    const RopeFrequencies table = make_rope_frequencies(c);
    for (float x : table.inv_freq) EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(DsvRope, FrequencyTable) {
  const RopeFrequencies plain = make_rope_frequencies(rope_config_for_ratio(0));
  const RopeFrequencies yarn = make_rope_frequencies(rope_config_for_ratio(128));
  for (std::size_t i = 0; i < kRopePairs; ++i) {
    const double base_plain = std::pow(10000.0, -static_cast<double>(2 * i) / 64.0);
    const double base_comp = std::pow(160000.0, -static_cast<double>(2 * i) / 64.0);
    EXPECT_NEAR(plain.inv_freq[i], base_plain, 2e-7 * base_plain) << "pair " << i;
    // Linear ramp between pairs 15 and 25: pairs <= 15 keep the frequency, >= 25 are divided by 16.
    const double ramp = std::clamp((static_cast<double>(i) - 15.0) / 10.0, 0.0, 1.0);
    const double expected = base_comp * (ramp / 16.0 + (1.0 - ramp));
    EXPECT_NEAR(yarn.inv_freq[i], expected, 4e-7 * expected) << "pair " << i;
  }
  EXPECT_EQ(plain.inv_freq[0], 1.0f);
  EXPECT_EQ(yarn.inv_freq[0], 1.0f);
}

TEST(DsvRope, KnownRotationsAtSmallPositions) {
  const RopeFrequencies f = make_rope_frequencies(rope_config_for_ratio(0));
  // Position 0 is the identity.
  std::vector<double> x(64);
  for (std::size_t i = 0; i < 64; ++i) x[i] = static_cast<double>(i) - 20.0;
  std::vector<double> y = x;
  rope_rotate_f64(y, 0, f, false);
  EXPECT_EQ(x, y);
  // Position 1, pair 0 rotates by exactly 1 radian: (1, 0) -> (cos 1, sin 1); (0, 1) -> (-sin 1, cos 1).
  std::vector<double> e(64, 0.0);
  e[0] = 1.0;
  e[3] = 1.0;  // pair 1 = (0, 1)
  rope_rotate_f64(e, 1, f, false);
  EXPECT_NEAR(e[0], std::cos(1.0), 1e-15);
  EXPECT_NEAR(e[1], std::sin(1.0), 1e-15);
  const double a1 = static_cast<double>(f.inv_freq[1]);  // pair 1 at position 1
  EXPECT_NEAR(e[2], -std::sin(a1), 1e-15);
  EXPECT_NEAR(e[3], std::cos(a1), 1e-15);
  // Position 3, pair 2 of the plain table: angle 3 * 10000^(-4/64).
  std::vector<double> g(64, 0.0);
  g[4] = 2.0;
  rope_rotate_f64(g, 3, f, false);
  const double ang = 3.0 * std::pow(10000.0, -4.0 / 64.0);
  EXPECT_NEAR(g[4], 2.0 * std::cos(ang), 1e-6);
  EXPECT_NEAR(g[5], 2.0 * std::sin(ang), 1e-6);
  // The fast path agrees on the same known values.
  RopeCosSin cs;
  rope_cos_sin(cs, f, 1);
  float t[64] = {};
  t[0] = 1.0f;
  rope_rotate(t, cs, false);
  EXPECT_FLOAT_EQ(t[0], static_cast<float>(std::cos(1.0)));
  EXPECT_FLOAT_EQ(t[1], static_cast<float>(std::sin(1.0)));
}

TEST(DsvRope, AngleIsFloat32Product) {
  const RopeFrequencies f = make_rope_frequencies(rope_config_for_ratio(4));
  for (std::int64_t p : {0LL, 1LL, 4LL, 65536LL, 1048575LL}) {
    for (std::size_t i = 0; i < kRopePairs; ++i) {
      EXPECT_EQ(rope_angle(f, p, i), static_cast<float>(p) * f.inv_freq[i]);
    }
  }
}

TEST(DsvRope, InverseUndoesForward) {
  KVC_SEEDED(rng);
  for (std::uint32_t m : {0u, 4u, 128u}) {
    const RopeFrequencies f = make_rope_frequencies(rope_config_for_ratio(m));
    for (int trial = 0; trial < 50; ++trial) {
      const std::int64_t p = rng.integer(0, (1 << 20) - 1);
      std::vector<float> x = rng.normals(64);
      std::vector<double> xd = to_f64(x);
      std::vector<double> yd = xd;
      rope_rotate_f64(yd, p, f, false);
      rope_rotate_f64(yd, p, f, true);
      EXPECT_TRUE(close_to(std::vector<float>(x), yd, 1e-14));
      RopeCosSin cs;
      rope_cos_sin(cs, f, p);
      std::vector<float> y = x;
      rope_rotate(y.data(), cs, false);
      rope_rotate(y.data(), cs, true);
      EXPECT_TRUE(close_to(y, xd, 1e-6)) << "position " << p;
    }
  }
}

TEST(DsvRope, FastMatchesOracleAndKeepsPairNorms) {
  KVC_SEEDED(rng);
  for (std::uint32_t m : {0u, 4u, 128u}) {
    const RopeFrequencies f = make_rope_frequencies(rope_config_for_ratio(m));
    for (int trial = 0; trial < 50; ++trial) {
      const std::int64_t p = rng.integer(0, (1 << 20) - 1);
      const bool inverse = trial % 2 == 1;
      // Three rows of width 512, tails at 448.
      std::vector<float> rows = rng.normals(3 * 512);
      std::vector<float> fast = rows;
      RopeCosSin cs;
      rope_cos_sin(cs, f, p);
      rope_rotate_rows(fast.data(), 3, 512, 448, cs, inverse);
      for (std::size_t r = 0; r < 3; ++r) {
        std::vector<double> tail = to_f64(std::span<const float>(rows).subspan(r * 512 + 448, 64));
        rope_rotate_f64(tail, p, f, inverse);
        EXPECT_TRUE(close_to(std::span<const float>(fast).subspan(r * 512 + 448, 64), tail, 1e-6));
        for (std::size_t i = 0; i < 448; ++i) ASSERT_EQ(fast[r * 512 + i], rows[r * 512 + i]);
        for (std::size_t i = 0; i < 32; ++i) {
          const double before = std::hypot(static_cast<double>(rows[r * 512 + 448 + 2 * i]),
                                          static_cast<double>(rows[r * 512 + 449 + 2 * i]));
          const double after = std::hypot(tail[2 * i], tail[2 * i + 1]);
          EXPECT_NEAR(before, after, 1e-12 * (1.0 + before));  // the oracle's rotation
          const double fast_after = std::hypot(static_cast<double>(fast[r * 512 + 448 + 2 * i]),
                                               static_cast<double>(fast[r * 512 + 449 + 2 * i]));
          EXPECT_NEAR(before, fast_after, 1e-6 * (1.0 + before));  // the fast path's, to float precision
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvcompact::dsv4
