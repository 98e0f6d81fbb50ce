// The fast encode kernel's quantiser tables (src/cuda/encode_quantiser.hpp), checked on the CPU (no device
// needed, so CI runs these): for every codebook the fast kernel serves (head_dim 64 / 128 / 256, 1–5 bits),
// with and without the skipped 1/√b multiplication, the threshold compare and the cell lookup give the CPU
// codec's code (Codebook::quantize of RN(y · s)) for every float near a threshold or a cell edge, for random
// bit patterns (NaN, ±∞, subnormals included) and random values in the codebook's range.
// KVC_EXHAUSTIVE_QUANTISER=1 also runs every one of the 2^32 floats for the recommended mode's codebooks
// (≈ 1 min each).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/encode_quantiser.hpp"
#include "kvcompact/tq/codebook.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq::detail {
namespace {

using kvcompact::tq::Codebook;
using kvcompact::tq::testing::fresh_seed;

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

struct Case {
  const Codebook* book;
  float scale;  // the kernel's skipped multiplication (1 = none)
  EncodeQuantiser q;
  std::uint64_t checked = 0;

  std::uint32_t expected(float y) const { return book->quantize(scale == 1.0f ? y : y * scale); }
  void check(float y) {
    const std::uint32_t want = expected(y);
    const std::uint32_t count = book->levels() - 1;
    ++checked;
    if (quantise_by_thresholds(q, count, y) != want || quantise_by_cells(q, y) != want) {
      ADD_FAILURE() << "d " << book->head_dim() << " bits " << book->bits() << " scale " << scale << " y "
                    << y << " (bits 0x" << std::hex << to_bits(y) << std::dec << "): CPU code " << want
                    << ", thresholds " << quantise_by_thresholds(q, count, y) << ", cells "
                    << quantise_by_cells(q, y);
    }
  }
  // Every float within `ulps` steps of v, both sides.
  void check_around(float v, int ulps) {
    float lo = v, hi = v;
    check(v);
    for (int i = 0; i < ulps; ++i) {
      lo = std::nextafter(lo, -std::numeric_limits<float>::infinity());
      hi = std::nextafter(hi, std::numeric_limits<float>::infinity());
      check(lo);
      check(hi);
    }
  }
};

Case make_case(const Codebook& book, float scale) {
  Case c{&book, scale, {}};
  EXPECT_TRUE(build_encode_quantiser(book.boundaries_f32().data(), book.levels() - 1, scale, c.q))
      << "d " << book.head_dim() << " bits " << book.bits() << " scale " << scale;
  return c;
}

TEST(EncodeQuantiser, MatchesTheCodebookNearThresholdsCellEdgesAndAtRandom) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (std::uint32_t d : {64u, 128u, 256u}) {
    for (std::uint32_t bits = 1; bits <= 5; ++bits) {
      const auto book = Codebook::solve(d, bits);
      ASSERT_TRUE(book.ok());
      for (const float scale : {1.0f, 1.0f / std::sqrt(static_cast<float>(d))}) {
        Case c = make_case(*book, scale);
        EXPECT_LE(c.q.cell_bits, kMaxCellBits);
        const std::uint32_t count = book->levels() - 1;
        for (std::uint32_t j = 0; j < count; ++j) {
          c.check_around(c.q.thresholds[j], 4096);
          // where RN(y · s) crosses the boundary itself, seen from the unscaled side
          c.check_around(book->boundaries_f32()[j] / scale, 64);
        }
        // cell edges: the cell changes between y and its successor
        const float span_lo = c.q.thresholds[0] - 1.0f, span_hi = c.q.thresholds[count - 1] + 1.0f;
        for (std::uint32_t k = 1; k <= (1u << c.q.cell_bits); ++k) {
          // inverse of the cell map (approximate), then every float around it
          const float edge = static_cast<float>((static_cast<double>(k) / c.q.cell_scale - c.q.cell_c) / c.q.cell_a);
          if (edge > span_lo && edge < span_hi) c.check_around(edge, 256);
        }
        std::uniform_int_distribution<std::uint32_t> any_bits;
        std::uniform_real_distribution<float> in_range(span_lo, span_hi);
        for (int i = 0; i < (1 << 18); ++i) {
          c.check(from_bits(any_bits(rng)));
          c.check(in_range(rng));
        }
        for (const float v : {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                              std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()}) {
          c.check(v);
        }
        EXPECT_GT(c.checked, 500000u);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(EncodeQuantiser, RecommendedCodebooksOverEveryFloat) {
  const char* env = std::getenv("KVC_EXHAUSTIVE_QUANTISER");
  if (env == nullptr || std::string(env) != "1") GTEST_SKIP() << "set KVC_EXHAUSTIVE_QUANTISER=1 (≈ 1 min per codebook)";
  for (std::uint32_t bits : {3u, 4u}) {
    const auto book = Codebook::solve(128, bits);
    ASSERT_TRUE(book.ok());
    Case c = make_case(*book, 1.0f / std::sqrt(128.0f));
    std::uint64_t bad = 0;
    for (std::uint64_t b = 0; b <= 0xffffffffull; ++b) {
      const float y = from_bits(static_cast<std::uint32_t>(b));
      const std::uint32_t want = c.expected(y);
      bad += (quantise_by_thresholds(c.q, book->levels() - 1, y) != want) + (quantise_by_cells(c.q, y) != want);
    }
    EXPECT_EQ(bad, 0u) << "bits " << bits;
  }
}

// The QJL sign bit without the multiplication: y ≥ scaled_threshold(0, s) ⟺ RN(y · s) ≥ 0 (−0 counts as ≥ 0).
TEST(EncodeQuantiser, SignThresholdMatchesTheScaledSign) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (std::uint32_t d : {64u, 128u, 256u}) {
    const float s = 1.0f / std::sqrt(static_cast<float>(d));
    const float t0 = scaled_threshold(0.0f, s);
    EXPECT_LT(t0, 0.0f) << "d " << d;  // a few negative subnormals still round to −0
    auto check = [&](float y) {
      ASSERT_EQ(y >= t0, y * s >= 0.0f) << "d " << d << " y " << y << " (bits 0x" << std::hex << to_bits(y) << ")";
    };
    for (std::uint32_t b = 0; b < (1u << 20); ++b) {  // every float of magnitude below ≈ 1.5e-39, both signs
      check(from_bits(b));
      check(from_bits(b | 0x80000000u));
    }
    for (int i = 0; i < (1 << 20); ++i) check(from_bits(any_bits(rng)));
    check(std::numeric_limits<float>::infinity());
    check(-std::numeric_limits<float>::infinity());
    check(std::numeric_limits<float>::quiet_NaN());
  }
}

TEST(EncodeQuantiser, RejectsUnorderedOrNonFiniteBoundaries) {
  EncodeQuantiser q;
  const float unordered[3] = {0.1f, -0.1f, 0.2f};
  EXPECT_FALSE(build_encode_quantiser(unordered, 3, 1.0f, q));
  const float repeated[3] = {-0.1f, 0.1f, 0.1f};
  EXPECT_FALSE(build_encode_quantiser(repeated, 3, 1.0f, q));
  const float infinite[3] = {-0.1f, 0.0f, std::numeric_limits<float>::infinity()};
  EXPECT_FALSE(build_encode_quantiser(infinite, 3, 1.0f, q));
  const float fine[3] = {-0.1f, 0.0f, 0.1f};
  EXPECT_FALSE(build_encode_quantiser(fine, 3, 0.0f, q));
  EXPECT_FALSE(build_encode_quantiser(fine, 0, 1.0f, q));
  ASSERT_TRUE(build_encode_quantiser(fine, 3, 1.0f, q));
  EXPECT_EQ(quantise_by_cells(q, -0.2f), 0u);
  EXPECT_EQ(quantise_by_cells(q, 0.0f), 2u);
  EXPECT_EQ(quantise_by_cells(q, 0.1f), 3u);
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
