// Exact top-k of the indexer scores with the CPU's order (higher score first, then lower index; NaN below
// every number; unavailable slots -1).
//
// One cluster of kCluster blocks per token (distributed shared memory, hardware cluster barriers), each block
// owning a contiguous eighth of the token's rows, read from global memory (L2: the score kernel has just
// written them) once per pass:
//   1. Radix select on the 32-bit order key of the score, most significant digit first (11, 11, 10 bits):
//      every block histograms its rows, every block sums the cluster's histograms and finds the bin that
//      holds the k-th largest key. It stops as soon as that bin is taken whole.
//   2. If three digits leave more keys equal to the boundary score than places (ties), the lower indices
//      win: each block ranks its ties in index order and the cluster adds the lower blocks' tie counts.
//   3. Every block sends its selected (score, index) keys to the leader block; every block then copies the
//      k keys and writes the final position of a k / kCluster share of them (rank = number of larger keys).
// (Replaces a two-kernel version — per-chunk candidates, then one block per token for the final select and a
// bitonic sort — whose second kernel ran on a single multiprocessor: 31 + 20 µs per batch-1 call at 1M.)
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "kernels_params.hpp"

namespace kvcompact::cuda::dsv4::detail {

namespace {

namespace cg = cooperative_groups;

constexpr unsigned kCluster = 8;      // blocks per token when the grid would be small (the portable cluster size)
constexpr unsigned kThreads = 1024;
constexpr unsigned kBins = 2048;      // the widest digit: 11 bits
constexpr unsigned kInFlight = 16;    // score loads a thread issues before using them

using BlockScan = cub::BlockScan<std::uint32_t, kThreads>;

struct TopkSmem {
  std::uint32_t hist[2][kBins];     // this block's histogram of the digit (by pass parity); the cluster reads it
  std::uint32_t total[kBins];       // the cluster's histogram of the current digit
  std::uint64_t chosen[kTopkMaxK];  // leader block: the selected keys, unordered (every block appends)
  std::uint64_t keys[kTopkMaxK];    // every block: a copy of the leader's chosen keys, for ranking
  BlockScan::TempStorage scan;
  std::uint32_t chosen_count;  // leader block: slots taken in chosen
  std::uint32_t tie_count;     // this block's ties of the boundary score (tie mode); higher blocks read it
  std::uint32_t bin, above, cnt;
};

// Monotone map of a float to uint32 (larger float -> larger key); -0 is +0 (the CPU compares them equal);
// every NaN maps to 0, below every number (then the index decides, as on the CPU).
__device__ __forceinline__ std::uint32_t order_key(float s) {
  if (s != s) return 0u;
  if (s == 0.0f) s = 0.0f;
  const std::uint32_t b = __float_as_uint(s);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// (order key, ~index): distinct for distinct rows, and "higher score, then lower index" is unsigned order.
__device__ __forceinline__ std::uint64_t composite(std::uint32_t u, std::uint32_t index) {
  return (static_cast<std::uint64_t>(u) << 32) | static_cast<std::uint64_t>(0xFFFFFFFFu - index);
}

__device__ std::uint32_t token_rows(const TopkParams& p, std::uint32_t token) {
  if (p.counts != nullptr) return p.counts[token];
  const std::int64_t t = p.tokens[token].position;
  return static_cast<std::uint32_t>((t + 1) / static_cast<std::int64_t>(p.ratio));
}

// Calls f(valid, index, order key) for the rows [begin, end) of this block, row begin + tid + j * kThreads on
// trip j; warp-uniform trip count (so f may use warp collectives), kInFlight loads issued before the first use.
template <class F>
__device__ __forceinline__ void for_each_row(const float* sc, std::uint32_t begin, std::uint32_t end, F&& f) {
  for (std::uint32_t i0 = begin; i0 < end; i0 += kThreads * kInFlight) {
    float v[kInFlight];
#pragma unroll
    for (unsigned j = 0; j < kInFlight; ++j) {
      const std::uint32_t i = i0 + j * kThreads + threadIdx.x;
      v[j] = i < end ? __ldg(sc + i) : 0.0f;
    }
#pragma unroll
    for (unsigned j = 0; j < kInFlight; ++j) {
      const std::uint32_t i = i0 + j * kThreads + threadIdx.x;
      f(i < end, i, order_key(v[j]));
    }
  }
}

// Appends key to the leader's chosen list (one remote atomic per warp when lanes agree to append).
__device__ __forceinline__ void append_warp(bool take, std::uint64_t key, std::uint32_t* leader_count,
                                            std::uint64_t* leader_chosen) {
  const unsigned mask = __ballot_sync(0xFFFFFFFFu, take);
  if (mask == 0) return;
  const unsigned lane = threadIdx.x % 32, first = static_cast<unsigned>(__ffs(static_cast<int>(mask)) - 1);
  std::uint32_t base = 0;
  if (lane == first) base = atomicAdd(leader_count, static_cast<std::uint32_t>(__popc(mask)));
  base = __shfl_sync(0xFFFFFFFFu, base, static_cast<int>(first));
  if (take) leader_chosen[base + static_cast<std::uint32_t>(__popc(mask & ((1u << lane) - 1u)))] = key;
}

// Cluster = the blocks of one token: kCluster when few tokens leave most multiprocessors idle, 1 for a prefill
// chunk's thousands of tokens (then cluster.sync is a block barrier and the "remote" memory is the block's own).
template <unsigned Cluster>
__global__ void __launch_bounds__(kThreads, 1) topk_kernel(TopkParams p) {
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  TopkSmem& sm = *reinterpret_cast<TopkSmem*>(smem_raw);
  cg::cluster_group cluster = cg::this_cluster();
  auto sync_cluster = [&] {
    if constexpr (Cluster == 1) {
      __syncthreads();
    } else {
      cluster.sync();
    }
  };
  auto remote = [&](auto* ptr, unsigned block) {  // ptr's counterpart in another block of the cluster
    if constexpr (Cluster == 1) {
      return ptr;
    } else {
      return cluster.map_shared_rank(ptr, block);
    }
  };
  const unsigned rank = Cluster == 1 ? 0u : cluster.block_rank(), tid = threadIdx.x;
  const std::uint32_t token = Cluster == 1 ? blockIdx.x : blockIdx.y;
  const std::uint32_t n = token_rows(p, token);
  const std::uint32_t kk = min(p.k, n);
  std::int32_t* out = p.out + static_cast<std::uint64_t>(token) * p.out_stride;
  if (kk == 0) {  // (uniform over the cluster: no block waits for another)
    if (rank == 0) {
      for (std::uint32_t i = tid; i < p.k; i += kThreads) out[i] = -1;
    }
    return;
  }
  const float* sc = p.scores + static_cast<std::uint64_t>(token) * p.score_stride;
  const std::uint32_t per = (n + Cluster - 1) / Cluster;
  const std::uint32_t begin = min(n, rank * per), end = min(n, begin + per);
  if (tid == 0) sm.chosen_count = 0;

  // ---- 1. radix select on the score's order key: afterwards the kk best rows are those with
  // (u >> shift) > prefix, plus those with (u >> shift) == prefix if `whole`, else the krem lowest-index ties.
  std::uint32_t prefix = 0, krem = kk;
  unsigned shift = 32;
  bool whole = true;
  if (kk < n) {
    whole = false;
    for (unsigned pass = 0; pass < 3 && !whole; ++pass) {
      const unsigned bits = pass == 2 ? 10u : 11u;
      shift -= bits;
      std::uint32_t* hist = sm.hist[pass & 1u];
      for (unsigned b = tid; b < kBins; b += kThreads) hist[b] = 0;
      __syncthreads();
      for_each_row(sc, begin, end, [&](bool valid, std::uint32_t, std::uint32_t u) {
        const bool counted = valid && (pass == 0 || (u >> (shift + bits)) == prefix);
        const std::uint32_t bin = (u >> shift) & ((1u << bits) - 1u);
        // Scores of a token share their leading bits, so in the first digit most warps agree on the bin:
        // one lane then adds for the warp.
        const unsigned voters = __ballot_sync(0xFFFFFFFFu, counted);
        const std::uint32_t lo = __reduce_min_sync(0xFFFFFFFFu, counted ? bin : 0xFFFFFFFFu);
        const std::uint32_t hi = __reduce_max_sync(0xFFFFFFFFu, counted ? bin : 0u);
        if (lo == hi) {
          if (voters != 0 && tid % 32 == static_cast<unsigned>(__ffs(static_cast<int>(voters)) - 1)) {
            atomicAdd(&hist[bin], static_cast<std::uint32_t>(__popc(voters)));
          }
        } else if (counted) {
          atomicAdd(&hist[bin], 1u);
        }
      });
      sync_cluster();  // every block's histogram is complete (and chosen_count zeroed before any append)
      for (unsigned b = tid; b < kBins; b += kThreads) {
        std::uint32_t part[Cluster];
#pragma unroll
        for (unsigned c = 0; c < Cluster; ++c) part[c] = remote(hist, c)[b];
        std::uint32_t s = 0;
#pragma unroll
        for (unsigned c = 0; c < Cluster; ++c) s += part[c];
        sm.total[b] = s;
      }
      __syncthreads();
      // Thread t owns bins 2047 - 2t and 2046 - 2t: an inclusive scan in thread order counts the keys in
      // higher-or-equal bins.
      const std::uint32_t c0 = sm.total[kBins - 1 - 2 * tid], c1 = sm.total[kBins - 2 - 2 * tid];
      std::uint32_t incl = 0;
      BlockScan(sm.scan).InclusiveSum(c0 + c1, incl);
      const std::uint32_t excl = incl - c0 - c1;
      if (excl < krem && krem <= incl) {
        const bool first = excl + c0 >= krem;
        sm.bin = first ? kBins - 1 - 2 * tid : kBins - 2 - 2 * tid;
        sm.above = first ? excl : excl + c0;
        sm.cnt = first ? c0 : c1;
      }
      __syncthreads();
      krem -= sm.above;
      prefix = (prefix << bits) | sm.bin;
      whole = sm.cnt == krem;
      __syncthreads();  // (sm.bin / above / cnt are rewritten by the next pass)
    }
  }
  if (n <= p.k) sync_cluster();  // (no pass ran: chosen_count must be zero before any block appends)

  // ---- 2. send the selected keys to the leader.
  std::uint32_t* leader_count = remote(&sm.chosen_count, 0);
  std::uint64_t* leader_chosen = remote(sm.chosen, 0);
  if (whole) {
    const std::uint64_t bound = prefix;
    for_each_row(sc, begin, end, [&](bool valid, std::uint32_t i, std::uint32_t u) {
      const bool take = valid && (static_cast<std::uint64_t>(u) >> shift) >= bound;
      append_warp(take, composite(u, i), leader_count, leader_chosen);
    });
  } else {
    // Tie mode (shift == 0, prefix = the boundary score's key): all higher keys, and the krem ties of lowest
    // index. A thread walks a contiguous range so that ties are ranked in index order by one block scan.
    const std::uint32_t span = (end - begin + kThreads - 1) / kThreads;
    const std::uint32_t r0 = min(end, begin + tid * span), r1 = min(end, r0 + span);
    std::uint32_t mine = 0;
    for (std::uint32_t i = r0; i < r1; ++i) mine += order_key(__ldg(sc + i)) == prefix ? 1u : 0u;
    std::uint32_t before = 0, block_ties = 0;
    BlockScan(sm.scan).ExclusiveSum(mine, before, block_ties);
    if (tid == 0) sm.tie_count = block_ties;
    sync_cluster();
    if constexpr (Cluster > 1) {
      for (unsigned c = 0; c < rank; ++c) before += *remote(&sm.tie_count, c);
    }
    for (std::uint32_t i = r0; i < r1; ++i) {
      const std::uint32_t u = order_key(__ldg(sc + i));
      bool take = u > prefix;
      if (u == prefix) take = before++ < krem;
      if (take) leader_chosen[atomicAdd(leader_count, 1u)] = composite(u, i);
    }
  }
  sync_cluster();  // the leader holds exactly kk keys

  // ---- 3. every block copies the kk keys and places its share: position = number of larger keys.
  for (std::uint32_t j = tid; j < kk; j += kThreads) sm.keys[j] = leader_chosen[j];
  sync_cluster();  // (also: the leader's chosen stays readable until every block has copied it)
  const std::uint32_t share = (kk + Cluster - 1) / Cluster;
  const std::uint32_t j0 = min(kk, rank * share), j1 = min(kk, j0 + share);
  const unsigned warp = tid / 32, lane = tid % 32;
  for (std::uint32_t j = j0 + warp; j < j1; j += kThreads / 32) {
    const std::uint64_t key = sm.keys[j];
    std::uint32_t larger = 0;
    for (std::uint32_t i = lane; i < kk; i += 32) larger += sm.keys[i] > key ? 1u : 0u;
    larger = __reduce_add_sync(0xFFFFFFFFu, larger);
    if (lane == 0) out[larger] = static_cast<std::int32_t>(0xFFFFFFFFu - static_cast<std::uint32_t>(key));
  }
  if (rank == Cluster - 1) {
    for (std::uint32_t i = kk + tid; i < p.k; i += kThreads) out[i] = -1;
  }
}

}  // namespace

cudaError_t launch_topk(const TopkParams& p, std::uint32_t multiprocessors, cudaStream_t stream) {
  if (p.count == 0) return cudaSuccess;
  constexpr int kSmem = static_cast<int>(sizeof(TopkSmem));
  // (Attributes set on every launch: cheap, and valid whichever device is current.)
  if (std::uint64_t{p.count} * kCluster > 2ull * multiprocessors) {
    const cudaError_t e = cudaFuncSetAttribute(topk_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (e != cudaSuccess) return e;
    topk_kernel<1><<<p.count, kThreads, kSmem, stream>>>(p);
    return cudaGetLastError();
  }
  const cudaError_t e = cudaFuncSetAttribute(topk_kernel<kCluster>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kCluster, p.count);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmem;
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kCluster;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, topk_kernel<kCluster>, p);
}

}  // namespace kvcompact::cuda::dsv4::detail
