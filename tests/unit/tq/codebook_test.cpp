// Lloyd–Max codebooks: the published reference values, the Lloyd optimality conditions checked with an
// independent adaptive-Simpson integration of the density, the quantiser's cell rule, the stable id,
// the process-wide cache, and the empirical D_mse of rotate → quantise → reconstruct on random unit vectors.
#include <gtest/gtest.h>

#include "golden_dir.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <numbers>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvcompact/core/checksum.hpp"
#include "kvcompact/core/sample_mean.hpp"
#include "kvcompact/tq/codebook.hpp"
#include "kvcompact/tq/rotation.hpp"
#include "test_seed.hpp"

namespace kvcompact::tq {
namespace {

using kvcompact::testing_support::fresh_seed;

const Codebook& book(std::uint32_t d, std::uint32_t b) {
  auto r = lloyd_max_codebook(d, b);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return **r;
}

// Composite 10-point Gauss–Legendre — an oracle independent of the solver's incomplete-beta formulas.
// Nodes and weights by Newton's method on P_10 (three-term recurrence).
struct GaussLegendre {
  std::array<double, 10> node{}, weight{};
  GaussLegendre() {
    constexpr int n = 10;
    for (int i = 0; i < n; ++i) {
      double x = std::cos(std::numbers::pi * (i + 0.75) / (n + 0.5));
      double derivative = 0.0;
      for (int it = 0; it < 100; ++it) {
        double p0 = 1.0, p1 = x;
        for (int k = 2; k <= n; ++k) {
          const double p2 = ((2.0 * k - 1.0) * x * p1 - (k - 1.0) * p0) / k;
          p0 = p1;
          p1 = p2;
        }
        derivative = n * (x * p1 - p0) / (x * x - 1.0);
        const double step = p1 / derivative;
        x -= step;
        if (std::fabs(step) < 1e-16) break;
      }
      node[i] = x;
      weight[i] = 2.0 / ((1.0 - x * x) * derivative * derivative);
    }
  }
};

// ∫_lo^hi f over panels no wider than `panel`.
double integrate(const std::function<double(double)>& f, double lo, double hi, double panel) {
  static const GaussLegendre rule;
  const int panels = std::max(1, static_cast<int>(std::ceil((hi - lo) / panel)));
  const double width = (hi - lo) / panels;
  double total = 0.0;
  for (int p = 0; p < panels; ++p) {
    const double a = lo + p * width;
    double sum = 0.0;
    for (int i = 0; i < 10; ++i) sum += rule.weight[i] * f(a + 0.5 * width * (rule.node[i] + 1.0));
    total += 0.5 * width * sum;
  }
  return total;
}

// Panels of σ/8 resolve the density (scale σ = 1/√d, narrower in the tails) to ~1e-15.
double panel_for(std::uint32_t d) { return 0.125 / std::sqrt(static_cast<double>(d)); }

TEST(CoordinateDensity, IsNormalisedAndMatchesTheCdf) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (const std::uint32_t d : {16u, 80u, 128u, 1024u}) {
    auto f = [d](double x) { return coordinate_density(d, x); };
    const double panel = panel_for(d);
    EXPECT_NEAR(integrate(f, -1.0, 1.0, panel), 1.0, 1e-13) << "d " << d;
    EXPECT_NEAR(integrate([&](double x) { return x * x * f(x); }, -1.0, 1.0, panel), 1.0 / d, 1e-15) << "d " << d;
    EXPECT_EQ(coordinate_density(d, 1.5), 0.0);
    EXPECT_EQ(coordinate_density(d, -1.0), 0.0);
    const double sigma = 1.0 / std::sqrt(static_cast<double>(d));
    std::uniform_real_distribution<double> uniform(-6.0 * sigma, 6.0 * sigma);
    for (int i = 0; i < 4; ++i) {
      const double x = uniform(rng);
      const double lower = integrate(f, -1.0, x, panel);
      EXPECT_NEAR(coordinate_cdf(d, x), lower, 1e-13) << "d " << d << " x " << x;
    }
    // Tail accuracy is relative, not just absolute: P(X ≤ −5σ) ≈ 3e-7 (less for small d; 0.9 at d = 16).
    const double far = -std::min(5.0 * sigma, 0.9);
    const double tail = integrate(f, -1.0, far, panel);
    EXPECT_NEAR(coordinate_cdf(d, far), tail, 1e-11 * tail) << "d " << d;
    EXPECT_EQ(coordinate_cdf(d, 0.0), 0.5);
    EXPECT_EQ(coordinate_cdf(d, 1.0), 1.0);
    EXPECT_EQ(coordinate_cdf(d, -1.0), 0.0);
  }
  // Uniform on [−1, 1] at d = 3 (Archimedes).
  EXPECT_NEAR(coordinate_density(3, 0.3), 0.5, 1e-15);
  EXPECT_NEAR(coordinate_cdf(3, 0.5), 0.75, 1e-15);
}

TEST(Codebook, ReferenceTwoBitValues) {
  const Codebook& b128 = book(128, 2);
  ASSERT_EQ(b128.centroids().size(), 4u);
  ASSERT_EQ(b128.boundaries().size(), 3u);
  const std::array<double, 4> c128 = {-0.1330415, -0.0399916, 0.0399916, 0.1330415};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(b128.centroids()[i], c128[i], 1e-5) << i;
  EXPECT_NEAR(b128.boundaries()[0], -0.0865166, 1e-5);
  EXPECT_EQ(b128.boundaries()[1], 0.0);
  EXPECT_NEAR(b128.boundaries()[2], 0.0865166, 1e-5);

  const Codebook& b64 = book(64, 2);
  const std::array<double, 4> c64 = {-0.1874969, -0.0565149, 0.0565149, 0.1874969};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(b64.centroids()[i], c64[i], 1e-5) << i;
  EXPECT_NEAR(b64.boundaries()[0], -0.1220059, 1e-5);
  EXPECT_NEAR(b64.boundaries()[2], 0.1220059, 1e-5);
}

TEST(Codebook, ReferenceCentroidTableAtD128) {
  const std::vector<std::vector<double>> positive = {
      {0.79944},
      {0.45245, 1.50519},
      {0.24442, 0.75333, 1.33660, 2.13147},
      {0.12787, 0.38638, 0.65362, 0.93710, 1.24777, 1.60434, 2.04593, 2.68886}};
  for (std::uint32_t b = 1; b <= 4; ++b) {
    const Codebook& cb = book(128, b);
    const auto& expected = positive[b - 1];
    const std::uint32_t half = cb.levels() / 2;
    for (std::uint32_t i = 0; i < half; ++i) {
      EXPECT_NEAR(cb.centroids()[half + i] * std::sqrt(128.0), expected[i], 1e-4) << "b " << b << " i " << i;
      EXPECT_NEAR(cb.centroids()[half - 1 - i] * std::sqrt(128.0), -expected[i], 1e-4) << "b " << b << " i " << i;
    }
  }
}

TEST(Codebook, ReferenceDistortionTable) {
  // The reference table is rounded to 4 decimals, so the honest tolerance is half its last digit.
  const std::vector<std::pair<std::uint32_t, std::array<double, 4>>> table = {
      {64, {0.3584, 0.1145, 0.0334, 0.0091}},
      {128, {0.3609, 0.1160, 0.0340, 0.0093}},
      {256, {0.3621, 0.1167, 0.0343, 0.0094}}};
  for (const auto& [d, row] : table) {
    for (std::uint32_t b = 1; b <= 4; ++b) {
      EXPECT_NEAR(book(d, b).distortion(), row[b - 1], 0.5e-4) << "d " << d << " b " << b;
    }
  }
  // Bounds from the paper: 4^−b ≤ D_mse ≤ (√3·π/2)·4^−b.
  for (std::uint32_t d = 16; d <= 1024; d += 16) {
    for (std::uint32_t b = 1; b <= 5; ++b) {
      const double scale = std::pow(4.0, -static_cast<double>(b));
      const double dist = book(d, b).distortion();
      EXPECT_GT(dist, scale) << "d " << d << " b " << b;
      EXPECT_LT(dist, std::sqrt(3.0) * std::numbers::pi / 2.0 * scale) << "d " << d << " b " << b;
    }
  }
}

TEST(Codebook, OneBitHasTheClosedForm) {
  // c = E[X | X > 0] = Γ(d/2) / (√π·Γ((d+1)/2)); → √(2/π)/√d for large d.
  for (std::uint32_t d = 16; d <= 1024; d += 16) {
    // long double lgamma: its cancellation (two values near 2700) still leaves ~1e-16 relative.
    const long double ld = d;
    const double exact = static_cast<double>(std::exp(std::lgamma(ld / 2) - std::lgamma((ld + 1) / 2)) /
                                             std::sqrt(std::numbers::pi_v<long double>));
    EXPECT_NEAR(book(d, 1).centroids()[1], exact, 1e-13 * exact) << "d " << d;
    EXPECT_EQ(book(d, 1).centroids()[0], -book(d, 1).centroids()[1]);
  }
  EXPECT_NEAR(book(1024, 1).centroids()[1] * 32.0, std::sqrt(2.0 / std::numbers::pi), 1e-3);
}

// (and the cell masses the codebook reports equal the integrator's)
TEST(Codebook, SatisfiesTheLloydConditionsUnderAnIndependentIntegrator) {
  for (const auto& [d, b] : std::vector<std::pair<std::uint32_t, std::uint32_t>>{
           {16, 3}, {64, 2}, {80, 4}, {128, 5}, {576, 3}, {1024, 4}}) {
    const Codebook& cb = book(d, b);
    auto f = [d = d](double x) { return coordinate_density(d, x); };
    const auto c = cb.centroids();
    const auto bd = cb.boundaries();
    double distortion = 0.0;
    const double piece = panel_for(d);
    for (std::uint32_t k = 0; k < cb.levels(); ++k) {
      if (k > 0) { EXPECT_LT(c[k - 1], c[k]); }
      if (k + 1 < cb.levels()) { EXPECT_DOUBLE_EQ(bd[k], 0.5 * (c[k] + c[k + 1])); }
      EXPECT_EQ(c[k], -c[cb.levels() - 1 - k]);
      const double lo = k == 0 ? -1.0 : bd[k - 1];
      const double hi = k + 1 == cb.levels() ? 1.0 : bd[k];
      const double m0 = integrate(f, lo, hi, piece);
      const double m1 = integrate([&](double x) { return x * f(x); }, lo, hi, piece);
      EXPECT_NEAR(c[k], m1 / m0, 1e-10) << "d " << d << " b " << b << " k " << k;
      EXPECT_NEAR(cb.cell_masses()[k], m0, 1e-12 * m0 + 1e-15) << "d " << d << " b " << b << " k " << k;
      EXPECT_EQ(cb.cell_masses()[k], cb.cell_masses()[cb.levels() - 1 - k]);
      distortion += integrate([&](double x) { return (x - c[k]) * (x - c[k]) * f(x); }, lo, hi, piece);
    }
    EXPECT_NEAR(cb.distortion(), d * distortion, 1e-9 * cb.distortion()) << "d " << d << " b " << b;
    double total = 0.0;
    for (double m : cb.cell_masses()) total += m;
    EXPECT_NEAR(total, 1.0, 1e-13) << "d " << d << " b " << b;
    EXPECT_LT(cb.solver_residual(), 1e-12);
  }
}

TEST(Codebook, EverySupportedPairSolves) {
  std::set<std::uint32_t> ids;
  for (std::uint32_t d = 16; d <= 1024; d += 16) {
    for (std::uint32_t b = 1; b <= 5; ++b) {
      const Codebook& cb = book(d, b);
      ASSERT_EQ(cb.head_dim(), d);
      ASSERT_EQ(cb.bits(), b);
      ASSERT_EQ(cb.centroids().size(), 1u << b);
      ASSERT_EQ(cb.boundaries().size(), (1u << b) - 1);
      ASSERT_EQ(cb.centroids_f32().size(), 1u << b);
      ASSERT_EQ(cb.boundaries_f32().size(), (1u << b) - 1);
      EXPECT_LT(cb.solver_residual(), 1e-12) << "d " << d << " b " << b;
      for (std::size_t k = 0; k < cb.centroids().size(); ++k) {
        EXPECT_EQ(cb.centroids_f32()[k], static_cast<float>(cb.centroids()[k]));
      }
      for (std::size_t k = 1; k < cb.boundaries_f32().size(); ++k) {
        EXPECT_LT(cb.boundaries_f32()[k - 1], cb.boundaries_f32()[k]) << "d " << d << " b " << b;
      }
      // More bits always help; larger d (at fixed b) approaches the Gaussian limit from below.
      if (b > 1) { EXPECT_LT(cb.distortion(), book(d, b - 1).distortion()); }
      if (d > 16) { EXPECT_GT(cb.distortion(), book(d - 16, b).distortion()); }
      ids.insert(cb.id());
    }
  }
  EXPECT_EQ(ids.size(), 64u * 5u);
}

TEST(Codebook, IdIsTheDocumentedFingerprint) {
  static_assert(std::endian::native == std::endian::little, "this check builds the bytes by memcpy");
  for (const auto& [d, b] : std::vector<std::pair<std::uint32_t, std::uint32_t>>{{128, 2}, {96, 3}, {576, 4}}) {
    const Codebook& cb = book(d, b);
    std::vector<std::uint8_t> bytes(cb.levels() * 4 + 8);
    std::memcpy(bytes.data(), cb.centroids_f32().data(), cb.levels() * 4);
    std::memcpy(bytes.data() + cb.levels() * 4, &d, 4);
    std::memcpy(bytes.data() + cb.levels() * 4 + 4, &b, 4);
    EXPECT_EQ(cb.id(), static_cast<std::uint32_t>(xxh64(bytes)));
    // A fresh solve gives the same bytes, hence the same id.
    auto again = Codebook::solve(d, b);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->id(), cb.id());
  }
}

