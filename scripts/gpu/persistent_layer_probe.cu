// What a batch-1 DeepSeek-V4 layer run as one persistent kernel could at best cost: the pieces such a kernel
// cannot avoid, measured alone on the GPU. A persistent layer kernel replaces the launches between a ratio-4
// layer's phases (query preparation, scores, the top-k's digits, attention, merge) by grid-wide barriers, so what
// it costs is its barriers plus its reads of the rows; this prints
//   - one grid barrier (a release add and an acquire spin per block) for 1, 2 and 4 blocks per multiprocessor,
//     and cooperative groups' grid.sync() beside it,
//   - one back-to-back launch of an empty kernel (what a phase boundary costs today), plain and under
//     programmatic dependent launch (the next launched as the previous one's blocks exit, as the layer kernels
//     are), each launched from the host and inside one CUDA graph (as the decode step runs),
//   - a read of a layer's rows spread over the persistent grid and ended by a barrier: the FP8 and BF16 indexer
//     rows of a ratio-4 layer at 1M (34.6 / 67.1 MB) and a ratio-128 layer's compressed FP8 rows (8192 × 584 B), from HBM
//     (each repetition reads a region that the seven read since evicted from L2) and from L2 (the same region
//     every time: what a read of rows prefetched during the layer before could take).
//   - one thread's dependent load from L2 and from HBM (a pointer chase): what each phase after a barrier pays at
//     least once, when its blocks read what the others wrote before it (a histogram, a boundary, a list).
// Times are the mean of many repetitions inside one launch (%globaltimer), so no launch is in them. Also printed:
// the copy bandwidth the benchmarks' HBM floors use (a device-to-device copy, bytes read + written).
// Build and run on the GPU machine (or build here and carry the binary):
//   nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/plp scripts/gpu/persistent_layer_probe.cu && /tmp/plp
// The analysis it feeds: docs/cuda-dsv4-kernels-history.md, round 37.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "grid_probe_common.cuh"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr int kThreads = 512;

struct ProbeArgs {
  const uint4* data;       // regions × region_vec 16-byte words
  std::size_t region_vec;  // 0: barriers only
  int regions;             // repetition r reads region r % regions
  int reps;
  unsigned* count;         // zeroed before the launch
  std::uint64_t* out_ns;   // block 0's time for all repetitions
  unsigned* sink;          // keeps the loads
};

