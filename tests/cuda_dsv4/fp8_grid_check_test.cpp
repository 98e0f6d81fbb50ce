// The FP8 indexer rows' grid check (src/cuda_dsv4/fp8_grid_check.hpp), on the host: its four-instruction word
// form against the per-code condition, the condition against the e4m3 values, and its verdict on the encoder's
// rows against the general 16-bit check's (indexer_rows16.cuh). No device needed, so CI runs these too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "cuda_dsv4/fp8_grid_check.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/dsv4/fp_sim.hpp"
#include "kvcompact/dsv4/storage.hpp"
#include "test_seed.hpp"

namespace kvcompact::cuda::dsv4::detail {
namespace {

namespace kd = kvcompact::dsv4;
using kvcompact::testing_support::fresh_seed;

// Significant bits of a finite nonzero float (the bits between its top set bit and its lowest set bit, both in).
int significant_bits(float v) {
  int e = 0;
  double f = std::frexp(std::fabs(static_cast<double>(v)), &e);  // f in [0.5, 1)
  int bits = 0;
  while (f != 0.0) {
    f = f * 2.0 - std::floor(f * 2.0);
    ++bits;
  }
  return bits;
}

// The general check of indexer_rows16.cuh on a row's decoded codes: at most two significant bits, every nonzero
// magnitude at least 2^(E - 6) with E = floor(log2 amax), E within f16's bounds [-8, 15] (an all-zero row passes).
bool general_check(const std::uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < 128; ++i) {
    const float v = fp8_e4m3_to_f32(codes[i]);
    if (std::isnan(v)) return false;
    amax = std::max(amax, std::fabs(v));
  }
  if (amax == 0.0f) return true;
  const int e = static_cast<int>(std::floor(std::log2(amax)));
  if (e < -8 || e > 15) return false;
  for (int i = 0; i < 128; ++i) {
    const float v = std::fabs(fp8_e4m3_to_f32(codes[i]));
    if (v != 0.0f && (significant_bits(v) > 2 || v < std::ldexp(1.0f, e - 6))) return false;
  }
  return true;
}

bool grid_check(const std::uint8_t* codes) {
  std::uint32_t failures = 0;
  for (int w = 0; w < 32; ++w) {
    const std::uint32_t word = codes[4 * w] | codes[4 * w + 1] << 8 | codes[4 * w + 2] << 16 |
                               static_cast<std::uint32_t>(codes[4 * w + 3]) << 24;
    failures = fp8_grid_failures(failures, word);
  }
  return (failures & kFp8GridFailMask) == 0;
}

TEST(CudaDsv4Fp8GridCheck, CodeConditionIsZeroOrTwoSignificantBitsFromFour) {
  int on_grid = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_e4m3_to_f32(static_cast<std::uint8_t>(c));
    const bool want = !std::isnan(v) && (v == 0.0f || (std::fabs(v) >= 4.0f && significant_bits(v) <= 2));
    EXPECT_EQ(fp8_code_on_grid(static_cast<std::uint8_t>(c)), want) << "code " << c;
    on_grid += want;
  }
  EXPECT_EQ(on_grid, 30);  // +-0 and 14 magnitudes (4, 6, 8, 12, ..., 256, 384) of each sign
}

// Every code in every byte of a word, beside random neighbours: a byte's failure bits are its own (no carry
// crosses bytes) and are clear exactly for codes on the grid.
TEST(CudaDsv4Fp8GridCheck, WordFormMatchesTheCodeCondition) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (unsigned c = 0; c < 256; ++c) {
    for (unsigned pos = 0; pos < 4; ++pos) {
      for (int t = 0; t < 64; ++t) {
        const std::uint32_t word = (static_cast<std::uint32_t>(rng()) & ~(0xFFu << (8 * pos))) | c << (8 * pos);
        const std::uint32_t failures = fp8_grid_failures(0u, word);
        for (unsigned i = 0; i < 4; ++i) {
          const bool passed = ((failures >> (8 * i)) & 0x83u) == 0u;
          ASSERT_EQ(passed, fp8_code_on_grid(static_cast<std::uint8_t>(word >> (8 * i)))) << "word " << word;
        }
      }
    }
  }
}

// The encoder's FP8 rows of FP4-grid values (the model's indexer keys), with the blocks' scales spread 0 to 6
// binades apart: the grid check accepts exactly the rows the general check accepts, and both outcomes occur.
// A nonzero row's largest code is 256 or 384 (E = 8, which the kernel's exactness bounds assume).
TEST(CudaDsv4Fp8GridCheck, AgreesWithTheGeneralCheckOnEncoderRows) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(128);
  std::vector<std::uint8_t> bytes(kd::indexer_row_bytes(kd::IndexerStorage::Fp8));
  int accepted = 0, rejected = 0;
  for (int r = 0; r < 4000; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    const int spread = static_cast<int>(rng() % 7);
    for (int i = 0; i < 128; ++i) {
      const int shift = (i / 32 == static_cast<int>(r % 4)) ? spread : 0;  // one block lower by the spread
      row[i] = normal(rng) * std::ldexp(scale, -shift);
    }
    kd::fp4_block_sim(row.data(), row.size(), 32);
    ASSERT_TRUE(kd::encode_indexer_row(row, kd::IndexerStorage::Fp8, bytes).ok());
    float amax = 0.0f;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(fp8_e4m3_to_f32(bytes[i])));
    if (amax != 0.0f) {
      EXPECT_TRUE(amax == 256.0f || amax == 384.0f) << amax;
    }
    const bool general = general_check(bytes.data());
    ASSERT_EQ(grid_check(bytes.data()), general) << "row " << r << " spread " << spread;
    (general ? accepted : rejected) += 1;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4::detail
