// TurboQuantCache bookkeeping: argument errors, dtype conversion, per-layer seeding, snapshot / restore
// checks, and random traces (append, chunked prefill, truncate, reset, snapshot, restore, bad appends)
// replayed against a dense model whose attention is computed by the float64 oracle from the rows that
// survived — decoded records, or the exact rows the window must still hold.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <cstring>
#include <string>
#include <algorithm>
#include <random>
#include <vector>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/tq/attention_oracle.hpp"
#include "kvcompact/tq/cache.hpp"
#include "kvcompact/tq/codec.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::tq {
namespace {

using testing::fresh_seed;
using testing::max_row_relative_error;
using testing::random_rows;

constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

CacheShape small_shape(std::uint32_t head_dim = 64) {
  CacheShape shape;
  shape.head_dim = head_dim;
  shape.kv_heads = {2, 0, 1};
  shape.sequences = 3;
  shape.capacity = 80;
  return shape;
}

TEST(TqCache, CreateRejectsBadShapes) {
  CacheShape shape = small_shape();
  shape.head_dim = 40;
  EXPECT_EQ(TurboQuantCache::create(shape, QuantConfig::seed_system()).error().code, ErrorCode::Unsupported);
  shape = small_shape();
  shape.kv_heads.clear();
  EXPECT_EQ(TurboQuantCache::create(shape, QuantConfig::seed_system()).error().code, ErrorCode::InvalidArgument);
  shape = small_shape();
  shape.capacity = 0;
  EXPECT_EQ(TurboQuantCache::create(shape, QuantConfig::seed_system()).error().code, ErrorCode::InvalidArgument);
  QuantConfig config = QuantConfig::seed_system();
  config.exact_window = 81;  // larger than the capacity
  EXPECT_FALSE(TurboQuantCache::create(small_shape(), config).ok());
  auto cache = TurboQuantCache::create(small_shape(), QuantConfig::seed_system());
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(cache->num_layers(), 3u);
  EXPECT_EQ(cache->kv_heads(1), 0u);
  EXPECT_EQ(cache->layer_bytes(1), 0u);
  EXPECT_EQ(cache->layout(1), nullptr);
  EXPECT_GT(cache->layer_bytes(0), cache->layer_bytes(2));
  EXPECT_EQ(cache->total_bytes(), cache->layer_bytes(0) + cache->layer_bytes(2));
  // Layer indices count the non-attention layer: the last codec is seeded with layer index 2.
  ASSERT_NE(cache->codec(2), nullptr);
  EXPECT_EQ(cache->codec(2)->layer_index(), 2u);
}

// A cache the host cannot allocate (here ~4.4 PB: every layout size fits 64 bits) is a typed CapacityExceeded,
// not an exception out of create. (Under AddressSanitizer this needs allocator_may_return_null=1: the cpu-asan
// test preset sets it.)
TEST(TqCache, CreateOfTooLargeACacheIsCapacityExceeded) {
  CacheShape shape;
  shape.head_dim = 128;
  shape.kv_heads = {8};
  shape.sequences = 4096;
  shape.capacity = 1u << 30;
  auto cache = TurboQuantCache::create(shape, QuantConfig::recommended());
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.error().code, ErrorCode::CapacityExceeded);
  EXPECT_NE(cache.error().message.find("host allocation"), std::string::npos) << cache.error().message;
}

