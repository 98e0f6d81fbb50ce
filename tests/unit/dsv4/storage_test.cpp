// DeepSeek-V4 row storage: bytes pinned by hand for each layout, and the losslessness claim — a row
// already on the model's FP8 / FP4 grid (built directly from random codes and power-of-two block
// scales, independent of the encoder) encodes to 584 / 68 / 132 bytes and decodes bit for bit.
#include "kvcompact/dsv4/storage.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kvcompact/core/dtypes.hpp"
#include "protocol_test_util.hpp"

namespace kvcompact::dsv4 {
namespace {

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A 512-wide row as the model leaves it: dims [0, 448) are e4m3 codes times 2^e per 64-block, the
// RoPE tail is bf16. Block exponents are random in [-40, 40]; some blocks are all zero.
std::vector<float> model_fp8_row(std::mt19937_64& rng) {
  std::vector<float> row(512);
  for (int b = 0; b < 7; ++b) {
    int e = static_cast<int>(rng() % 81) - 40;
    bool zero_block = rng() % 10 == 0;
    for (int i = 0; i < 64; ++i) {
      std::uint8_t code = static_cast<std::uint8_t>(rng() % 127);  // finite magnitudes 0x00..0x7E
      if (rng() % 2) code |= 0x80;
      row[static_cast<std::size_t>(64 * b + i)] = zero_block ? 0.0f : std::ldexp(fp8_e4m3_to_f32(code), e);
    }
  }
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int k = 448; k < 512; ++k) row[static_cast<std::size_t>(k)] = bf16_to_f32(f32_to_bf16(normal(rng)));
  return row;
}

// A 128-wide indexer row on the e2m1 grid with a power-of-two scale per 32-block; exponents within
// `spread` of each other.
std::vector<float> model_fp4_row(std::mt19937_64& rng, int spread) {
  std::vector<float> row(128);
  int base = static_cast<int>(rng() % 61) - 30;
  for (int b = 0; b < 4; ++b) {
    int e = base + static_cast<int>(rng() % static_cast<std::uint64_t>(spread + 1));
    for (int i = 0; i < 32; ++i) {
      std::uint8_t code = static_cast<std::uint8_t>(rng() % 16);
      row[static_cast<std::size_t>(32 * b + i)] = std::ldexp(fp4_e2m1_to_f32(code), e);
    }
  }
  return row;
}

TEST(Dsv4Storage, RowSizes) {
  EXPECT_EQ(attention_row_bytes(RowStorage::Bf16), 1024u);
  EXPECT_EQ(attention_row_bytes(RowStorage::Fp8), 584u);
  EXPECT_EQ(indexer_row_bytes(IndexerStorage::Bf16), 256u);
  EXPECT_EQ(indexer_row_bytes(IndexerStorage::Fp8), 132u);
  EXPECT_EQ(indexer_row_bytes(IndexerStorage::Mxfp4), 68u);
}

TEST(Dsv4Storage, Fp8AttentionBytesPinnedByHand) {
  std::vector<float> row(512, 0.0f);
  for (int i = 0; i < 64; ++i) row[static_cast<std::size_t>(i)] = 1.0f;            // block 0: 1.0
  for (int i = 128; i < 192; ++i) row[static_cast<std::size_t>(i)] = -448.0f;      // block 2: -448
  row[200] = 3.0f;                                                                   // block 3: one 3.0
  for (int k = 448; k < 512; ++k) row[static_cast<std::size_t>(k)] = 2.0f;         // tail
  std::vector<std::uint8_t> out(584, 0xAA);
  ASSERT_TRUE(encode_attention_row(row, RowStorage::Fp8, out).ok());
  // Block 0: amax 1 -> scale 2^ceil(log2(1/448)) = 2^-8 (ue8m0 119); 1.0 / 2^-8 = 256 = e4m3 0x78.
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)], 0x78) << i;
  EXPECT_EQ(out[576], 119);
  // Block 1 is zero: smallest scale (byte 0), codes 0.
  for (int i = 64; i < 128; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)], 0x00) << i;
  EXPECT_EQ(out[577], 0);
  // Block 2: amax 448 -> scale 2^0 (127); -448 = 0xFE.
  for (int i = 128; i < 192; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)], 0xFE) << i;
  EXPECT_EQ(out[578], 127);
  // Block 3: amax 3 -> 2^ceil(log2(3/448)) = 2^-7 (120); 3 / 2^-7 = 384 = 1.5 * 2^8 -> 0x7C.
  EXPECT_EQ(out[200], 0x7C);
  EXPECT_EQ(out[201], 0x00);
  EXPECT_EQ(out[579], 120);
  // Tail: bf16(2.0) = 0x4000, little-endian.
  for (int k = 0; k < 64; ++k) {
    EXPECT_EQ(out[static_cast<std::size_t>(448 + 2 * k)], 0x00);
    EXPECT_EQ(out[static_cast<std::size_t>(449 + 2 * k)], 0x40);
  }
  EXPECT_EQ(out[583], 0);  // pad
  std::vector<float> back(512);
  ASSERT_TRUE(decode_attention_row(out, RowStorage::Fp8, back).ok());
  EXPECT_TRUE(same_bits(back, row));
}

