// DeepSeek-V4 math on the CPU: the float32 fast paths (sparse attention with sink, indexer scores, a
// compressor decode step) against their float64 oracles on the same inputs, in the same run. Counters:
// bytes of rows read per call, GB/s and GFLOP/s of the fast path.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kvcompact/dsv4/attention.hpp"
#include "kvcompact/dsv4/compressor.hpp"
#include "kvcompact/dsv4/indexer.hpp"

namespace kvcompact::dsv4 {
namespace {

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

struct AttentionCase {
  std::size_t heads, n_rows;
  std::vector<float> q, data, sink, out;
  std::vector<const float*> rows;
  RopeFrequencies rope = make_rope_frequencies(rope_config_for_ratio(4));
  AttentionCase(std::size_t h, std::size_t n)
      : heads(h), n_rows(n), q(random_floats(h * 512, 1)), data(random_floats(n * 512, 2)),
        sink(random_floats(h, 3)), out(h * 512) {
    for (std::size_t j = 0; j < n; ++j) rows.push_back(data.data() + j * 512);
  }
};

void set_counters(benchmark::State& state, double bytes, double flops) {
  state.counters["bytes"] = bytes;
  state.counters["GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// Args: heads, rows (window 128 + top-k or all compressed rows).
void BM_Dsv4AttentionFast(benchmark::State& state) {
  AttentionCase c(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  AttentionScratch scratch;
  RopeCosSin cs;
  rope_cos_sin(cs, c.rope, 12345);
  for (auto _ : state) {
    sparse_attention(c.out.data(), c.q.data(), c.heads, c.rows.data(), c.n_rows, c.sink.data(), &cs, scratch);
    benchmark::DoNotOptimize(c.out.data());
  }
  set_counters(state, static_cast<double>(c.n_rows * 512 * 4), 4.0 * static_cast<double>(c.heads * c.n_rows * 512));
}

void BM_Dsv4AttentionOracle(benchmark::State& state) {
  AttentionCase c(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  for (auto _ : state) {
    auto o = sparse_attention_f64(c.q, c.heads, c.rows, c.sink, &c.rope, 12345);
    benchmark::DoNotOptimize(o.data());
  }
}

// Args: index heads, visible rows.
void BM_Dsv4IndexerScoresFast(benchmark::State& state) {
  const std::size_t ih = static_cast<std::size_t>(state.range(0)), rows = static_cast<std::size_t>(state.range(1));
  const auto q = random_floats(ih * 128, 4), w = random_floats(ih, 5), keys = random_floats(rows * 128, 6);
  std::vector<float> scores(rows);
  std::vector<std::int32_t> sel(512);
  TopkScratch topk;
  for (auto _ : state) {
    indexer_scores_contiguous(scores.data(), q.data(), w.data(), keys.data(), rows, ih, 128);
    indexer_topk(sel.data(), sel.size(), scores.data(), rows, topk);
    benchmark::DoNotOptimize(sel.data());
  }
  set_counters(state, static_cast<double>(rows * 128 * 4), 2.0 * static_cast<double>(ih * rows * 128));
}

void BM_Dsv4IndexerScoresOracle(benchmark::State& state) {
  const std::size_t ih = static_cast<std::size_t>(state.range(0)), rows = static_cast<std::size_t>(state.range(1));
  const auto q = random_floats(ih * 128, 4), w = random_floats(ih, 5), keys = random_floats(rows * 128, 6);
  std::vector<std::int32_t> sel(512);
  for (auto _ : state) {
    auto s = indexer_scores_f64(q, w, keys, ih, 128);
    indexer_topk_f64(sel, s);
    benchmark::DoNotOptimize(sel.data());
  }
}

// One ratio-4 main-branch group: 4 decode steps, the last one pooling and finishing a row.
void BM_Dsv4CompressorGroupRatio4(benchmark::State& state) {
  CompressorParams p;
  const RopeFrequencies rope = make_rope_frequencies(rope_config_for_ratio(4));
  const auto ape = random_floats(4 * 1024, 7), a = random_floats(4 * 1024, 8), z = random_floats(4 * 1024, 9);
  std::vector<float> norm(512, 1.0f), kv(p.state_floats()), sc(p.state_floats()), row(512);
  p.ape = ape.data();
  p.norm_weight = norm.data();
  p.rope = &rope;
  compressor_reset_state(p, kv.data(), sc.data());
  std::int64_t t = 0;
  for (auto _ : state) {
    for (int i = 0; i < 4; ++i, ++t) {
      compressor_decode_step(p, kv.data(), sc.data(), t, a.data() + i * 1024, z.data() + i * 1024, row.data());
    }
    benchmark::DoNotOptimize(row.data());
  }
}

BENCHMARK(BM_Dsv4AttentionFast)->Args({64, 128 + 512})->Args({128, 128 + 1024})->Args({64, 128 + 8192});
BENCHMARK(BM_Dsv4AttentionOracle)->Args({64, 128 + 512});
BENCHMARK(BM_Dsv4IndexerScoresFast)->Args({64, 4096})->Args({64, 65536});
BENCHMARK(BM_Dsv4IndexerScoresOracle)->Args({64, 4096});
BENCHMARK(BM_Dsv4CompressorGroupRatio4);

}  // namespace
}  // namespace kvcompact::dsv4