TEST(TqCache, AppendErrorsNameTheNumbersAndStoreNothing) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  QuantConfig config = QuantConfig::seed_system(seed);
  config.exact_window = 4;
  auto cache = TurboQuantCache::create(small_shape(), config);
  ASSERT_TRUE(cache.ok());
  auto rows = random_rows(rng, 10 * 2, 64, 1.0f, false);
  ASSERT_TRUE(cache->append(0, 1, 0, 6, DType::F32, rows.data(), rows.data()).ok());
  auto gap = cache->append(0, 1, 7, 1, DType::F32, rows.data(), rows.data());
  ASSERT_FALSE(gap.ok());
  EXPECT_EQ(gap.error().code, ErrorCode::OutOfRange);
  EXPECT_EQ(gap.error().expected, 6);
  EXPECT_EQ(gap.error().actual, 7);
  std::vector<float> big(80 * 2 * 64, 0.5f);
  auto full = cache->append(0, 1, 6, 75, DType::F32, big.data(), big.data());
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, ErrorCode::CapacityExceeded);
  EXPECT_EQ(full.error().expected, 80);
  EXPECT_EQ(full.error().actual, 81);
  EXPECT_EQ(cache->append(1, 0, 0, 1, DType::F32, rows.data(), rows.data()).error().code,
            ErrorCode::InvalidArgument);  // no attention in layer 1
  EXPECT_EQ(cache->append(3, 0, 0, 1, DType::F32, rows.data(), rows.data()).error().code, ErrorCode::OutOfRange);
  EXPECT_EQ(cache->append(0, 3, 0, 1, DType::F32, rows.data(), rows.data()).error().code, ErrorCode::OutOfRange);
  EXPECT_EQ(cache->append(0, 1, 6, 1, DType::F8E4M3, rows.data(), rows.data()).error().code, ErrorCode::Unsupported);

  // A NaN in the last row of a 4-row append: NonFinite, and neither the records nor the window change.
  auto before = cache->snapshot(0, 1);
  ASSERT_TRUE(before.ok());
  auto bad = random_rows(rng, 4 * 2, 64, 1.0f, false);
  bad[3 * 2 * 64 + 70] = std::numeric_limits<float>::quiet_NaN();
  auto nan = cache->append(0, 1, 6, 4, DType::F32, bad.data(), bad.data());
  ASSERT_FALSE(nan.ok());
  EXPECT_EQ(nan.error().code, ErrorCode::NonFinite);
  EXPECT_EQ(cache->length(0, 1), 6u);
  auto after = cache->snapshot(0, 1);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(before->key_codes, after->key_codes);
  EXPECT_EQ(before->window_keys, after->window_keys);
  EXPECT_EQ(before->window_values, after->window_values);
}

// append_check.hpp: an append of 0 rows passes (and stores nothing) whatever its dtype and pointers.
TEST(TqCache, AppendOfZeroRowsPassesWhateverItsDtypeAndPointers) {
  auto cache = TurboQuantCache::create(small_shape(), QuantConfig::seed_system(3));
  ASSERT_TRUE(cache.ok());
  EXPECT_TRUE(cache->append(0, 1, 0, 0, DType::F8E4M3, nullptr, nullptr).ok());
  EXPECT_TRUE(cache->append(0, 1, 0, 0, DType::F32, nullptr, nullptr).ok());
  EXPECT_EQ(cache->length(0, 1), 0u);
}

// truncate_layer rolls one layer back and leaves the others; reset_all empties every sequence of every layer.
TEST(TqCache, TruncateLayerAndResetAll) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto cache = TurboQuantCache::create(small_shape(), QuantConfig::recommended(seed));
  ASSERT_TRUE(cache.ok());
  const auto rows = random_rows(rng, 6 * 2, 64, 1.0f, false);
  for (std::uint32_t layer : {0u, 2u}) {
    for (std::uint32_t seq : {0u, 1u}) {
      ASSERT_TRUE(cache->append(layer, seq, 0, 6, DType::F32, rows.data(), rows.data()).ok());
    }
  }
  ASSERT_TRUE(cache->truncate_layer(2, 1, 4).ok());
  EXPECT_EQ(cache->length(2, 1), 4u);
  EXPECT_EQ(cache->length(0, 1), 6u);  // the other layer keeps its tokens
  EXPECT_EQ(cache->length(2, 0), 6u);  // and so does the other sequence
  EXPECT_TRUE(cache->truncate_layer(1, 0, 2).ok());  // no attention in layer 1: nothing to roll back
  EXPECT_EQ(cache->truncate_layer(2, 5, 2).error().code, ErrorCode::OutOfRange);
  cache->reset_all();
  for (std::uint32_t layer : {0u, 2u}) {
    for (std::uint32_t seq : {0u, 1u}) EXPECT_EQ(cache->length(layer, seq), 0u) << layer << " " << seq;
  }
  // Usable again from position 0.
  EXPECT_TRUE(cache->append(0, 0, 0, 6, DType::F32, rows.data(), rows.data()).ok());
}

