// TurboQuant codec: bit packing, estimator unbiasedness and variance against theory, the fast scoring
// primitives against float64 dequantisation, and robustness for extreme / invalid inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "kvcompact/core/sample_mean.hpp"
#include "kvcompact/tq/codebook.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/normalise.hpp"
#include "kvcompact/tq/rotation.hpp"
#include "test_seed.hpp"

namespace kvcompact::tq {
namespace {

using kvcompact::testing_support::fresh_seed;

std::vector<float> random_unit(std::mt19937_64& rng, std::uint32_t d) {
  std::normal_distribution<float> normal;
  std::vector<float> v(d);
  double sum = 0;
  for (auto& x : v) {
    x = normal(rng);
    sum += double(x) * x;
  }
  for (auto& x : v) x = static_cast<float>(x / std::sqrt(sum));
  return v;
}

// Owns the bytes of one packed key or value so tests can pass records around.
struct KeyStorage {
  explicit KeyStorage(const TokenBytes& t) : codes(t.key_codes), signs(t.key_signs + 1) {}
  std::vector<std::uint8_t> codes, signs;
  float norm = 0;
  std::uint16_t residual = 0;
  KeyRecord record() { return {codes.data(), signs.data(), &norm, &residual}; }
  ConstKeyRecord view() const { return {codes.data(), signs.data(), &norm, &residual}; }
};
struct ValueStorage {
  explicit ValueStorage(const TokenBytes& t) : codes(t.value_codes) {}
  std::vector<std::uint8_t> codes;
  float norm = 0;
  ValueRecord record() { return {codes.data(), &norm}; }
  ConstValueRecord view() const { return {codes.data(), &norm}; }
};

double dot(std::span<const float> a, std::span<const double> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

TEST(CodePacking, RoundTripsEveryWidthAndMatchesSeedLayoutForTwoBits) {
  const auto seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (std::uint32_t bits = 1; bits <= 5; ++bits) {
    const std::uint32_t d = 128;
    std::vector<std::uint8_t> packed(packed_code_bytes(d, bits), 0xA5);
    std::vector<std::uint32_t> codes(d);
    for (auto& c : codes) c = static_cast<std::uint32_t>(rng() % (1u << bits));
    for (std::uint32_t j = 0; j < d; ++j) write_code(packed.data(), j, bits, codes[j]);
    for (std::uint32_t j = 0; j < d; ++j) ASSERT_EQ(read_code(packed.data(), j, bits), codes[j]) << "seed " << seed;
    if (bits == 2) {
      for (std::uint32_t j = 0; j < d; ++j) {
        ASSERT_EQ((packed[j / 4] >> (2 * (j % 4))) & 3u, codes[j]);
      }
    }
    // A little-endian bit stream: code j starts at bit j·b.
    for (std::uint32_t j = 0; j < d; ++j) {
      std::uint32_t v = 0;
      for (std::uint32_t k = 0; k < bits; ++k) {
        const std::uint32_t bit = j * bits + k;
        v |= ((packed[bit / 8] >> (bit % 8)) & 1u) << k;
      }
      ASSERT_EQ(v, codes[j]);
    }
  }
}

TEST(QuantConfig, ParsesNamesAndRejectsBadModes) {
  auto seed = QuantConfig::seed_system(7);
  EXPECT_EQ(seed.name(), "k=prod3,v=mse2");
  auto parsed = QuantConfig::parse("k=prod4,v=mse3,w=64", 9);
  ASSERT_TRUE(parsed.ok()) << parsed.error().to_string();
  EXPECT_EQ(parsed->key_mode, KeyMode::Prod);
  EXPECT_EQ(parsed->key_bits, 4);
  EXPECT_EQ(parsed->value_bits, 3);
  EXPECT_EQ(parsed->exact_window, 64u);
  EXPECT_EQ(parsed->seed, 9u);
  EXPECT_EQ(QuantConfig::parse(parsed->name()).value().name(), parsed->name());
  EXPECT_EQ(QuantConfig::parse("k=prod6,v=mse2").error().code, ErrorCode::Unsupported);
  EXPECT_EQ(QuantConfig::parse("k=mse1,v=mse2").error().code, ErrorCode::Unsupported);
  EXPECT_EQ(QuantConfig::parse("k=mse3,v=mse5").error().code, ErrorCode::Unsupported);
  EXPECT_EQ(QuantConfig::parse("k=prod3,v=mse2,nc").error().code, ErrorCode::Unsupported);
  EXPECT_EQ(QuantConfig::parse("k=prod3").error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(QuantConfig::parse("k=abc3,v=mse2").error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(QuantConfig::parse("k=prod3,v=mse2,zz").error().code, ErrorCode::InvalidArgument);
  // Every item at most once (the last one used to win silently).
  for (const char* twice : {"k=mse4,k=prod3,v=mse3", "k=mse4,v=mse3,v=mse2", "k=mse4,v=mse3,nc,nc",
                            "k=mse4,v=mse3,w=8,w=16"}) {
    const auto parsed = QuantConfig::parse(twice);
    ASSERT_FALSE(parsed.ok()) << twice;
    EXPECT_EQ(parsed.error().code, ErrorCode::InvalidArgument);
    EXPECT_NE(parsed.error().message.find("twice"), std::string::npos) << parsed.error().message;
  }
  EXPECT_TRUE(QuantConfig::recommended().validate().ok());
}

TEST(Layout, SeedModeBytesAndAlignedRegions) {
  const TokenBytes t = token_bytes(128, QuantConfig::seed_system());
  EXPECT_EQ(t.key_codes, 32u);
  EXPECT_EQ(t.key_signs, 16u);
  EXPECT_EQ(t.key_total(), 32u + 16 + 4 + 2);
  EXPECT_EQ(t.value_total(), 36u);
  auto config = QuantConfig::seed_system();
  config.exact_window = 8;
  auto layout = plan_layer_layout(128, 8, 3, 100, config);
  ASSERT_TRUE(layout.ok());
  for (auto off : {layout->key_codes_offset, layout->key_signs_offset, layout->key_norms_offset,
                   layout->key_residual_norms_offset, layout->value_codes_offset, layout->value_norms_offset,
                   layout->window_keys_offset, layout->window_values_offset, layout->total_bytes}) {
    EXPECT_EQ(off % kRegionAlignment, 0u);
  }
  EXPECT_GE(layout->key_signs_offset - layout->key_codes_offset, 3u * 8 * 100 * 32);
  EXPECT_GE(layout->total_bytes - layout->window_values_offset, 3u * 8 * 8 * 128 * 4);
  EXPECT_EQ(plan_layer_layout(96, 1, 1, 1 << 30, config).ok(), true);
  EXPECT_EQ(plan_layer_layout(128, 0xFFFFFFFF, 0xFFFFFFFF, kMaxCapacity, config).error().code, ErrorCode::Overflow);
  // More positions per sequence than the attention paths' 32-bit position blocks can step through.
  EXPECT_TRUE(plan_layer_layout(16, 1, 1, kMaxCapacity, config).ok());
  EXPECT_EQ(plan_layer_layout(16, 1, 1, kMaxCapacity + 1, config).error().code, ErrorCode::Unsupported);
  EXPECT_EQ(plan_layer_layout(16, 1, 1, 0xFFFFFFFF, config).error().code, ErrorCode::Unsupported);
  EXPECT_EQ(plan_layer_layout(100, 1, 1, 16, config).error().code, ErrorCode::Unsupported);
  EXPECT_EQ(plan_layer_layout(128, 1, 1, 4, config).error().code, ErrorCode::InvalidArgument);
}

// Paper bound on the prod estimator's error variance for ‖k‖ = 1: (√3·π²/d)·‖q‖²/4^b.
double prod_variance_bound(std::uint32_t d, std::uint32_t bits, double q_norm_sq) {
  return std::sqrt(3.0) * M_PI * M_PI / d * q_norm_sq / std::pow(4.0, bits);
}

TEST(Estimator, ProdModeIsUnbiasedWithVarianceWithinTheBound) {
  const auto seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (std::uint32_t d : {64u, 128u, 256u}) {
    for (std::uint8_t bits : {2, 3, 4, 5}) {
      QuantConfig config;
      config.key_mode = KeyMode::Prod;
      config.key_bits = bits;
      config.value_bits = 2;
      config.seed = rng();
      auto codec = LayerCodec::create(d, config, static_cast<std::uint32_t>(rng() % 64));
      ASSERT_TRUE(codec.ok()) << codec.error().to_string();
      KeyStorage key(codec->token_bytes());
      std::vector<float> scratch(2 * d), q_rot(d), q_jl(d);
      const int pairs = 12000;
      // Regression of the estimate on the truth over correlated pairs (truth spans [-1, 1]).
      double sx = 0, sy = 0, sxx = 0, sxy = 0, err_sq = 0;
      for (int i = 0; i < pairs; ++i) {
        auto q = random_unit(rng, d);
        auto noise = random_unit(rng, d);
        const double alpha = uniform(rng);
        std::vector<float> k(d);
        double nk = 0;
        for (std::uint32_t j = 0; j < d; ++j) {
          k[j] = static_cast<float>(alpha * q[j] + std::sqrt(1 - alpha * alpha) * noise[j]);
          nk += double(k[j]) * k[j];
        }
        for (auto& x : k) x = static_cast<float>(x / std::sqrt(nk));
        double truth = 0;
        for (std::uint32_t j = 0; j < d; ++j) truth += double(q[j]) * k[j];
        ASSERT_TRUE(codec->encode_key(k, key.record(), scratch).ok());
        codec->prepare_query(q, q_rot, q_jl);
        const double estimate = codec->score_key(q_rot, q_jl, key.view());
        sx += truth;
        sy += estimate;
        sxx += truth * truth;
        sxy += truth * estimate;
        err_sq += (estimate - truth) * (estimate - truth);
      }
      const double slope = (pairs * sxy - sx * sy) / (pairs * sxx - sx * sx);
      const double variance = err_sq / pairs;
      EXPECT_NEAR(slope, 1.0, 0.01) << "d " << d << " prod" << int(bits) << " seed " << seed;
      EXPECT_LT(variance, prod_variance_bound(d, bits, 1.0)) << "d " << d << " prod" << int(bits) << " seed " << seed;
    }
  }
}

TEST(Estimator, MseKeysShrinkInnerProductsAndNormCorrectionRestoresNorms) {
  const auto seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const std::uint32_t d = 128;
  for (bool nc : {false, true}) {
    QuantConfig config;
    config.key_mode = KeyMode::Mse;
    config.key_bits = 2;
    config.norm_correction = nc;
    config.seed = rng();
    auto codec = LayerCodec::create(d, config, 3).value();
    KeyStorage key(codec.token_bytes());
    std::vector<float> scratch(2 * d);
    std::vector<double> decoded(d);
    SampleMean shrink;  // ⟨x̂, x⟩ / ‖x‖² per vector
    for (int i = 0; i < 4000; ++i) {
      auto k = random_unit(rng, d);
      for (auto& x : k) x *= 3.0f;
      ASSERT_TRUE(codec.encode_key(k, key.record(), scratch).ok());
      codec.decode_key(key.view(), decoded);
      double norm_sq = 0, proj = 0;
      for (std::uint32_t j = 0; j < d; ++j) {
        norm_sq += decoded[j] * decoded[j];
        proj += decoded[j] * k[j];
      }
      if (nc) {
        EXPECT_NEAR(std::sqrt(norm_sq), 3.0, 3e-5) << "seed " << seed;
      }
      shrink.add(proj / 9.0);
    }
    // Without correction E⟨x̂, x⟩ / ‖x‖² = Σ E[c(y_j)·y_j] = Σ E[c(y_j)²] = 1 − D_mse exactly (each centroid is its
    // cell's conditional mean), so the bound is 5 standard errors of the sample mean (0.0027; a fixed 0.01
    // before); with it the norms are restored and the projection grows well beyond that.
    const double expected = 1.0 - codec.key_codebook().distortion();
    if (nc) {
      EXPECT_GT(shrink.mean(), expected + 0.02) << "seed " << seed;
    } else {
      EXPECT_NEAR(shrink.mean(), expected, 5.0 * shrink.standard_error() + 1e-6)
          << "seed " << seed << ": " << (shrink.mean() - expected) / shrink.standard_error() << " standard errors off";
    }
  }
}

TEST(Codec, FastPrimitivesMatchFloat64Dequantisation) {
  const auto seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (std::uint32_t d : {16u, 64u, 80u, 128u, 192u, 256u, 576u}) {
    for (const char* mode : {"k=prod3,v=mse2", "k=prod5,v=mse4", "k=mse4,v=mse3,nc", "k=mse2,v=mse2"}) {
      auto config = QuantConfig::parse(mode, rng()).value();
      auto codec = LayerCodec::create(d, config, 5).value();
      KeyStorage key(codec.token_bytes());
      ValueStorage value(codec.token_bytes());
      std::vector<float> scratch(2 * d), q_rot(d), q_jl(d), acc(d, 0.0f), out(d);
      std::vector<double> k_hat(d), v_hat(d);
      std::vector<float> q(d), k(d), v(d);
      for (int trial = 0; trial < 20; ++trial) {
        for (std::uint32_t j = 0; j < d; ++j) {
          q[j] = normal(rng);
          k[j] = normal(rng) * 5;
          v[j] = normal(rng) * 0.1f;
        }
        ASSERT_TRUE(codec.encode_key(k, key.record(), scratch).ok());
        ASSERT_TRUE(codec.encode_value(v, value.record(), scratch).ok());
        codec.decode_key(key.view(), k_hat);
        codec.decode_value(value.view(), v_hat);
        codec.prepare_query(q, q_rot, q_jl);
        const double exact = dot(q, k_hat);
        double qn = 0, kn = 0;
        for (std::uint32_t j = 0; j < d; ++j) {
          qn += double(q[j]) * q[j];
          kn += k_hat[j] * k_hat[j];
        }
        // (Measured: 1.1e-7 for the score and 5.8e-8 for the values, relative to these norms.)
        EXPECT_NEAR(codec.score_key(q_rot, q_jl, key.view()), exact, 1e-6 * std::sqrt(qn * kn))
            << mode << " d " << d << " seed " << seed;
        std::fill(acc.begin(), acc.end(), 0.0f);
        codec.accumulate_value(value.view(), 0.75f, acc);
        codec.finish_values(acc, out);
        double vn = 0;
        for (double x : v_hat) vn += x * x;
        for (std::uint32_t j = 0; j < d; ++j) {
          ASSERT_NEAR(out[j], 0.75 * v_hat[j], 1e-6 * std::sqrt(vn)) << mode << " d " << d << " seed " << seed;
        }
      }
    }
  }
}

// The codec's round trip of a random unit vector: its mean squared error has expectation distortion() exactly
// (the rotation is orthogonal, Codebook's EmpiricalDistortionMatchesTheExactValue), and the stored norm (‖x‖ = 1
// to float rounding) does not change that; bound: 5 standard errors of the sample mean (0.7–1.2 % of the value for
// 2–4 bits; a fixed 2 % before) and 10⁻⁶ relative.
TEST(Codec, EmpiricalDistortionMatchesLloydMax) {
  const auto seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const std::uint32_t d = 128;
  for (std::uint8_t bits : {2, 3, 4}) {
    QuantConfig config;
    config.key_mode = KeyMode::Mse;
    config.key_bits = 2;
    config.value_bits = bits;
    config.seed = rng();
    auto codec = LayerCodec::create(d, config, 0).value();
    ValueStorage value(codec.token_bytes());
    std::vector<float> scratch(2 * d);
    std::vector<double> decoded(d);
    SampleMean error;
    for (int i = 0; i < 10000; ++i) {
      auto x = random_unit(rng, d);
      ASSERT_TRUE(codec.encode_value(x, value.record(), scratch).ok());
      codec.decode_value(value.view(), decoded);
      double e = 0;
      for (std::uint32_t j = 0; j < d; ++j) e += (decoded[j] - x[j]) * (decoded[j] - x[j]);
      error.add(e);
    }
    const double exact = codec.value_codebook().distortion();
    EXPECT_NEAR(error.mean(), exact, 5.0 * error.standard_error() + 1e-6 * exact)
        << "bits " << int(bits) << " seed " << seed << ": " << (error.mean() - exact) / error.standard_error()
        << " standard errors off";
  }
}

TEST(Codec, ExtremeZeroAndNonFiniteInputs) {
  const auto seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (const char* mode : {"k=prod3,v=mse2", "k=mse4,v=mse4,nc"}) {
    const std::uint32_t d = 128;
    auto codec = LayerCodec::create(d, QuantConfig::parse(mode, 1).value(), 0).value();
    KeyStorage key(codec.token_bytes());
    ValueStorage value(codec.token_bytes());
    std::vector<float> scratch(2 * d), q_rot(d), q_jl(d), acc(d), out(d);
    std::vector<double> decoded(d);
    // |x| up to 1e30: everything stays finite.
    std::vector<float> big(d);
    for (auto& x : big) x = normal(rng) * 1e30f;
    big[3] = 1e30f;
    big[4] = -1e30f;
    ASSERT_TRUE(codec.encode_key(big, key.record(), scratch).ok());
    ASSERT_TRUE(codec.encode_value(big, value.record(), scratch).ok());
    codec.decode_key(key.view(), decoded);
    for (double v : decoded) ASSERT_TRUE(std::isfinite(v));
    std::vector<float> q(d);
    for (auto& x : q) x = normal(rng);
    codec.prepare_query(q, q_rot, q_jl);
    EXPECT_TRUE(std::isfinite(codec.score_key(q_rot, q_jl, key.view())));
    std::fill(acc.begin(), acc.end(), 0.0f);
    codec.accumulate_value(value.view(), 1.0f, acc);
    codec.finish_values(acc, out);
    for (float v : out) ASSERT_TRUE(std::isfinite(v));
    // Tiny (subnormal-scale) vectors do not underflow into NaN.
    std::vector<float> tiny(d, 0.0f);
    tiny[7] = std::numeric_limits<float>::denorm_min();
    ASSERT_TRUE(codec.encode_key(tiny, key.record(), scratch).ok());
    codec.decode_key(key.view(), decoded);
    for (double v : decoded) ASSERT_TRUE(std::isfinite(v));
    // Zero vectors are exact.
    std::vector<float> zero(d, 0.0f);
    ASSERT_TRUE(codec.encode_key(zero, key.record(), scratch).ok());
    codec.decode_key(key.view(), decoded);
    for (double v : decoded) ASSERT_EQ(v, 0.0);
    EXPECT_EQ(codec.score_key(q_rot, q_jl, key.view()), 0.0f);
    // NaN / inf rejected with a typed error.
    auto bad = big;
    bad[17] = std::numeric_limits<float>::quiet_NaN();
    auto status = codec.encode_key(bad, key.record(), scratch);
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.error().code, ErrorCode::NonFinite);
    EXPECT_NE(status.error().message.find("17"), std::string::npos);
    bad[17] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(codec.encode_value(bad, value.record(), scratch).error().code, ErrorCode::NonFinite);
    // A norm beyond float32 (finite coordinates near FLT_MAX) is a typed error, not an inf.
    std::vector<float> huge(d, std::numeric_limits<float>::max());
    EXPECT_EQ(codec.encode_key(huge, key.record(), scratch).error().code, ErrorCode::OutOfRange);
    // A norm that fits float32 (FLT_MAX itself) but whose norm-corrected value ‖x‖ / ‖c‖ does not (after the
    // rotation every coordinate of a basis vector has magnitude 1/√d, whose centroid is below it: ‖c‖ ≈ 0.94):
    // a typed error too with norm correction, where it was stored as inf; without it the norm is stored as is.
    std::vector<float> edge(d, 0.0f);
    edge[0] = std::numeric_limits<float>::max();
    const bool nc = std::string_view(mode).find(",nc") != std::string_view::npos;
    for (const Status& st : {codec.encode_key(edge, key.record(), scratch),
                             codec.encode_value(edge, value.record(), scratch)}) {
      if (!nc) {
        EXPECT_TRUE(st.ok()) << mode;
        continue;
      }
      ASSERT_FALSE(st.ok()) << mode;
      EXPECT_EQ(st.error().code, ErrorCode::OutOfRange);
      EXPECT_NE(st.error().message.find("norm correction"), std::string::npos) << st.error().message;
    }
    if (!nc) {
      EXPECT_EQ(key.norm, std::numeric_limits<float>::max());
      EXPECT_EQ(value.norm, std::numeric_limits<float>::max());
    }
  }
}

// The value codes of x under one normalisation (normalise.hpp's product, or the float64 division for every
// coordinate), then the codec's rotation and codebook: the reference the codec must equal.
std::vector<std::uint32_t> value_codes_by(const LayerCodec& codec, std::span<const float> x, bool product) {
  double sum = 0.0;
  for (float v : x) sum += static_cast<double>(v) * static_cast<double>(v);
  const double n = std::sqrt(sum);
  std::vector<float> u(x.size()), y(x.size());
  const float r = unit_reciprocal(n);
  for (std::size_t j = 0; j < x.size(); ++j) u[j] = product ? unit_coordinate(x[j], r) : unit_coordinate_f64(x[j], n);
  codec.main_rotation().forward(u, y);
  std::vector<std::uint32_t> codes(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) codes[j] = codec.value_codebook().quantize(y[j]);
  return codes;
}

std::vector<std::uint32_t> stored_value_codes(const LayerCodec& codec, const ValueStorage& v) {
  std::vector<std::uint32_t> codes(codec.head_dim());
  for (std::uint32_t j = 0; j < codec.head_dim(); ++j) codes[j] = read_code(v.codes.data(), j, codec.value_codebook().bits());
  return codes;
}

TEST(Codec, NormalisesByTheFloatProductInItsRangeAndByDivisionOutside) {
  // The range's ends: the reciprocal is a normal float and a coordinate of the row (|x_j| ≤ n) maps to ≤ 1 + ulp.
  for (double n : {kProductNormMin, kProductNormMax}) {
    EXPECT_TRUE(normalises_by_product(n));
    const float r = unit_reciprocal(n);
    EXPECT_EQ(std::fpclassify(r), FP_NORMAL) << n;
    EXPECT_LE(std::fabs(unit_coordinate(static_cast<float>(n), r)), std::nextafter(1.0f, 2.0f));
  }
  EXPECT_FALSE(normalises_by_product(std::nextafter(kProductNormMin, 0.0)));
  EXPECT_FALSE(normalises_by_product(std::nextafter(kProductNormMax, 1e300)));

  // Random rows: the codec's codes equal the product form, and rows where the float64 division would have
  // given other codes exist (so this test tells the two forms apart). Rows scaled far out take the division.
  const auto seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const std::uint32_t d = 64;
  auto codec = LayerCodec::create(d, QuantConfig::parse("k=mse5,v=mse4", 1).value(), 0).value();
  ValueStorage value(codec.token_bytes());
  std::vector<float> scratch(2 * d), x(d);
  // About one row in 10⁵ tells them apart (a rotated coordinate within an ulp of a boundary); the bound leaves
  // a chance of e⁻¹⁵ to find none.
  int rows_telling_apart = 0, rows = 0;
  for (; rows < 2000000 && rows_telling_apart < 1; ++rows) {
    for (float& v : x) v = normal(rng);
    ASSERT_TRUE(codec.encode_value(x, value.record(), scratch).ok());
    const auto by_product = value_codes_by(codec, x, true);
    ASSERT_EQ(stored_value_codes(codec, value), by_product) << "seed " << seed << " row " << rows;
    if (value_codes_by(codec, x, false) != by_product) ++rows_telling_apart;
  }
  EXPECT_EQ(rows_telling_apart, 1) << "seed " << seed << ": no row in " << rows << " where the two forms differ";
  for (float scale : {1e-38f, 1e37f}) {  // norms ≈ 1e-37 < 2^-120 and ≈ 1e38 > 2^120
    for (int i = 0; i < 200; ++i) {
      for (float& v : x) v = normal(rng) * scale;
      ASSERT_TRUE(codec.encode_value(x, value.record(), scratch).ok());
      EXPECT_EQ(stored_value_codes(codec, value), value_codes_by(codec, x, false)) << "seed " << seed << " scale " << scale;
    }
  }
}

TEST(Codec, RejectsUnsupportedHeadDims) {
  for (std::uint32_t d : {0u, 8u, 100u, 1040u}) {
    auto codec = LayerCodec::create(d, QuantConfig::seed_system(), 0);
    ASSERT_FALSE(codec.ok());
    EXPECT_EQ(codec.error().code, ErrorCode::Unsupported);
  }
}

}  // namespace
}  // namespace kvcompact::tq
