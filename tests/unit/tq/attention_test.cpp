// The fast CPU attention path against the float64 oracle (explicit dequantisation + exact softmax) on
// fresh random inputs: lengths 1, 7, 127, 128, 129, 600 as a ragged batch, GQA 1 / 4 / 8, head_dim
// 64 / 128 / 256, every key / value bit width, sinks and the exact window on and off, chunked prefill
// from non-zero starts; plus the dense fp32 baseline against its own oracle and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kvcompact/core/parallel.hpp"
#include "kvcompact/tq/attention.hpp"
#include "kvcompact/tq/attention_oracle.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::tq {
namespace {

using testing::fresh_seed;
using testing::max_row_relative_error;
using testing::random_rows;

constexpr double kTolerance = 1e-5;  // fp32 arithmetic against float64, relative to the row's output norm
const std::uint32_t kLengths[] = {1, 7, 127, 128, 129, 600};

const char* const kModes[] = {"k=prod3,v=mse2", "k=mse4,v=mse4,nc", "k=prod5,v=mse3", "k=mse3,v=mse3,nc",
                              "k=prod4,v=mse4", "k=mse5,v=mse2", "k=prod2,v=mse3"};

struct Batch {
  std::vector<std::vector<float>> queries;
  std::vector<std::vector<float>> outputs;
  std::vector<AttentionRequest> requests;
};

// Per sequence: one decode row at the end, a prefill chunk from a third of the way in, and one from 0.
Batch make_batch(std::mt19937_64& rng, const TurboQuantCache& cache, std::uint32_t q_heads) {
  Batch batch;
  const std::uint32_t d = cache.head_dim();
  auto add = [&](std::uint32_t seq, std::uint32_t first, std::uint32_t rows) {
    batch.queries.push_back(random_rows(rng, static_cast<std::size_t>(rows) * q_heads, d, 1.0f, false));
    batch.outputs.emplace_back(static_cast<std::size_t>(rows) * q_heads * d, std::numeric_limits<float>::quiet_NaN());
    AttentionRequest req;
    req.seq = seq;
    req.first_position = first;
    req.rows = rows;
    batch.requests.push_back(req);
  };
  for (std::uint32_t seq = 0; seq < cache.sequences(); ++seq) {
    const std::uint32_t length = cache.length(0, seq);
    add(seq, length - 1, 1);
    const std::uint32_t start = length / 3;
    add(seq, start, std::min(length - start, 9u));
    add(seq, 0, std::min(length, 5u));
  }
  for (std::size_t r = 0; r < batch.requests.size(); ++r) {
    batch.requests[r].queries = batch.queries[r].data();
    batch.requests[r].output = batch.outputs[r].data();
  }
  return batch;
}

// Builds a one-layer cache holding the ragged lengths, runs the fast path and the oracle, compares.
void check_against_oracle(std::uint64_t seed, std::uint32_t head_dim, std::uint32_t gqa, const char* mode,
                          bool sinks_on, std::uint32_t window, std::uint32_t threads, std::uint32_t chunk = 0) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " head_dim " << head_dim << " gqa " << gqa << " mode "
                                    << mode << " sinks " << sinks_on << " window " << window << " threads "
                                    << threads << " chunk " << chunk);
  std::mt19937_64 rng(seed);
  const std::uint32_t kv_heads = 2;
  const std::uint32_t q_heads = kv_heads * gqa;
  auto config = QuantConfig::parse(mode, seed);
  ASSERT_TRUE(config.ok()) << config.error().to_string();
  config->exact_window = window;
  CacheShape shape;
  shape.head_dim = head_dim;
  shape.kv_heads = {kv_heads};
  shape.sequences = static_cast<std::uint32_t>(std::size(kLengths));
  shape.capacity = 640;
  auto cache = TurboQuantCache::create(shape, *config);
  ASSERT_TRUE(cache.ok()) << cache.error().to_string();
  for (std::uint32_t seq = 0; seq < shape.sequences; ++seq) {
    const std::uint32_t length = kLengths[seq];
    const auto keys = random_rows(rng, static_cast<std::size_t>(length) * kv_heads, head_dim, 1.0f, true);
    const auto values = random_rows(rng, static_cast<std::size_t>(length) * kv_heads, head_dim, 1.0f, false);
    // Two appends, so the window ring is filled across calls.
    const std::uint32_t first = length / 2;
    const std::size_t split = static_cast<std::size_t>(first) * kv_heads * head_dim;
    ASSERT_TRUE(cache->append(0, seq, 0, first, DType::F32, keys.data(), values.data()).ok());
    auto s = cache->append(0, seq, first, length - first, DType::F32, keys.data() + split, values.data() + split);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
  }
  Batch batch = make_batch(rng, *cache, q_heads);
  std::vector<float> sinks(q_heads);
  std::normal_distribution<float> sink_dist(1.0f, 2.0f);
  for (float& v : sinks) v = sink_dist(rng);
  AttentionOptions options;
  options.q_heads = q_heads;
  options.sinks = sinks_on ? sinks.data() : nullptr;
  options.threads = threads;
  options.chunk_tokens = chunk;
  auto status = cache->attention(0, batch.requests, options);
  ASSERT_TRUE(status.ok()) << status.error().to_string();
  auto reference = attention_oracle(cache->view(0), batch.requests, options);
  ASSERT_TRUE(reference.ok()) << reference.error().to_string();
  for (std::size_t r = 0; r < batch.requests.size(); ++r) {
    const auto& req = batch.requests[r];
    EXPECT_LE(max_row_relative_error(batch.outputs[r], (*reference)[r], static_cast<std::size_t>(q_heads) * head_dim),
              kTolerance)
        << "request " << r << " seq " << req.seq << " first_position " << req.first_position << " rows " << req.rows
        << " length " << cache->length(0, req.seq);
  }
}

