// TurboQuant CPU attention: the packed fast path against exact fp32 attention over the same KV, on the
// same shapes, in the same run. Each fast-path case reports the bytes it reads, the achieved GB/s, and
// the exact baseline's time and the ratio (exact / fast, > 1 means the packed path is faster).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kvcompact/tq/attention.hpp"
#include "kvcompact/tq/cache.hpp"

namespace kvcompact::tq {
namespace {

constexpr std::uint32_t kHeadDim = 128;
constexpr std::uint32_t kKvHeads = 2;
constexpr std::uint32_t kQHeads = 8;

struct Setup {
  std::uint32_t batch = 0, context = 0, rows = 0;
  std::vector<float> keys, values, queries, out;  // keys / values [batch][context, kv_heads, d]
  TurboQuantCache cache;
  std::vector<AttentionRequest> requests;
  std::vector<DenseAttentionRequest> dense;
};

Setup make_setup(const char* mode, std::uint32_t batch, std::uint32_t context, std::uint32_t rows) {
  auto config = QuantConfig::parse(mode, 7);
  CacheShape shape;
  shape.head_dim = kHeadDim;
  shape.kv_heads = {kKvHeads};
  shape.sequences = batch;
  shape.capacity = context;
  auto cache = TurboQuantCache::create(shape, *config);
  Setup s{batch, context, rows, {}, {}, {}, {}, std::move(*cache), {}, {}};
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t per_seq = static_cast<std::size_t>(context) * kKvHeads * kHeadDim;
  s.keys.resize(per_seq * batch);
  s.values.resize(per_seq * batch);
  for (float& x : s.keys) x = normal(rng);
  for (float& x : s.values) x = normal(rng);
  s.queries.resize(static_cast<std::size_t>(batch) * rows * kQHeads * kHeadDim);
  for (float& x : s.queries) x = normal(rng);
  s.out.resize(s.queries.size());
  for (std::uint32_t b = 0; b < batch; ++b) {
    (void)s.cache.append(0, b, 0, context, DType::F32, s.keys.data() + b * per_seq, s.values.data() + b * per_seq);
    const std::size_t q = static_cast<std::size_t>(b) * rows * kQHeads * kHeadDim;
    s.requests.push_back({b, context - rows, rows, s.queries.data() + q, s.out.data() + q});
    s.dense.push_back({context, context - rows, rows, s.keys.data() + b * per_seq, s.values.data() + b * per_seq,
                       s.queries.data() + q, s.out.data() + q});
  }
  return s;
}

AttentionOptions options() {
  AttentionOptions o;
  o.q_heads = kQHeads;
  return o;
}

double exact_seconds(const Setup& s) {
  const AttentionOptions o = options();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)dense_attention_f32(kHeadDim, kKvHeads, s.dense, o);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Args: batch, context, rows per sequence.
void run_fast(benchmark::State& state, const char* mode) {
  Setup s = make_setup(mode, static_cast<std::uint32_t>(state.range(0)), static_cast<std::uint32_t>(state.range(1)),
                       static_cast<std::uint32_t>(state.range(2)));
  const AttentionOptions o = options();
  for (auto _ : state) {
    benchmark::DoNotOptimize(s.cache.attention(0, s.requests, o).ok());
    benchmark::ClobberMemory();
  }
  const double bytes = static_cast<double>(s.batch) * s.context * kKvHeads * s.cache.layout(0)->token.total();
  const double exact = exact_seconds(s);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes * static_cast<double>(state.iterations())));
  state.counters["exact_us"] = exact * 1e6;
  state.counters["speedup"] = benchmark::Counter(exact * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
  state.counters["flop/s"] = benchmark::Counter(
      4.0 * s.batch * s.context * kQHeads * kHeadDim * s.rows * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

void run_exact(benchmark::State& state) {
  Setup s = make_setup("seed", static_cast<std::uint32_t>(state.range(0)), static_cast<std::uint32_t>(state.range(1)),
                       static_cast<std::uint32_t>(state.range(2)));
  const AttentionOptions o = options();
  for (auto _ : state) {
    benchmark::DoNotOptimize(dense_attention_f32(kHeadDim, kKvHeads, s.dense, o).ok());
    benchmark::ClobberMemory();
  }
  const double bytes = static_cast<double>(s.batch) * s.context * kKvHeads * kHeadDim * 2 * sizeof(float);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes * static_cast<double>(state.iterations())));
  state.counters["flop/s"] = benchmark::Counter(
      4.0 * s.batch * s.context * kQHeads * kHeadDim * s.rows * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "context", "rows"});
  b->Args({1, 1024, 1})->Args({1, 8192, 1})->Args({1, 32768, 1})->Args({8, 4096, 1})->Args({1, 4096, 16});
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK_CAPTURE(run_fast, seed_prod3_mse2, "seed")->Apply(shapes);
BENCHMARK_CAPTURE(run_fast, mse4_mse4_nc, "k=mse4,v=mse4,nc")->Apply(shapes);
BENCHMARK_CAPTURE(run_fast, prod4_mse4, "k=prod4,v=mse4")->Apply(shapes);
BENCHMARK(run_exact)->Apply(shapes);

}  // namespace
}  // namespace kvcompact::tq