TEST(Codebook, QuantizeCountsBoundariesAtOrBelow) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (std::uint32_t b = 1; b <= 5; ++b) {
    for (const std::uint32_t d : {16u, 128u, 576u}) {
      const Codebook& cb = book(d, b);
      const auto bf = cb.boundaries_f32();
      auto reference = [&](float y) {
        std::uint32_t n = 0;
        for (const float boundary : bf) n += boundary <= y ? 1u : 0u;
        return n;
      };
      std::normal_distribution<float> normal(0.0f, 1.5f / std::sqrt(static_cast<float>(d)));
      for (int i = 0; i < 2000; ++i) {
        const float y = normal(rng);
        ASSERT_EQ(cb.quantize(y), reference(y)) << "y " << y;
      }
      for (std::uint32_t k = 0; k < bf.size(); ++k) {
        EXPECT_EQ(cb.quantize(bf[k]), k + 1) << "on boundary " << k;  // ties go up
        EXPECT_EQ(cb.quantize(std::nextafter(bf[k], -1.0f)), k) << "below boundary " << k;
      }
      EXPECT_EQ(cb.quantize(-1.0f), 0u);
      EXPECT_EQ(cb.quantize(1.0f), cb.levels() - 1);
      EXPECT_EQ(cb.quantize(std::numeric_limits<float>::infinity()), cb.levels() - 1);
      EXPECT_EQ(cb.quantize(-std::numeric_limits<float>::infinity()), 0u);
      EXPECT_EQ(cb.quantize(std::numeric_limits<float>::quiet_NaN()), 0u);
    }
  }
}