TEST(TqCache, HalfPrecisionInputEqualsItsF32Widening) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  QuantConfig config = QuantConfig::seed_system(seed);
  config.exact_window = 3;
  for (DType dtype : {DType::BF16, DType::F16}) {
    auto a = TurboQuantCache::create(small_shape(), config);
    auto b = TurboQuantCache::create(small_shape(), config);
    ASSERT_TRUE(a.ok() && b.ok());
    const auto keys = random_rows(rng, 5 * 2, 64, 1.0f, true);
    const auto values = random_rows(rng, 5 * 2, 64, 1.0f, false);
    std::vector<std::uint16_t> k16(keys.size()), v16(values.size());
    std::vector<float> k32(keys.size()), v32(values.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      k16[i] = dtype == DType::BF16 ? f32_to_bf16(keys[i]) : f32_to_f16(keys[i]);
      v16[i] = dtype == DType::BF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      k32[i] = dtype == DType::BF16 ? bf16_to_f32(k16[i]) : f16_to_f32(k16[i]);
      v32[i] = dtype == DType::BF16 ? bf16_to_f32(v16[i]) : f16_to_f32(v16[i]);
    }
    ASSERT_TRUE(a->append(0, 2, 0, 5, dtype, k16.data(), v16.data()).ok());
    ASSERT_TRUE(b->append(0, 2, 0, 5, DType::F32, k32.data(), v32.data()).ok());
    auto sa = a->snapshot(0, 2);
    auto sb = b->snapshot(0, 2);
    ASSERT_TRUE(sa.ok() && sb.ok());
    EXPECT_EQ(sa->key_codes, sb->key_codes);
    EXPECT_EQ(sa->key_signs, sb->key_signs);
    EXPECT_EQ(sa->key_norms, sb->key_norms);
    EXPECT_EQ(sa->value_codes, sb->value_codes);
    EXPECT_EQ(sa->window_keys, sb->window_keys);
    EXPECT_EQ(sa->window_values, sb->window_values);
  }
}

TEST(TqCache, RecordsAreTheCodecOfTheModelLayerIndex) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const QuantConfig config = QuantConfig::seed_system(seed);
  auto cache = TurboQuantCache::create(small_shape(), config);
  ASSERT_TRUE(cache.ok());
  const auto keys = random_rows(rng, 3, 64, 1.0f, true);
  const auto values = random_rows(rng, 3, 64, 1.0f, false);
  ASSERT_TRUE(cache->append(2, 0, 0, 3, DType::F32, keys.data(), values.data()).ok());
  auto snap = cache->snapshot(2, 0);
  ASSERT_TRUE(snap.ok());
  auto codec = LayerCodec::create(64, config, 2);
  ASSERT_TRUE(codec.ok());
  const TokenBytes tb = codec->token_bytes();
  std::vector<float> scratch(128);
  for (std::uint32_t t = 0; t < 3; ++t) {
    std::vector<std::uint8_t> codes(tb.key_codes), signs(tb.key_signs);
    float norm = 0.0f;
    std::uint16_t rho = 0;
    ASSERT_TRUE(codec->encode_key({keys.data() + t * 64, 64}, {codes.data(), signs.data(), &norm, &rho}, scratch).ok());
    EXPECT_TRUE(std::equal(codes.begin(), codes.end(), snap->key_codes.begin() + t * tb.key_codes)) << t;
    EXPECT_TRUE(std::equal(signs.begin(), signs.end(), snap->key_signs.begin() + t * tb.key_signs)) << t;
    EXPECT_EQ(std::memcmp(&norm, snap->key_norms.data() + t * 4, 4), 0) << t;
    EXPECT_EQ(std::memcmp(&rho, snap->key_residual_norms.data() + t * 2, 2), 0) << t;
  }
}

