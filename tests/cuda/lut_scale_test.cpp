// The fp16 centroid tables' scale α (src/cuda/lut_scale.hpp), on the CPU: for every codebook of head_dim 64 / 128 /
// 256, the chosen α has the smallest weighted RMS rounding error on the whole grid it searches (checked against a
// coarser grid that is a subset of it and against neighbours) and the weights are a distribution. It prints both
// errors beside those of the α that minimises the largest error (the choice before 2026-12-01).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "cuda/lut_scale.hpp"
#include "kvcompact/tq/codebook.hpp"

namespace kvcompact::cuda::tq::detail {
namespace {

using kvcompact::tq::Codebook;

TEST(LutScale, WeightsAreADistributionSymmetricLikeTheCentroids) {
  for (std::uint32_t d : {64u, 128u, 256u}) {
    for (std::uint32_t bits = 1; bits <= 5; ++bits) {
      const Codebook cb = Codebook::solve(d, bits).value();
      const auto w = centroid_error_weights(cb);
      ASSERT_EQ(w.size(), cb.levels());
      EXPECT_NEAR(std::accumulate(w.begin(), w.end(), 0.0), 1.0, 1e-12);
      for (std::size_t i = 0; i < w.size(); ++i) {
        EXPECT_GT(w[i], 0.0) << "d " << d << " bits " << bits << " centroid " << i;
        EXPECT_NEAR(w[i], w[w.size() - 1 - i], 1e-9) << "d " << d << " bits " << bits << " centroid " << i;
      }
    }
  }
}

TEST(LutScale, ChosenScaleMinimisesTheWeightedRoundingError) {
  for (std::uint32_t d : {64u, 128u, 256u}) {
    for (std::uint32_t bits = 1; bits <= 5; ++bits) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + " bits " + std::to_string(bits));
      const Codebook cb = Codebook::solve(d, bits).value();
      const auto c = cb.centroids_f32();
      const auto w = centroid_error_weights(cb);
      const float alpha = fp16_table_scale(cb);
      ASSERT_GE(alpha, 1.0f);
      ASSERT_LT(alpha, 2.0f);
      const LutRounding chosen = lut_rounding(c, w, alpha);
      // Every α of the 2⁻¹² grid (a subset of the searched 2⁻¹⁶ grid) is no better; so are the chosen one's
      // neighbours on the searched grid.
      float max_opt_alpha = 1.0f;
      double max_opt = INFINITY;
      for (int i = 0; i < 4096; ++i) {
        const float a = 1.0f + static_cast<float>(i) / 4096.0f;
        const LutRounding r = lut_rounding(c, w, a);
        ASSERT_GE(r.weighted_rms, chosen.weighted_rms) << "alpha " << a;
        if (r.max_relative < max_opt) {
          max_opt = r.max_relative;
          max_opt_alpha = a;
        }
      }
      for (float a : {alpha - 1.0f / 65536.0f, alpha + 1.0f / 65536.0f}) {
        if (a >= 1.0f && a < 2.0f) {
          EXPECT_GE(lut_rounding(c, w, a).weighted_rms, chosen.weighted_rms);
        }
      }
      EXPECT_LE(chosen.max_relative, 1.0 / 2048.0);  // never worse than one fp16 rounding
      const LutRounding before = lut_rounding(c, w, max_opt_alpha);
      std::printf("[lut-scale] d=%u bits=%u alpha %.6f: weighted RMS %.3g, max %.3g (min-max alpha %.6f: %.3g, %.3g)\n",
                  d, bits, alpha, chosen.weighted_rms, chosen.max_relative, max_opt_alpha, before.weighted_rms,
                  before.max_relative);
    }
  }
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