TEST(Codebook, RejectsUnsupportedArguments) {
  for (const auto& [d, b] : std::vector<std::pair<std::uint32_t, std::uint32_t>>{
           {8, 2}, {24, 2}, {0, 2}, {1040, 2}, {2048, 2}, {128, 0}, {128, 6}, {128, 32}}) {
    auto r = lloyd_max_codebook(d, b);
    ASSERT_FALSE(r.ok()) << d << " " << b;
    EXPECT_EQ(r.error().code, ErrorCode::InvalidArgument);
    auto s = Codebook::solve(d, b);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code, ErrorCode::InvalidArgument);
  }
}

TEST(Codebook, CacheReturnsOnePointerPerPairAcrossThreads) {
  std::vector<std::vector<const Codebook*>> seen(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, &seen] {
      for (std::uint32_t i = 0; i < 40; ++i) {
        const std::uint32_t d = 16 * (1 + (i * 7 + static_cast<std::uint32_t>(t)) % 64);
        auto r = lloyd_max_codebook(d, 1 + i % 5);
        seen[t].push_back(r.ok() ? *r : nullptr);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) {
    for (std::uint32_t i = 0; i < 40; ++i) {
      const std::uint32_t d = 16 * (1 + (i * 7 + static_cast<std::uint32_t>(t)) % 64);
      auto again = lloyd_max_codebook(d, 1 + i % 5);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(seen[t][i], *again);
      EXPECT_EQ((*again)->head_dim(), d);
    }
  }
}

// The rotation is orthogonal, so for x uniform on the sphere y = R·x is uniform too, and ‖x − R⁻¹c(y)‖² =
// ‖y − c(y)‖²: the mean squared error over random unit vectors has expectation distortion() exactly, with no
// finite-d or rotation term. What separates them is the sample's noise, plus float rounding (x, y and the f32
// centroids and boundaries: ~10⁻⁷ relative), so the bound is 5 standard errors of the sample mean (0.2 % of the
// value at d = 576, 1 bit, to 1.7 % at d = 64, 4 bits; a fixed 2 % before) and 10⁻⁶ relative. (Measured over 5
// seeds, 115 checks: the deviations in standard errors had mean −0.13, spread 0.94 and largest 2.6 — the
// sample's noise, nothing systematic.)
TEST(Codebook, EmpiricalDistortionMatchesTheExactValue) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  constexpr int kVectors = 10000;
  for (const std::uint32_t d : {64u, 128u, 256u, 80u, 576u}) {
    const auto rotation = Rotation::create(d, rng());
    ASSERT_TRUE(rotation.ok());
    std::array<SampleMean, 5> error{};
    std::vector<float> x(d), y(d), code(d), recon(d);
    for (int v = 0; v < kVectors; ++v) {
      double norm_sq = 0.0;
      std::vector<double> g(d);
      for (auto& value : g) {
        value = normal(rng);
        norm_sq += value * value;
      }
      for (std::uint32_t i = 0; i < d; ++i) x[i] = static_cast<float>(g[i] / std::sqrt(norm_sq));
      rotation->forward(x, y);
      for (std::uint32_t b = 1; b <= 4; ++b) {
        const Codebook& cb = book(d, b);
        for (std::uint32_t i = 0; i < d; ++i) code[i] = cb.centroids_f32()[cb.quantize(y[i])];
        rotation->inverse(code, recon);
        double err = 0.0;
        for (std::uint32_t i = 0; i < d; ++i) {
          const double e = static_cast<double>(x[i]) - recon[i];
          err += e * e;
        }
        error[b].add(err);
      }
    }
    for (std::uint32_t b = 1; b <= 4; ++b) {
      const double exact = book(d, b).distortion();
      EXPECT_NEAR(error[b].mean(), exact, 5.0 * error[b].standard_error() + 1e-6 * exact)
          << "d " << d << " b " << b << ": " << (error[b].mean() - exact) / error[b].standard_error()
          << " standard errors off";
    }
  }
}

