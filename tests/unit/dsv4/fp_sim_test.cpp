// FP8 / FP4 / Hadamard simulation: known scale and rounding values (ties to even, saturation,
// subnormals), the fast path bit-equal to the grid-search oracle on random data of many magnitudes,
// idempotence, and the Hadamard transform against its definition.
#include "kvcompact/dsv4/fp_sim.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "math_test_util.hpp"

namespace kvcompact::dsv4 {
namespace {

using testutil::close_to;
using testutil::same_values;
using testutil::to_f64;

TEST(DsvFpSim, Pow2CeilScale) {
  EXPECT_EQ(pow2_ceil_scale(448.0f, kFp8AmaxFloor, 448.0f), 1.0f);
  EXPECT_EQ(pow2_ceil_scale(449.0f, kFp8AmaxFloor, 448.0f), 2.0f);
  EXPECT_EQ(pow2_ceil_scale(224.0f, kFp8AmaxFloor, 448.0f), 0.5f);
  EXPECT_EQ(pow2_ceil_scale(225.0f, kFp8AmaxFloor, 448.0f), 1.0f);
  // amax floored at 1e-4: 1e-4 / 448 = 2.23e-7 -> 2^-22.
  EXPECT_EQ(pow2_ceil_scale(0.0f, kFp8AmaxFloor, 448.0f), 0x1p-22f);
  EXPECT_EQ(pow2_ceil_scale(6.0f, kFp4AmaxFloor, 6.0f), 1.0f);
  EXPECT_EQ(pow2_ceil_scale(6.5f, kFp4AmaxFloor, 6.0f), 2.0f);
  EXPECT_EQ(pow2_ceil_scale(0.0f, kFp4AmaxFloor, 6.0f), 0x1p-126f);
}

TEST(DsvFpSim, E4M3KnownRoundings) {
  EXPECT_EQ(round_to_e4m3_f64(0.0), 0.0);
  EXPECT_EQ(round_to_e4m3_f64(1.0), 1.0);
  EXPECT_EQ(round_to_e4m3_f64(1.0625), 1.0);     // tie 1 / 1.125 -> even mantissa (1.0)
  EXPECT_EQ(round_to_e4m3_f64(1.1875), 1.25);    // tie 1.125 / 1.25 -> even mantissa (1.25)
  EXPECT_EQ(round_to_e4m3_f64(-1.1875), -1.25);
  EXPECT_EQ(round_to_e4m3_f64(0x1p-9), 0x1p-9);  // smallest subnormal
  EXPECT_EQ(round_to_e4m3_f64(0x1p-10), 0.0);    // tie 0 / 2^-9 -> 0
  EXPECT_EQ(round_to_e4m3_f64(3 * 0x1p-10), 0x1p-8);
  EXPECT_EQ(round_to_e4m3_f64(448.0), 448.0);
  EXPECT_EQ(round_to_e4m3_f64(432.0), 448.0);    // tie 416 / 448 -> 448 (mantissa 6 is even)
  EXPECT_EQ(round_to_e4m3_f64(500.0), 448.0);    // saturates
}

TEST(DsvFpSim, E2M1KnownRoundings) {
  const double in[] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5, 7.0, -0.75, -5.0};
  const double out[] = {0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -1.0, -4.0};
  for (std::size_t i = 0; i < std::size(in); ++i) EXPECT_EQ(round_to_e2m1_f64(in[i]), out[i]) << in[i];
}

// A random vector whose blocks span many magnitudes, with some zero blocks and exact grid values.
std::vector<float> awkward_data(testutil::Rng& rng, std::size_t n, std::size_t block) {
  std::vector<float> x(n);
  for (std::size_t b = 0; b < n; b += block) {
    const int kind = static_cast<int>(rng.integer(0, 5));
    const float mag = std::ldexp(1.0f, static_cast<int>(rng.integer(-30, 20)));
    for (std::size_t i = 0; i < block; ++i) {
      switch (kind) {
        case 0: x[b + i] = 0.0f; break;
        case 1: x[b + i] = static_cast<float>(rng.integer(-8, 8)) * 0.5f; break;  // small exact values
        case 2: x[b + i] = rng.normal() * 1e-6f; break;                          // below the fp8 floor
        default: x[b + i] = rng.normal() * mag; break;
      }
    }
  }
  return x;
}

TEST(DsvFpSim, Fp8FastMatchesOracleExactly) {
  KVC_SEEDED(rng);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<float> x = awkward_data(rng, 448, 64);
    std::vector<double> oracle = to_f64(x);
    fp8_block_sim_f64(oracle);
    std::vector<float> fast = x;
    fp8_block_sim(fast.data(), fast.size());
    ASSERT_TRUE(same_values(fast, oracle));
    std::vector<float> again = fast;
    fp8_block_sim(again.data(), again.size());
    ASSERT_TRUE(same_values(again, to_f64(fast))) << "simulation is not idempotent";
  }
}

