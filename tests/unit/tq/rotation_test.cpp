// Randomized Hadamard rotation: the seed system's sign convention (known answers), block structure for
// non-power-of-two head dims, orthogonality in float and double, agreement with the explicit matrix
// H·D/√b built here by Sylvester's recursion, and bit-equality with the seed's three-pass float sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvcompact/tq/prng.hpp"
#include "kvcompact/tq/rotation.hpp"
#include "test_seed.hpp"

namespace kvcompact::tq {
namespace {

const std::vector<std::uint32_t> kDims = {16, 32, 64, 128, 256, 512, 1024, 80, 96, 112, 192, 576, 1008};

using kvcompact::testing_support::fresh_seed;

Rotation make(std::uint32_t d, std::uint64_t seed) {
  auto r = Rotation::create(d, seed);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return std::move(r).value();
}

std::string sign_string(const Rotation& r) {
  std::string s;
  for (const float v : r.signs()) s += v > 0 ? '+' : '-';
  return s;
}

// Dense Sylvester Hadamard matrix H_n (n a power of two) by the recursion H_2n = [[H, H], [H, −H]].
std::vector<std::vector<double>> sylvester(std::uint32_t n) {
  std::vector<std::vector<double>> h = {{1.0}};
  for (std::uint32_t size = 1; size < n; size *= 2) {
    std::vector<std::vector<double>> next(2 * size, std::vector<double>(2 * size));
    for (std::uint32_t i = 0; i < size; ++i) {
      for (std::uint32_t j = 0; j < size; ++j) {
        next[i][j] = h[i][j];
        next[i][j + size] = h[i][j];
        next[i + size][j] = h[i][j];
        next[i + size][j + size] = -h[i][j];
      }
    }
    h = std::move(next);
  }
  return h;
}

// The explicit matrix R: block-diagonal over `blocks`, each block H_b·D/√b.
std::vector<std::vector<double>> explicit_matrix(const Rotation& r) {
  const std::uint32_t d = r.head_dim();
  std::vector<std::vector<double>> m(d, std::vector<double>(d, 0.0));
  std::uint32_t offset = 0;
  for (const std::uint32_t b : r.blocks()) {
    const auto h = sylvester(b);
    for (std::uint32_t i = 0; i < b; ++i) {
      for (std::uint32_t j = 0; j < b; ++j) {
        m[offset + i][offset + j] = h[i][j] * r.signs()[offset + j] / std::sqrt(static_cast<double>(b));
      }
    }
    offset += b;
  }
  return m;
}

TEST(Rotation, SignsFollowTheSeedSystemConvention) {
  // sign_i = +1 iff the low bit of the i-th xoshiro256** output is 1 (values from an independent
  // Python transcription of the published generators).
  EXPECT_EQ(sign_string(make(16, 0)), "----+--+++-+-+--");
  EXPECT_EQ(sign_string(make(32, 42)), "--++---+-+++--+-+-+-++++------+-");
  // Layer 3 of seed 42: main stream seeded with 42 ^ 3, QJL stream with qjl_stream_seed(42 ^ 3).
  EXPECT_EQ(sign_string(make(32, layer_seed(42, 3))), "---+++-++++--+-+---++--++-------");
  EXPECT_EQ(sign_string(make(32, qjl_stream_seed(layer_seed(42, 3)))), "++-+----+-++-++-++-++++++-++--+-");
}

TEST(Rotation, SignsAreOneStreamOverTheWholeHeadDim) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const std::uint32_t d : kDims) {
    const Rotation r = make(d, seed);
    Xoshiro256StarStar rng(seed);
    ASSERT_EQ(r.signs().size(), d);
    for (std::uint32_t i = 0; i < d; ++i) {
      ASSERT_EQ(r.signs()[i], (rng.next_u64() & 1u) ? 1.0f : -1.0f) << "d " << d << " i " << i;
    }
    // A prefix of the same stream: the first 16 signs do not depend on head_dim.
    EXPECT_EQ(sign_string(r).substr(0, 16), sign_string(make(16, seed)));
  }
}

TEST(Rotation, BlocksAreTheBinaryDecompositionLargestFirst) {
  const std::vector<std::pair<std::uint32_t, std::vector<std::uint32_t>>> cases = {
      {16, {16}},        {128, {128}},        {1024, {1024}},   {80, {64, 16}},
      {96, {64, 32}},    {192, {128, 64}},    {576, {512, 64}}, {1008, {512, 256, 128, 64, 32, 16}},
      {112, {64, 32, 16}}};
  for (const auto& [d, blocks] : cases) {
    const Rotation r = make(d, 1);
    EXPECT_EQ(std::vector<std::uint32_t>(r.blocks().begin(), r.blocks().end()), blocks) << "d " << d;
    EXPECT_EQ(r.head_dim(), d);
  }
}