TEST(Dsv4Storage, IndexerBytesPinnedByHand) {
  std::vector<float> row(128, 1.0f);
  row[1] = -6.0f;
  std::vector<std::uint8_t> mx(68, 0xAA);
  ASSERT_TRUE(encode_indexer_row(row, IndexerStorage::Mxfp4, mx).ok());
  // Block 0: amax 6 -> scale 2^0 (127); dim 0 = 1.0 -> code 2 (low nibble), dim 1 = -6 -> 0xF (high).
  EXPECT_EQ(mx[0], 0xF2);
  EXPECT_EQ(mx[1], 0x22);
  EXPECT_EQ(mx[64], 127);
  // Blocks 1..3: amax 1 -> 2^ceil(log2(1/6)) = 2^-2 (125); 1.0 / 0.25 = 4 -> code 6.
  EXPECT_EQ(mx[16], 0x66);
  EXPECT_EQ(mx[63], 0x66);
  EXPECT_EQ(mx[65], 125);
  EXPECT_EQ(mx[67], 125);

  std::vector<float> ones(128, 1.0f);
  std::vector<std::uint8_t> f8(132, 0xAA);
  ASSERT_TRUE(encode_indexer_row(ones, IndexerStorage::Fp8, f8).ok());
  EXPECT_EQ(f8[0], 0x78);
  EXPECT_EQ(f8[127], 0x78);
  // Scale 2^-8 as f32 0x3B800000, little-endian.
  EXPECT_EQ(f8[128], 0x00);
  EXPECT_EQ(f8[129], 0x00);
  EXPECT_EQ(f8[130], 0x80);
  EXPECT_EQ(f8[131], 0x3B);

  std::vector<std::uint8_t> b16(256);
  ASSERT_TRUE(encode_indexer_row(row, IndexerStorage::Bf16, b16).ok());
  EXPECT_EQ(b16[0], 0x80);  // bf16(1.0) = 0x3F80
  EXPECT_EQ(b16[1], 0x3F);
  EXPECT_EQ(b16[2], 0xC0);  // bf16(-6.0) = 0xC0C0
  EXPECT_EQ(b16[3], 0xC0);
}

TEST(Dsv4Storage, ModelFp8RowsRoundTripBitExactly) {
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> bytes(584);
  std::vector<float> back(512);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<float> row = model_fp8_row(rng);
    ASSERT_TRUE(encode_attention_row(row, RowStorage::Fp8, bytes).ok());
    ASSERT_TRUE(decode_attention_row(bytes, RowStorage::Fp8, back).ok());
    ASSERT_TRUE(same_bits(row, back)) << "trial " << trial;
    // BF16 storage holds the same row exactly too (e4m3 values fit bf16).
    std::vector<std::uint8_t> wide(1024);
    ASSERT_TRUE(encode_attention_row(row, RowStorage::Bf16, wide).ok());
    ASSERT_TRUE(decode_attention_row(wide, RowStorage::Bf16, back).ok());
    ASSERT_TRUE(same_bits(row, back)) << "trial " << trial;
  }
}

TEST(Dsv4Storage, ModelFp4IndexerRowsRoundTripBitExactly) {
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<float> back(128);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<float> row = model_fp4_row(rng, 40);
    std::vector<std::uint8_t> mx(68);
    ASSERT_TRUE(encode_indexer_row(row, IndexerStorage::Mxfp4, mx).ok());
    ASSERT_TRUE(decode_indexer_row(mx, IndexerStorage::Mxfp4, back).ok());
    ASSERT_TRUE(same_bits(row, back)) << "mxfp4 trial " << trial;
    std::vector<std::uint8_t> b16(256);
    ASSERT_TRUE(encode_indexer_row(row, IndexerStorage::Bf16, b16).ok());
    ASSERT_TRUE(decode_indexer_row(b16, IndexerStorage::Bf16, back).ok());
    ASSERT_TRUE(same_bits(row, back)) << "bf16 trial " << trial;
    // One FP8 scale per row holds FP4 rows whose block scales lie within 2^8 of each other.
    std::vector<float> narrow = model_fp4_row(rng, 8);
    std::vector<std::uint8_t> f8(132);
    ASSERT_TRUE(encode_indexer_row(narrow, IndexerStorage::Fp8, f8).ok());
    ASSERT_TRUE(decode_indexer_row(f8, IndexerStorage::Fp8, back).ok());
    ASSERT_TRUE(same_bits(narrow, back)) << "fp8 trial " << trial;
  }
}

