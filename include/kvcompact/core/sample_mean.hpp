// The mean of i.i.d. samples with its standard error (Welford's update): `kvcompact eval` reports its sampled
// statistics with it, and tests compare a sampled estimate with its exact expectation. A bound of k standard
// errors fails by chance with probability erfc(k/√2) per check (k = 5: 5.7·10⁻⁷), whatever the size of the
// effect being estimated, so the bound is as tight as the sample allows instead of a fixed fraction that is
// many standard errors wide for some cases and few for others.
#pragma once

#include <cmath>
#include <cstdint>

namespace kvcompact {

class SampleMean {
 public:
  void add(double x) {
    ++n_;
    const double delta = x - mean_;
    mean_ += delta / static_cast<double>(n_);
    m2_ += delta * (x - mean_);
  }
  std::uint64_t count() const { return n_; }
  double mean() const { return mean_; }
  // √(s² / n) with the unbiased sample variance s²; NaN with fewer than two samples (no spread to estimate).
  double standard_error() const {
    if (n_ < 2) return std::nan("");
    return std::sqrt(m2_ / static_cast<double>(n_ - 1) / static_cast<double>(n_));
  }

 private:
  std::uint64_t n_ = 0;
  double mean_ = 0.0;
  double m2_ = 0.0;
};

}  // namespace kvcompact