TEST(TqCache, RestoreChecksEverythingBeforeTouchingTheCache) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  QuantConfig config = QuantConfig::seed_system(seed);
  config.exact_window = 4;
  auto cache = TurboQuantCache::create(small_shape(), config);
  ASSERT_TRUE(cache.ok());
  const auto rows = random_rows(rng, 9 * 2, 64, 1.0f, false);
  ASSERT_TRUE(cache->append(0, 0, 0, 9, DType::F32, rows.data(), rows.data()).ok());
  auto snap = cache->snapshot(0, 0);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->length, 9u);
  EXPECT_EQ(snap->window_begin, 5u);
  // Tokens in the target sequence, which every failed restore below must leave as they are.
  const auto other_rows = random_rows(rng, 3 * 2, 64, 1.0f, false);
  ASSERT_TRUE(cache->append(0, 1, 0, 3, DType::F32, other_rows.data(), other_rows.data()).ok());
  const LayerSnapshot target_before = cache->snapshot(0, 1).value();
  EXPECT_EQ(snap->window_keys.size(), 2u * 4 * 64);

  EXPECT_EQ(cache->restore(2, 0, *snap).error().code, ErrorCode::Mismatch);  // other layer
  LayerSnapshot other = *snap;
  other.config.seed ^= 1;
  EXPECT_EQ(cache->restore(0, 1, other).error().code, ErrorCode::Mismatch);
  other = *snap;
  other.config.key_bits = 4;
  EXPECT_EQ(cache->restore(0, 1, other).error().code, ErrorCode::Mismatch);
  other = *snap;
  other.key_codes.pop_back();
  EXPECT_EQ(cache->restore(0, 1, other).error().code, ErrorCode::Truncated);
  other = *snap;
  other.value_norms.push_back(0);
  EXPECT_EQ(cache->restore(0, 1, other).error().code, ErrorCode::Corrupt);
  other = *snap;
  other.window_begin = 4;  // 5 exact rows do not fit a window of 4
  EXPECT_EQ(cache->restore(0, 1, other).error().code, ErrorCode::Corrupt);
  other = *snap;
  other.window_values[3] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cache->restore(0, 1, other).error().code, ErrorCode::NonFinite);
  // Norms as the blob decoder requires them: finite and non-negative (f32 key / value norms, f16 residual norms).
  auto set_float = [](std::vector<std::uint8_t>& bytes, std::size_t i, float v) {
    std::memcpy(bytes.data() + 4 * i, &v, 4);
  };
  other = *snap;
  set_float(other.key_norms, 5, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(cache->restore(0, 1, other).error().code, ErrorCode::NonFinite);
  other = *snap;
  set_float(other.value_norms, 11, -1.0f);
  EXPECT_EQ(cache->restore(0, 1, other).error().code, ErrorCode::Corrupt);
  other = *snap;
  const std::uint16_t half_inf = 0x7C00;
  std::memcpy(other.key_residual_norms.data() + 2 * 3, &half_inf, 2);
  EXPECT_EQ(cache->restore(0, 1, other).error().code, ErrorCode::NonFinite);
  // None of the failures stored anything.
  const LayerSnapshot target_after = cache->snapshot(0, 1).value();
  EXPECT_EQ(target_after.length, 3u);
  EXPECT_EQ(target_after.key_codes, target_before.key_codes);
  EXPECT_EQ(target_after.key_signs, target_before.key_signs);
  EXPECT_EQ(target_after.key_norms, target_before.key_norms);
  EXPECT_EQ(target_after.key_residual_norms, target_before.key_residual_norms);
  EXPECT_EQ(target_after.value_codes, target_before.value_codes);
  EXPECT_EQ(target_after.value_norms, target_before.value_norms);
  EXPECT_EQ(target_after.window_begin, target_before.window_begin);
  EXPECT_EQ(target_after.window_keys, target_before.window_keys);
  EXPECT_EQ(target_after.window_values, target_before.window_values);

  ASSERT_TRUE(cache->restore(0, 1, *snap).ok());
  EXPECT_EQ(cache->length(0, 1), 9u);
  auto again = cache->snapshot(0, 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->key_codes, snap->key_codes);
  EXPECT_EQ(again->value_codes, snap->value_codes);
  EXPECT_EQ(again->window_keys, snap->window_keys);
  EXPECT_EQ(again->window_begin, snap->window_begin);

  // A non-attention layer snapshots as empty and restores as a no-op.
  auto empty = cache->snapshot(1, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->kv_heads, 0u);
  EXPECT_TRUE(cache->restore(1, 2, *empty).ok());
}

// ---- random traces against a dense model ------------------------------------------------------------

struct ModelSeq {
  std::vector<std::vector<float>> keys, values;       // per position: [kv_heads · d] as stored (after dtype)
  std::vector<std::vector<double>> dec_keys, dec_values;  // per position: decoded records
  std::vector<std::uint32_t> ring_owner;              // per ring slot: the position whose row it holds
};

