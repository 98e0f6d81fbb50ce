// Folded QJL keys (docs/cuda-prefill.md, "Folded QJL keys") on the CPU: the prefill kernel's FP8 cross terms hold
// K_hi = fp16(α·k̂) times kFoldKhiScale and K_lo times kFoldKloScale as e4m3 codes (largest 448; the conversion
// saturates beyond), with k̂ = c + ρ·s·R_j⁻¹σ the folded key in the rotated space and α < 2 the key table's scale.
// So the scales are safe while |k̂| ≤ 448 / (2 · kFoldKhiScale) = 56 (K_lo is at most half an fp16 ulp of K_hi,
// which keeps K_lo · kFoldKloScale below 448 for |K_hi| < 256). The codec encodes unit-norm rows, so k̂ stays
// below one unit whatever the input (measured ≤ 0.45); this checks it on rows of every kind of shape — Gaussian,
// heavy-tailed, one coordinate, constant, a few large coordinates — for every QJL key mode at head_dim 128, with
// a margin of 8, through the codec's own float64 dequantisation (decode_key builds the same k̂ before its inverse
// rotation). Folded MSE keys ("Folded MSE keys"): their e4m3 tile holds K_hi = fp16(α·c) times kFoldKhiScale for
// the key table's centroids c, and the queries' operand Q_lo times kFoldQloScale; both are checked against e4m3's
// range for every MSE key width.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cuda_fp16.h>
#include <random>
#include <string>
#include <vector>

#include "cuda/lut_scale.hpp"
#include "cuda/prefill_params.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/config.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq::detail {
namespace {

using kvcompact::tq::LayerCodec;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::testing::fresh_seed;

// The folded key k̂ of one encoded row: decode_key's output (R_p⁻¹ k̂ · n) rotated back and divided by n.
std::vector<float> folded_key(const LayerCodec& codec, std::span<const float> row, std::uint32_t d) {
  const auto bytes = codec.token_bytes();
  std::vector<std::uint8_t> codes(bytes.key_codes), signs(bytes.key_signs + 1);
  float norm = 0;
  std::uint16_t rho = 0;
  std::vector<float> scratch(2 * d);
  EXPECT_TRUE(codec.encode_key(row, {codes.data(), signs.data(), &norm, &rho}, scratch).ok());
  std::vector<double> decoded(d);
  codec.decode_key({codes.data(), signs.data(), &norm, &rho}, decoded);
  std::vector<float> unit(d), k_hat(d), unused(d);
  for (std::uint32_t j = 0; j < d; ++j) unit[j] = norm > 0 ? static_cast<float>(decoded[j] / norm) : 0.0f;
  codec.prepare_query(unit, k_hat, unused);  // (the main rotation)
  return k_hat;
}

TEST(PrefillFoldRange, FoldedQjlKeysStayFarInsideTheFp8Scales) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(0.01f, 1.0f);
  constexpr std::uint32_t d = 128;
  constexpr double kSafe = 448.0 / (2.0 * kFoldKhiScale);  // |k̂| up to which K_hi · kFoldKhiScale fits e4m3
  for (const char* mode : {"k=prod2,v=mse4", "k=prod3,v=mse2", "k=prod4,v=mse4", "k=prod5,v=mse4"}) {
    SCOPED_TRACE(std::string(mode) + " seed " + std::to_string(seed));
    const LayerCodec codec = LayerCodec::create(d, QuantConfig::parse(mode, rng()).value(), 0).value();
    double largest = 0.0;
    std::vector<float> row(d);
    for (int trial = 0; trial < 400; ++trial) {
      const int shape = trial % 5;
      for (std::uint32_t j = 0; j < d; ++j) {
        switch (shape) {
          case 0: row[j] = normal(rng); break;                                        // Gaussian
          case 1: row[j] = normal(rng) / (uniform(rng) * uniform(rng)); break;        // heavy-tailed
          case 2: row[j] = j == static_cast<std::uint32_t>(trial) % d ? 5.0f : 0.0f; break;  // one coordinate
          case 3: row[j] = 1.0f; break;                                              // constant
          default: row[j] = j % 37 == 0 ? 1000.0f * normal(rng) : normal(rng); break;  // a few large ones
        }
      }
      for (float x : folded_key(codec, row, d)) largest = std::max(largest, static_cast<double>(std::fabs(x)));
    }
    std::printf("[fold-range] %s: largest |k̂| %.3f (safe up to %.0f)\n", mode, largest, kSafe);
    EXPECT_LE(largest, kSafe / 8.0);
  }
}

TEST(PrefillFoldRange, FoldedMseKeysAndTheirQueriesFitTheFp8Scales) {
  constexpr double kE4m3Max = 448.0;
  // The queries are scaled to max |q| = 2^10, so Q_lo = q − fp16(q) is at most half an fp16 ulp at 2^10 (2^-1).
  EXPECT_LE(0.5 * kFoldQloScale, kE4m3Max / 2.0);
  constexpr std::uint32_t d = 128;
  for (const char* mode : {"k=mse2,v=mse2", "k=mse3,v=mse2", "k=mse4,v=mse3", "k=mse5,v=mse2"}) {
    SCOPED_TRACE(mode);
    const LayerCodec codec = LayerCodec::create(d, QuantConfig::parse(mode, 1).value(), 0).value();
    const float alpha = fp16_table_scale(codec.key_codebook());
    double largest = 0.0;
    for (const float c : codec.key_codebook().centroids_f32()) {
      largest = std::max(largest, std::fabs(static_cast<double>(__half2float(__float2half_rn(alpha * c)))));
    }
    std::printf("[fold-range] %s: largest |fp16(α·c)| %.3f, in e4m3 units %.1f of %.0f\n", mode, largest,
                largest * kFoldKhiScale, kE4m3Max);
    EXPECT_GT(largest, 0.0);
    EXPECT_LE(largest * kFoldKhiScale, kE4m3Max / 8.0);
  }
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