TEST(DsvFpSim, Fp4FastMatchesOracleExactly) {
  KVC_SEEDED(rng);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<float> x = awkward_data(rng, 128, 32);
    std::vector<double> oracle = to_f64(x);
    fp4_block_sim_f64(oracle);
    std::vector<float> fast = x;
    fp4_block_sim(fast.data(), fast.size());
    ASSERT_TRUE(same_values(fast, oracle));
    std::vector<float> again = fast;
    fp4_block_sim(again.data(), again.size());
    ASSERT_TRUE(same_values(again, to_f64(fast))) << "simulation is not idempotent";
  }
}

TEST(DsvFpSim, MainRowLeavesRopeTail) {
  KVC_SEEDED(rng);
  std::vector<float> row = rng.normals(512);
  std::vector<float> sim = row;
  simulate_main_row(sim.data());
  for (std::size_t i = 448; i < 512; ++i) EXPECT_EQ(sim[i], row[i]);
  std::vector<double> oracle = to_f64(row);
  simulate_main_row_f64(oracle);
  EXPECT_TRUE(same_values(sim, oracle));
}

TEST(DsvFpSim, HadamardMatchesDefinitionAndIsAnInvolution) {
  KVC_SEEDED(rng);
  for (std::size_t n : {1u, 2u, 8u, 128u}) {
    std::vector<float> x = rng.normals(n);
    std::vector<double> oracle = to_f64(x);
    hadamard_f64(oracle);
    std::vector<float> fast = x;
    hadamard(fast.data(), n);
    EXPECT_TRUE(close_to(fast, oracle, 1e-6)) << "n " << n;
    hadamard(fast.data(), n);  // H / sqrt(n) is symmetric and orthogonal: applying it twice is the identity
    EXPECT_TRUE(close_to(fast, to_f64(x), 1e-6)) << "n " << n;
  }
  // H_2 / sqrt 2 on (1, 0) = (1, 1) / sqrt 2; the first output is the scaled sum.
  std::vector<double> e = {1.0, 0.0};
  hadamard_f64(e);
  EXPECT_NEAR(e[0], std::sqrt(0.5), 1e-15);
  EXPECT_NEAR(e[1], std::sqrt(0.5), 1e-15);
}

TEST(DsvFpSim, IndexerRowIsHadamardThenFp4) {
  KVC_SEEDED(rng);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> row = rng.normals(128);
    std::vector<float> fast = row;
    simulate_indexer_row(fast.data());
    // Decomposed: the fast Hadamard (checked above against the definition), then the oracle FP4 exactly.
    std::vector<float> rotated = row;
    hadamard(rotated.data(), 128);
    std::vector<double> expected = to_f64(rotated);
    fp4_block_sim_f64(expected);
    EXPECT_TRUE(same_values(fast, expected));
  }
}

}  // namespace
}  // namespace kvcompact::dsv4
