// KVCB and TQK1 / TQV1 blobs: round trips, byte-exact header layout, and typed errors for truncated,
// corrupted, mismatched and hostile inputs.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kvcompact/core/checksum.hpp"
#include "kvcompact/tq/blob.hpp"
#include "kvcompact/tq/codec.hpp"
#include "test_seed.hpp"

namespace kvcompact::tq {
namespace {

using kvcompact::testing_support::fresh_seed;

// A blob of real encoded data: `tokens` random rows per head.
LayerBlob make_blob(std::mt19937_64& rng, BlobKind kind, const QuantConfig& config, std::uint32_t head_dim,
                    std::uint32_t kv_heads, std::uint32_t tokens, std::uint32_t layer, std::uint32_t window_rows = 0) {
  LayerBlob blob;
  blob.header = make_blob_header(kind, config, head_dim, kv_heads, tokens, layer).value();
  blob.header.window_rows = window_rows;
  blob.header.window_first_position = tokens - window_rows;
  auto codec = LayerCodec::create(head_dim, config, layer).value();
  const TokenBytes t = codec.token_bytes();
  const bool keys = kind == BlobKind::Keys;
  const std::uint32_t code_bytes = keys ? t.key_codes : t.value_codes;
  const std::uint64_t n = std::uint64_t{kv_heads} * tokens;
  blob.codes.resize(n * code_bytes);
  blob.norms.resize(n);
  if (keys && config.has_qjl()) {
    blob.signs.resize(n * t.key_signs);
    blob.residual_norms.resize(n);
  }
  std::normal_distribution<float> normal;
  std::vector<float> row(head_dim), scratch(2 * head_dim);
  for (std::uint64_t i = 0; i < n; ++i) {
    for (auto& x : row) x = normal(rng);
    if (keys) {
      KeyRecord rec{blob.codes.data() + i * code_bytes, blob.signs.empty() ? nullptr : blob.signs.data() + i * t.key_signs,
                    &blob.norms[i], blob.residual_norms.empty() ? nullptr : &blob.residual_norms[i]};
      EXPECT_TRUE(codec.encode_key(row, rec, scratch).ok());
    } else {
      EXPECT_TRUE(codec.encode_value(row, {blob.codes.data() + i * code_bytes, &blob.norms[i]}, scratch).ok());
    }
  }
  blob.window.resize(std::uint64_t{kv_heads} * window_rows * head_dim);
  for (auto& x : blob.window) x = normal(rng);
  return blob;
}

void expect_equal(const LayerBlob& a, const LayerBlob& b) {
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.signs, b.signs);
  EXPECT_EQ(a.norms, b.norms);
  EXPECT_EQ(a.residual_norms, b.residual_norms);
  EXPECT_EQ(a.window, b.window);
  EXPECT_EQ(a.header.seed, b.header.seed);
  EXPECT_EQ(a.header.seq_len, b.header.seq_len);
  EXPECT_EQ(a.header.codebook_id, b.header.codebook_id);
}

TEST(LayerBlob, RoundTripsEveryModeWithExactHeaderBytes) {
  const auto seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (const char* mode : {"k=prod3,v=mse2", "k=mse4,v=mse3,nc,w=4", "k=prod5,v=mse4,w=8"}) {
    auto config = QuantConfig::parse(mode, rng()).value();
    for (BlobKind kind : {BlobKind::Keys, BlobKind::Values}) {
      const std::uint32_t window = config.exact_window ? 3 : 0;
      LayerBlob blob = make_blob(rng, kind, config, 96, 3, 11, 4, window);
      auto bytes = encode_layer_blob(blob);
      ASSERT_TRUE(bytes.ok()) << bytes.error().to_string();
      EXPECT_EQ(std::memcmp(bytes->data(), "KVCB", 4), 0);
      std::uint32_t head_dim = 0;
      std::memcpy(&head_dim, bytes->data() + 12, 4);
      EXPECT_EQ(head_dim, 96u);
      std::uint64_t stored_seed = 0;
      std::memcpy(&stored_seed, bytes->data() + 32, 8);
      EXPECT_EQ(stored_seed, config.seed);
      const auto sizes = blob_sizes(blob.header).value();
      EXPECT_EQ(bytes->size(), kBlobHeaderBytes + sizes.payload_bytes + kBlobChecksumBytes);
      BlobExpectation expect{kind, config, 96, 3, 4};
      auto decoded = decode_layer_blob(*bytes, expect);
      ASSERT_TRUE(decoded.ok()) << decoded.error().to_string() << " seed " << seed;
      expect_equal(blob, *decoded);
      EXPECT_NE(describe_blob(*bytes).find("verification      OK"), std::string::npos);
    }
  }
}

TEST(LayerBlob, TruncatedCorruptedAndMismatchedBlobsAreTypedErrors) {
  const auto seed = fresh_seed();
  std::mt19937_64 rng(seed);
  auto config = QuantConfig::parse("k=prod3,v=mse2,w=4", rng()).value();
  LayerBlob blob = make_blob(rng, BlobKind::Keys, config, 64, 2, 9, 1, 4);
  auto bytes = encode_layer_blob(blob).value();
  // Every truncation.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    auto r = decode_layer_blob(std::span(bytes).subspan(0, n));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_TRUE(r.error().code == ErrorCode::Truncated || r.error().code == ErrorCode::Corrupt) << n;
  }
  // Every single-bit flip is caught (by structure, version or checksum).
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    auto damaged = bytes;
    damaged[i] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
    ASSERT_FALSE(decode_layer_blob(damaged).ok()) << "flip at byte " << i << " seed " << seed;
  }
  // Trailing garbage.
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_EQ(decode_layer_blob(longer).error().code, ErrorCode::Corrupt);
  // Mismatches against what the cache expects.
  BlobExpectation good{BlobKind::Keys, config, 64, 2, 1};
  ASSERT_TRUE(decode_layer_blob(bytes, good).ok());
  auto other_seed = good;
  other_seed.config.seed ^= 1;
  auto r = decode_layer_blob(bytes, other_seed);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::Mismatch);
  EXPECT_NE(r.error().message.find("seed"), std::string::npos);
  auto other_layer = good;
  other_layer.layer_index = 2;
  EXPECT_EQ(decode_layer_blob(bytes, other_layer).error().code, ErrorCode::Mismatch);
  auto other_mode = good;
  other_mode.config.key_bits = 4;
  EXPECT_EQ(decode_layer_blob(bytes, other_mode).error().code, ErrorCode::Mismatch);
  auto other_shape = good;
  other_shape.kv_heads = 4;
  EXPECT_EQ(decode_layer_blob(bytes, other_shape).error().code, ErrorCode::Mismatch);
  auto other_kind = good;
  other_kind.kind = BlobKind::Values;
  EXPECT_EQ(decode_layer_blob(bytes, other_kind).error().code, ErrorCode::Mismatch);
}

