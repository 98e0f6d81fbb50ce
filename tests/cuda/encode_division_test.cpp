// The fast encode kernel's division check (src/cuda/encode_division.hpp), run on the CPU (no device needed, so CI
// runs it): wherever checked_quotient accepts its float-float result, that result equals the CPU codec's
// float(double(x) / norm) — on random coordinates and norms over the whole range the fast path takes, and on
// quotients placed within 2⁻⁴⁰ of a float rounding midpoint, where a wrong acceptance would show. The share of
// rejected (out-of-line) coordinates is reported and bounded.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>

#include "cuda/encode_division.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq::detail {
namespace {

using kvcompact::tq::testing::fresh_seed;

struct Tally {
  std::uint64_t accepted = 0, rejected = 0;
};

// The kernel's per-row constants for `norm` (tq_encode.cu: __drcp_rn, then the float split) and one coordinate.
void check(float x, double norm, Tally& tally) {
  const double rcp = 1.0 / norm;
  const float rh = static_cast<float>(rcp);
  const float rl = static_cast<float>(rcp - static_cast<double>(rh));
  const CheckedQuotient q = checked_quotient(x, rh, rl, rh * 0x1p-42f);
  if (!q.exact) {
    ++tally.rejected;
    return;
  }
  ++tally.accepted;
  const float cpu = static_cast<float>(static_cast<double>(x) / norm);  // LayerCodec's division
  // Bit for bit, except the sign of a zero (x = ±0 gives +0 here), which never reaches a byte (docs/cuda-encode.md).
  const bool same = std::bit_cast<std::uint32_t>(q.value) == std::bit_cast<std::uint32_t>(cpu) ||
                    (q.value == 0.0f && cpu == 0.0f);
  ASSERT_TRUE(same) << "x " << x << " norm " << norm << ": accepted " << q.value << ", CPU " << cpu;
}

TEST(EncodeDivision, AcceptedQuotientsEqualTheFloat64Division) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> norm_exp(-60, 59), x_exp(-40, 0), tiny_exp(-149, -95);
  Tally random, ties;
  for (int i = 0; i < 4000000; ++i) {
    // |x| ≤ norm as for a row's coordinate; mostly ordinary magnitudes, some far below the norm (subnormal x/‖x‖).
    const double norm = std::ldexp(1.0 + std::fabs(unit(rng)), norm_exp(rng));
    const int e = (i % 64 == 0) ? tiny_exp(rng) : x_exp(rng);
    const float x = static_cast<float>(std::fmin(norm, 0x1p127) * std::ldexp(unit(rng), e));
    check(x, norm, random);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (int i = 0; i < 4000000; ++i) {
    // Quotients within 2⁻⁴⁰ (relative) of a float rounding midpoint: pick the midpoint m of two floats, a
    // coordinate x, and the norm x / (m·(1 + ε)).
    const float lo = static_cast<float>(std::ldexp(1.0 + std::fabs(unit(rng)), -1 - (-x_exp(rng)) % 20));
    const double mid = (static_cast<double>(lo) + static_cast<double>(std::nextafter(lo, 2.0f))) / 2.0;
    const double eps = unit(rng) * 0x1p-40;
    const float x = static_cast<float>(std::ldexp(1.0 + std::fabs(unit(rng)), norm_exp(rng) / 2));
    const double norm = static_cast<double>(x) / (mid * (1.0 + eps));
    if (!(norm >= 0x1p-60 && norm <= 0x1p60) || std::fabs(static_cast<double>(x)) > norm) continue;
    check(i % 2 ? x : -x, norm, ties);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("[encode-division] random: %llu accepted, %llu rejected; near ties: %llu accepted, %llu rejected\n",
              static_cast<unsigned long long>(random.accepted), static_cast<unsigned long long>(random.rejected),
              static_cast<unsigned long long>(ties.accepted), static_cast<unsigned long long>(ties.rejected));
  // Random quotients are rejected only near a tie (≈ 2⁻¹⁷ of them) or when tiny (the 1 in 64 subnormal ones).
  EXPECT_LT(random.rejected, random.accepted / 50);
  EXPECT_GT(random.accepted, 3000000u);
  EXPECT_GT(ties.accepted + ties.rejected, 1000000u);
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
