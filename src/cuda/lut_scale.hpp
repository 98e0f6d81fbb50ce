// Internal: the scale α of the CUDA kernels' fp16 centroid tables. Decode and prefill read α·c rounded to fp16 and
// divide α out in fp32, so the rounding error of fp16(α·c) is a fixed relative error ε_c per centroid, for keys a
// systematic error of every score (docs/cuda-prefill.md, "Precision").
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcompact/tq/codebook.hpp"

namespace kvcompact::cuda::tq::detail {

// Each centroid's weight in a dot product's error: c² times the probability of its cell under the coordinate
// density (Codebook::cell_masses), normalised to sum 1. A score's error
// Σ_j q_j·c_j·ε_j over rotated coordinates of similar spread has the variance Σ weight_c·ε_c² (up to ‖q‖²).
std::vector<double> centroid_error_weights(const kvcompact::tq::Codebook& codebook);

// The relative rounding errors of fp16(α·c) over a codebook: the weighted RMS (the weights above) and the maximum.
struct LutRounding {
  double weighted_rms = 0.0;
  double max_relative = 0.0;
};
LutRounding lut_rounding(std::span<const float> centroids, std::span<const double> weights, float alpha);

// α in [1, 2), in steps of 2⁻¹⁶, with the smallest weighted RMS of fp16(α·c) (the first on ties). On the H200's
// prefill tests this objective matters for 4- and 5-bit keys, whose ε is the largest error term: it is 1.6–1.7×
// lower than with the α that minimises the largest ε (the choice before 2026-12-01).
float fp16_table_scale(const kvcompact::tq::Codebook& codebook);

}  // namespace kvcompact::cuda::tq::detail
