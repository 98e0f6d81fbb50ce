// Read ceiling: how fast one kernel launch can merely read the bytes of each decode case of the TurboQuant table
// (tq_cuda_bench.cpp's cases: Llama-3-8B heads, 8 KV heads × d 128, batch {1, 8, 32, 64} × context {4K, 32K,
// 128K}, the recommended and the seed mode; bytes = tokens × the mode's packed token bytes, as there), timed the
// same way (median of CUDA-event-timed single launches after warm-up, rotating over buffer copies so the bytes
// come from HBM, not L2). Each case takes the fastest of a few launch shapes of a plain streaming-read kernel
// (read_kernel.cu), so its time bounds from below what any single-launch decode of those bytes can take, and its
// "% of copy" is the most of the "≥ 70 % of measured bandwidth" target such a launch can reach.
// --bytes N (repeatable) measures those sizes instead; --csv FILE writes every case.
// Usage: kvcompact_cuda_read_ceiling_bench [--csv FILE] [--bytes N ...]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/tq/layout.hpp"
#include "read_kernel.hpp"

namespace {

using namespace kvcompact;

struct Case {
  std::string mode;  // "-" for a --bytes size
  std::uint32_t batch = 0, context = 0;
  std::uint64_t bytes = 0;
};

// The decode table's cases (tq_cuda_bench.cpp): their bytes read.
std::vector<Case> table_cases() {
  const std::uint32_t head_dim = 128, kv_heads = 8;
  std::vector<Case> cases;
  for (const bench::BenchMode& m : bench::bench_modes()) {
    const std::uint64_t token = tq::token_bytes(head_dim, m.config).total();
    for (std::uint32_t batch : bench::decode_table_batches()) {
      for (std::uint32_t context : bench::decode_table_contexts()) {
        cases.push_back(Case{m.name, batch, context, std::uint64_t{batch} * kv_heads * context * token});
      }
    }
  }
  return cases;
}

struct Timed {
  double us = 0;
  bench::ReadShape shape;
};

// The fastest launch shape's median time for reading `bytes`, rotating over copies of ≥ 512 MB in all.
Timed read_ceiling(std::uint64_t bytes, int multiprocessors, unsigned* flag) {
  const std::uint64_t rounded = (bytes + 15) / 16 * 16;
  const std::uint64_t copies = std::clamp<std::uint64_t>((512ull << 20) / rounded + 1, 1, 128);
  std::vector<cuda::DeviceBuffer> buffers;
  for (std::uint64_t c = 0; c < copies; ++c) {
    buffers.push_back(bench::take(cuda::DeviceBuffer::allocate(rounded), "allocate read buffer"));
    BENCH_CHECK(buffers.back().fill(1));  // (every word 0x01010101: their XOR is never the kernel's flag value)
  }
  const bench::ReadShape shapes[] = {{256, 4, 8}, {256, 8, 4}, {512, 4, 4}, {512, 2, 8}, {1024, 2, 4}, {1024, 1, 8}};
  Timed best;
  for (const bench::ReadShape& s : shapes) {
    const double us = bench::median_us(3, 30, [&](int i) {
      CUDA_CHECK(static_cast<cudaError_t>(
          bench::launch_read(buffers[i % copies].data(), rounded, flag, s, multiprocessors, nullptr)));
    });
    if (best.us == 0 || us < best.us) best = Timed{us, s};
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  std::vector<Case> cases;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      csv_path = argv[++i];
    } else if (std::strcmp(argv[i], "--bytes") == 0 && i + 1 < argc) {
      const long long n = std::atoll(argv[++i]);
      if (n <= 0) {
        std::fprintf(stderr, "--bytes takes a positive byte count, not '%s'\n", argv[i]);
        return 2;
      }
      cases.push_back(Case{"-", 0, 0, static_cast<std::uint64_t>(n)});
    } else {
      std::fprintf(stderr, "unknown argument '%s'\nusage: %s [--csv FILE] [--bytes N ...]\n", argv[i], argv[0]);
      return 2;
    }
  }
  if (cases.empty()) cases = table_cases();
  const cuda::DeviceProperties props = bench::require_device();
  FILE* csv = nullptr;
  if (!csv_path.empty()) {
    csv = std::fopen(csv_path.c_str(), "w");
    if (csv == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", csv_path.c_str());
      return 1;
    }
    std::fprintf(csv, "mode,batch,context,bytes,read_us,read_gbps,pct_of_copy,us_at_70pct,threads,blocks_per_sm,in_flight\n");
  }
  const bench::CopyBandwidth copy = bench::measure_copy_bandwidth(4ull << 30);
  auto flag = bench::take(cuda::DeviceBuffer::allocate(4), "allocate flag");
  BENCH_CHECK(flag.fill(0));
  std::printf("\n%-12s %5s %7s %12s %9s %9s %7s %10s  %s\n", "mode", "batch", "context", "bytes", "read us", "GB/s",
              "%copy", "us at 70%", "shape (threads x blocks/SM x in flight)");
  for (const Case& c : cases) {
    const Timed t = read_ceiling(c.bytes, props.multiprocessors, static_cast<unsigned*>(flag.data()));
    const double gbps = static_cast<double>(c.bytes) / (t.us * 1e3);
    const double at70 = static_cast<double>(c.bytes) / (0.7 * copy.gbps * 1e3);
    std::printf("%-12s %5u %7u %12llu %9.1f %9.0f %6.1f%% %10.1f  %u x %u x %u\n", c.mode.c_str(), c.batch, c.context,
                static_cast<unsigned long long>(c.bytes), t.us, gbps, 100.0 * gbps / copy.gbps, at70, t.shape.threads,
                t.shape.blocks_per_sm, t.shape.in_flight);
    if (csv != nullptr) {
      std::fprintf(csv, "%s,%u,%u,%llu,%.3f,%.1f,%.2f,%.3f,%u,%u,%u\n", c.mode.c_str(), c.batch, c.context,
                   static_cast<unsigned long long>(c.bytes), t.us, gbps, 100.0 * gbps / copy.gbps, at70,
                   t.shape.threads, t.shape.blocks_per_sm, t.shape.in_flight);
      std::fflush(csv);
    }
  }
  if (csv != nullptr) std::fclose(csv);
  unsigned flagged = 0;
  BENCH_CHECK(flag.download(&flagged, 4));
  if (flagged != 0) {
    std::fprintf(stderr, "the read kernel's flag was set (%u): its loads saw other bytes than the fill's\n", flagged);
    return 1;
  }
  return 0;
}
