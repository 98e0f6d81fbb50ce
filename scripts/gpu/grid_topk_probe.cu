// What an exact top-512 of a ratio-4 layer's 262 144 index scores costs as phases of one persistent grid (every
// multiprocessor, grid-wide barriers between phases) — the piece round 37 of docs/cuda-dsv4-kernels-history.md
// names as the one to price before a persistent batch-1 layer kernel is worth building. Today's top-k runs on one
// 16-block cluster (≈ 21 µs per call at batch 1); here the whole grid takes part:
//   1. each block turns its slice of scores into order-preserving 32-bit keys (in shared memory) and histograms
//      their top 11 bits; the blocks' histograms are added into one global histogram; barrier,
//   2. every block finds the same boundary bin (the bin where the count from the top reaches the k still needed)
//      and, unless the whole bin is taken, histograms the next 11 bits of its keys in that bin; barrier,
//   3. the same for the last 10 bits; barrier,
//   4. if the keys equal to the boundary key are not all taken: each block counts its own; barrier; the lowest
//      indices among them are taken (the CPU's tie-break),
//   5. each block appends its selected rows to the list; barrier (the attention phase would start after it).
// Times are %globaltimer means over many calls inside one cooperative launch, with a breakdown per phase; the
// scores are read from L2 (in the layer kernel they would come from the score phase just before). Each case's
// list is checked against a host sort (score descending, index ascending) and the probe exits 1 on a mismatch.
// Build and run on the GPU machine (or build here and carry the binary):
//   nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/gtp scripts/gpu/grid_topk_probe.cu && /tmp/gtp
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "grid_probe_common.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr int kThreads = 512;
constexpr int kK = 512;
constexpr int kMaxChunk = 4096;  // scores per block held in shared memory
constexpr int kMaxGrid = 1024;
constexpr int kDigits = 3;
// Digit d of a key: digit_bits(d) bits from bit digit_shift(d) up (11, 11, 10 from the top).
__host__ __device__ constexpr int digit_shift(int d) { return d == 0 ? 21 : d == 1 ? 10 : 0; }
__host__ __device__ constexpr int digit_bits(int d) { return d == 2 ? 10 : 11; }
constexpr int kMaxBins = 2048;
constexpr int kPhases = 5;  // the breakdown's columns

// One call's global counters (a fresh set per call, zeroed before the launch, so no call has to clear them).
struct CallScratch {
  unsigned hist[kDigits][kMaxBins];
  unsigned equal_per_block[kMaxGrid];
  unsigned listed;
};

struct TopkArgs {
  const float* scores;
  int n;
  int calls;
  CallScratch* scratch;  // `calls` of them
  unsigned* count;       // the barrier's arrivals, zeroed before the launch
  unsigned* list;        // kK row indices (every call writes the same set)
  std::uint64_t* phase_ns;  // kPhases sums over the calls (block 0's clock)
  unsigned* equal_phases;   // how many calls needed phase 4
};