__global__ void __launch_bounds__(kThreads) probe_kernel(ProbeArgs a) {
  const unsigned grid = gridDim.x;
  unsigned target = grid;
  grid_barrier(a.count, target);  // every block is resident before the clock starts
  const std::uint64_t t0 = global_ns();
  unsigned acc = 0;
  const std::size_t stride = static_cast<std::size_t>(grid) * kThreads;
  for (int r = 0; r < a.reps; ++r) {
    const uint4* base = a.data + static_cast<std::size_t>(r % a.regions) * a.region_vec;
#pragma unroll 8
    for (std::size_t i = blockIdx.x * kThreads + threadIdx.x; i < a.region_vec; i += stride) {
      const uint4 v = __ldcg(base + i);  // L2 only, as the kernels' bulk copies
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    target += grid;
    grid_barrier(a.count, target);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.out_ns = global_ns() - t0;
  if (acc == 0x9e3779b9u) a.sink[blockIdx.x] = acc;  // (never in practice; the loads cannot be dropped)
}

// The same barrier loop through cooperative groups' grid.sync(), for comparison with the hand-written one.
__global__ void __launch_bounds__(kThreads) cg_barrier_kernel(int reps, std::uint64_t* out_ns) {
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  grid.sync();
  const std::uint64_t t0 = global_ns();
  for (int r = 0; r < reps; ++r) grid.sync();
  if (blockIdx.x == 0 && threadIdx.x == 0) *out_ns = global_ns() - t0;
}

// One thread follows a cycle of dependent loads: the round trip that every phase of a persistent kernel pays at
// least once after its barrier (reading what the other blocks wrote: a histogram, a boundary, a list).
__global__ void chase_kernel(const unsigned* next, int steps, std::uint64_t* out_ns, unsigned* sink) {
  unsigned i = 0;
  const std::uint64_t t0 = global_ns();
  for (int s = 0; s < steps; ++s) i = __ldcg(next + i);
  *out_ns = global_ns() - t0;
  *sink = i;
}

// next[perm[k] * stride] = perm[k + 1] * stride: one cycle through n slots `stride` words apart, in perm's order.
__global__ void link_cycle_kernel(unsigned* next, const unsigned* perm, unsigned n, unsigned stride) {
  for (unsigned k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
    next[perm[k] * stride] = perm[(k + 1) % n] * stride;
  }
}

__global__ void __launch_bounds__(kThreads) empty_kernel(int pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
}

struct Device {
  int sms = 0;
  cudaDeviceProp prop{};
};

// Launches `kernel` cooperatively (every block resident) on blocks_per_sm × SMs blocks and returns the mean µs per
// repetition that its block 0 wrote to out_ns.
double cooperative_us(const Device& d, const void* kernel, int blocks_per_sm, void** params, int reps,
                      const std::uint64_t* out_ns) {
  CHECK(cudaLaunchCooperativeKernel(kernel, dim3(d.sms * blocks_per_sm), dim3(kThreads), params, 0, nullptr));
  CHECK(cudaDeviceSynchronize());
  std::uint64_t ns = 0;
  CHECK(cudaMemcpy(&ns, out_ns, sizeof ns, cudaMemcpyDeviceToHost));
  return static_cast<double>(ns) / 1000.0 / reps;
}

// Mean µs per repetition of probe_kernel.
double probe_us(const Device& d, int blocks_per_sm, const uint4* data, std::size_t region_bytes, int regions,
                int reps, unsigned* count, std::uint64_t* out_ns, unsigned* sink) {
  ProbeArgs a{data, region_bytes / 16, regions, reps, count, out_ns, sink};
  void* params[] = {&a};
  CHECK(cudaMemset(count, 0, sizeof(unsigned)));
  return cooperative_us(d, reinterpret_cast<const void*>(probe_kernel), blocks_per_sm, params, reps, out_ns);
}

// Mean µs per grid.sync() of cg_barrier_kernel.
double cg_barrier_us(const Device& d, int blocks_per_sm, int reps, std::uint64_t* out_ns) {
  void* params[] = {&reps, &out_ns};
  return cooperative_us(d, reinterpret_cast<const void*>(cg_barrier_kernel), blocks_per_sm, params, reps, out_ns);
}

// Mean µs per launch of `n` empty kernels back to back on one stream (after a warm-up), PDL or not; launched one
// by one from the host, or as one CUDA graph of the n launches (as the decode step runs: no host cost per launch).
double launch_us(const Device& d, int blocks_per_sm, bool pdl, bool graph, int n) {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(d.sms * blocks_per_sm);
  cfg.blockDim = dim3(kThreads);
  cfg.stream = s;
  cfg.attrs = pdl ? &attr : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  const int flag = pdl ? 1 : 0;
  auto launch_all = [&] {
    for (int i = 0; i < n; ++i) CHECK(cudaLaunchKernelEx(&cfg, empty_kernel, flag));
  };
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    launch_all();
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphDestroy(g));
  }
  auto run = [&] {
    if (graph) {
      CHECK(cudaGraphLaunch(exec, s));
    } else {
      launch_all();
    }
  };
  run();  // warm-up
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0, s));
  run();
  CHECK(cudaEventRecord(e1, s));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  if (exec != nullptr) CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaStreamDestroy(s));
  return 1000.0 * ms / n;
}

// Mean ns per dependent load of one thread chasing a random cycle through `slots` 128-byte lines of `data`'s first
// gigabyte. From L2: the cycle is walked once before the clock. From HBM: its second gigabyte is written before the
// clock instead, which evicts the cycle from L2 (the 20 000 timed loads then touch few lines twice).
double chase_ns(uint4* data, unsigned slots, bool from_l2, std::uint64_t* out_ns, unsigned* sink) {
  constexpr unsigned kLineWords = 128 / 4;
  std::vector<unsigned> perm(slots);
  std::iota(perm.begin(), perm.end(), 0u);
  std::shuffle(perm.begin() + 1, perm.end(), std::mt19937(12345));  // slot 0 first: the chase starts there
  unsigned* dperm = nullptr;
  CHECK(cudaMalloc(&dperm, slots * sizeof(unsigned)));
  CHECK(cudaMemcpy(dperm, perm.data(), slots * sizeof(unsigned), cudaMemcpyHostToDevice));
  unsigned* next = reinterpret_cast<unsigned*>(data);
  link_cycle_kernel<<<256, 256>>>(next, dperm, slots, kLineWords);
  CHECK(cudaGetLastError());
  const int steps = 20000;
  if (from_l2) {
    chase_kernel<<<1, 1>>>(next, static_cast<int>(slots), out_ns, sink);
  } else {
    CHECK(cudaMemset(reinterpret_cast<char*>(data) + (1ull << 30), 0, 1ull << 30));
  }
  chase_kernel<<<1, 1>>>(next, steps, out_ns, sink);
  CHECK(cudaDeviceSynchronize());
  std::uint64_t ns = 0;
  CHECK(cudaMemcpy(&ns, out_ns, sizeof ns, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(dperm));
  return static_cast<double>(ns) / steps;
}

}  // namespace