// tests/golden/codebooks.json, written by scripts/golden/codebook_golden.py: an independent solver
// (scipy adaptive quadrature + MINPACK root finding) over d ∈ {16 ... 1024} × bits 1..5. The file has a
// fixed shape we write ourselves, so a small scanner reads it.
struct GoldenBook {
  std::uint32_t head_dim = 0;
  std::uint32_t bits = 0;
  double distortion = 0.0;
  std::vector<double> centroids;
};

std::vector<GoldenBook> read_golden(const std::string& text) {
  std::vector<GoldenBook> books;
  auto number_after = [&text](std::size_t& pos, const char* key) {
    pos = text.find(key, pos);
    if (pos == std::string::npos) return std::numeric_limits<double>::quiet_NaN();
    pos += std::strlen(key);
    char* end = nullptr;
    const double v = std::strtod(text.c_str() + pos, &end);
    pos = static_cast<std::size_t>(end - text.c_str());
    return v;
  };
  std::size_t pos = 0;
  while ((pos = text.find("\"head_dim\":", pos)) != std::string::npos) {
    GoldenBook book;
    book.head_dim = static_cast<std::uint32_t>(number_after(pos, "\"head_dim\":"));
    book.bits = static_cast<std::uint32_t>(number_after(pos, "\"bits\":"));
    book.distortion = number_after(pos, "\"distortion\":");
    pos = text.find('[', text.find("\"centroids\":", pos)) + 1;
    const std::size_t close = text.find(']', pos);
    while (pos < close) {
      char* end = nullptr;
      book.centroids.push_back(std::strtod(text.c_str() + pos, &end));
      pos = text.find_first_not_of(" ,\n", static_cast<std::size_t>(end - text.c_str()));
    }
    books.push_back(std::move(book));
  }
  return books;
}

TEST(Codebook, MatchesTheIndependentGoldenSolver) {
  const auto path = testing_support::golden_dir() / "codebooks.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto books = read_golden(text);
  ASSERT_EQ(books.size(), 50u);
  for (const auto& golden : books) {
    const Codebook& cb = book(golden.head_dim, golden.bits);
    ASSERT_EQ(golden.centroids.size(), cb.levels()) << "d " << golden.head_dim << " b " << golden.bits;
    EXPECT_NEAR(cb.distortion(), golden.distortion, 1e-10 * golden.distortion)
        << "d " << golden.head_dim << " b " << golden.bits;
    for (std::uint32_t k = 0; k < cb.levels(); ++k) {
      EXPECT_NEAR(cb.centroids()[k], golden.centroids[k], 1e-13)
          << "d " << golden.head_dim << " b " << golden.bits << " k " << k;
    }
  }
}

}  // namespace
}  // namespace kvcompact::tq
