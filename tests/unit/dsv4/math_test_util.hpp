// Shared helpers for the DSV4 math tests: a seeded RNG whose seed is printed on failure, random fills,
// and float-vs-double comparison with a tolerance scaled to the data's magnitude.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>
#include "test_seed.hpp"

namespace kvcompact::dsv4::testutil {

// Fresh seed per test (KVCOMPACT_TEST_SEED replays one); SCOPED_TRACE it so every failure names it.
using kvcompact::testing_support::fresh_seed;

struct Rng {
  explicit Rng(std::uint64_t seed) : gen(seed) {}
  std::mt19937_64 gen;
  float normal(float sigma = 1.0f) { return std::normal_distribution<float>(0.0f, sigma)(gen); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(gen); }
  // Bulk fills use a cheap zero-mean, unit-variance uniform (on [-sqrt 3, sqrt 3]) from splitmix64 seeded
  // by the main generator: long token streams would otherwise spend most of a test in the RNG.
  std::vector<float> normals(std::size_t n, float sigma = 1.0f) {
    std::vector<float> v(n);
    std::uint64_t state = gen();
    for (float& x : v) {
      state += 0x9E3779B97F4A7C15ull;
      std::uint64_t z = state;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const float u = static_cast<float>(z >> 40) * 0x1p-24f;  // [0, 1)
      x = sigma * 1.7320508f * (2.0f * u - 1.0f);
    }
    return v;
  }
};

#define KVC_SEEDED(rng_name)                                           \
  const std::uint64_t kvc_seed_ = ::kvcompact::dsv4::testutil::fresh_seed(); \
  SCOPED_TRACE(::testing::Message() << "seed " << kvc_seed_);             \
  ::kvcompact::dsv4::testutil::Rng rng_name(kvc_seed_)

inline std::vector<double> to_f64(std::span<const float> x) { return std::vector<double>(x.begin(), x.end()); }

// max |fast - oracle| <= rel * max(|oracle|) + abs_tol, element-wise report of the worst index.
inline ::testing::AssertionResult close_to(std::span<const float> fast, std::span<const double> oracle, double rel,
                                           double abs_tol = 0.0) {
  if (fast.size() != oracle.size()) {
    return ::testing::AssertionFailure() << "size " << fast.size() << " vs " << oracle.size();
  }
  double scale = 0.0;
  for (double v : oracle) scale = std::max(scale, std::fabs(v));
  const double tol = rel * scale + abs_tol;
  for (std::size_t i = 0; i < fast.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(fast[i]) - oracle[i]);
    if (!(diff <= tol)) {
      return ::testing::AssertionFailure() << "index " << i << ": fast " << fast[i] << " oracle " << oracle[i]
                                           << " diff " << diff << " > tol " << tol;
    }
  }
  return ::testing::AssertionSuccess();
}

// Bitwise equality of float buffers (NaN-safe, -0 != +0).
inline ::testing::AssertionResult same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "size " << a.size() << " vs " << b.size();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "index " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult same_values(std::span<const float> fast, std::span<const double> oracle) {
  if (fast.size() != oracle.size()) return ::testing::AssertionFailure() << "size";
  for (std::size_t i = 0; i < fast.size(); ++i) {
    if (static_cast<double>(fast[i]) != oracle[i]) {
      return ::testing::AssertionFailure() << "index " << i << ": fast " << fast[i] << " oracle " << oracle[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kvcompact::dsv4::testutil
