// Lloyd–Max scalar quantisers for one coordinate of a uniformly random unit vector in R^d, whose density
// is f(x) = Γ(d/2) / (√π·Γ((d−1)/2)) · (1 − x²)^((d−3)/2) on [−1, 1]. Solved once per (d, bits) in double
// and cached for the process. docs/turboquant-math.md gives the solver and the resulting numbers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcompact/core/error.hpp"

namespace kvcompact::tq {

inline constexpr std::uint32_t kMinCodebookBits = 1;
inline constexpr std::uint32_t kMaxCodebookBits = 5;

class Codebook {
 public:
  // Solve without the cache (tests, tools). Same argument rules as lloyd_max_codebook.
  static Result<Codebook> solve(std::uint32_t head_dim, std::uint32_t bits);

  std::uint32_t head_dim() const { return head_dim_; }
  std::uint32_t bits() const { return bits_; }
  std::uint32_t levels() const { return 1u << bits_; }
  std::span<const double> centroids() const { return centroids_; }    // ascending, 2^bits, antisymmetric
  std::span<const double> boundaries() const { return boundaries_; }  // 2^bits − 1 midpoints, ascending
  std::span<const float> centroids_f32() const { return centroids_f32_; }
  std::span<const float> boundaries_f32() const { return boundaries_f32_; }
  // Expected D_mse of a unit vector, d · E[(y − c(y))²], under the exact density (double centroids).
  double distortion() const { return distortion_; }
  // Probability of each centroid's cell (between its boundaries, ±1 at the ends) under the exact density;
  // 2^bits values, summing to 1, symmetric like the centroids.
  std::span<const double> cell_masses() const { return cell_masses_; }
  // Low 32 bits of xxh64 (seed 0) over: the 2^bits f32 centroids (little-endian IEEE bits, ascending),
  // then head_dim as u32 LE, then bits as u32 LE. Stable across platforms.
  std::uint32_t id() const { return id_; }
  // Solver diagnostics: iterations taken and the final fixed-point residual max|T(c) − c| of the Lloyd map.
  std::uint32_t solver_iterations() const { return iterations_; }
  double solver_residual() const { return residual_; }

  // Index of y's cell: the number of f32 boundaries ≤ y. A value exactly on a boundary goes to the upper
  // cell (the seed system's `y < b` comparisons give the same); NaN gives 0. Branch-free binary search.
  std::uint32_t quantize(float y) const {
    const float* b = boundaries_f32_.data();
    std::uint32_t index = 0;
    for (std::uint32_t step = levels() >> 1; step > 0; step >>= 1) {
      index += (y >= b[index + step - 1]) ? step : 0u;
    }
    return index;
  }

 private:
  Codebook() = default;
  std::uint32_t head_dim_ = 0;
  std::uint32_t bits_ = 0;
  std::vector<double> centroids_;
  std::vector<double> boundaries_;
  std::vector<double> cell_masses_;
  std::vector<float> centroids_f32_;
  std::vector<float> boundaries_f32_;
  double distortion_ = 0.0;
  std::uint32_t id_ = 0;
  std::uint32_t iterations_ = 0;
  double residual_ = 0.0;
};

// The normalised coordinate density f(x) above; 0 for |x| > 1. head_dim ≥ 3.
double coordinate_density(std::uint32_t head_dim, double x);
// P(X ≤ x) for the same density, accurate in relative terms in both tails. head_dim ≥ 3.
double coordinate_cdf(std::uint32_t head_dim, double x);

// The cached codebook for (head_dim, bits): head_dim a multiple of 16 in [16, 1024], bits 1..5.
// Thread-safe; the first call for a pair solves it (about a millisecond), later calls look it up. The
// pointer stays valid for the lifetime of the process.
Result<const Codebook*> lloyd_max_codebook(std::uint32_t head_dim, std::uint32_t bits);

}  // namespace kvcompact::tq
