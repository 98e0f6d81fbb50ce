// FP8 / FP4 / Hadamard simulation of the model's rounding (see fp_sim.hpp). The oracle rounds by
// searching the format's value grid; the fast path uses the core dtypes encoders (round to nearest
// even on the bits), so the two are independent and must agree bit for bit.
#include "kvcompact/dsv4/fp_sim.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/dsv4/config.hpp"

namespace kvcompact::dsv4 {

float pow2_ceil_scale(float amax, float amax_floor, float max_code) {
  const float inv_max = 1.0f / max_code;
  const float r = std::max(amax, amax_floor) * inv_max;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(r);
  const int exp = static_cast<int>((bits >> 23) & 0xFFu) - 127 + ((bits & 0x7FFFFFu) != 0 ? 1 : 0);
  return std::bit_cast<float>(static_cast<std::uint32_t>(exp + 127) << 23);
}

namespace {

// Every non-negative finite value of a minifloat format, in code order (code = index).
std::vector<double> e4m3_grid() {
  std::vector<double> g;
  for (int e = 0; e < 16; ++e) {
    for (int m = 0; m < 8; ++m) {
      if (e == 15 && m == 7) continue;  // NaN code in E4M3FN
      g.push_back(e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7));
    }
  }
  return g;
}
const std::vector<double>& e4m3_values() {
  static const std::vector<double> g = e4m3_grid();
  return g;
}
constexpr double kE2M1Values[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// Nearest grid value to |v| (grid ascending, code = index), ties to the even code.
template <typename Grid>
double round_on_grid(double v, const Grid& grid, std::size_t n) {
  const double a = std::fabs(v);
  std::size_t best = 0;
  for (std::size_t k = 1; k < n; ++k) {
    const double dk = std::fabs(a - grid[k]);
    const double db = std::fabs(a - grid[best]);
    if (dk < db || (dk == db && k % 2 == 0)) best = k;
  }
  return std::copysign(grid[best], v);
}

// Oracle scale: the same float32 rule, but written with frexp instead of bit fields.
double oracle_scale(double amax, float amax_floor, float max_code) {
  const float r = std::max(static_cast<float>(amax), amax_floor) * (1.0f / max_code);
  int e = 0;
  const double f = std::frexp(static_cast<double>(r), &e);  // r = f * 2^e, f in [0.5, 1)
  return f == 0.5 ? std::ldexp(1.0, e - 1) : std::ldexp(1.0, e);
}

template <typename Round>
void block_sim_f64(std::span<double> x, std::size_t block, float amax_floor, float max_code, Round round) {
  KVC_ASSERT(block > 0 && x.size() % block == 0, "block simulation: length is not a multiple of the block");
  for (std::size_t b = 0; b < x.size(); b += block) {
    double amax = 0.0;
    for (std::size_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const double s = oracle_scale(amax, amax_floor, max_code);
    for (std::size_t i = 0; i < block; ++i) {
      const double q = std::clamp(x[b + i] / s, -static_cast<double>(max_code), static_cast<double>(max_code));
      x[b + i] = round(q) * s;
    }
  }
}

}  // namespace

double round_to_e4m3_f64(double v) {
  const auto& g = e4m3_values();
  return round_on_grid(std::clamp(v, -448.0, 448.0), g, g.size());
}

double round_to_e2m1_f64(double v) { return round_on_grid(std::clamp(v, -6.0, 6.0), kE2M1Values, 8); }

void fp8_block_sim_f64(std::span<double> x, std::size_t block) {
  block_sim_f64(x, block, kFp8AmaxFloor, kFp8E4M3Max, round_to_e4m3_f64);
}

void fp4_block_sim_f64(std::span<double> x, std::size_t block) {
  block_sim_f64(x, block, kFp4AmaxFloor, kFp4E2M1Max, round_to_e2m1_f64);
}

void hadamard_f64(std::span<double> x) {
  const std::size_t n = x.size();
  KVC_ASSERT(n > 0 && std::has_single_bit(n), "hadamard_f64: length must be a power of two");
  std::vector<double> y(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    double acc = 0.0;
    for (std::size_t j = 0; j < n; ++j) acc += (std::popcount(i & j) % 2 == 0 ? x[j] : -x[j]);
    y[i] = acc / std::sqrt(static_cast<double>(n));
  }
  std::copy(y.begin(), y.end(), x.begin());
}

void fp8_block_sim(float* x, std::size_t n, std::size_t block) {
  KVC_ASSERT(block > 0 && n % block == 0, "fp8_block_sim: length is not a multiple of the block");
  for (std::size_t b = 0; b < n; b += block) {
    float amax = 0.0f;
    for (std::size_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const float s = pow2_ceil_scale(amax, kFp8AmaxFloor, kFp8E4M3Max);
    const float inv_s = 1.0f / s;  // exact: s is a power of two
    for (std::size_t i = 0; i < block; ++i) {
      const float q = std::clamp(x[b + i] * inv_s, -kFp8E4M3Max, kFp8E4M3Max);
      x[b + i] = fp8_e4m3_to_f32(f32_to_fp8_e4m3(q)) * s;
    }
  }
}

void fp4_block_sim(float* x, std::size_t n, std::size_t block) {
  KVC_ASSERT(block > 0 && n % block == 0, "fp4_block_sim: length is not a multiple of the block");
  for (std::size_t b = 0; b < n; b += block) {
    float amax = 0.0f;
    for (std::size_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const float s = pow2_ceil_scale(amax, kFp4AmaxFloor, kFp4E2M1Max);
    const float inv_s = 1.0f / s;
    for (std::size_t i = 0; i < block; ++i) {
      const float q = std::clamp(x[b + i] * inv_s, -kFp4E2M1Max, kFp4E2M1Max);
      x[b + i] = fp4_e2m1_to_f32(f32_to_fp4_e2m1(q)) * s;
    }
  }
}

void hadamard(float* x, std::size_t n) {
  KVC_ASSERT(n > 0 && std::has_single_bit(n), "hadamard: length must be a power of two");
  for (std::size_t h = 1; h < n; h *= 2) {
    for (std::size_t i = 0; i < n; i += 2 * h) {
      for (std::size_t j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (std::size_t i = 0; i < n; ++i) x[i] *= scale;
}

void simulate_main_row(float* row512) { fp8_block_sim(row512, kNopeDims, kFp8SimBlock); }

void simulate_main_row_f64(std::span<double> row512) {
  KVC_ASSERT(row512.size() == kHeadDim, "simulate_main_row_f64: row must hold 512 values");
  fp8_block_sim_f64(row512.first(kNopeDims), kFp8SimBlock);
}

void simulate_indexer_row(float* row128) {
  hadamard(row128, kIndexerHeadDim);
  fp4_block_sim(row128, kIndexerHeadDim, kFp4SimBlock);
}

void simulate_indexer_row_f64(std::span<double> row128) {
  KVC_ASSERT(row128.size() == kIndexerHeadDim, "simulate_indexer_row_f64: row must hold 128 values");
  hadamard_f64(row128);
  fp4_block_sim_f64(row128, kFp4SimBlock);
}

}  // namespace kvcompact::dsv4