// Brute-force nearest e4m3 grid point at scale 2^e, ties to the even code: the simulation's oracle.
float nearest_e4m3(float x, int e) {
  double best = 0;
  double best_err = INFINITY;
  int best_code = 0;
  for (int code = 0; code < 127; ++code) {
    double v = std::ldexp(static_cast<double>(fp8_e4m3_to_f32(static_cast<std::uint8_t>(code))), e);
    double err = std::fabs(std::fabs(static_cast<double>(x)) - v);
    if (err < best_err || (err == best_err && code % 2 == 0)) {
      best_err = err;
      best = v;
      best_code = code;
    }
  }
  (void)best_code;
  if (std::fabs(static_cast<double>(x)) >= std::ldexp(448.0, e)) best = std::ldexp(448.0, e);
  return static_cast<float>(std::signbit(x) ? -best : best);
}

TEST(Dsv4Storage, ArbitraryRowsRoundLikeTheModel) {
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint8_t> bytes(584);
  std::vector<float> back(512);
  for (int trial = 0; trial < 50; ++trial) {
    float spread = std::ldexp(1.0f, static_cast<int>(rng() % 30) - 15);
    std::vector<float> row(512);
    for (float& v : row) v = normal(rng) * spread;
    // Oracle: per block, scale 2^ceil(log2(amax / 448)) in long double, nearest grid point.
    std::vector<float> want = row;
    for (int b = 0; b < 7; ++b) {
      long double amax = 0;
      for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs((long double)row[static_cast<std::size_t>(64 * b + i)]));
      int e = static_cast<int>(std::ceil(std::log2(amax / 448.0L)));
      for (int i = 0; i < 64; ++i) {
        std::size_t d = static_cast<std::size_t>(64 * b + i);
        want[d] = nearest_e4m3(row[d], e);
      }
    }
    for (int k = 448; k < 512; ++k) want[static_cast<std::size_t>(k)] = bf16_to_f32(f32_to_bf16(row[static_cast<std::size_t>(k)]));
    ASSERT_TRUE(encode_attention_row(row, RowStorage::Fp8, bytes).ok());
    ASSERT_TRUE(decode_attention_row(bytes, RowStorage::Fp8, back).ok());
    ASSERT_TRUE(same_bits(back, want)) << "trial " << trial;
    std::vector<float> simulated = row;
    simulate_fp8_attention_row(simulated);
    for (int k = 448; k < 512; ++k) EXPECT_EQ(simulated[static_cast<std::size_t>(k)], row[static_cast<std::size_t>(k)]);
    ASSERT_TRUE(same_bits(std::span<const float>(simulated).first(448), std::span<const float>(want).first(448)));
  }
}

TEST(Dsv4Storage, SimulatedFp4RowsSurviveMxfp4) {
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> back(128);
  std::vector<std::uint8_t> mx(68);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> row(128);
    for (float& v : row) v = normal(rng) * 0.01f;
    simulate_fp4_indexer_row(row);
    for (float v : row) {  // every value is an e2m1 code times a power of two
      if (v == 0) continue;
      int e = 0;
      float f = std::frexp(std::fabs(v), &e);
      EXPECT_TRUE(f == 0.5f || f == 0.75f) << v;
    }
    ASSERT_TRUE(encode_indexer_row(row, IndexerStorage::Mxfp4, mx).ok());
    ASSERT_TRUE(decode_indexer_row(mx, IndexerStorage::Mxfp4, back).ok());
    ASSERT_TRUE(same_bits(row, back)) << "trial " << trial;
  }
}

TEST(Dsv4Storage, BadArgumentsAreTypedErrors) {
  std::vector<float> row(512, 1.0f);
  std::vector<std::uint8_t> small(583);
  EXPECT_EQ(encode_attention_row(row, RowStorage::Fp8, small).error().code, ErrorCode::InvalidArgument);
  std::vector<float> short_row(511);
  std::vector<std::uint8_t> out(584);
  EXPECT_EQ(encode_attention_row(short_row, RowStorage::Fp8, out).error().code, ErrorCode::InvalidArgument);
  row[300] = NAN;
  EXPECT_EQ(encode_attention_row(row, RowStorage::Fp8, out).error().code, ErrorCode::NonFinite);
  std::vector<float> idx(128, 1.0f);
  idx[5] = INFINITY;
  std::vector<std::uint8_t> mx(68);
  EXPECT_EQ(encode_indexer_row(idx, IndexerStorage::Mxfp4, mx).error().code, ErrorCode::NonFinite);
  std::vector<float> back(128);
  std::vector<std::uint8_t> wrong(67);
  EXPECT_EQ(decode_indexer_row(wrong, IndexerStorage::Mxfp4, back).error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(parse_row_storage("fp16").error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(*parse_indexer_storage("mxfp4"), IndexerStorage::Mxfp4);
}

}  // namespace
}  // namespace kvcompact::dsv4
