// The DSV4 math against independent numpy values (scripts/golden/math_dsv4_golden.py ->
// tests/golden/dsv4/math_golden.json): YaRN / plain frequency tables bit for bit, a forward and an inverse
// rotation, FP8 and Hadamard + FP4 simulation, and two finished ratio-4 compressor rows. Inputs come from
// the script's integer formula, regenerated here bit for bit.
#include <gtest/gtest.h>

#include "golden_dir.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kvcompact/dsv4/compressor.hpp"
#include "kvcompact/dsv4/fp_sim.hpp"
#include "kvcompact/dsv4/rope.hpp"
#include "math_test_util.hpp"

namespace kvcompact::dsv4 {
namespace {

using testutil::close_to;
using testutil::same_values;
using testutil::to_f64;

nlohmann::json load_golden() {
  const std::filesystem::path base = testing_support::golden_dir();
  std::ifstream in(base / "dsv4" / "math_golden.json");
  EXPECT_TRUE(in.good()) << "cannot open " << (base / "dsv4" / "math_golden.json");
  return nlohmann::json::parse(in);
}

float val(std::int64_t k, std::int64_t salt, double scale = 1.0) {
  return static_cast<float>(static_cast<double>((k * 7919 + salt * 104729) % 2001 - 1000) / 400.0 * scale);
}

std::vector<float> vec(std::size_t n, std::int64_t salt, double scale = 1.0) {
  std::vector<float> v(n);
  for (std::size_t k = 0; k < n; ++k) v[k] = val(static_cast<std::int64_t>(k), salt, scale);
  return v;
}

std::vector<double> doubles(const nlohmann::json& j) { return j.get<std::vector<double>>(); }

TEST(DsvMathGolden, FrequencyTablesBitForBit) {
  const nlohmann::json g = load_golden();
  const RopeFrequencies plain = make_rope_frequencies(rope_config_for_ratio(0));
  const RopeFrequencies yarn = make_rope_frequencies(rope_config_for_ratio(4));
  EXPECT_TRUE(same_values(plain.inv_freq, doubles(g["inv_freq_plain"])));
  EXPECT_TRUE(same_values(yarn.inv_freq, doubles(g["inv_freq_yarn"])));
  // A float32 pow that is not correctly rounded (numpy's own) is one ulp off for a few powers, which the
  // float32 reciprocal turns into at most two ulps of the frequency.
  for (const char* key : {"inv_freq_plain_numpy_powf", "inv_freq_yarn_numpy_powf"}) {
    const std::vector<double> other = doubles(g[key]);
    const auto& mine = std::string(key).find("yarn") != std::string::npos ? yarn.inv_freq : plain.inv_freq;
    for (std::size_t i = 0; i < kRopePairs; ++i) {
      const float o = static_cast<float>(other[i]);
      EXPECT_LE(std::fabs(o - mine[i]), 2.0f * (std::nextafter(mine[i], 2.0f * mine[i]) - mine[i])) << key << " pair " << i;
    }
  }
}

TEST(DsvMathGolden, Rotations) {
  const nlohmann::json g = load_golden();
  const std::vector<float> tail = vec(64, 5);
  const RopeFrequencies plain = make_rope_frequencies(rope_config_for_ratio(0));
  const RopeFrequencies yarn = make_rope_frequencies(rope_config_for_ratio(128));
  std::vector<double> f = to_f64(tail);
  rope_rotate_f64(f, 100003, yarn, false);
  EXPECT_TRUE(close_to(std::vector<float>(f.begin(), f.end()), doubles(g["rope"]["forward_yarn"]), 1e-7));
  for (std::size_t i = 0; i < 64; ++i) EXPECT_NEAR(f[i], doubles(g["rope"]["forward_yarn"])[i], 1e-12);
  std::vector<double> inv = to_f64(tail);
  rope_rotate_f64(inv, 77, plain, true);
  for (std::size_t i = 0; i < 64; ++i) EXPECT_NEAR(inv[i], doubles(g["rope"]["inverse_plain"])[i], 1e-12);
  RopeCosSin cs;
  rope_cos_sin(cs, yarn, 100003);
  std::vector<float> fast = tail;
  rope_rotate(fast.data(), cs, false);
  EXPECT_TRUE(close_to(fast, doubles(g["rope"]["forward_yarn"]), 1e-6));
}

TEST(DsvMathGolden, Fp8AndFp4Simulation) {
  const nlohmann::json g = load_golden();
  std::vector<float> fp8_in;
  for (int b = 0; b < 7; ++b) {
    const std::vector<float> blk = vec(64, 10 + b, std::ldexp(1.0, 6 * b - 18));
    fp8_in.insert(fp8_in.end(), blk.begin(), blk.end());
  }
  std::vector<double> oracle = to_f64(fp8_in);
  fp8_block_sim_f64(oracle);
  std::vector<float> fast = fp8_in;
  fp8_block_sim(fast.data(), fast.size());
  const std::vector<double> expect8 = doubles(g["fp8"]["output"]);
  EXPECT_EQ(oracle, expect8);
  EXPECT_TRUE(same_values(fast, expect8));

  const std::vector<float> fp4_in = vec(128, 20, 3.0);
  std::vector<double> o4 = to_f64(fp4_in);
  simulate_indexer_row_f64(o4);
  EXPECT_EQ(o4, doubles(g["fp4"]["hadamard_then_fp4"]));
}

TEST(DsvMathGolden, CompressorRowsRatio4) {
  const nlohmann::json g = load_golden();
  std::vector<float> a, z, ape;
  for (int t = 0; t < 8; ++t) {
    const auto at = vec(1024, 1000 + t), zt = vec(1024, 2000 + t, 0.5);
    a.insert(a.end(), at.begin(), at.end());
    z.insert(z.end(), zt.begin(), zt.end());
  }
  for (int i = 0; i < 4; ++i) {
    const auto ai = vec(1024, 3000 + i, 0.25);
    ape.insert(ape.end(), ai.begin(), ai.end());
  }
  std::vector<float> w = vec(512, 4000, 0.125);
  for (float& x : w) x = 1.0f + x;
  const RopeFrequencies rope = make_rope_frequencies(rope_config_for_ratio(4));
  CompressorParams p;
  p.ape = ape.data();
  p.norm_weight = w.data();
  p.rope = &rope;
  std::vector<float> kv(p.state_floats()), sc(p.state_floats()), row(512);
  compressor_reset_state(p, kv.data(), sc.data());
  std::size_t g_row = 0;
  for (std::int64_t t = 0; t < 8; ++t) {
    const bool done = compressor_decode_step(p, kv.data(), sc.data(), t, a.data() + t * 1024, z.data() + t * 1024, row.data());
    if (!done) continue;
    const std::vector<double> expect = doubles(g["compressor_ratio4"]["rows"][g_row]);
    const std::vector<double> oracle = compressor_row_f64(p, static_cast<std::int64_t>(g_row), a, z);
    for (std::size_t i = 0; i < 512; ++i) ASSERT_NEAR(oracle[i], expect[i], 1e-12) << "row " << g_row << " dim " << i;
    // The float32 fast path: every FP8-rounded dim equal to the golden row's, the RoPE tail (dims 448..511, a
    // float32 rotation) within float error of it (measured: 1.7e-7 of the row's largest value).
    std::size_t equal = 0;
    for (std::size_t i = 0; i < 448; ++i) equal += static_cast<double>(row[i]) == expect[i];
    EXPECT_EQ(equal, 448u) << "row " << g_row << ": FP8 values differ from the golden row";
    double largest = 0.0;
    for (double v : expect) largest = std::max(largest, std::fabs(v));
    for (std::size_t i = 448; i < 512; ++i) {
      EXPECT_NEAR(row[i], expect[i], 1e-6 * largest) << "row " << g_row << " dim " << i;
    }
    ++g_row;
  }
  EXPECT_EQ(g_row, 2u);
}

}  // namespace
}  // namespace kvcompact::dsv4