TEST(TqAttention, FastPathMatchesFloat64OracleAcrossShapes) {
  const std::uint64_t seed = fresh_seed();
  std::uint32_t combo = 0;
  for (std::uint32_t head_dim : {64u, 128u, 256u}) {
    for (std::uint32_t gqa : {1u, 4u, 8u}) {
      for (std::uint32_t variant = 0; variant < 2; ++variant) {
        const char* mode = kModes[combo % std::size(kModes)];
        const bool sinks = variant == 1;
        const std::uint32_t window = variant == 1 ? 32u : 0u;
        // Short chunks on one variant: long sequences split and merge (flash-decoding) on both kernels.
        check_against_oracle(seed + combo, head_dim, gqa, mode, sinks, window, 0, variant == 0 ? 100u : 0u);
        ++combo;
      }
    }
  }
}

TEST(TqAttention, EveryModeSingleThreadAndFineChunks) {
  const std::uint64_t seed = fresh_seed();
  std::uint32_t combo = 0;
  for (const char* mode : kModes) {
    check_against_oracle(seed + combo, 64, 4, mode, combo % 2 == 0, combo % 3 == 0 ? 7u : 0u, 1);
    ++combo;
  }
  // Head dims that are not powers of two (block-diagonal rotations; 3-bit groups and nibbles still align).
  check_against_oracle(seed + 50, 80, 4, "k=prod4,v=mse3", true, 5, 0, 0);
  check_against_oracle(seed + 51, 96, 2, "k=mse5,v=mse2,nc", false, 0, 0, 150);
  check_against_oracle(seed + 52, 576, 1, "k=prod2,v=mse4", true, 0, 0, 0);
  // The smallest head_dim, and a GQA group of 16 (two 8-lane passes even for one decode row).
  check_against_oracle(seed + 53, 16, 16, "k=prod3,v=mse3", true, 3, 0, 0);
  check_against_oracle(seed + 54, 64, 16, "k=mse3,v=mse2,nc", false, 0, 0, 128);
  // A bigger pool and the shortest chunks split even short sequences into many chunks and merges.
  set_num_threads(7);
  check_against_oracle(seed + 100, 128, 4, "k=prod3,v=mse2", true, 16, 0, 37);
  check_against_oracle(seed + 101, 64, 1, "k=mse4,v=mse3", false, 0, 0, 64);
  check_against_oracle(seed + 102, 64, 8, "k=prod5,v=mse3", true, 7, 0, 200);
  set_num_threads(0);
}

TEST(TqAttention, DenseBaselineMatchesOracle) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const std::uint32_t d = 128, kv_heads = 2, q_heads = 8;
  std::vector<std::vector<float>> keys, values, queries, outputs;
  std::vector<std::vector<double>> keys64, values64;
  std::vector<DenseAttentionRequest> requests;
  for (std::uint32_t length : kLengths) {
    keys.push_back(random_rows(rng, static_cast<std::size_t>(length) * kv_heads, d, 1.0f, true));
    values.push_back(random_rows(rng, static_cast<std::size_t>(length) * kv_heads, d, 1.0f, false));
    keys64.emplace_back(keys.back().begin(), keys.back().end());
    values64.emplace_back(values.back().begin(), values.back().end());
    const std::uint32_t rows = std::min(length - length / 2, 24u);
    const std::uint32_t first = length - rows;
    queries.push_back(random_rows(rng, static_cast<std::size_t>(rows) * q_heads, d, 1.0f, false));
    outputs.emplace_back(queries.back().size(), std::numeric_limits<float>::quiet_NaN());
    requests.push_back({length, first, rows, nullptr, nullptr, nullptr, nullptr});
  }
  std::vector<DenseOracleRequest> oracle_requests;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    requests[r].keys = keys[r].data();
    requests[r].values = values[r].data();
    requests[r].queries = queries[r].data();
    requests[r].output = outputs[r].data();
    oracle_requests.push_back(
        {requests[r].length, requests[r].first_position, requests[r].rows, keys64[r].data(), values64[r].data(),
         queries[r].data()});
  }
  std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f, 3.0f, -2.0f, 1.0f, 0.25f};
  AttentionOptions options;
  options.q_heads = q_heads;
  options.sinks = sinks.data();
  options.chunk_tokens = 50;  // split and merge
  ASSERT_TRUE(dense_attention_f32(d, kv_heads, requests, options).ok());
  auto reference = dense_attention_oracle(d, kv_heads, oracle_requests, options);
  ASSERT_TRUE(reference.ok());
  for (std::size_t r = 0; r < requests.size(); ++r) {
    EXPECT_LE(max_row_relative_error(outputs[r], (*reference)[r], static_cast<std::size_t>(q_heads) * d), kTolerance)
        << "length " << requests[r].length;
  }
}

