// One DeepSeek-V4-Flash decode step on the GPU through every attention layer (the real layer ratios, heads and
// index_topk of the preset): per ratio-4 layer indexer query preparation + scores over every visible indexer
// row + top-k + sparse attention over window + selected rows; per ratio-128 layer attention over window + all
// compressed rows; per ratio-0 layer attention over the window. Contexts 64K / 256K / 1M, batch 1 and 8, BF16
// (BF16 indexer rows) and FP8 (FP8 and MXFP4 indexer rows) storage. Every layer and sequence has its own
// buffers (nothing is shared through L2). Reports microseconds per step (CUDA graph replay and direct
// launches), the bytes the step must read, the HBM floor from the device-to-device copy bandwidth measured
// in the same run, and a 4096-token prefill chunk's throughput. CSV with --csv FILE; --quick: fewer cases;
// --only STORAGE BATCH CONTEXT: one decode case; --no-prefill / --prefill-only: without / only the prefill chunks
// (--only STORAGE 1 65536 --prefill-only: that storage's chunk alone). The rows repeat a pool of 1024 model-like
// rows, so every indexer score occurs many times over; --distinct-indexer-rows flips the signs of a random half
// of each indexer row's values (the rows stay on their grid), which makes the rows and the scores distinct, as a
// model's are (docs/cuda-dsv4-kernels-history.md, round 26: the top-k's path depends on ties).
// --price-without-prepare (pricing only): the query preparation runs once when the case is built and the steps
// leave its launches out. Every layer of this benchmark prepares the same query into the same workspace, so the
// step computes the same scores without them; the time saved is the most that preparing the query inside another
// kernel (the score kernel's prologue) could save (cuda-dsv4-kernels-history.md, round 36).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "fill.hpp"
#include "kvcompact/cuda/dsv4_kernels.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/dsv4/config.hpp"
#include "kvcompact/dsv4/fp_sim.hpp"
#include "kvcompact/dsv4/rope.hpp"
#include "kvcompact/dsv4/storage.hpp"

using namespace kvcompact;
namespace kd = kvcompact::dsv4;
namespace kc = kvcompact::cuda::dsv4;