int main() {
  Device d;
  CHECK(cudaGetDeviceProperties(&d.prop, 0));
  d.sms = d.prop.multiProcessorCount;
  int fit = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, probe_kernel, kThreads, 0));
  std::printf("device: %s, %d multiprocessors, L2 %d MB; probe blocks of %d threads, at most %d per multiprocessor\n",
              d.prop.name, d.sms, d.prop.l2CacheSize >> 20, kThreads, fit);

  // Eight regions of the largest read, so that a cold repetition's region was evicted by the seven before it.
  const std::size_t kFp8Rows = 262144ull * 132, kBf16Rows = 262144ull * 256, kR128Rows = 8192ull * 584;
  const int kRegions = 8;
  const std::size_t bytes = 2ull << 30;  // ≥ kRegions × kBf16Rows, and the copy's source and destination
  uint4* data = nullptr;
  unsigned *count = nullptr, *sink = nullptr;
  std::uint64_t* out_ns = nullptr;
  CHECK(cudaMalloc(&data, bytes));
  CHECK(cudaMemset(data, 0x5a, bytes));
  CHECK(cudaMalloc(&count, sizeof(unsigned)));
  CHECK(cudaMalloc(&sink, 4096 * sizeof(unsigned)));
  CHECK(cudaMalloc(&out_ns, sizeof(std::uint64_t)));

  {  // the floors' bandwidth, as bench_util.hpp's measure_copy_bandwidth, but the best of 10 after 2 warm-ups
    const std::size_t n = 1ull << 30;
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int i = 0; i < 12; ++i) {
      CHECK(cudaEventRecord(e0));
      CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(data) + n, data, n, cudaMemcpyDeviceToDevice));
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 2 && ms < best) best = ms;
    }
    std::printf("copy bandwidth (read + write): %.0f GB/s\n", 2.0 * n / (best * 1e6));
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
  }

  std::printf("\n%-48s %12s %12s %12s\n", "piece (µs each; mean of many)", "1 block/SM", "2 blocks/SM",
              "4 blocks/SM");
  // Prints one row of the table; returns its µs at 1, 2 and 4 blocks per multiprocessor (0 where they do not fit).
  auto row = [&](const char* name, auto f) {
    std::array<double, 3> us{};
    std::printf("%-48s", name);
    for (int i = 0; i < 3; ++i) {
      const int b = 1 << i;
      if (b > fit) {
        std::printf(" %12s", "-");
      } else {
        us[i] = f(b);
        std::printf(" %12.2f", us[i]);
      }
    }
    std::printf("\n");
    return us;
  };
  row("grid barrier", [&](int b) { return probe_us(d, b, data, 0, 1, 2000, count, out_ns, sink); });
  row("grid barrier, cooperative groups' grid.sync()", [&](int b) { return cg_barrier_us(d, b, 2000, out_ns); });
  row("empty launch, back to back", [&](int b) { return launch_us(d, b, false, false, 2000); });
  row("empty launch, back to back under PDL", [&](int b) { return launch_us(d, b, true, false, 2000); });
  row("empty launch in a CUDA graph", [&](int b) { return launch_us(d, b, false, true, 2000); });
  row("empty launch in a CUDA graph under PDL", [&](int b) { return launch_us(d, b, true, true, 2000); });
  struct Read {
    const char* name;
    std::size_t bytes;
    int regions;
  };
  const Read reads[] = {
      {"FP8 indexer rows 34.6 MB from HBM + barrier", kFp8Rows, kRegions},
      {"FP8 indexer rows 34.6 MB from L2 + barrier", kFp8Rows, 1},
      {"BF16 indexer rows 67.1 MB from HBM + barrier", kBf16Rows, kRegions},
      {"ratio-128 rows 4.8 MB from HBM + barrier", kR128Rows, kRegions},
      {"ratio-128 rows 4.8 MB from L2 + barrier", kR128Rows, 1},
  };
  std::array<double, 3> read_us[std::size(reads)];
  for (std::size_t i = 0; i < std::size(reads); ++i) {
    const Read& r = reads[i];
    read_us[i] = row(r.name, [&](int b) { return probe_us(d, b, data, r.bytes, r.regions, 64, count, out_ns, sink); });
  }
  // What each phase after a barrier pays at least once: one dependent load (random lines of 2 MB / 256 MB).
  std::printf("\none thread's dependent load (ns each): from L2 %.0f, from HBM %.0f\n",
              chase_ns(data, 16384, true, out_ns, sink), chase_ns(data, 2u << 20, false, out_ns, sink));
  // The same reads as bandwidth, at the most blocks per multiprocessor measured (4 where they fit).
  const int most = fit >= 4 ? 2 : (fit >= 2 ? 1 : 0);
  std::printf("\nas bandwidth at %d blocks per multiprocessor (GB/s, barrier included):\n", 1 << most);
  for (std::size_t i = 0; i < std::size(reads); ++i) {
    std::printf("  %-48s %8.0f\n", reads[i].name, reads[i].bytes / read_us[i][most] / 1000.0);
  }
  CHECK(cudaFree(data));
  CHECK(cudaFree(count));
  CHECK(cudaFree(sink));
  CHECK(cudaFree(out_ns));
  return 0;
}
