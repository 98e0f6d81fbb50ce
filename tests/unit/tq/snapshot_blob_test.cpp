// Cache snapshots through blobs: KVCB round trips restore bit-identical attention into another cache,
// blobs from another seed / layer / mode are Mismatch errors that leave the cache untouched, and the
// seed system's TQK1 / TQV1 blobs restore into a seed-preset cache.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kvcompact/tq/snapshot_blob.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::tq {
namespace {

using testing::fresh_seed;
using testing::random_rows;

constexpr std::uint32_t kHeadDim = 64;
constexpr std::uint32_t kQHeads = 4;

CacheShape shape() {
  CacheShape s;
  s.head_dim = kHeadDim;
  s.kv_heads = {0, 2, 2};
  s.sequences = 2;
  s.capacity = 96;
  return s;
}

// Fills (layer, seq 0) with `tokens` random rows.
void fill(TurboQuantCache& cache, std::mt19937_64& rng, std::uint32_t layer, std::uint32_t tokens) {
  auto keys = random_rows(rng, std::size_t{tokens} * 2, kHeadDim, 1.0f, true);
  auto values = random_rows(rng, std::size_t{tokens} * 2, kHeadDim, 1.0f, false);
  ASSERT_TRUE(cache.append(layer, 0, 0, tokens, DType::F32, keys.data(), values.data()).ok());
}

std::vector<float> decode_output(const TurboQuantCache& cache, std::uint32_t layer, std::uint32_t seq,
                                 const std::vector<float>& query) {
  std::vector<float> out(kQHeads * kHeadDim, -1.0f);
  AttentionRequest request{seq, cache.length(layer, seq) - 1, 1, query.data(), out.data()};
  AttentionOptions options;
  options.q_heads = kQHeads;
  EXPECT_TRUE(cache.attention(layer, std::span(&request, 1), options).ok());
  return out;
}

TEST(SnapshotBlob, RoundTripRestoresIdenticalAttentionInAnotherCache) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (const char* mode : {"k=prod3,v=mse2", "k=mse4,v=mse3,nc,w=16"}) {
    auto config = QuantConfig::parse(mode, rng()).value();
    auto source = TurboQuantCache::create(shape(), config).value();
    auto target = TurboQuantCache::create(shape(), config).value();
    fill(source, rng, 1, 57);
    fill(target, rng, 1, 5);  // something to overwrite: the restore goes into this same sequence
    auto blobs = snapshot_layer_blobs(source, 1, 0);
    ASSERT_TRUE(blobs.ok()) << blobs.error().to_string();
    ASSERT_TRUE(restore_layer_blobs(target, 1, 0, blobs->keys, blobs->values).ok());
    EXPECT_EQ(target.length(1, 0), 57u);
    auto query = random_rows(rng, kQHeads, kHeadDim, 1.0f, false);
    EXPECT_EQ(decode_output(source, 1, 0, query), decode_output(target, 1, 0, query)) << mode;
    // And the restored cache snapshots to the same bytes.
    auto again = snapshot_layer_blobs(target, 1, 0).value();
    EXPECT_EQ(again.keys, blobs->keys);
    EXPECT_EQ(again.values, blobs->values);
  }
}

