// End-to-end decode step through the GPU-resident TurboQuant cache (DeviceCache), as a serving loop runs it:
// per layer, append every sequence's new token (bf16 K and V), then decode attention for all sequences. The
// ways, host wall-clock per step (append waits for its encode, so the step's end is a host event anyway):
//   append    - DeviceCache::append once per sequence (one encode launch and one wait each), then decode;
//   batch     - DeviceCache::append_batch for all sequences of the layer (one wait), then decode;
//   deferred  - DeviceCache::append_deferred per layer, then decode; one finish_appends (one wait) per step;
//   graph     - the whole step (append_at_length and decode per layer) captured once in a CUDA graph and
//               replayed: one launch per step, the lengths stay on the device (sync_lengths after the runs);
//   graph_sync - the graph's replay followed by sync_lengths every step (the host learns each step's lengths);
//   decode    - decode alone (no append): the attention kernels' share of the step.
// Llama-3-8B attention shapes (32 query / 8 KV heads, head_dim 128), 8 layers, contexts prefilled with random
// rows. Prints µs per step, per layer (graph) and deferred ÷ graph; CSV with --csv.
// Usage: kvcompact_cuda_tq_step_bench [--quick] [--csv FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "fill.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq_cache.hpp"
#include "kvcompact/tq/config.hpp"