TEST(Rotation, RejectsUnsupportedHeadDims) {
  for (const std::uint32_t d : {0u, 1u, 8u, 15u, 24u, 100u, 1040u, 2048u, 4294967280u}) {
    auto r = Rotation::create(d, 0);
    ASSERT_FALSE(r.ok()) << "d " << d;
    EXPECT_EQ(r.error().code, ErrorCode::InvalidArgument);
    EXPECT_NE(r.error().message.find(std::to_string(d)), std::string::npos) << r.error().message;
  }
}

TEST(Rotation, MatchesTheExplicitMatrixOnBasisVectors) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const std::uint32_t d : {16u, 64u, 128u, 80u, 96u, 192u}) {
    const Rotation r = make(d, seed);
    const auto m = explicit_matrix(r);
    std::vector<double> e(d), col(d);
    std::vector<float> ef(d), colf(d);
    for (std::uint32_t j = 0; j < d; ++j) {
      std::fill(e.begin(), e.end(), 0.0);
      std::fill(ef.begin(), ef.end(), 0.0f);
      e[j] = 1.0;
      ef[j] = 1.0f;
      r.forward(e, col);
      r.forward(ef, colf);
      for (std::uint32_t i = 0; i < d; ++i) {
        ASSERT_NEAR(col[i], m[i][j], 1e-15) << "d " << d << " (" << i << ", " << j << ")";
        ASSERT_NEAR(colf[i], m[i][j], 1e-7) << "d " << d << " (" << i << ", " << j << ")";
        ASSERT_NEAR(r.matrix_entry(i, j), m[i][j], 1e-15);
      }
      // Row j of R is column j of R⁻¹ = Rᵀ.
      r.inverse(e, col);
      for (std::uint32_t i = 0; i < d; ++i) ASSERT_NEAR(col[i], m[j][i], 1e-15) << "inverse d " << d;
    }
  }
}

TEST(Rotation, IsOrthogonalInFloatAndDouble) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  for (const std::uint32_t d : kDims) {
    const Rotation r = make(d, rng());
    for (int trial = 0; trial < 8; ++trial) {
      std::vector<double> x(d), y(d), back(d), forth(d);
      std::vector<float> xf(d), yf(d), backf(d), forthf(d);
      double norm_sq = 0.0;
      for (std::uint32_t i = 0; i < d; ++i) {
        xf[i] = static_cast<float>(normal(rng) * (trial == 0 ? 1e-3 : 1.0));
        x[i] = xf[i];
        norm_sq += x[i] * x[i];
      }
      const double norm = std::sqrt(norm_sq);
      r.forward(x, y);
      r.inverse(y, back);
      r.inverse(x, forth);
      r.forward(forth, forth);  // in place
      r.forward(xf, yf);
      r.inverse(yf, backf);
      r.inverse(xf, forthf);
      r.forward(forthf, forthf);
      double y_sq = 0.0, yf_sq = 0.0;
      for (std::uint32_t i = 0; i < d; ++i) {
        y_sq += y[i] * y[i];
        yf_sq += static_cast<double>(yf[i]) * yf[i];
        ASSERT_NEAR(back[i], x[i], 1e-12 * norm) << "d " << d << " i " << i;
        ASSERT_NEAR(forth[i], x[i], 1e-12 * norm) << "d " << d << " i " << i;
        ASSERT_NEAR(backf[i], x[i], 1e-6 * norm) << "d " << d << " i " << i;
        ASSERT_NEAR(forthf[i], x[i], 1e-6 * norm) << "d " << d << " i " << i;
        // float and double paths agree
        ASSERT_NEAR(yf[i], y[i], 1e-6 * norm) << "d " << d << " i " << i;
      }
      EXPECT_NEAR(std::sqrt(y_sq), norm, 1e-12 * norm) << "d " << d;
      EXPECT_NEAR(std::sqrt(yf_sq), norm, 1e-6 * norm) << "d " << d;
    }
  }
}

