// CUDA TurboQuant benchmark: fused decode attention with Llama-3-8B heads (32 query / 8 KV heads, d 128) at
// batch {1, 8, 32, 64} × context {4K, 32K, 128K} for the recommended and the seed mode, encode throughput,
// and the device-to-device copy bandwidth of the same run (the roofline). Prints a table and writes CSV
// (--csv FILE). Each case rotates over enough buffer copies that the data cannot sit in L2; times are the
// median of CUDA-event-timed single launches after warm-up. scripts/gpu/run_all.sh runs it with the bf16
// SDPA baseline.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "fill.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/config.hpp"
#include "kvcompact/tq/layout.hpp"

namespace {

using namespace kvcompact;

using bench::median_us;
using bench::regions_of;
using bench::take;

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  bool quick = false;
  struct Case { std::string mode; unsigned batch, ctx; };
  std::vector<Case> only_cases;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv_path = argv[++i];
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    // --only MODE BATCH CONTEXT (repeatable): these decode cases and nothing else (profiler, A/B runs).
    if (std::strcmp(argv[i], "--only") == 0 && i + 3 < argc) {
      Case c;
      c.mode = argv[i + 1];
      c.batch = static_cast<unsigned>(std::atoi(argv[i + 2]));
      c.ctx = static_cast<unsigned>(std::atoi(argv[i + 3]));
      only_cases.push_back(c);
      i += 3;
    }
  }
  const bool only = !only_cases.empty();
  auto wanted = [&](const std::string& mode, unsigned batch, unsigned ctx) {
    if (!only) return true;
    for (const Case& c : only_cases)
      if (c.mode == mode && c.batch == batch && c.ctx == ctx) return true;
    return false;
  };
  const cuda::DeviceProperties props = bench::require_device();
  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (csv != nullptr) std::fprintf(csv, "kind,mode,batch,context,us,bytes,gbps,bf16_bytes,splits\n");

  // Roofline: device-to-device copy of 4 GiB, counting bytes read + written.
  double copy_gbps = 1.0;
  if (!only) {
    const bench::CopyBandwidth copy = bench::measure_copy_bandwidth(4ull << 30);
    copy_gbps = copy.gbps;
    if (csv != nullptr) std::fprintf(csv, "copy,-,-,-,%.3f,%llu,%.1f,0,0\n", copy.us, static_cast<unsigned long long>(copy.bytes), copy_gbps);
  }

  const std::uint32_t head_dim = 128, kv_heads = 8, q_heads = 32;
  const std::vector<bench::BenchMode> modes = bench::bench_modes();
  std::vector<std::uint32_t> batches = bench::decode_table_batches();
  std::vector<std::uint32_t> contexts = bench::decode_table_contexts();
  if (quick) {
    batches = {1, 8};
    contexts = {4096, 32768};
  }
  if (only) {
    batches.clear();
    contexts.clear();
    for (const Case& c : only_cases) {
      if (std::find(batches.begin(), batches.end(), c.batch) == batches.end()) batches.push_back(c.batch);
      if (std::find(contexts.begin(), contexts.end(), c.ctx) == contexts.end()) contexts.push_back(c.ctx);
    }
  }
  std::printf("\n%-12s %5s %7s %5s %10s %12s %9s %7s\n", "mode", "batch", "context", "split", "us", "bytes", "GB/s", "%copy");
  for (const bench::BenchMode& mode : modes) {
    if (only && !std::any_of(only_cases.begin(), only_cases.end(), [&](const Case& c) { return c.mode == mode.name; }))
      continue;
    auto codec = take(tq::LayerCodec::create(head_dim, mode.config, 0), "LayerCodec::create");
    auto dcodec = take(cuda::tq::DeviceCodec::create(codec), "DeviceCodec::create");
    for (std::uint32_t batch : batches) {
      for (std::uint32_t ctx : contexts) {
        if (!wanted(mode.name, batch, ctx)) continue;
        auto layout = take(tq::plan_layer_layout(head_dim, kv_heads, batch, ctx, mode.config), "plan_layer_layout");
        const std::uint64_t layer_bytes = cuda::tq::layer_buffer_bytes(layout);
        const std::uint64_t copies = std::clamp<std::uint64_t>((512ull << 20) / layer_bytes + 1, 1, 128);
        std::vector<cuda::DeviceBuffer> layers;
        for (std::uint64_t c = 0; c < copies; ++c) {
          layers.push_back(take(cuda::DeviceBuffer::allocate(layer_bytes), "allocate layer"));
          CUDA_CHECK(static_cast<cudaError_t>(bench::fill_layer_random(layers.back().data(), regions_of(layout), 1000 + c)));
        }
        std::vector<std::uint32_t> lengths(batch, ctx);
        auto dlen = take(cuda::DeviceBuffer::allocate(4ull * batch), "allocate lengths");
        BENCH_CHECK(dlen.upload(lengths.data(), 4ull * batch));
        std::vector<float> q(std::size_t{batch} * q_heads * head_dim);
        std::mt19937 rng(7);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (float& x : q) x = normal(rng);
        auto dq = take(cuda::DeviceBuffer::allocate(q.size() * 4), "allocate queries");
        BENCH_CHECK(dq.upload(q.data(), q.size() * 4));
        auto dout = take(cuda::DeviceBuffer::allocate(q.size() * 4), "allocate output");
        auto plan = take(cuda::tq::plan_decode(layout, mode.config, q_heads, ctx, props.multiprocessors), "plan_decode");
        auto ws = take(cuda::DeviceBuffer::allocate(plan.workspace_bytes), "allocate workspace");
        cuda::tq::DecodeArgs args;
        args.queries = static_cast<const float*>(dq.data());
        args.lengths = static_cast<const std::uint32_t*>(dlen.data());
        args.output = static_cast<float*>(dout.data());
        const double us = median_us(3, 30, [&](int i) {
          BENCH_CHECK(cuda::tq::decode_attention(plan, dcodec, layers[i % copies].data(), args, ws.data()));
        });
        const std::uint64_t tokens = std::uint64_t{batch} * kv_heads * ctx;
        const std::uint64_t bytes = tokens * layout.token.total();
        const std::uint64_t bf16_bytes = tokens * head_dim * 2 * 2;
        const double gbps = bytes / (us * 1e3);
        std::printf("%-12s %5u %7u %5u %10.1f %12llu %9.0f %6.1f%%\n", mode.name, batch, ctx, plan.splits, us,
                    static_cast<unsigned long long>(bytes), gbps, 100.0 * gbps / copy_gbps);
        if (csv != nullptr) {
          std::fprintf(csv, "decode,%s,%u,%u,%.3f,%llu,%.1f,%llu,%u\n", mode.name, batch, ctx, us,
                       static_cast<unsigned long long>(bytes), gbps, static_cast<unsigned long long>(bf16_bytes),
                       plan.splits);
          std::fflush(csv);
        }
      }
    }
    // Encode: 32768 tokens × 8 KV heads of bf16 keys and values (one prefill of a Llama-3-8B layer).
    if (!only) {
      const std::uint32_t rows = quick ? 4096 : 32768;
      auto layout = take(tq::plan_layer_layout(head_dim, kv_heads, 1, rows, mode.config), "plan_layer_layout");
      auto layer = take(cuda::DeviceBuffer::allocate(cuda::tq::layer_buffer_bytes(layout)), "allocate layer");
      const std::uint64_t count = std::uint64_t{rows} * kv_heads * head_dim;
      auto k = take(cuda::DeviceBuffer::allocate(count * 2), "allocate keys");
      auto v = take(cuda::DeviceBuffer::allocate(count * 2), "allocate values");
      CUDA_CHECK(static_cast<cudaError_t>(bench::fill_bf16_random(k.data(), count, 1)));
      CUDA_CHECK(static_cast<cudaError_t>(bench::fill_bf16_random(v.data(), count, 2)));
      cuda::tq::EncodeRequest req;
      req.rows = rows;
      req.dtype = DType::BF16;
      req.keys = k.data();
      req.values = v.data();
      const double us = median_us(2, 10, [&](int) { BENCH_CHECK(cuda::tq::encode_append(layout, dcodec, layer.data(), req)); });
      const std::uint64_t bytes = count * 2 * 2 + std::uint64_t{rows} * kv_heads * layout.token.total();
      const double gbps = bytes / (us * 1e3);
      std::printf("%-12s encode %u tokens x %u heads: %.1f us, %.0f GB/s (%.1f%% of copy)\n", mode.name, rows, kv_heads,
                  us, gbps, 100.0 * gbps / copy_gbps);
      if (csv != nullptr) {
        std::fprintf(csv, "encode,%s,1,%u,%.3f,%llu,%.1f,%llu,0\n", mode.name, rows, us,
                     static_cast<unsigned long long>(bytes), gbps, static_cast<unsigned long long>(count * 4));
      }
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}
