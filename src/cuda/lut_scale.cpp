#include "lut_scale.hpp"

#include <algorithm>
#include <cmath>

#include "kvcompact/core/dtypes.hpp"

namespace kvcompact::cuda::tq::detail {

std::vector<double> centroid_error_weights(const kvcompact::tq::Codebook& codebook) {
  const auto c = codebook.centroids();
  const auto mass = codebook.cell_masses();
  std::vector<double> w(c.size());
  double total = 0.0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    w[i] = c[i] * c[i] * mass[i];
    total += w[i];
  }
  for (double& x : w) x /= total;
  return w;
}

LutRounding lut_rounding(std::span<const float> centroids, std::span<const double> weights, float alpha) {
  LutRounding r;
  double sum = 0.0;
  for (std::size_t i = 0; i < centroids.size(); ++i) {
    const float x = alpha * centroids[i];
    if (x == 0.0f) continue;
    const double err = (static_cast<double>(f16_to_f32(f32_to_f16(x))) - x) / x;
    sum += weights[i] * err * err;
    r.max_relative = std::max(r.max_relative, std::fabs(err));
  }
  r.weighted_rms = std::sqrt(sum);
  return r;
}

float fp16_table_scale(const kvcompact::tq::Codebook& codebook) {
  const auto centroids = codebook.centroids_f32();
  const std::vector<double> weights = centroid_error_weights(codebook);
  constexpr int kSteps = 1 << 16;
  float best_alpha = 1.0f;
  double best = INFINITY;
  for (int i = 0; i < kSteps; ++i) {
    const float alpha = 1.0f + static_cast<float>(i) / kSteps;
    const double rms = lut_rounding(centroids, weights, alpha).weighted_rms;
    if (rms < best) {
      best = rms;
      best_alpha = alpha;
    }
  }
  return best_alpha;
}

}  // namespace kvcompact::cuda::tq::detail
