// CUDA chunked-prefill attention benchmark: one 2048-token chunk (queries at positions [ctx, ctx + 2048)) over
// a sequence of ctx cached tokens plus the chunk itself, Llama-3-8B heads (32 query / 8 KV heads, d 128),
// batch 1, contexts 8K / 32K / 128K, the recommended and the seed mode, both P precisions; where the plan picks
// the warpgroup kernel (head_dim 128: both modes) the portable one is timed beside it. Layer contents are
// random codes and norms (bench/cuda/fill.cu); times are the median of CUDA-event-timed launches after
// warm-up. Prints a table and writes CSV (--csv FILE); scripts/gpu/steps/tq_prefill.sh runs it next to the
// bf16 torch SDPA baseline (scripts/gpu/sdpa_prefill_baseline.py) with the same FLOP count.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.hpp"
#include "fill.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/cuda/tq_prefill.hpp"
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
  std::string csv_path, only_mode;
  bool quick = false, sweep_splits = false;
  unsigned only_ctx = 0;
  std::uint32_t chunk = 2048;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv_path = argv[++i];
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    // --sweep-splits: the warpgroup kernel at every key split count (1 … kMaxPrefillKeySplits) beside the plan's.
    if (std::strcmp(argv[i], "--sweep-splits") == 0) sweep_splits = true;
    if (std::strcmp(argv[i], "--chunk") == 0 && i + 1 < argc) chunk = static_cast<std::uint32_t>(std::atoi(argv[++i]));
    // --only MODE CONTEXT: one case (the default precision) and nothing else (for the profiler and A/B runs).
    if (std::strcmp(argv[i], "--only") == 0 && i + 2 < argc) {
      only_mode = argv[++i];
      only_ctx = static_cast<unsigned>(std::atoi(argv[++i]));
    }
  }
  const bool only = !only_mode.empty();
  const cuda::DeviceProperties props = bench::require_device();
  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (csv != nullptr) std::fprintf(csv, "kind,mode,precision,kernel,context,chunk,us,tflops,kv_bytes\n");

  const std::uint32_t head_dim = 128, kv_heads = 8, q_heads = 32;
  struct Mode {
    const char* name;
    tq::QuantConfig config;
  };
  const Mode modes[] = {{"recommended", tq::QuantConfig::recommended(1)}, {"seed", tq::QuantConfig::seed_system(1)}};
  std::vector<std::uint32_t> contexts = {8192, 32768, 131072};
  if (quick) contexts = {8192, 32768};
  if (only) contexts = {only_ctx};
  const cuda::tq::PrefillPrecision precisions[] = {cuda::tq::PrefillPrecision::HiLo, cuda::tq::PrefillPrecision::Fast};
  std::printf("\n%-12s %-5s %-10s %7s %6s %10s %8s %7s %5s %6s\n", "mode", "prec", "kernel", "context", "chunk",
              "us", "TFLOP/s", "rows/blk", "occ", "splits");
  for (const Mode& mode : modes) {
    if (only && only_mode != mode.name) continue;
    auto codec = take(tq::LayerCodec::create(head_dim, mode.config, 0), "LayerCodec::create");
    auto dcodec = take(cuda::tq::DeviceCodec::create(codec), "DeviceCodec::create");
    for (std::uint32_t ctx : contexts) {
      const std::uint32_t length = ctx + chunk;
      auto layout = take(tq::plan_layer_layout(head_dim, kv_heads, 1, length, mode.config), "plan_layer_layout");
      auto layer = take(cuda::DeviceBuffer::allocate(cuda::tq::layer_buffer_bytes(layout)), "allocate layer");
      CUDA_CHECK(static_cast<cudaError_t>(bench::fill_layer_random(layer.data(), regions_of(layout), 1000 + ctx)));
      const std::uint32_t host_args[3] = {length, ctx, chunk};  // length, first position, rows
      auto dargs = take(cuda::DeviceBuffer::allocate(12), "allocate args");
      BENCH_CHECK(dargs.upload(host_args, 12));
      std::vector<float> q(std::size_t{chunk} * q_heads * head_dim);
      std::mt19937 rng(7);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& x : q) x = normal(rng);
      auto dq = take(cuda::DeviceBuffer::allocate(q.size() * 4), "allocate queries");
      BENCH_CHECK(dq.upload(q.data(), q.size() * 4));
      auto dout = take(cuda::DeviceBuffer::allocate(q.size() * 4), "allocate output");
      const auto* dev = static_cast<const std::uint32_t*>(dargs.data());
      cuda::tq::PrefillArgs args;
      args.batch = 1;
      args.lengths = dev;
      args.first_positions = dev + 1;
      args.rows = dev + 2;
      args.queries = static_cast<const float*>(dq.data());
      args.output = static_cast<float*>(dout.data());
      // Causal pairs: row i (position ctx + i) sees ctx + i + 1 keys. 2 FLOPs per multiply-add, Q·Kᵀ and P·V.
      const double pairs = static_cast<double>(chunk) * ctx + 0.5 * static_cast<double>(chunk) * (chunk + 1.0);
      const double flops = 4.0 * head_dim * q_heads * pairs;
      const std::uint64_t kv_bytes = std::uint64_t{length} * kv_heads * layout.token.total();
      for (cuda::tq::PrefillPrecision precision : precisions) {
        if (only && precision != cuda::tq::kDefaultPrefillPrecision) continue;
        auto plan = take(cuda::tq::plan_prefill(layout, mode.config, q_heads, chunk, length, props.multiprocessors,
                                                precision),
                         "plan_prefill");
        // (plan, kernel column): the plan's choice, then what it is compared with in the same run.
        std::vector<std::pair<cuda::tq::PrefillPlan, std::string>> plans = {{plan, "warpgroup"}};
        if (plan.kernel == cuda::tq::PrefillKernel::Portable) plans[0].second = "portable";
        if (plan.kernel == cuda::tq::PrefillKernel::Warpgroup) {
          // The same kernel with other key splits: unsplit ("wg-nosplit") when the plan splits, every count
          // with --sweep-splits ("wg-sN").
          for (std::uint32_t s = 1; s <= cuda::tq::kMaxPrefillKeySplits; ++s) {
            if (s == plan.key_splits || (!sweep_splits && (s > 1 || plan.key_splits == 1))) continue;
            auto other = cuda::tq::with_key_splits(plan, s);
            if (!other) continue;  // more splits than key tiles
            plans.emplace_back(*other, sweep_splits ? "wg-s" + std::to_string(s) : std::string("wg-nosplit"));
          }
          if (!only) {
            plans.emplace_back(take(cuda::tq::plan_prefill(layout, mode.config, q_heads, chunk, length,
                                                           props.multiprocessors, precision,
                                                           cuda::tq::PrefillKernel::Portable),
                                    "plan_prefill (portable)"),
                               "portable");
          }
        }
        std::uint64_t workspace_bytes = 16;
        for (const auto& [kplan, kname] : plans) workspace_bytes = std::max(workspace_bytes, kplan.workspace_bytes);
        auto workspace = take(cuda::DeviceBuffer::allocate(workspace_bytes), "allocate workspace");
        for (const auto& [kplan, kname_str] : plans) {
          const int iters = ctx >= 131072 ? 8 : 15;
          const double us = median_us(2, only ? 3 : iters, [&] {
            BENCH_CHECK(cuda::tq::prefill_attention(kplan, dcodec, layer.data(), args, workspace.data()));
          });
          const double tflops = flops / (us * 1e6);
          const char* pname = precision == cuda::tq::PrefillPrecision::HiLo ? "hilo" : "fast";
          const char* kname = kname_str.c_str();
          std::printf("%-12s %-5s %-10s %7u %6u %10.1f %8.1f %7u %5d %6u\n", mode.name, pname, kname, ctx, chunk,
                      us, tflops, kplan.block_rows, kplan.blocks_per_sm, kplan.key_splits);
          if (csv != nullptr) {
            std::fprintf(csv, "prefill,%s,%s,%s,%u,%u,%.3f,%.2f,%llu\n", mode.name, pname, kname, ctx, chunk, us,
                         tflops, static_cast<unsigned long long>(kv_bytes));
            std::fflush(csv);
          }
        }
      }
      std::vector<float> out(16);
      CUDA_CHECK(cudaMemcpy(out.data(), dout.data(), 64, cudaMemcpyDeviceToHost));
      for (float x : out) {
        if (!(x == x)) {
          std::fprintf(stderr, "NaN in the prefill output (%s, ctx %u)\n", mode.name, ctx);
          return 1;
        }
      }
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}
