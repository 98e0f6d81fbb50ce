// Shared helpers of the TurboQuant cache / attention tests: seeds, random rows and the relative error
// measure (per query row, relative to the reference output's norm over all heads of that row).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "test_seed.hpp"

namespace kvcompact::tq::testing {

using kvcompact::testing_support::fresh_seed;  // KVCOMPACT_TEST_SEED replays a seed (test_seed.hpp)

// Gaussian rows with a few large outlier channels, like real keys.
inline std::vector<float> random_rows(std::mt19937_64& rng, std::size_t count, std::uint32_t head_dim, float sigma,
                                      bool outliers) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> out(count * head_dim);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = normal(rng);
    const std::uint32_t channel = static_cast<std::uint32_t>(i % head_dim);
    if (outliers && (channel == 3 || channel == head_dim / 2 + 1)) out[i] *= 8.0f;
  }
  return out;
}

// max over rows of ‖out_row − ref_row‖ / ‖ref_row‖, a row being q_heads·head_dim numbers.
inline double max_row_relative_error(const std::vector<float>& out, const std::vector<double>& ref,
                                     std::size_t row_floats) {
  double worst = 0.0;
  for (std::size_t r = 0; r * row_floats < ref.size(); ++r) {
    double err = 0.0, norm = 0.0;
    for (std::size_t j = r * row_floats; j < (r + 1) * row_floats; ++j) {
      const double diff = static_cast<double>(out[j]) - ref[j];
      err += diff * diff;
      norm += ref[j] * ref[j];
    }
    const double rel = norm > 0.0 ? std::sqrt(err / norm) : std::sqrt(err);
    if (std::isnan(rel)) return rel;  // a NaN anywhere fails every tolerance
    worst = std::max(worst, rel);
  }
  return worst;
}

}  // namespace kvcompact::tq::testing