TEST(Rotation, DenseOracleOnRandomVectors) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  for (const std::uint32_t d : {32u, 128u, 80u, 576u}) {
    const Rotation r = make(d, rng());
    const auto m = explicit_matrix(r);
    std::vector<double> x(d), y(d);
    std::vector<float> xf(d), yf(d);
    for (std::uint32_t i = 0; i < d; ++i) x[i] = xf[i] = static_cast<float>(normal(rng));
    r.forward(x, y);
    r.forward(xf, yf);
    for (std::uint32_t i = 0; i < d; ++i) {
      double expected = 0.0;
      for (std::uint32_t j = 0; j < d; ++j) expected += m[i][j] * x[j];
      ASSERT_NEAR(y[i], expected, 1e-12) << "d " << d << " i " << i;
      ASSERT_NEAR(yf[i], expected, 2e-6) << "d " << d << " i " << i;
    }
  }
}

TEST(Rotation, InPlaceEqualsOutOfPlaceBitForBit) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (const std::uint32_t d : kDims) {
    const Rotation r = make(d, rng());
    std::vector<float> x(d), out(d), inplace(d);
    for (auto& v : x) v = normal(rng);
    inplace = x;
    r.forward(x, out);
    r.forward(inplace, inplace);
    ASSERT_EQ(0, std::memcmp(out.data(), inplace.data(), d * sizeof(float))) << "forward d " << d;
    inplace = x;
    r.inverse(x, out);
    r.inverse(inplace, inplace);
    ASSERT_EQ(0, std::memcmp(out.data(), inplace.data(), d * sizeof(float))) << "inverse d " << d;
  }
}

// The seed system's float sequence, written as three plain passes: multiply by the signs, butterflies with
// strides 1, 2, 4, ..., multiply by 1.0f / sqrtf(n); the inverse scales first and flips signs last.
void seed_forward(std::vector<float>& x, std::span<const float> signs) {
  const std::size_t n = x.size();
  for (std::size_t i = 0; i < n; ++i) x[i] *= signs[i];
  for (std::size_t h = 1; h < n; h *= 2) {
    for (std::size_t i = 0; i < n; i += 2 * h) {
      for (std::size_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (auto& v : x) v *= scale;
}
void seed_inverse(std::vector<float>& x, std::span<const float> signs) {
  const std::size_t n = x.size();
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (auto& v : x) v *= scale;
  for (std::size_t h = 1; h < n; h *= 2) {
    for (std::size_t i = 0; i < n; i += 2 * h) {
      for (std::size_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) x[i] *= signs[i];
}

TEST(Rotation, PowerOfTwoFloatPathIsBitIdenticalToTheSeedSequence) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (const std::uint32_t d : {16u, 32u, 64u, 128u, 256u, 512u, 1024u}) {
    const Rotation r = make(d, rng());
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<float> x(d), ours(d);
      for (auto& v : x) v = normal(rng);
      std::vector<float> theirs = x;
      r.forward(x, ours);
      seed_forward(theirs, r.signs());
      ASSERT_EQ(0, std::memcmp(ours.data(), theirs.data(), d * sizeof(float))) << "forward d " << d;
      theirs = x;
      r.inverse(x, ours);
      seed_inverse(theirs, r.signs());
      ASSERT_EQ(0, std::memcmp(ours.data(), theirs.data(), d * sizeof(float))) << "inverse d " << d;
    }
  }
}

TEST(Rotation, DifferentLayersAndStreamsGiveDifferentSigns) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::set<std::string> seen;
  for (std::uint32_t layer = 0; layer < 64; ++layer) {
    const std::uint64_t s = layer_seed(seed, layer);
    seen.insert(sign_string(make(128, s)));
    seen.insert(sign_string(make(128, qjl_stream_seed(s))));
  }
  EXPECT_EQ(seen.size(), 128u);
  // Same seed, same signs.
  EXPECT_EQ(sign_string(make(128, seed)), sign_string(make(128, seed)));
}

TEST(Rotation, BlockDiagonalKeepsMassInsideItsBlock) {
  // The documented weakness of non-power-of-two dims: a vector supported on one block stays there.
  const Rotation r = make(80, fresh_seed());
  std::vector<double> x(80, 0.0), y(80);
  for (std::uint32_t i = 64; i < 80; ++i) x[i] = 1.0;
  r.forward(x, y);
  for (std::uint32_t i = 0; i < 64; ++i) EXPECT_EQ(y[i], 0.0);
  double tail = 0.0;
  for (std::uint32_t i = 64; i < 80; ++i) tail += y[i] * y[i];
  EXPECT_NEAR(tail, 16.0, 1e-12);
}

}  // namespace
}  // namespace kvcompact::tq