struct TraceRunner {
  std::mt19937_64 rng;
  QuantConfig config;
  CacheShape shape;
  TurboQuantCache cache;
  std::vector<std::unique_ptr<LayerCodec>> codecs;   // per layer, independent of the cache's
  std::vector<std::vector<ModelSeq>> model;          // [layer][seq]
  struct Saved {
    std::uint32_t layer;
    LayerSnapshot snap;
    ModelSeq model;
  };
  std::vector<Saved> bank;
  std::uint32_t checks = 0;

  std::uint32_t window() const { return config.exact_window; }

  void append(std::uint32_t layer, std::uint32_t seq, std::uint32_t rows, DType dtype) {
    const std::uint32_t d = shape.head_dim;
    const std::uint32_t heads = shape.kv_heads[layer];
    ModelSeq& m = model[layer][seq];
    const std::uint32_t position = static_cast<std::uint32_t>(m.keys.size());
    auto keys = random_rows(rng, static_cast<std::size_t>(rows) * heads, d, 1.0f, true);
    auto values = random_rows(rng, static_cast<std::size_t>(rows) * heads, d, 1.0f, false);
    std::vector<std::uint16_t> k16(keys.size()), v16(values.size());
    if (dtype == DType::BF16) {
      for (std::size_t i = 0; i < keys.size(); ++i) {
        k16[i] = f32_to_bf16(keys[i]);
        v16[i] = f32_to_bf16(values[i]);
        keys[i] = bf16_to_f32(k16[i]);
        values[i] = bf16_to_f32(v16[i]);
      }
    }
    const void* kp = dtype == DType::BF16 ? static_cast<const void*>(k16.data()) : keys.data();
    const void* vp = dtype == DType::BF16 ? static_cast<const void*>(v16.data()) : values.data();
    auto status = cache.append(layer, seq, position, rows, dtype, kp, vp);
    ASSERT_TRUE(status.ok()) << status.error().to_string();
    const LayerCodec& codec = *codecs[layer];
    const TokenBytes tb = codec.token_bytes();
    std::vector<std::uint8_t> kc(tb.key_codes), ks(tb.key_signs), vc(tb.value_codes);
    float kn = 0, vn = 0;
    std::uint16_t rho = 0;
    std::vector<float> scratch(2 * d);
    for (std::uint32_t r = 0; r < rows; ++r) {
      std::vector<float> krow(keys.begin() + static_cast<std::ptrdiff_t>(r) * heads * d,
                              keys.begin() + static_cast<std::ptrdiff_t>(r + 1) * heads * d);
      std::vector<float> vrow(values.begin() + static_cast<std::ptrdiff_t>(r) * heads * d,
                              values.begin() + static_cast<std::ptrdiff_t>(r + 1) * heads * d);
      std::vector<double> kd(static_cast<std::size_t>(heads) * d), vd(kd.size());
      for (std::uint32_t h = 0; h < heads; ++h) {
        KeyRecord key{kc.data(), config.has_qjl() ? ks.data() : nullptr, &kn, config.has_qjl() ? &rho : nullptr};
        ASSERT_TRUE(codec.encode_key({krow.data() + h * d, d}, key, scratch).ok());
        codec.decode_key({kc.data(), key.signs, &kn, key.residual_norm}, {kd.data() + h * d, d});
        ASSERT_TRUE(codec.encode_value({vrow.data() + h * d, d}, {vc.data(), &vn}, scratch).ok());
        codec.decode_value({vc.data(), &vn}, {vd.data() + h * d, d});
      }
      m.keys.push_back(std::move(krow));
      m.values.push_back(std::move(vrow));
      m.dec_keys.push_back(std::move(kd));
      m.dec_values.push_back(std::move(vd));
      if (window() > 0) m.ring_owner[(position + r) % window()] = position + r;
    }
  }

  void truncate(std::uint32_t seq, std::uint32_t position) {
    ASSERT_TRUE(cache.truncate(seq, position).ok());
    for (auto& layer : model) {
      if (layer.empty()) continue;
      ModelSeq& m = layer[seq];
      if (m.keys.size() <= position) continue;
      m.keys.resize(position);
      m.values.resize(position);
      m.dec_keys.resize(position);
      m.dec_values.resize(position);
    }
  }

  void reset(std::uint32_t seq) {
    ASSERT_TRUE(cache.reset(seq).ok());
    for (auto& layer : model) {
      if (layer.empty()) continue;
      layer[seq] = ModelSeq{};
      layer[seq].ring_owner.assign(window(), kNone);
    }
  }