namespace {

using bench::take;

cuda::DeviceBuffer alloc(std::uint64_t bytes) { return take(cuda::DeviceBuffer::allocate(std::max<std::uint64_t>(bytes, 256)), "allocate"); }

template <typename T>
cuda::DeviceBuffer upload(const std::vector<T>& v) {
  cuda::DeviceBuffer b = alloc(v.size() * sizeof(T));
  BENCH_CHECK(b.upload(v.data(), v.size() * sizeof(T)));
  return b;
}

// Fills `rows` rows of `row_bytes` at dst by repeating the pool (device) of `pool_rows` rows (doubling copies).
void replicate(std::uint8_t* dst, std::uint64_t rows, const std::uint8_t* pool, std::uint64_t pool_rows, std::uint64_t row_bytes,
               cudaStream_t s) {
  if (rows == 0) return;
  std::uint64_t done = std::min(rows, pool_rows);
  CUDA_CHECK(cudaMemcpyAsync(dst, pool, done * row_bytes, cudaMemcpyDeviceToDevice, s));
  while (done < rows) {
    const std::uint64_t n = std::min(done, rows - done);
    CUDA_CHECK(cudaMemcpyAsync(dst + done * row_bytes, dst, n * row_bytes, cudaMemcpyDeviceToDevice, s));
    done += n;
  }
}

// Model-like rows: attention rows FP8-simulated on dims [0, 448), indexer rows Hadamard + FP4.
std::vector<std::uint8_t> attention_pool(std::mt19937_64& rng, kd::RowStorage st, std::size_t n) {
  const std::size_t rb = kd::attention_row_bytes(st);
  std::vector<std::uint8_t> out(n * rb);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> row(512);
  for (std::size_t r = 0; r < n; ++r) {
    for (auto& x : row) x = d(rng);
    kd::simulate_main_row(row.data());
    if (!kd::encode_attention_row(row, st, std::span<std::uint8_t>(out.data() + r * rb, rb)).ok()) std::exit(1);
  }
  return out;
}
std::vector<std::uint8_t> indexer_pool(std::mt19937_64& rng, kd::IndexerStorage st, std::size_t n) {
  const std::size_t rb = kd::indexer_row_bytes(st);
  std::vector<std::uint8_t> out(n * rb);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> row(128);
  for (std::size_t r = 0; r < n; ++r) {
    for (auto& x : row) x = d(rng);
    kd::simulate_indexer_row(row.data());
    if (!kd::encode_indexer_row(row, st, std::span<std::uint8_t>(out.data() + r * rb, rb)).ok()) std::exit(1);
  }
  return out;
}

std::vector<float> normal(std::mt19937_64& rng, std::size_t n, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Storage {
  const char* name;
  kd::RowStorage rows;
  kd::IndexerStorage index;
};

// Everything one step (decode: `batch` sequences at position t; prefill: `tokens` consecutive tokens of one
// sequence ending at t) needs, for every layer.
struct Step {
  const kd::ModelConfig* model = nullptr;
  Storage st{};
  std::uint32_t batch = 1;   // sequences
  std::uint32_t tokens = 1;  // tokens per call (decode: batch; prefill: chunk)
  std::uint32_t heads = 64, index_heads = 64, topk = 512;
  std::int64_t t = 0;  // last position
  std::uint64_t bytes = 0;  // HBM bytes the step must read
  cuda::DeviceBuffer att, idx, chunk, pool_a, pool_i;
  std::vector<cuda::DeviceBuffer> token_rows;  // per layer [tokens]
  cuda::DeviceBuffer q, qi, w, sink, qws, scores, tws, indices, aws, out, fallback;
  std::uint64_t qws_bytes = 0, tws_bytes = 0, aws_bytes = 0;
  std::uint32_t max_visible = 0, score_stride = 1;
  std::vector<std::array<float, 32>> inv_freq;  // per layer
  bool prepare_in_step = true;  // false: --price-without-prepare (prepared once in build)

  void prepare_query(cudaStream_t s) {
    BENCH_CHECK(kc::indexer_prepare_queries(static_cast<const float*>(qi.data()), tokens, index_heads, false, qws.data(),
                                            qws_bytes, s));
  }
  void enqueue_indexer(std::size_t layer, cudaStream_t s) {
    const auto* tr = static_cast<const kc::TokenRows*>(token_rows[layer].data());
    if (prepare_in_step) prepare_query(s);
    kc::IndexerScoreArgs sa;
    sa.tokens = tr;
    sa.count = tokens;
    sa.heads = index_heads;
    sa.weights = static_cast<const float*>(w.data());
    sa.query_workspace = qws.data();
    sa.query_workspace_bytes = qws_bytes;
    sa.storage = st.index;
    sa.max_visible = max_visible;
    sa.scores = static_cast<float*>(scores.data());
    sa.score_stride = score_stride;
    sa.fallback_rows = static_cast<unsigned long long*>(fallback.data());
    BENCH_CHECK(kc::indexer_scores(sa, s));
    kc::TopkArgs ta;
    ta.scores = sa.scores;
    ta.score_stride = score_stride;
    ta.count = tokens;
    ta.tokens = tr;
    ta.ratio = 4;
    ta.max_rows = max_visible;
    ta.k = topk;
    ta.out = static_cast<std::int32_t*>(indices.data());
    ta.out_stride = topk;
    BENCH_CHECK(kc::indexer_topk(ta, tws.data(), tws_bytes, s));
  }
  void enqueue_attention(std::size_t layer, cudaStream_t s) {
    const std::uint32_t m = model->compress_ratios[layer];
    kc::AttentionArgs a;
    a.tokens = static_cast<const kc::TokenRows*>(token_rows[layer].data());
    a.count = tokens;
    a.heads = heads;
    a.q = static_cast<const float*>(q.data());
    a.sink = static_cast<const float*>(sink.data());
    a.storage = st.rows;
    a.ratio = m;
    a.indices = static_cast<const std::int32_t*>(indices.data());
    a.index_stride = topk;
    a.index_topk = topk;
    a.inv_freq = inv_freq[layer];
    a.max_rows = static_cast<std::uint32_t>(128 + (m == 4 ? std::min<std::int64_t>(topk, (t + 1) / 4) : m == 128 ? (t + 1) / 128 : 0));
    a.out = static_cast<float*>(out.data());
    BENCH_CHECK(kc::sparse_attention(a, aws.data(), aws_bytes, s));
  }
  // what: 0 everything, 1 indexer only, 2 attention only.
  void enqueue(int what, cudaStream_t s) {
    for (std::size_t l = 0; l < model->compress_ratios.size(); ++l) {
      if (what != 2 && model->compress_ratios[l] == 4) enqueue_indexer(l, s);
      if (what != 1) enqueue_attention(l, s);
    }
  }
};

// prefill_chunk == 0: decode of `batch` sequences at t = ctx - 1; else one sequence, chunk ending at ctx - 1.
void build(Step& S, const kd::ModelConfig& model, const Storage& st, std::uint64_t ctx, std::uint32_t batch,
           std::uint32_t prefill_chunk, bool distinct_indexer_rows, bool prepare_in_step, std::mt19937_64& rng) {
  S.model = &model;
  S.st = st;
  S.batch = prefill_chunk == 0 ? batch : 1;
  S.tokens = prefill_chunk == 0 ? batch : prefill_chunk;
  S.heads = model.num_attention_heads != 0 ? model.num_attention_heads : 64;
  S.index_heads = model.index_n_heads;
  S.topk = model.index_topk;
  S.t = static_cast<std::int64_t>(ctx) - 1;
  const std::uint64_t rb = kd::attention_row_bytes(st.rows), ib = kd::indexer_row_bytes(st.index);
  const std::int64_t first = S.t - static_cast<std::int64_t>(S.tokens) + 1;  // first token of the call
  const std::size_t L = model.compress_ratios.size();
  // Row counts per layer and sequence: ring 128 + compressed ctx / m; indexer ctx / 4.
  std::uint64_t att_rows = 0, idx_rows = 0;
  std::vector<std::uint64_t> att_off(L), idx_off(L);
  for (std::size_t l = 0; l < L; ++l) {
    const std::uint32_t m = model.compress_ratios[l];
    att_off[l] = att_rows;
    idx_off[l] = idx_rows;
    att_rows += S.batch * (128 + (m == 0 ? 0 : ctx / m));
    if (m == 4) idx_rows += S.batch * (ctx / 4);
  }
  S.att = alloc(att_rows * rb);
  S.idx = alloc(idx_rows * ib);
  S.pool_a = upload(attention_pool(rng, st.rows, 1024));
  S.pool_i = upload(indexer_pool(rng, st.index, 1024));
  replicate(static_cast<std::uint8_t*>(S.att.data()), att_rows, static_cast<const std::uint8_t*>(S.pool_a.data()), 1024, rb, nullptr);
  replicate(static_cast<std::uint8_t*>(S.idx.data()), idx_rows, static_cast<const std::uint8_t*>(S.pool_i.data()), 1024, ib, nullptr);
  if (distinct_indexer_rows && idx_rows != 0) {
    const int format = st.index == kd::IndexerStorage::Bf16 ? 0 : st.index == kd::IndexerStorage::Fp8 ? 1 : 2;
    CUDA_CHECK(static_cast<cudaError_t>(bench::flip_indexer_signs(S.idx.data(), idx_rows, format, ib, rng())));
  }
  S.chunk = alloc(std::uint64_t{S.tokens} * rb * (prefill_chunk == 0 ? 0 : 1));
  if (prefill_chunk != 0) {
    replicate(static_cast<std::uint8_t*>(S.chunk.data()), S.tokens, static_cast<const std::uint8_t*>(S.pool_a.data()), 1024, rb, nullptr);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  S.bytes = 0;
  S.max_visible = static_cast<std::uint32_t>((S.t + 1) / 4);
  for (std::size_t l = 0; l < L; ++l) {
    const std::uint32_t m = model.compress_ratios[l];
    std::vector<kc::TokenRows> tr(S.tokens);
    for (std::uint32_t i = 0; i < S.tokens; ++i) {
      const std::uint32_t sq = prefill_chunk == 0 ? i : 0;
      const std::uint64_t base = att_off[l] + sq * (128 + (m == 0 ? 0 : ctx / m));
      tr[i].window_ring = static_cast<std::uint8_t*>(S.att.data()) + base * rb;
      tr[i].compressed_rows = static_cast<std::uint8_t*>(S.att.data()) + (base + 128) * rb;
      tr[i].indexer_rows = m == 4 ? static_cast<std::uint8_t*>(S.idx.data()) + (idx_off[l] + sq * (ctx / 4)) * ib : nullptr;
      tr[i].position = prefill_chunk == 0 ? S.t : first + i;
      tr[i].chunk_rows = prefill_chunk == 0 ? nullptr : S.chunk.data();
      tr[i].chunk_start = prefill_chunk == 0 ? S.t : first;
      tr[i].ring_capacity = 128;
    }
    S.token_rows.push_back(upload(tr));
    std::array<float, 32> f{};
    const auto fr = kd::make_rope_frequencies(kd::rope_config_for_layer(model, m));
    for (std::size_t i = 0; i < 32; ++i) f[i] = fr.inv_freq[i];
    S.inv_freq.push_back(f);
    // Bytes a decode step must read per sequence (prefill: the rows of the whole chunk's union, i.e. the
    // compressed / indexer rows once, the chunk's own rows once).
    const std::uint64_t vis = static_cast<std::uint64_t>(S.t + 1) / (m == 0 ? 1 : m);
    std::uint64_t per = 0;
    if (m == 0) per = 128 * rb;
    if (m == 128) per = (128 + vis) * rb;
    if (m == 4) per = vis * ib + (128 + std::min<std::uint64_t>(S.topk, vis)) * rb;
    S.bytes += per * S.batch;
  }
  S.q = upload(normal(rng, std::size_t{S.tokens} * S.heads * 512, 1.0f));
  S.qi = upload(normal(rng, std::size_t{S.tokens} * S.index_heads * 128, 1.0f));
  S.w = upload(normal(rng, std::size_t{S.tokens} * S.index_heads, 1.0f / std::sqrt(128.0f * 64.0f)));
  S.sink = upload(normal(rng, S.heads, 1.0f));
  S.qws_bytes = kc::indexer_query_workspace_bytes(S.tokens);
  S.qws = alloc(S.qws_bytes);
  S.score_stride = std::max<std::uint32_t>(S.max_visible, 1);
  S.scores = alloc(std::uint64_t{S.tokens} * S.score_stride * 4);
  S.tws_bytes = kc::topk_workspace_bytes(S.tokens, S.max_visible, S.topk);
  S.tws = alloc(S.tws_bytes);
  S.indices = alloc(std::uint64_t{S.tokens} * S.topk * 4);
  const std::uint32_t max_rows = static_cast<std::uint32_t>(128 + std::max<std::int64_t>(S.topk, (S.t + 1) / 128));
  S.aws_bytes = 0;
  for (std::uint32_t r : {128u, max_rows, static_cast<std::uint32_t>(128 + std::min<std::int64_t>(S.topk, (S.t + 1) / 4)),
                          static_cast<std::uint32_t>(128 + (S.t + 1) / 128)}) {
    S.aws_bytes = std::max(S.aws_bytes, kc::attention_workspace_bytes(S.tokens, S.heads, r));
  }
  S.aws = alloc(S.aws_bytes);
  S.out = alloc(std::uint64_t{S.tokens} * S.heads * 512 * 4);
  S.fallback = alloc(8);
  CUDA_CHECK(cudaMemset(S.fallback.data(), 0, 8));
  S.prepare_in_step = prepare_in_step;
  if (!prepare_in_step) {
    S.prepare_query(nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
}

// Median of a captured CUDA graph of the whole step; -1 if capture is not possible.
double graph_us(Step& S, cudaStream_t s, int reps) {
  cudaGraph_t g = nullptr;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1;
  S.enqueue(0, s);
  if (cudaStreamEndCapture(s, &g) != cudaSuccess || g == nullptr) {
    (void)cudaGetLastError();
    return -1;
  }
  cudaGraphExec_t ge = nullptr;
  if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaGraphDestroy(g);
    return -1;
  }
  const double us = bench::median_us(2, reps, [&] { CUDA_CHECK(cudaGraphLaunch(ge, s)); }, s);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  bool quick = false, no_prefill = false, prefill_only = false, distinct_indexer_rows = false;
  bool prepare_in_step = true;
  std::string only_storage;
  std::uint64_t only_ctx = 0;
  std::uint32_t only_batch = 0;
  for (int i = 1; i < argc; ++i) {
    // --only STORAGE BATCH CONTEXT: one decode case, no prefill (for a profiler).
    if (std::strcmp(argv[i], "--only") == 0 && i + 3 < argc) {
      only_storage = argv[++i];
      only_batch = static_cast<std::uint32_t>(std::atoi(argv[++i]));
      only_ctx = static_cast<std::uint64_t>(std::atoll(argv[++i]));
      no_prefill = true;
    }
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv_path = argv[++i];
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--no-prefill") == 0) no_prefill = true;
    // --prefill-only: the prefill chunks alone (for an A/B of the prefill path); after --only STORAGE ..., that
    // storage's chunk alone (for a profiler).
    if (std::strcmp(argv[i], "--prefill-only") == 0) prefill_only = true;
    if (std::strcmp(argv[i], "--distinct-indexer-rows") == 0) distinct_indexer_rows = true;
    if (std::strcmp(argv[i], "--price-without-prepare") == 0) prepare_in_step = false;
  }
  if (prefill_only) no_prefill = false;
  (void)bench::require_device();
  const kd::ModelConfig model = take(kd::preset_config("deepseek-v4-flash"), "preset");
  std::printf("model: %s, %zu layers (%u x ratio 0, %u x 4, %u x 128), %u heads, indexer %u heads, top-%u\n",
              model.name.c_str(), model.compress_ratios.size(), model.count_layers_with_ratio(0),
              model.count_layers_with_ratio(4), model.count_layers_with_ratio(128),
              model.num_attention_heads, model.index_n_heads, model.index_topk);
  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (csv != nullptr) std::fprintf(csv, "kind,storage,batch,context,us,graph_us,indexer_us,attention_us,bytes,floor_us,ratio\n");

  double copy_gbps = 1.0;
  {
    const bench::CopyBandwidth copy = bench::measure_copy_bandwidth(2ull << 30);
    copy_gbps = copy.gbps;
    if (csv != nullptr) std::fprintf(csv, "copy,-,-,-,%.3f,0,0,0,%llu,0,0\n", copy.us, static_cast<unsigned long long>(copy.bytes));
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937_64 rng(12345);
  const Storage storages[] = {{"bf16", kd::RowStorage::Bf16, kd::IndexerStorage::Bf16},
                              {"fp8", kd::RowStorage::Fp8, kd::IndexerStorage::Fp8},
                              {"fp8+mxfp4", kd::RowStorage::Fp8, kd::IndexerStorage::Mxfp4}};
  std::vector<std::uint64_t> contexts = {65536, 262144, 1048576};
  std::vector<std::uint32_t> batches = {1, 8};
  if (quick) contexts = {65536, 1048576};
  if (only_batch != 0) {
    contexts = {only_ctx};
    batches = {only_batch};
  }
  if (prefill_only) batches.clear();
  const int reps = quick ? 5 : 10;
  std::printf("\ndecode step, all %zu layers (us = direct launches; graph = one CUDA graph; floor = bytes / copy bw)\n",
              model.compress_ratios.size());
  std::printf("%-10s %5s %8s %9s %9s %9s %9s %11s %8s %6s\n", "storage", "batch", "context", "us", "graph_us",
              "index_us", "attn_us", "bytes", "floor_us", "ratio");
  for (const Storage& st : storages) {
    if (!only_storage.empty() && only_storage != st.name) continue;
    for (std::uint64_t ctx : contexts) {
      for (std::uint32_t b : batches) {
        Step S;
        build(S, model, st, ctx, b, 0, distinct_indexer_rows, prepare_in_step, rng);
        const double us = bench::median_us(2, reps, [&] { S.enqueue(0, stream); }, stream);
        const double ius = bench::median_us(1, reps, [&] { S.enqueue(1, stream); }, stream);
        const double aus = bench::median_us(1, reps, [&] { S.enqueue(2, stream); }, stream);
        const double gus = graph_us(S, stream, reps);
        unsigned long long fb = 0;
        CUDA_CHECK(cudaMemcpy(&fb, S.fallback.data(), 8, cudaMemcpyDeviceToHost));
        const double floor_us = static_cast<double>(S.bytes) / (copy_gbps * 1e3);
        const double best = gus > 0 ? std::min(us, gus) : us;
        std::printf("%-10s %5u %8llu %9.1f %9.1f %9.1f %9.1f %11llu %8.1f %6.2f%s\n", st.name, b,
                    static_cast<unsigned long long>(ctx), us, gus, ius, aus, static_cast<unsigned long long>(S.bytes),
                    floor_us, best / floor_us, fb != 0 ? "  (scalar-path rows!)" : "");
        std::fflush(stdout);
        if (csv != nullptr) {
          std::fprintf(csv, "decode,%s,%u,%llu,%.2f,%.2f,%.2f,%.2f,%llu,%.2f,%.3f\n", st.name, b,
                       static_cast<unsigned long long>(ctx), us, gus, ius, aus, static_cast<unsigned long long>(S.bytes),
                       floor_us, best / floor_us);
          std::fflush(csv);
        }
      }
    }
  }
  if (!no_prefill) {
    std::printf("\nprefill: one 4096-token chunk ending at context 65536, all layers (one sequence)\n");
    for (const Storage& st : storages) {
      if (prefill_only && !only_storage.empty() && only_storage != st.name) continue;
      Step S;
      build(S, model, st, 65536, 1, 4096, distinct_indexer_rows, prepare_in_step, rng);
      const double us = bench::median_us(1, 2, [&] { S.enqueue(0, stream); }, stream);
      const double ius = bench::median_us(0, 1, [&] { S.enqueue(1, stream); }, stream);
      const double aus = bench::median_us(0, 1, [&] { S.enqueue(2, stream); }, stream);
      std::printf("%-10s prefill 4096 tokens: %.0f us (indexer %.0f, attention %.0f), %.0f tokens/s\n", st.name, us, ius,
                  aus, 4096.0 / (us * 1e-6));
      if (csv != nullptr) {
        std::fprintf(csv, "prefill4096,%s,1,65536,%.2f,0,%.2f,%.2f,%llu,0,0\n", st.name, us, ius, aus,
                     static_cast<unsigned long long>(S.bytes));
        std::fflush(csv);
      }
    }
  }
  if (csv != nullptr) std::fclose(csv);
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