// A hostile blob: a consistent checksum over a header that claims huge sizes must not allocate or read.
TEST(LayerBlob, HostileHeadersWithValidChecksumAreRejected) {
  std::mt19937_64 rng(fresh_seed());
  auto config = QuantConfig::seed_system(3);
  auto bytes = encode_layer_blob(make_blob(rng, BlobKind::Values, config, 64, 1, 2, 0)).value();
  const auto reseal = [](std::vector<std::uint8_t> b) {
    const std::uint64_t sum = xxh64(std::span(b).subspan(0, b.size() - 8));
    std::memcpy(b.data() + b.size() - 8, &sum, 8);
    return b;
  };
  auto huge = bytes;
  const std::uint32_t big = 0xFFFFFFFF;
  std::memcpy(huge.data() + 16, &big, 4);  // kv_heads
  std::memcpy(huge.data() + 20, &big, 4);  // seq_len
  EXPECT_FALSE(decode_layer_blob(reseal(huge)).ok());
  auto nan_norm = bytes;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_norm.data() + kBlobHeaderBytes + 2 * 16, &nan, 4);  // first norm after 2×16 code bytes
  auto r = decode_layer_blob(reseal(nan_norm));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::Corrupt);
  auto wrong_codebook = bytes;
  wrong_codebook[28] ^= 0xFF;
  EXPECT_EQ(decode_layer_blob(reseal(wrong_codebook)).error().code, ErrorCode::Mismatch);
  auto new_version = bytes;
  new_version[4] = 2;
  EXPECT_EQ(decode_layer_blob(reseal(new_version)).error().code, ErrorCode::Unsupported);
}

TEST(SeedBlob, RoundTripsTheSeedConfigurationByteExactly) {
  const auto seed = fresh_seed();
  std::mt19937_64 rng(seed);
  auto config = QuantConfig::seed_system(rng());
  for (BlobKind kind : {BlobKind::Keys, BlobKind::Values}) {
    LayerBlob blob = make_blob(rng, kind, config, 128, 2, 5, 7);
    // The seed stores f16 norms: make the norms exactly representable so the round trip is exact.
    for (auto& n : blob.norms) n = static_cast<float>(static_cast<int>(n * 64)) / 64.0f;
    auto bytes = encode_seed_blob(blob);
    ASSERT_TRUE(bytes.ok()) << bytes.error().to_string();
    const std::uint64_t per_token = kind == BlobKind::Keys ? 3 * 128 / 8 + 4 : 128 / 4 + 2;
    EXPECT_EQ(bytes->size(), kSeedBlobHeaderBytes + 2 * 5 * per_token);
    EXPECT_EQ(std::memcmp(bytes->data(), kind == BlobKind::Keys ? "TQK1" : "TQV1", 4), 0);
    auto decoded = decode_seed_blob(*bytes, config.seed, 7);
    ASSERT_TRUE(decoded.ok()) << decoded.error().to_string();
    expect_equal(blob, *decoded);
    EXPECT_EQ(encode_seed_blob(*decoded).value(), *bytes);
    for (std::size_t n = 0; n < bytes->size(); ++n) {
      ASSERT_FALSE(decode_seed_blob(std::span(*bytes).subspan(0, n), 1, 7).ok()) << n;
    }
    EXPECT_NE(describe_blob(*bytes).find("OK"), std::string::npos);
  }
  // Norms beyond f16 cannot be written in the seed format: a typed error, not an inf.
  LayerBlob big = make_blob(rng, BlobKind::Values, config, 64, 1, 1, 0);
  big.norms[0] = 1e6f;
  EXPECT_EQ(encode_seed_blob(big).error().code, ErrorCode::OutOfRange);
  // Other modes are not representable.
  LayerBlob other = make_blob(rng, BlobKind::Keys, QuantConfig::parse("k=prod4,v=mse2", 1).value(), 64, 1, 1, 0);
  EXPECT_EQ(encode_seed_blob(other).error().code, ErrorCode::Unsupported);
}

}  // namespace
}  // namespace kvcompact::tq