  void save(std::uint32_t layer, std::uint32_t seq) {
    auto snap = cache.snapshot(layer, seq);
    ASSERT_TRUE(snap.ok()) << snap.error().to_string();
    ASSERT_EQ(snap->length, model[layer][seq].keys.size());
    bank.push_back({layer, std::move(*snap), model[layer][seq]});
  }

  void restore(std::uint32_t seq) {
    const Saved& saved = bank[rng() % bank.size()];
    auto status = cache.restore(saved.layer, seq, saved.snap);
    ASSERT_TRUE(status.ok()) << status.error().to_string();
    ModelSeq m = saved.model;
    m.ring_owner.assign(window(), kNone);
    for (std::uint32_t t = saved.snap.window_begin; t < saved.snap.length; ++t) m.ring_owner[t % window()] = t;
    model[saved.layer][seq] = std::move(m);
  }

  // The model's view: exact rows where the window must still hold them, decoded records elsewhere.
  bool exact_in_model(const ModelSeq& m, std::uint32_t t) const {
    const std::uint32_t length = static_cast<std::uint32_t>(m.keys.size());
    return window() > 0 && t + window() >= length && m.ring_owner[t % window()] == t;
  }

  void check_attention(std::uint32_t layer) {
    const std::uint32_t d = shape.head_dim;
    const std::uint32_t heads = shape.kv_heads[layer];
    const std::uint32_t q_heads = heads * (1u + static_cast<std::uint32_t>(rng() % 3));
    std::vector<std::vector<float>> queries, outputs;
    std::vector<std::vector<double>> dense_keys, dense_values;
    std::vector<AttentionRequest> requests;
    std::vector<DenseOracleRequest> model_requests;
    for (std::uint32_t seq = 0; seq < shape.sequences; ++seq) {
      const ModelSeq& m = model[layer][seq];
      const std::uint32_t length = static_cast<std::uint32_t>(m.keys.size());
      if (length == 0 || rng() % 4 == 0) continue;  // ragged batches, sometimes skipping a sequence
      const std::uint32_t first = static_cast<std::uint32_t>(rng() % length);
      const std::uint32_t rows = 1 + static_cast<std::uint32_t>(rng() % (length - first));
      queries.push_back(random_rows(rng, static_cast<std::size_t>(rows) * q_heads, d, 1.0f, false));
      outputs.emplace_back(queries.back().size(), std::numeric_limits<float>::quiet_NaN());
      requests.push_back({seq, first, rows, nullptr, nullptr});
      std::vector<double> k(static_cast<std::size_t>(length) * heads * d), v(k.size());
      for (std::uint32_t t = 0; t < length; ++t) {
        const bool exact = exact_in_model(m, t);
        for (std::size_t j = 0; j < static_cast<std::size_t>(heads) * d; ++j) {
          k[t * heads * d + j] = exact ? m.keys[t][j] : m.dec_keys[t][j];
          v[t * heads * d + j] = exact ? m.values[t][j] : m.dec_values[t][j];
        }
      }
      dense_keys.push_back(std::move(k));
      dense_values.push_back(std::move(v));
    }
    if (requests.empty()) return;
    for (std::size_t r = 0; r < requests.size(); ++r) {
      requests[r].queries = queries[r].data();
      requests[r].output = outputs[r].data();
      model_requests.push_back({requests[r].first_position + requests[r].rows, requests[r].first_position,
                                requests[r].rows, dense_keys[r].data(), dense_values[r].data(), queries[r].data()});
    }
    std::vector<float> sinks(q_heads, 0.5f);
    AttentionOptions options;
    options.q_heads = q_heads;
    options.sinks = rng() % 2 ? sinks.data() : nullptr;
    options.chunk_tokens = rng() % 2 ? 0u : 16u;  // short chunks: split + merge even on short sequences
    auto status = cache.attention(layer, requests, options);
    ASSERT_TRUE(status.ok()) << status.error().to_string();
    auto expected = dense_attention_oracle(d, heads, model_requests, options);
    ASSERT_TRUE(expected.ok());
    auto cache_oracle = attention_oracle(cache.view(layer), requests, options);
    ASSERT_TRUE(cache_oracle.ok());
    for (std::size_t r = 0; r < requests.size(); ++r) {
      const std::size_t row_floats = static_cast<std::size_t>(q_heads) * d;
      EXPECT_LE(max_row_relative_error(outputs[r], (*expected)[r], row_floats), 1e-5)
          << "layer " << layer << " seq " << requests[r].seq << " first " << requests[r].first_position << " rows "
          << requests[r].rows << " check " << checks;
      // Both references are float64 over the same rows: they agree to rounding.
      std::vector<float> as_float((*cache_oracle)[r].begin(), (*cache_oracle)[r].end());
      EXPECT_LE(max_row_relative_error(as_float, (*expected)[r], row_floats), 1e-6)
          << "cache oracle vs model, layer " << layer << " seq " << requests[r].seq << " check " << checks;
    }
    ++checks;
  }
};

