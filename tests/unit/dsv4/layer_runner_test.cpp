// LayerRunner against the pieces it is built from: each output equals the float64 attention oracle over
// the rows the cache holds (window rows, the indexer's top-k checked against oracle scores, all rows for
// m = 128); the stored rows and states equal the standalone compressor / FP8 math byte for byte; argument
// errors are typed and leave the cache untouched; the per-layer protocol flow equals decode_step.
#include "kvcompact/dsv4/layer_runner.hpp"

#include <gtest/gtest.h>

#include <limits>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/dsv4/fp_sim.hpp"
#include "math_layer_fixture.hpp"

namespace kvcompact::dsv4 {
namespace {

using testutil::close_to;
using testutil::dump_valid;
using testutil::Outputs;
using testutil::run_chunks;
using testutil::run_decode;
using testutil::SyntheticModel;
using testutil::TokenStream;

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const auto& kvc_st_ = (expr);                             \
    ASSERT_TRUE(kvc_st_.ok()) << kvc_st_.error().to_string(); \
  } while (0)

std::vector<float> decode_row(std::span<const std::uint8_t> bytes, RowStorage s) {
  std::vector<float> row(512);
  EXPECT_TRUE(decode_attention_row(bytes, s, row).ok());
  return row;
}

TEST(DsvLayerRunner, OutputsMatchOracleOverStoredRows) {
  KVC_SEEDED(rng);
  const std::size_t n0 = 290, n = 300;
  const std::uint32_t heads = 3, ih = 2, topk = 8;
  SyntheticModel model(rng, testutil::synthetic_config({0, 4, 128}, ih, topk), heads);
  TokenStream stream(rng, model, n);
  LayerRunner runner(model.config);
  auto created = Deepseek4Cache::create(model.config, 320, StorageConfig::bf16());
  ASSERT_OK(created);
  Deepseek4Cache& cache = *created;
  Outputs out(3, n, heads);
  ASSERT_OK(run_chunks(runner, cache, model, stream, out, 0, n0, {97}));
  for (std::size_t t = n0; t < n; ++t) {
    ASSERT_OK(run_decode(runner, cache, model, stream, out, t, t + 1));
    for (std::uint32_t l = 0; l < 3; ++l) {
      SCOPED_TRACE(::testing::Message() << "token " << t << " layer " << l);
      const std::uint32_t m = model.config.compress_ratios[l];
      const auto& in = stream.layers[l];
      // The ring row of t is the FP8-simulated c_t, encoded.
      std::vector<float> c(in.kv.begin() + static_cast<std::ptrdiff_t>(t * 512),
                           in.kv.begin() + static_cast<std::ptrdiff_t>((t + 1) * 512));
      simulate_main_row(c.data());
      std::vector<std::uint8_t> enc(attention_row_bytes(RowStorage::Bf16));
      ASSERT_TRUE(encode_attention_row(c, RowStorage::Bf16, enc).ok());
      const auto ring_row = cache.window_rows(l).row(cache.window_slot(t));
      ASSERT_TRUE(std::equal(enc.begin(), enc.end(), ring_row.begin()));
      // The rows attention should use, read back from the cache.
      std::vector<std::vector<float>> store;
      for (std::int64_t q : window_positions(static_cast<std::int64_t>(t))) {
        store.push_back(decode_row(cache.window_rows(l).row(cache.window_slot(static_cast<std::uint64_t>(q))), RowStorage::Bf16));
      }
      const std::size_t visible = visible_compressed_rows(m, static_cast<std::int64_t>(t));
      if (m == 128) {
        for (std::size_t i = 0; i < visible; ++i) store.push_back(decode_row(cache.compressed_rows(l).row(i), RowStorage::Bf16));
      } else if (m == 4 && visible > 0) {
        std::vector<float> qi(in.iq.begin() + static_cast<std::ptrdiff_t>(t * ih * 128),
                              in.iq.begin() + static_cast<std::ptrdiff_t>((t + 1) * ih * 128));
        prepare_indexer_query(qi.data(), ih);
        std::vector<float> keys(visible * 128);
        for (std::size_t i = 0; i < visible; ++i) {
          ASSERT_TRUE(decode_indexer_row(cache.indexer_rows(l).row(i), IndexerStorage::Bf16,
                                         std::span<float>(keys.data() + i * 128, 128)).ok());
        }
        const std::span<const float> w(in.iw.data() + t * ih, ih);
        std::vector<float> fast(visible);
        indexer_scores_contiguous(fast.data(), qi.data(), w.data(), keys.data(), visible, ih, 128);
        std::vector<std::int32_t> sel(topk);
        TopkScratch scratch;
        const std::size_t k = indexer_topk(sel.data(), topk, fast.data(), visible, scratch);
        ASSERT_EQ(k, std::min<std::size_t>(topk, visible));
        const std::vector<double> oracle = indexer_scores_f64(qi, w, keys, ih, 128);
        std::vector<bool> chosen(visible, false);
        for (std::size_t i = 0; i < k; ++i) chosen[static_cast<std::size_t>(sel[i])] = true;
        for (std::size_t i = 0; i < k; ++i) {
          for (std::size_t s = 0; s < visible; ++s) {
            if (!chosen[s]) {
              ASSERT_GE(oracle[static_cast<std::size_t>(sel[i])], oracle[s] - 1e-4) << "not a top-k";
            }
          }
          store.push_back(decode_row(cache.compressed_rows(l).row(static_cast<std::uint64_t>(sel[i])), RowStorage::Bf16));
        }
      }
      std::vector<const float*> rows;
      for (const auto& r : store) rows.push_back(r.data());
      const std::span<const float> q(in.q.data() + t * heads * 512, heads * 512);
      const std::vector<double> expect =
          sparse_attention_f64(q, heads, rows, model.layers[l].sink, &runner.rope_for_ratio(m), static_cast<std::int64_t>(t));
      const std::span<const float> got(out.layers[l].data() + t * heads * 512, heads * 512);
      EXPECT_TRUE(close_to(got, expect, 2e-5, 1e-6));
    }
  }
}

TEST(DsvLayerRunner, StoredRowsAndStatesEqualStandaloneMath) {
  KVC_SEEDED(rng);
  const std::size_t n = 263;
  SyntheticModel model(rng, testutil::synthetic_config({4, 128}, 2, 8), 2);
  TokenStream stream(rng, model, n);
  LayerRunner runner(model.config);
  auto created = Deepseek4Cache::create(model.config, n, StorageConfig::fp8());
  ASSERT_OK(created);
  Deepseek4Cache& cache = *created;
  Outputs out(2, n, 2);
  ASSERT_OK(run_chunks(runner, cache, model, stream, out, 0, n, {41, 3}));
  const RopeFrequencies rope = make_rope_frequencies(rope_config_for_ratio(4));
  for (std::uint32_t l = 0; l < 2; ++l) {
    const std::uint32_t m = model.config.compress_ratios[l];
    const auto& in = stream.layers[l];
    for (int branch = 0; branch < (m == 4 ? 2 : 1); ++branch) {
      CompressorParams p;
      p.ratio = m;
      p.overlap = m == 4;
      p.rope = &rope;
      if (branch == 0) {
        p.width = 512;
        p.branch = CompressorBranch::Main;
        p.ape = model.layers[l].comp_ape.data();
        p.norm_weight = model.layers[l].comp_norm.data();
      } else {
        p.width = 128;
        p.branch = CompressorBranch::Indexer;
        p.ape = model.layers[l].idx_ape.data();
        p.norm_weight = model.layers[l].idx_norm.data();
      }
      std::vector<float> kv(p.state_floats()), sc(p.state_floats()), rows(n / m * p.width + 1);
      compressor_reset_state(p, kv.data(), sc.data());
      const std::size_t emitted = compressor_prefill(p, kv.data(), sc.data(), 0, n, branch == 0 ? in.a.data() : in.ia.data(),
                                                     branch == 0 ? in.z.data() : in.iz.data(), rows.data());
      ASSERT_EQ(emitted, n / m);
      const auto cache_kv = branch == 0 ? cache.kv_state(l).data : cache.indexer_kv_state(l).data;
      const auto cache_sc = branch == 0 ? cache.score_state(l).data : cache.indexer_score_state(l).data;
      EXPECT_TRUE(testutil::same_bits(kv, cache_kv));
      EXPECT_TRUE(testutil::same_bits(sc, cache_sc));
      for (std::size_t g = 0; g < emitted; ++g) {
        const std::span<const float> row(rows.data() + g * p.width, p.width);
        if (branch == 0) {
          std::vector<std::uint8_t> enc(attention_row_bytes(RowStorage::Fp8));
          ASSERT_TRUE(encode_attention_row(row, RowStorage::Fp8, enc).ok());
          const auto stored = cache.compressed_rows(l).row(g);
          ASSERT_TRUE(std::equal(enc.begin(), enc.end(), stored.begin())) << "layer " << l << " row " << g;
          // FP8 storage of a model-rounded row is lossless on [0, 448); the RoPE tail is kept as bf16.
          std::vector<float> expect(row.begin(), row.end());
          for (std::size_t i = 448; i < 512; ++i) expect[i] = bf16_to_f32(f32_to_bf16(expect[i]));
          EXPECT_TRUE(testutil::same_bits(decode_row(stored, RowStorage::Fp8), expect));
        } else {
          std::vector<std::uint8_t> enc(indexer_row_bytes(IndexerStorage::Fp8));
          ASSERT_TRUE(encode_indexer_row(row, IndexerStorage::Fp8, enc).ok());
          const auto stored = cache.indexer_rows(l).row(g);
          ASSERT_TRUE(std::equal(enc.begin(), enc.end(), stored.begin())) << "indexer row " << g;
        }
      }
    }
  }
}

TEST(DsvLayerRunner, PerLayerProtocolEqualsDecodeStep) {
  KVC_SEEDED(rng);
  const std::size_t n = 20;
  SyntheticModel model(rng, testutil::synthetic_config({0, 4, 128}, 2, 4), 2);
  TokenStream stream(rng, model, n);
  LayerRunner runner(model.config);
  auto a = Deepseek4Cache::create(model.config, 64);
  auto b = Deepseek4Cache::create(model.config, 64);
  ASSERT_OK(a);
  ASSERT_OK(b);
  Outputs oa(3, n, 2), ob(3, n, 2);
  ASSERT_OK(run_decode(runner, *a, model, stream, oa, 0, n));
  for (std::size_t t = 0; t < n; ++t) {
    auto step = b->plan_next_step();
    ASSERT_OK(step);
    for (std::uint32_t l = 0; l < 3; ++l) {
      ASSERT_OK(runner.run_layer(*b, l, 1, model.weights[l], stream.slice(l, t), ob.layers[l].data() + t * 2 * 512));
    }
    ASSERT_OK(b->commit_step(step->position));
  }
  EXPECT_TRUE(dump_valid(*a) == dump_valid(*b));
  for (std::uint32_t l = 0; l < 3; ++l) EXPECT_TRUE(testutil::same_bits(oa.layers[l], ob.layers[l]));
}

TEST(DsvLayerRunner, PreparedIndexerQueryFlag) {
  KVC_SEEDED(rng);
  const std::size_t n = 40;
  SyntheticModel model(rng, testutil::synthetic_config({4}, 2, 4), 2);
  TokenStream stream(rng, model, n);
  TokenStream prepared = stream;
  for (std::size_t t = 0; t < n; ++t) prepare_indexer_query(prepared.layers[0].iq.data() + t * 2 * 128, 2);
  LayerRunner runner(model.config);
  auto a = Deepseek4Cache::create(model.config, n);
  auto b = Deepseek4Cache::create(model.config, n);
  ASSERT_OK(a);
  ASSERT_OK(b);
  std::vector<float> oa(n * 2 * 512), ob(n * 2 * 512);
  LayerInputs ia = stream.slice(0, 0);
  LayerInputs ib = prepared.slice(0, 0);
  ib.indexer_q_prepared = true;
  float* pa[] = {oa.data()};
  float* pb[] = {ob.data()};
  ASSERT_OK(runner.prefill_chunk(*a, n, model.weights, std::span<const LayerInputs>(&ia, 1), pa));
  ASSERT_OK(runner.prefill_chunk(*b, n, model.weights, std::span<const LayerInputs>(&ib, 1), pb));
  EXPECT_TRUE(testutil::same_bits(oa, ob));
}

TEST(DsvLayerRunner, SmallContextWindow) {
  // Context below 128: the ring has min(context, 128) slots; chunked prefill still equals decode.
  KVC_SEEDED(rng);
  const std::size_t n = 50;
  SyntheticModel model(rng, testutil::synthetic_config({0, 4, 128}, 2, 4), 2);
  TokenStream stream(rng, model, n);
  LayerRunner runner(model.config);
  auto a = Deepseek4Cache::create(model.config, n);
  auto b = Deepseek4Cache::create(model.config, n);
  ASSERT_OK(a);
  ASSERT_OK(b);
  Outputs oa(3, n, 2), ob(3, n, 2);
  ASSERT_OK(run_decode(runner, *a, model, stream, oa, 0, n));
  ASSERT_OK(run_chunks(runner, *b, model, stream, ob, 0, n, {7}));
  EXPECT_TRUE(dump_valid(*a) == dump_valid(*b));
  for (std::uint32_t l = 0; l < 3; ++l) EXPECT_TRUE(testutil::same_bits(oa.layers[l], ob.layers[l]));
  // The context is exhausted now.
  Status st = testutil::run_span(runner, *a, model, stream, oa, n - 1, 1, true);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::ContextExhausted);
  EXPECT_FALSE(a->poisoned());
}