namespace {

using namespace kvcompact;
using bench::take;

constexpr std::uint32_t kLayers = 8, kKvHeads = 8, kQHeads = 32, kHeadDim = 128;
constexpr std::uint32_t kMaxBatch = 64;  // (batch 64: two encode launches per layer, kEncodeBatchMax = 32)

// Median host wall-clock µs of `reps` calls of step() after `warmup` untimed ones; each call ends with a device
// synchronisation, so the time covers the whole step's GPU work.
template <class F>
double median_step_us(int warmup, int reps, F&& step) {
  for (int i = 0; i < warmup; ++i) {
    step();
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    step();
    CUDA_CHECK(cudaDeviceSynchronize());
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv_path = argv[++i];
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
  }
  (void)bench::require_device();
  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (csv != nullptr) std::fprintf(csv, "mode,batch,context,layers,way,step_us,layer_us\n");
  const int warmup = 2, reps = quick ? 5 : 15;
  const std::vector<std::uint32_t> batches = quick ? std::vector<std::uint32_t>{1, 8} : std::vector<std::uint32_t>{1, 8, 32, kMaxBatch};
  const std::uint32_t context = quick ? 4096 : 32768;
  const std::vector<bench::BenchMode> modes = bench::bench_modes();

  // Random bf16 rows: the prefill source (context rows) and one new token per sequence (up to kMaxBatch).
  const std::uint64_t row_elems = std::uint64_t{kKvHeads} * kHeadDim;
  auto prefill_k = take(cuda::DeviceBuffer::allocate(context * row_elems * 2), "allocate prefill keys");
  auto prefill_v = take(cuda::DeviceBuffer::allocate(context * row_elems * 2), "allocate prefill values");
  CUDA_CHECK(static_cast<cudaError_t>(bench::fill_bf16_random(prefill_k.data(), context * row_elems, 1)));
  CUDA_CHECK(static_cast<cudaError_t>(bench::fill_bf16_random(prefill_v.data(), context * row_elems, 2)));
  auto token_k = take(cuda::DeviceBuffer::allocate(kMaxBatch * row_elems * 2), "allocate token keys");
  auto token_v = take(cuda::DeviceBuffer::allocate(kMaxBatch * row_elems * 2), "allocate token values");
  CUDA_CHECK(static_cast<cudaError_t>(bench::fill_bf16_random(token_k.data(), kMaxBatch * row_elems, 3)));
  CUDA_CHECK(static_cast<cudaError_t>(bench::fill_bf16_random(token_v.data(), kMaxBatch * row_elems, 4)));

  std::printf("decode step through DeviceCache: %u layers, %u query / %u KV heads, head_dim %u, context %u\n",
              kLayers, kQHeads, kKvHeads, kHeadDim, context);
  std::printf("%-12s %5s %8s %10s %10s %11s %10s %13s %10s %9s %9s\n", "mode", "batch", "context", "append_us",
              "batch_us", "deferred_us", "graph_us", "graph_sync_us", "decode_us", "per_layer", "speedup");
  for (const bench::BenchMode& mode : modes) {
    for (std::uint32_t b : batches) {
      tq::CacheShape shape;
      shape.head_dim = kHeadDim;
      shape.kv_heads.assign(kLayers, kKvHeads);
      shape.sequences = b;
      shape.capacity = context + 5 * static_cast<std::uint32_t>(warmup + reps) + 8;  // five appending ways
      auto cache = take(cuda::tq::DeviceCache::create(shape, mode.config), "DeviceCache::create");
      for (std::uint32_t l = 0; l < kLayers; ++l) {
        for (std::uint32_t s = 0; s < b; ++s) {
          BENCH_CHECK(cache.append(l, s, 0, context, DType::BF16, prefill_k.data(), prefill_v.data()));
        }
      }
      std::vector<cuda::tq::DecodePlan> plans;
      std::uint64_t ws_bytes = 0;
      for (std::uint32_t l = 0; l < kLayers; ++l) {
        plans.push_back(take(cache.plan_decode(l, kQHeads, shape.capacity), "plan_decode"));
        ws_bytes = std::max<std::uint64_t>(ws_bytes, plans.back().workspace_bytes);
      }
      auto ws = take(cuda::DeviceBuffer::allocate(std::max<std::uint64_t>(ws_bytes, 4)), "allocate workspace");
      auto queries = take(cuda::DeviceBuffer::allocate(std::uint64_t{b} * kQHeads * kHeadDim * 4), "allocate queries");
      auto out = take(cuda::DeviceBuffer::allocate(std::uint64_t{b} * kQHeads * kHeadDim * 4), "allocate output");
      BENCH_CHECK(queries.fill(0));
      const auto* q = static_cast<const float*>(queries.data());
      auto* o = static_cast<float*>(out.data());
      auto token = [&](const cuda::DeviceBuffer& buf, std::uint32_t s) {
        return static_cast<const std::uint8_t*>(buf.data()) + std::uint64_t{s} * row_elems * 2;
      };
      auto decode_all = [&](std::uint32_t l) {
        BENCH_CHECK(cache.decode(l, plans[l], q, nullptr, 0.0f, o, ws.data()));
      };
      const double append_us = median_step_us(warmup, reps, [&] {
        for (std::uint32_t l = 0; l < kLayers; ++l) {
          for (std::uint32_t s = 0; s < b; ++s) {
            BENCH_CHECK(cache.append(l, s, cache.length(l, s), 1, DType::BF16, token(token_k, s), token(token_v, s)));
          }
          decode_all(l);
        }
      });
      std::vector<cuda::tq::AppendRequest> requests(b);
      const double batch_us = median_step_us(warmup, reps, [&] {
        for (std::uint32_t l = 0; l < kLayers; ++l) {
          for (std::uint32_t s = 0; s < b; ++s) {
            requests[s] = {s, cache.length(l, s), 1, DType::BF16, token(token_k, s), token(token_v, s)};
          }
          BENCH_CHECK(cache.append_batch(l, requests));
          decode_all(l);
        }
      });
      const double deferred_us = median_step_us(warmup, reps, [&] {
        for (std::uint32_t l = 0; l < kLayers; ++l) {
          for (std::uint32_t s = 0; s < b; ++s) {
            requests[s] = {s, cache.length(l, s), 1, DType::BF16, token(token_k, s), token(token_v, s)};
          }
          BENCH_CHECK(cache.append_deferred(l, requests));
          decode_all(l);
        }
        BENCH_CHECK(cache.finish_appends());
      });
      // The step captured once: per layer the appends at the device lengths and decode, on a stream of its own.
      cudaStream_t stream = nullptr;
      CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      std::vector<cuda::tq::LengthAppend> at_length(b);
      for (std::uint32_t s = 0; s < b; ++s) at_length[s] = {s, 1, DType::BF16, token(token_k, s), token(token_v, s)};
      CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (std::uint32_t l = 0; l < kLayers; ++l) {
        BENCH_CHECK(cache.append_at_length(l, at_length, shape.capacity, stream));
        BENCH_CHECK(cache.decode(l, plans[l], q, nullptr, 0.0f, o, ws.data(), stream));
      }
      cudaGraph_t graph = nullptr;
      CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec = nullptr;
      CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      const std::uint32_t before = cache.length(0, 0);
      const double graph_us = median_step_us(warmup, reps, [&] { CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
      const double graph_sync_us = median_step_us(warmup, reps, [&] {
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        BENCH_CHECK(cache.sync_lengths(stream));
      });
      BENCH_CHECK(cache.sync_lengths(stream));
      if (cache.length(0, 0) != before + 2 * static_cast<std::uint32_t>(warmup + reps)) {
        std::fprintf(stderr, "graph replays appended %u rows, expected %d\n", cache.length(0, 0) - before,
                     2 * (warmup + reps));
        return 1;
      }
      CUDA_CHECK(cudaGraphExecDestroy(exec));
      CUDA_CHECK(cudaGraphDestroy(graph));
      CUDA_CHECK(cudaStreamDestroy(stream));
      const double decode_us = median_step_us(warmup, reps, [&] {
        for (std::uint32_t l = 0; l < kLayers; ++l) decode_all(l);
      });
      std::printf("%-12s %5u %8u %10.1f %10.1f %11.1f %10.1f %13.1f %10.1f %9.1f %8.2fx\n", mode.name, b, context,
                  append_us, batch_us, deferred_us, graph_us, graph_sync_us, decode_us, graph_us / kLayers,
                  deferred_us / graph_us);
      std::fflush(stdout);
      if (csv != nullptr) {
        const char* ways[] = {"append", "batch", "deferred", "graph", "graph_sync", "decode"};
        const double us[] = {append_us, batch_us, deferred_us, graph_us, graph_sync_us, decode_us};
        for (int w = 0; w < 6; ++w) {
          std::fprintf(csv, "%s,%u,%u,%u,%s,%.2f,%.2f\n", mode.name, b, context, kLayers, ways[w], us[w], us[w] / kLayers);
        }
        std::fflush(csv);
      }
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}