TEST(TqAttention, RejectsBadRequests) {
  CacheShape shape;
  shape.head_dim = 64;
  shape.kv_heads = {2, 0};
  shape.sequences = 2;
  shape.capacity = 16;
  auto cache = TurboQuantCache::create(shape, QuantConfig::seed_system(1));
  ASSERT_TRUE(cache.ok());
  std::mt19937_64 rng(fresh_seed());
  const auto rows = random_rows(rng, 4 * 2, 64, 1.0f, false);
  ASSERT_TRUE(cache->append(0, 0, 0, 4, DType::F32, rows.data(), rows.data()).ok());
  std::vector<float> q(64 * 8 * 4), out(q.size());
  AttentionRequest req{0, 3, 1, q.data(), out.data()};
  AttentionOptions options;
  options.q_heads = 3;  // not a multiple of 2
  EXPECT_EQ(cache->attention(0, {&req, 1}, options).error().code, ErrorCode::InvalidArgument);
  options.q_heads = 4;
  req.first_position = 4;  // position 4 is not stored yet
  auto past = cache->attention(0, {&req, 1}, options);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.error().code, ErrorCode::OutOfRange);
  EXPECT_EQ(past.error().expected, 4);
  EXPECT_EQ(past.error().actual, 5);
  req.first_position = 0;
  req.seq = 2;
  EXPECT_EQ(cache->attention(0, {&req, 1}, options).error().code, ErrorCode::OutOfRange);
  req.seq = 1;  // empty sequence: even position 0 is past its length
  EXPECT_EQ(cache->attention(0, {&req, 1}, options).error().code, ErrorCode::OutOfRange);
  req.seq = 0;
  EXPECT_EQ(cache->attention(1, {&req, 1}, options).error().code, ErrorCode::InvalidArgument);  // no attention
  EXPECT_EQ(cache->attention(2, {&req, 1}, options).error().code, ErrorCode::OutOfRange);
  req.output = nullptr;
  EXPECT_EQ(cache->attention(0, {&req, 1}, options).error().code, ErrorCode::InvalidArgument);
  req.output = out.data();
  options.scale = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cache->attention(0, {&req, 1}, options).error().code, ErrorCode::InvalidArgument);
  options.scale = 0.0f;
  std::vector<float> sinks(4, std::numeric_limits<float>::quiet_NaN());
  options.sinks = sinks.data();
  EXPECT_EQ(cache->attention(0, {&req, 1}, options).error().code, ErrorCode::NonFinite);
  options.sinks = nullptr;
  ASSERT_TRUE(cache->attention(0, {&req, 1}, options).ok());
  for (std::size_t j = 0; j < 4 * 64; ++j) EXPECT_TRUE(std::isfinite(out[j])) << j;
  // A view a tool builds with a length beyond the layout's capacity (here 4096 over 16): OutOfRange before any
  // read (its keys past the capacity are not in the buffer).
  LayerView view = cache->view(0);
  const std::uint32_t too_long[2] = {4096, 0};
  view.lengths = too_long;
  req.first_position = 4095;
  auto beyond = attention_cpu(view, {&req, 1}, options);
  ASSERT_FALSE(beyond.ok());
  EXPECT_EQ(beyond.error().code, ErrorCode::OutOfRange);
  EXPECT_EQ(beyond.error().expected, 16);
  EXPECT_EQ(beyond.error().actual, 4096);
}

TEST(TqAttention, ExactWindowBegin) {
  EXPECT_EQ(exact_window_begin(10, 0, 0), 10u);   // no window
  EXPECT_EQ(exact_window_begin(10, 0, 4), 6u);    // last 4
  EXPECT_EQ(exact_window_begin(3, 0, 4), 0u);     // everything
  EXPECT_EQ(exact_window_begin(10, 8, 4), 8u);    // after a truncation: only what survived
  EXPECT_EQ(exact_window_begin(10, 12, 4), 10u);  // nothing valid yet
}

}  // namespace
}  // namespace kvcompact::tq