void run_trace(std::uint64_t seed, const char* mode, std::uint32_t window, std::uint32_t head_dim) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " mode " << mode << " window " << window);
  auto config = QuantConfig::parse(mode, seed);
  ASSERT_TRUE(config.ok());
  config->exact_window = window;
  CacheShape shape = small_shape(head_dim);
  auto cache = TurboQuantCache::create(shape, *config);
  ASSERT_TRUE(cache.ok()) << cache.error().to_string();
  TraceRunner run{std::mt19937_64(seed), *config, shape, std::move(*cache), {}, {}, {}, 0};
  for (std::uint32_t l = 0; l < shape.kv_heads.size(); ++l) {
    if (shape.kv_heads[l] == 0) {
      run.codecs.emplace_back();
      run.model.emplace_back();
      continue;
    }
    auto codec = LayerCodec::create(head_dim, *config, l);
    ASSERT_TRUE(codec.ok());
    run.codecs.push_back(std::make_unique<LayerCodec>(std::move(*codec)));
    run.model.emplace_back(shape.sequences);
    for (auto& m : run.model.back()) m.ring_owner.assign(window, kNone);
  }
  const std::uint32_t attention_layers[] = {0, 2};
  for (std::uint32_t step = 0; step < 160; ++step) {
    const std::uint32_t layer = attention_layers[run.rng() % 2];
    const std::uint32_t seq = static_cast<std::uint32_t>(run.rng() % shape.sequences);
    const std::uint32_t length = run.cache.length(layer, seq);
    ASSERT_EQ(length, run.model[layer][seq].keys.size()) << "step " << step;
    const std::uint32_t op = static_cast<std::uint32_t>(run.rng() % 100);
    if (op < 40) {
      // A decode step (1 row) or a prefill chunk, in every attention layer, as a model forward does.
      const std::uint32_t rows = run.rng() % 3 == 0 ? 1u : 1u + static_cast<std::uint32_t>(run.rng() % 13);
      const DType dtype = run.rng() % 3 == 0 ? DType::BF16 : DType::F32;
      for (std::uint32_t l : attention_layers) {
        if (run.cache.length(l, seq) + rows > shape.capacity) continue;
        run.append(l, seq, rows, dtype);
      }
    } else if (op < 62) {
      run.check_attention(layer);
    } else if (op < 74) {
      run.truncate(seq, length == 0 ? 0u : static_cast<std::uint32_t>(run.rng() % (length + 1)));
    } else if (op < 78) {
      run.reset(seq);
    } else if (op < 86) {
      run.save(layer, seq);
    } else if (op < 93) {
      if (!run.bank.empty()) run.restore(seq);
    } else {
      // Out-of-order append: rejected with the expected position, nothing changes.
      std::vector<float> rows(static_cast<std::size_t>(shape.kv_heads[layer]) * head_dim, 1.0f);
      auto bad = run.cache.append(layer, seq, length + 1, 1, DType::F32, rows.data(), rows.data());
      ASSERT_FALSE(bad.ok());
      EXPECT_EQ(bad.error().expected, length);
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (std::uint32_t l : attention_layers) run.check_attention(l);
  EXPECT_GT(run.checks, 10u);
}

TEST(TqCache, RandomTracesMatchDenseModel) {
  const std::uint64_t seed = fresh_seed();
  run_trace(seed, "k=prod3,v=mse2", 0, 64);
  run_trace(seed + 1, "k=prod3,v=mse2", 5, 64);
  run_trace(seed + 2, "k=mse4,v=mse3,nc", 16, 32);
  run_trace(seed + 3, "k=prod4,v=mse4", 1, 32);
}

}  // namespace
}  // namespace kvcompact::tq