// Larger float, larger key (no NaNs among the scores).
__device__ __forceinline__ unsigned order_key(float f) {
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

using BlockScan = cub::BlockScan<unsigned, kThreads>;
using BlockReduce = cub::BlockReduce<unsigned, kThreads>;

struct Shared {
  unsigned keys[kMaxChunk];
  unsigned hist[kMaxBins];
  union {
    BlockScan::TempStorage scan;
    BlockReduce::TempStorage reduce;
  } temp;
  unsigned boundary_bin;
  unsigned above;  // keys in bins above the boundary bin
};

// Every block runs this on the same global histogram and gets the same answer: the bin where the count from the
// top first reaches `need`, and how many keys lie above it. Thread t looks at bins in descending order.
__device__ void find_boundary(Shared& sh, const unsigned* global_hist, int bins, unsigned need) {
  const int per = bins / kThreads;
  for (int i = threadIdx.x; i < bins; i += kThreads) sh.hist[i] = __ldcg(global_hist + i);
  __syncthreads();
  unsigned mine = 0;
  for (int j = 0; j < per; ++j) mine += sh.hist[bins - 1 - (threadIdx.x * per + j)];
  unsigned before = 0;
  BlockScan(sh.temp.scan).ExclusiveSum(mine, before);
  for (int j = 0; j < per; ++j) {
    const int bin = bins - 1 - (threadIdx.x * per + j);
    const unsigned c = sh.hist[bin];
    if (before < need && before + c >= need) {
      sh.boundary_bin = static_cast<unsigned>(bin);
      sh.above = before;
    }
    before += c;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) grid_topk_kernel(TopkArgs a) {
  __shared__ Shared sh;
  const unsigned grid = gridDim.x;
  unsigned target = grid;
  grid_barrier(a.count, target);  // every block is resident before the clock starts
  const int chunk = (a.n + static_cast<int>(grid) - 1) / static_cast<int>(grid);
  const int begin = static_cast<int>(blockIdx.x) * chunk;
  const int len = max(0, min(a.n, begin + chunk) - begin);
  const int per = (chunk + kThreads - 1) / kThreads;  // thread t's contiguous keys: [t·per, (t+1)·per) ∩ [0, len)
  const int mine_begin = min(len, static_cast<int>(threadIdx.x) * per);
  const int mine_end = min(len, mine_begin + per);
  std::uint64_t phase[kPhases] = {};
  unsigned equal_phases = 0;

  for (int call = 0; call < a.calls; ++call) {
    CallScratch& s = a.scratch[call];
    std::uint64_t t = global_ns();
    for (int i = threadIdx.x; i < len; i += kThreads) sh.keys[i] = order_key(__ldcg(a.scores + begin + i));
    unsigned need = kK, prefix = 0;  // prefix: the boundary key's digits found so far
    int resolved_shift = 32;         // keys whose bits from here up equal `prefix` are the boundary's
    bool whole_bin = false;          // the last boundary bin is taken whole: no tie phase
    for (int d = 0; d < kDigits && !whole_bin; ++d) {
      const int bins = 1 << digit_bits(d);
      for (int i = threadIdx.x; i < bins; i += kThreads) sh.hist[i] = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < len; i += kThreads) {
        const unsigned key = sh.keys[i];
        if (resolved_shift == 32 || (key >> resolved_shift) == prefix) {
          atomicAdd(&sh.hist[(key >> digit_shift(d)) & (bins - 1)], 1u);
        }
      }
      __syncthreads();
      for (int i = threadIdx.x; i < bins; i += kThreads) {
        if (sh.hist[i] != 0) atomicAdd(&s.hist[d][i], sh.hist[i]);
      }
      target += grid;
      grid_barrier(a.count, target);
      find_boundary(sh, s.hist[d], bins, need);
      whole_bin = (sh.above + sh.hist[sh.boundary_bin] == need);
      need -= sh.above;
      prefix = (resolved_shift == 32 ? 0u : prefix << digit_bits(d)) | sh.boundary_bin;
      resolved_shift = digit_shift(d);
      __syncthreads();  // sh.hist and sh.boundary_bin are rewritten by the next digit
      const std::uint64_t now = global_ns();
      phase[d] += now - t;
      t = now;
    }
    // Keys above the boundary (their bits from resolved_shift up exceed prefix) are taken; of the boundary's keys,
    // all when the bin is taken whole, else the `need` with the lowest indices.
    auto above = [&](unsigned key) { return resolved_shift == 32 ? false : (key >> resolved_shift) > prefix; };
    auto at = [&](unsigned key) { return (key >> resolved_shift) == prefix; };
    unsigned take_before = 0;  // boundary keys taken by earlier blocks and threads
    if (!whole_bin) {
      ++equal_phases;
      unsigned my_equal = 0;
      for (int i = mine_begin; i < mine_end; ++i) my_equal += at(sh.keys[i]) ? 1u : 0u;
      const unsigned block_equal = BlockReduce(sh.temp.reduce).Sum(my_equal);
      if (threadIdx.x == 0) s.equal_per_block[blockIdx.x] = block_equal;
      target += grid;
      grid_barrier(a.count, target);
      unsigned earlier = 0;
      for (unsigned b = threadIdx.x; b < blockIdx.x; b += kThreads) earlier += __ldcg(s.equal_per_block + b);
      const unsigned earlier_blocks = BlockReduce(sh.temp.reduce).Sum(earlier);
      if (threadIdx.x == 0) sh.above = earlier_blocks;  // (sh.above is free now)
      __syncthreads();
      unsigned thread_before = 0;
      BlockScan(sh.temp.scan).ExclusiveSum(my_equal, thread_before);
      take_before = sh.above + thread_before;
    }
    const std::uint64_t t_equal = global_ns();
    phase[3] += t_equal - t;
    for (int i = mine_begin; i < mine_end; ++i) {
      const unsigned key = sh.keys[i];
      bool taken = above(key);
      if (!taken && at(key)) {
        taken = whole_bin || take_before < need;
        ++take_before;
      }
      if (taken) {
        const unsigned slot = atomicAdd(&s.listed, 1u);
        if (slot < kK) a.list[slot] = static_cast<unsigned>(begin + i);  // more than kK fails the check below
      }
    }
    target += grid;
    grid_barrier(a.count, target);
    phase[4] += global_ns() - t_equal;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (int p = 0; p < kPhases; ++p) a.phase_ns[p] = phase[p];
    *a.equal_phases = equal_phases;
  }
}

// The expected list: the kK rows of largest score, ties to the lower index, as a sorted set of indices.
std::vector<unsigned> host_topk(const std::vector<float>& scores) {
  std::vector<unsigned> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::partial_sort(idx.begin(), idx.begin() + kK, idx.end(), [&](unsigned x, unsigned y) {
    return scores[x] != scores[y] ? scores[x] > scores[y] : x < y;
  });
  idx.resize(kK);
  std::sort(idx.begin(), idx.end());
  return idx;
}

struct Case {
  const char* name;
  int distribution;  // 0 normal, 1 uniform in [-1, 1), 2 integers 0..99 (many ties at the boundary)
};

std::vector<float> make_scores(int n, int distribution, std::mt19937& rng) {
  std::vector<float> v(n);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::uniform_int_distribution<int> small(0, 99);
  for (float& x : v) x = distribution == 0 ? normal(rng) : distribution == 1 ? uniform(rng) : float(small(rng));
  return v;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  int fit = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, grid_topk_kernel, kThreads, 0));
  const int n = 262144;  // a ratio-4 layer's compressed rows at 1M context
  const int calls = 200;
  std::printf("device: %s, %d multiprocessors; top-%d of %d scores, blocks of %d threads (at most %d per SM)\n",
              prop.name, sms, kK, n, kThreads, fit);
  std::printf("%-10s %6s %9s %8s %8s %8s %8s %8s %9s %6s\n", "scores", "blocks", "us/call", "digit1", "digit2",
              "digit3", "ties", "list", "tie calls", "check");

  float* scores = nullptr;
  CallScratch* scratch = nullptr;
  unsigned *count = nullptr, *list = nullptr, *equal_phases = nullptr;
  std::uint64_t* phase_ns = nullptr;
  CHECK(cudaMalloc(&scores, n * sizeof(float)));
  CHECK(cudaMalloc(&scratch, calls * sizeof(CallScratch)));
  CHECK(cudaMalloc(&count, sizeof(unsigned)));
  CHECK(cudaMalloc(&list, kK * sizeof(unsigned)));
  CHECK(cudaMalloc(&equal_phases, sizeof(unsigned)));
  CHECK(cudaMalloc(&phase_ns, kPhases * sizeof(std::uint64_t)));

  std::mt19937 rng(20261207);
  const Case cases[] = {{"normal", 0}, {"uniform", 1}, {"ties", 2}};
  bool all_ok = true;
  for (const Case& c : cases) {
    const std::vector<float> host = make_scores(n, c.distribution, rng);
    const std::vector<unsigned> expected = host_topk(host);
    CHECK(cudaMemcpy(scores, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    for (int blocks_per_sm = 1; blocks_per_sm <= std::min(fit, 4); blocks_per_sm *= 2) {
      const int grid = sms * blocks_per_sm;
      if (grid > kMaxGrid || (n + grid - 1) / grid > kMaxChunk) continue;
      CHECK(cudaMemset(scratch, 0, calls * sizeof(CallScratch)));
      CHECK(cudaMemset(count, 0, sizeof(unsigned)));
      TopkArgs a{scores, n, calls, scratch, count, list, phase_ns, equal_phases};
      void* params[] = {&a};
      CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(grid_topk_kernel), dim3(grid), dim3(kThreads),
                                        params, 0, nullptr));
      CHECK(cudaDeviceSynchronize());
      std::uint64_t ns[kPhases];
      unsigned ties = 0;
      std::vector<unsigned> got(kK);
      CHECK(cudaMemcpy(ns, phase_ns, sizeof ns, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(&ties, equal_phases, sizeof ties, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(got.data(), list, kK * sizeof(unsigned), cudaMemcpyDeviceToHost));
      // The list (the last call's) is complete only if that call appended exactly kK rows.
      unsigned listed = 0;
      CHECK(cudaMemcpy(&listed, &scratch[calls - 1].listed, sizeof listed, cudaMemcpyDeviceToHost));
      std::sort(got.begin(), got.end());
      const bool ok = listed == kK && got == expected;
      all_ok = all_ok && ok;
      double us[kPhases], total = 0;
      for (int p = 0; p < kPhases; ++p) {
        us[p] = static_cast<double>(ns[p]) / 1000.0 / calls;
        total += us[p];
      }
      std::printf("%-10s %6d %9.2f %8.2f %8.2f %8.2f %8.2f %8.2f %5u/%-3d %6s\n", c.name, grid, total, us[0], us[1],
                  us[2], us[3], us[4], ties, calls, ok ? "ok" : "WRONG");
    }
  }
  std::printf("(µs per call, block 0's clock; digit d: its histogram, the barrier and the boundary search; a digit "
              "shows 0 when an earlier boundary bin was taken whole)\n");
  CHECK(cudaFree(scores));
  CHECK(cudaFree(scratch));
  CHECK(cudaFree(count));
  CHECK(cudaFree(list));
  CHECK(cudaFree(equal_phases));
  CHECK(cudaFree(phase_ns));
  return all_ok ? 0 : 1;
}