TEST(DsvLayerRunner, ArgumentErrorsLeaveTheCacheAlone) {
  KVC_SEEDED(rng);
  const std::size_t n = 12;
  SyntheticModel model(rng, testutil::synthetic_config({0, 4, 128}, 2, 4), 2);
  TokenStream stream(rng, model, n);
  LayerRunner runner(model.config);
  auto created = Deepseek4Cache::create(model.config, 16);
  ASSERT_OK(created);
  Deepseek4Cache& cache = *created;
  Outputs out(3, n, 2);
  ASSERT_OK(run_chunks(runner, cache, model, stream, out, 0, 6, {6}));
  const std::vector<std::uint8_t> before = dump_valid(cache);
  std::vector<float> o(12 * 2 * 512);
  auto code = [](const Status& s) { return s.ok() ? ErrorCode::Internal : s.error().code; };
  EXPECT_EQ(code(runner.run_layer(cache, 3, 1, model.weights[0], stream.slice(0, 6), o.data())), ErrorCode::InvalidArgument);
  LayerWeights no_heads = model.weights[0];
  no_heads.heads = 0;
  EXPECT_EQ(code(runner.run_layer(cache, 0, 1, no_heads, stream.slice(0, 6), o.data())), ErrorCode::InvalidArgument);
  LayerInputs missing = stream.slice(1, 6);
  missing.compressor_kv = nullptr;
  EXPECT_EQ(code(runner.run_layer(cache, 1, 1, model.weights[1], missing, o.data())), ErrorCode::InvalidArgument);
  LayerInputs no_index = stream.slice(1, 6);
  no_index.indexer_weights = nullptr;
  EXPECT_EQ(code(runner.run_layer(cache, 1, 1, model.weights[1], no_index, o.data())), ErrorCode::InvalidArgument);
  EXPECT_EQ(code(runner.run_layer(cache, 0, 1, model.weights[0], stream.slice(0, 6), nullptr)), ErrorCode::InvalidArgument);
  EXPECT_EQ(code(runner.run_layer(cache, 0, 0, model.weights[0], stream.slice(0, 6), o.data())), ErrorCode::EmptyPrefill);
  EXPECT_EQ(code(runner.run_layer(cache, 0, 11, model.weights[0], stream.slice(0, 0), o.data())), ErrorCode::ContextBound);
  EXPECT_EQ(code(testutil::run_span(runner, cache, model, stream, out, 6, 11, false)), ErrorCode::ContextBound);
  std::vector<LayerWeights> two(model.weights.begin(), model.weights.begin() + 2);
  std::vector<LayerInputs> ins = {stream.slice(0, 6), stream.slice(1, 6), stream.slice(2, 6)};
  std::vector<float*> outs = out.at(6);
  EXPECT_EQ(code(runner.decode_step(cache, two, ins, outs)), ErrorCode::InvalidArgument);
  ModelConfig other = model.config;
  other.index_topk = 5;
  LayerRunner stranger(other);
  EXPECT_EQ(code(stranger.decode_step(cache, model.weights, ins, outs)), ErrorCode::Mismatch);
  EXPECT_FALSE(cache.poisoned());
  EXPECT_EQ(cache.position(), 6u);
  EXPECT_TRUE(dump_valid(cache) == before);
}

}  // namespace
}  // namespace kvcompact::dsv4
