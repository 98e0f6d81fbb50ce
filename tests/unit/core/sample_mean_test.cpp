// SampleMean against the textbook two-pass formulas: mean, unbiased variance over n − 1, standard error
// √(s²/n); a large common offset does not cost the spread its digits (Welford's point); fewer than two samples
// have no standard error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kvcompact/core/sample_mean.hpp"
#include "test_seed.hpp"

namespace kvcompact {
namespace {

double two_pass_standard_error(const std::vector<double>& xs) {
  double mean = 0;
  for (double x : xs) mean += x;
  mean /= static_cast<double>(xs.size());
  double sum_sq = 0;
  for (double x : xs) sum_sq += (x - mean) * (x - mean);
  return std::sqrt(sum_sq / static_cast<double>(xs.size() - 1) / static_cast<double>(xs.size()));
}

TEST(SampleMean, SmallExample) {
  SampleMean m;
  for (double x : {1.0, 2.0, 3.0, 4.0}) m.add(x);
  EXPECT_EQ(m.count(), 4u);
  EXPECT_DOUBLE_EQ(m.mean(), 2.5);
  EXPECT_DOUBLE_EQ(m.standard_error(), std::sqrt(5.0 / 3.0 / 4.0));  // s² = 5/3
}

TEST(SampleMean, MatchesTwoPassFormulasUnderALargeOffset) {
  const std::uint64_t seed = testing_support::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, 1.0);
  for (double offset : {0.0, 1e6}) {
    std::vector<double> xs(1000);
    SampleMean m;
    double sum = 0;
    for (double& x : xs) {
      x = offset + noise(rng);
      m.add(x);
      sum += x - offset;
    }
    // Each of the 1000 updates rounds the running mean once, by at most ε·|mean|: with the offset at 10⁶ that
    // is ≈ 10⁻¹⁰ per update (a fixed 10⁻⁹ failed once in CI), still 10⁷ below the samples' spread of 1.
    const double rounding = 1000 * std::numeric_limits<double>::epsilon() * (offset + 10.0);
    EXPECT_NEAR(m.mean() - offset, sum / 1000.0, rounding);
    std::vector<double> centred(xs);
    for (double& x : centred) x -= offset;  // exact: every x is within a few units of the offset
    EXPECT_NEAR(m.standard_error() / two_pass_standard_error(centred), 1.0, 1e-8) << "offset " << offset;
  }
}

TEST(SampleMean, NoStandardErrorBelowTwoSamples) {
  SampleMean m;
  EXPECT_TRUE(std::isnan(m.standard_error()));
  m.add(3.0);
  EXPECT_DOUBLE_EQ(m.mean(), 3.0);
  EXPECT_TRUE(std::isnan(m.standard_error()));
  m.add(3.0);
  EXPECT_DOUBLE_EQ(m.standard_error(), 0.0);
}

}  // namespace
}  // namespace kvcompact
