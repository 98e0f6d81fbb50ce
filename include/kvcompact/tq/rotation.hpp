// The orthonormal randomized Hadamard rotation of TurboQuant: R(x) = H·D·x/√b per block, R⁻¹(y) = D·H·y/√b.
// A power-of-two head_dim is one block (the seed system's rotation, bit for bit in float); any other
// multiple of 16 is block-diagonal over its binary decomposition, largest block first (576 = 512 + 64).
// docs/turboquant-math.md derives the scheme and its limits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcompact/core/error.hpp"

namespace kvcompact::tq {

class Rotation {
 public:
  // head_dim: a multiple of 16 in [16, 1024] (the rule of validate_head_dim). Signs: one xoshiro256**
  // stream seeded with stream_seed; sign_i = +1 iff the low bit of the i-th next_u64() is 1, i = 0..head_dim−1.
  static Result<Rotation> create(std::uint32_t head_dim, std::uint64_t stream_seed);

  std::uint32_t head_dim() const { return head_dim_; }
  std::uint64_t stream_seed() const { return stream_seed_; }
  std::span<const float> signs() const { return signs_; }
  // Power-of-two block sizes, in order (largest first), summing to head_dim.
  std::span<const std::uint32_t> blocks() const { return blocks_; }

  // y = R(x) and x = R⁻¹(y). Spans must hold head_dim elements; x and y may be the same buffer
  // (fully overlapping), never partially overlapping. No allocation.
  void forward(std::span<const float> x, std::span<float> y) const;
  void inverse(std::span<const float> y, std::span<float> x) const;
  // float64 versions for the oracle: same operations in double.
  void forward(std::span<const double> x, std::span<double> y) const;
  void inverse(std::span<const double> y, std::span<double> x) const;

  // Entry (row, col) of the explicit matrix R, from its definition (block-diagonal H_b·D/√b with
  // H_b[r][c] = (−1)^popcount(r & c)). Slow; for oracles and tests.
  double matrix_entry(std::uint32_t row, std::uint32_t col) const;

 private:
  Rotation() = default;
  std::uint32_t head_dim_ = 0;
  std::uint64_t stream_seed_ = 0;
  std::vector<float> signs_;
  std::vector<double> signs_f64_;
  std::vector<std::uint32_t> blocks_;
  std::vector<std::uint32_t> offsets_;   // first coordinate of each block
  std::vector<float> scales_;            // 1/√b per block, as the seed computes it in f32
  std::vector<double> scales_f64_;       // 1/√b per block in double
};

}  // namespace kvcompact::tq