TEST(SnapshotBlob, ForeignBlobsAreMismatchesAndChangeNothing) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto config = QuantConfig::seed_system(rng());
  auto source = TurboQuantCache::create(shape(), config).value();
  fill(source, rng, 1, 20);
  fill(source, rng, 2, 20);
  auto blobs = snapshot_layer_blobs(source, 1, 0).value();

  auto other_seed_config = config;
  other_seed_config.seed ^= 0x55;
  auto other_seed = TurboQuantCache::create(shape(), other_seed_config).value();
  fill(other_seed, rng, 1, 3);
  auto status = restore_layer_blobs(other_seed, 1, 0, blobs.keys, blobs.values);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, ErrorCode::Mismatch);
  EXPECT_EQ(other_seed.length(1, 0), 3u);

  auto same = TurboQuantCache::create(shape(), config).value();
  fill(same, rng, 1, 4);  // tokens a failed restore must leave as they are
  const auto same_before = snapshot_layer_blobs(same, 1, 0).value();
  EXPECT_EQ(restore_layer_blobs(same, 2, 0, blobs.keys, blobs.values).error().code, ErrorCode::Mismatch);
  EXPECT_EQ(restore_layer_blobs(same, 0, 0, blobs.keys, blobs.values).error().code, ErrorCode::InvalidArgument);
  // A layer past the last: OutOfRange, as snapshot_layer_blobs and TurboQuantCache::restore say it.
  EXPECT_EQ(restore_layer_blobs(same, 7, 0, blobs.keys, blobs.values).error().code, ErrorCode::OutOfRange);
  EXPECT_EQ(snapshot_layer_blobs(same, 7, 0).error().code, ErrorCode::OutOfRange);
  EXPECT_EQ(restore_layer_blobs(same, 1, 0, blobs.values, blobs.keys).error().code, ErrorCode::Mismatch);
  auto layer2 = snapshot_layer_blobs(source, 2, 0).value();
  EXPECT_EQ(restore_layer_blobs(same, 1, 0, blobs.keys, layer2.values).error().code, ErrorCode::Mismatch);
  auto other_mode = TurboQuantCache::create(shape(), QuantConfig::parse("k=prod4,v=mse2", config.seed).value()).value();
  EXPECT_EQ(restore_layer_blobs(other_mode, 1, 0, blobs.keys, blobs.values).error().code, ErrorCode::Mismatch);
  auto damaged = blobs.values;
  damaged[damaged.size() / 2] ^= 0x10;
  EXPECT_EQ(restore_layer_blobs(same, 1, 0, blobs.keys, damaged).error().code, ErrorCode::Corrupt);
  EXPECT_EQ(same.length(1, 0), 4u);
  const auto same_after = snapshot_layer_blobs(same, 1, 0).value();
  EXPECT_EQ(same_after.keys, same_before.keys);
  EXPECT_EQ(same_after.values, same_before.values);
}

TEST(SnapshotBlob, SeedSystemBlobsRestoreIntoASeedPresetCache) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto config = QuantConfig::seed_system(rng());
  auto source = TurboQuantCache::create(shape(), config).value();
  fill(source, rng, 2, 33);
  auto snapshot = source.snapshot(2, 0).value();
  auto key_blob = snapshot_to_blob(snapshot, BlobKind::Keys).value();
  auto value_blob = snapshot_to_blob(snapshot, BlobKind::Values).value();
  auto tqk1 = encode_seed_blob(key_blob).value();
  auto tqv1 = encode_seed_blob(value_blob).value();
  auto target = TurboQuantCache::create(shape(), config).value();
  ASSERT_TRUE(restore_layer_blobs(target, 2, 1, tqk1, tqv1).ok());
  // The seed format rounds norms to f16; everything else is identical, and exporting again is exact.
  auto restored = target.snapshot(2, 1).value();
  EXPECT_EQ(restored.key_codes, snapshot.key_codes);
  EXPECT_EQ(restored.key_signs, snapshot.key_signs);
  EXPECT_EQ(restored.value_codes, snapshot.value_codes);
  EXPECT_EQ(restored.key_residual_norms, snapshot.key_residual_norms);
  EXPECT_EQ(encode_seed_blob(snapshot_to_blob(restored, BlobKind::Keys).value()).value(), tqk1);
  auto query = random_rows(rng, kQHeads, kHeadDim, 1.0f, false);
  auto a = decode_output(source, 2, 0, query);
  auto b = decode_output(target, 2, 1, query);
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err += (a[i] - b[i]) * (a[i] - b[i]);
    norm += a[i] * a[i];
  }
  EXPECT_LT(std::sqrt(err / norm), 2e-3);  // f16 norm rounding: relative 2^-11 per norm
  // A seed blob restored into a cache of another mode is refused.
  auto other = TurboQuantCache::create(shape(), QuantConfig::parse("k=prod4,v=mse2", config.seed).value()).value();
  EXPECT_EQ(restore_layer_blobs(other, 2, 0, tqk1, tqv1).error().code, ErrorCode::Mismatch);
}

}  // namespace
}  // namespace kvcompact::tq
