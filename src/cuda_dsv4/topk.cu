// Exact top-k of the indexer scores with the CPU's order (higher score first, then lower index; NaN below
// every number; unavailable slots -1).
//
// Each (score, index) is one distinct 64-bit key (order-preserving score bits, then ~index), so "higher score,
// then lower index" is unsigned order and the answer is unique. A cluster of blocks per token (distributed
// shared memory, hardware cluster barriers), each block owning a contiguous part of the token's rows:
//   1. MSB-first radix select on the keys, digits of 11, 11, 10 | 11, 11, 10 bits: every block histograms its
//      keys and adds its nonzero bins into every block's copy of the cluster's histogram (one cluster
//      barrier per digit), then finds the bin that holds the k-th largest key;
//      it stops as soon as that bin is taken whole (the index digits only run when scores tie at the bound).
//      The first digit reads the scores from global memory (the score kernel has just written them) and,
//      when the block's share fits (32768 rows: batch 1 up to 2M context, batch 8 up to 1M), stages their order
//      keys in shared memory for the second digit (a share of at least 4096 aligned rows arrives there by bulk
//      copies issued at the kernel's start, and its scores become order keys in place); otherwise the second
//      digit reads the scores again. While passing
//      over them the second time a block keeps the keys at or above the first digit's boundary bin in shared
//      memory (if they fit, which they do unless many scores share their leading 11 bits; a block whose keys
//      did not fit keeps those at or above the 22-bit prefix in the third digit's pass instead), and the later
//      digits and the selection scan only those.
//   Code size matters here: every pass is inlined and unrolled, and a version whose code had grown by half
//   (staging with a second 16-deep loop form) ran 1-3 % slower per decode step even where it did not stage, so
//   the passes that only run when the list overflows keep 4 loads in flight (cuda-dsv4-kernels-history.md, round 16).
//   2. Every block gathers its selected keys in its own shared memory and tells every block how many it has
//      (no remote atomics: an append to the leader's list cost the appending warp a distributed-shared-memory
//      round trip, and the busiest block several); every block then copies the k keys from all of them and
//      writes the final position of its share of them (position = number of larger keys).
// (Replaces a two-kernel version — per-chunk candidates, then one block per token for the final select and a
// bitonic sort — whose second kernel ran on a single multiprocessor: 31 + 20 µs per batch-1 call at 1M.)
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>
#include <cub/block/block_scan.cuh>

#include "cuda/bulk_copy.cuh"
#include "cuda/per_device.hpp"
#include "kernels_params.hpp"
#include "pdl.cuh"

namespace kvcompact::cuda::dsv4::detail {

namespace {

namespace cg = cooperative_groups;

constexpr unsigned kThreads = 1024;
constexpr unsigned kBins = 2048;      // the widest digit: 11 bits
constexpr unsigned kInFlight = 16;    // score loads a thread issues before using them (the hot passes)
constexpr unsigned kColdInFlight = 4; // the same on the passes that run only when the list overflows: every
                                      // site is inlined and unrolled, so fewer keep the kernel's code small
constexpr unsigned kListCap = 4096;   // keys a block keeps in shared memory after the first digit
constexpr unsigned kStageCap = 32768; // order keys a block stages in shared memory during the first digit
// A block whose share is staged, 16-byte aligned and at least kBulkMinRows rows long brings its scores into the
// staging area with bulk copies in kBulkChunks chunks (issued at the kernel's start), and the first digit turns
// each chunk into order keys in place once it has landed: the copies need no registers, so the whole share is in
// flight at once, and the chunks after the first arrive while it is counted. (Loaded by the threads, 16 scores
// each in flight, the first pass at batch 8 x 1M spent ~10 us on two rounds of loads followed by their keys.)
constexpr unsigned kBulkChunks = 8, kBulkMinRows = 4096;
// (Shared memory: 16 + 16 + 32 + 16 + 128 + 16 KB, one block per multiprocessor; the scans' storage shares the
// last 16 with the ranking's copy of the keys, which is written after the last scan. A token's keys at or above the
// first digit's boundary bin are a few hundred, so 4096 list slots per block lose nothing measurable — a list
// of 4096 beside 8192 measured 0.998-1.002 in round 16 — and the staged keys then cover a block's 32768 rows:
// batch 8 at 1M context.)

using BlockScan = cub::BlockScan<std::uint32_t, kThreads>;

struct TopkSmem {
  std::uint32_t hist[2][kBins];     // this block's histogram of the digit (by digit parity)
  std::uint32_t total[2][kBins];    // the cluster's histogram of the digit (by parity; every block adds into it)
  std::uint64_t list[kListCap];     // this block's keys at or above the first digit's boundary bin
  std::uint64_t chosen[kTopkMaxK];  // this block's selected keys, unordered
  std::uint32_t staged[kStageCap];  // the order key of row begin + j at j, when the block's share fits (first the
                                    // score itself, while the bulk copies land)
  std::uint64_t chunk_landed[kBulkChunks];  // the bulk copies' mbarriers
  union {
    BlockScan::TempStorage scan;    // the digits' scans (1)
    std::uint64_t keys[kTopkMaxK];  // every block: a copy of the cluster's chosen keys, for ranking (3)
  };
  std::uint32_t list_count;    // keys in list
  std::uint32_t chosen_count;  // keys in chosen
  std::uint32_t chosen_counts[16];  // block b's chosen_count at [b] (written by block b, before the send's barrier)
  std::uint32_t bin[2], above[2], cnt[2];  // the digit's boundary bin (by parity: no barrier before the next digit)
};
static_assert(sizeof(TopkSmem) <= 227 * 1024, "one block per multiprocessor on sm_90 (227 KB of shared memory)");

// Monotone map of a float to uint32 (larger float -> larger key); -0 is +0 (the CPU compares them equal);
// every NaN maps to 0, below every number (then the index decides, as on the CPU).
// Integer form (six instructions; the branchy float form took eight): negative numbers are complemented, the
// others get the top bit, by one XOR with (sign replicated) | top bit.
__device__ __forceinline__ std::uint32_t order_key(float s) {
  std::uint32_t b = __float_as_uint(s);
  if (b == 0x80000000u) b = 0u;  // -0 -> +0
  const std::uint32_t u = b ^ (static_cast<std::uint32_t>(static_cast<std::int32_t>(b) >> 31) | 0x80000000u);
  return s != s ? 0u : u;
}

// (order key, ~index): distinct for distinct rows, and "higher score, then lower index" is unsigned order.
__device__ __forceinline__ std::uint64_t composite(std::uint32_t u, std::uint32_t index) {
  return (static_cast<std::uint64_t>(u) << 32) | static_cast<std::uint64_t>(0xFFFFFFFFu - index);
}

// A token's row count: counts[token], or (position + 1) / ratio, in 64 bits (a negative position: more than any
// bound), so that the caller can compare it with max_rows before it reads a score.
__device__ std::uint64_t token_rows(const TopkParams& p, std::uint32_t token) {
  if (p.counts != nullptr) return p.counts[token];
  const std::int64_t t = p.tokens[token].position;
  return t < 0 ? ~std::uint64_t{0} : static_cast<std::uint64_t>(t + 1) / p.ratio;
}

// Calls f(valid, index, order key) for the rows [begin, end) of this block, row begin + tid + j * kThreads on
// trip j; warp-uniform trip count (so f may use warp collectives), InFlight loads issued before the first use.
template <unsigned InFlight = kInFlight, class F>
__device__ __forceinline__ void for_each_row(const float* sc, std::uint32_t begin, std::uint32_t end, F&& f) {
  for (std::uint32_t i0 = begin; i0 < end; i0 += kThreads * InFlight) {
    float v[InFlight];
#pragma unroll
    for (unsigned j = 0; j < InFlight; ++j) {
      const std::uint32_t i = i0 + j * kThreads + threadIdx.x;
      v[j] = i < end ? __ldg(sc + i) : 0.0f;
    }
#pragma unroll
    for (unsigned j = 0; j < InFlight; ++j) {
      const std::uint32_t i = i0 + j * kThreads + threadIdx.x;
      f(i < end, i, order_key(v[j]));
    }
  }
}

// Appends the taking lanes' keys at dst[*count ...] (one atomic per warp; count may be another block's).
__device__ __forceinline__ void append_warp(bool take, std::uint64_t key, std::uint32_t* count, std::uint64_t* dst) {
  const unsigned mask = __ballot_sync(0xFFFFFFFFu, take);
  if (mask == 0) return;
  const unsigned lane = threadIdx.x % 32, first = static_cast<unsigned>(__ffs(static_cast<int>(mask)) - 1);
  std::uint32_t base = 0;
  if (lane == first) base = atomicAdd(count, static_cast<std::uint32_t>(__popc(mask)));
  base = __shfl_sync(0xFFFFFFFFu, base, static_cast<int>(first));
  if (take) dst[base + static_cast<std::uint32_t>(__popc(mask & ((1u << lane) - 1u)))] = key;
}

// Counts the key in hist[bin]. A plain increment: sm_90 issues it as one ATOMS.POPC.INC per warp, which adds each
// distinct address's lane count once, so lanes that agree on the bin cost no more than one. (Until round 26 a
// warp first compared its lanes' bins with two reductions and let one lane add for all when they agreed; at batch
// 8 x 1M the benchmark's warps never agreed in the first digit, and the reductions were a quarter of the pass.)
__device__ __forceinline__ void count_key(bool counted, std::uint32_t bin, std::uint32_t* hist) {
  if (counted) atomicAdd(&hist[bin], 1u);
}

// Cluster = the blocks of one token: 16, 12 or 8 when few tokens would leave most multiprocessors idle, 1 for a
// prefill chunk's thousands of tokens (then the cluster barrier is a block barrier and "remote" memory the
// block's own).
template <unsigned Cluster>
__global__ void __launch_bounds__(kThreads, 1) topk_kernel(TopkParams p) {
  static_assert(Cluster <= 16, "chosen_counts holds one count per block of a cluster");
  wait_for_previous_grid();
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
  // The first cluster barrier in two halves, so that its round trip overlaps the first pass over the scores:
  // a block arrives once its totals and counters are zero and waits just before it first adds into another's.
  bool arrival_pending = false;
  auto arrive_cluster = [&] {
    if constexpr (Cluster == 1) {
      __syncthreads();
    } else {
      asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
      arrival_pending = true;
    }
  };
  auto finish_arrival = [&] {
    if (arrival_pending) asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    arrival_pending = false;
  };
  const unsigned rank = Cluster == 1 ? 0u : cluster.block_rank(), tid = threadIdx.x;
  const std::uint32_t token = Cluster == 1 ? blockIdx.x : blockIdx.y;
  // A token beyond the call's max_rows reads no score (its row holds max_rows of them); kTopkBeyondBound in every
  // slot tells sparse_attention (which answers NaN for it) and the caller. (Both branches are uniform over the
  // cluster: no block waits for another.)
  const std::uint64_t rows = token_rows(p, token);
  const bool beyond = rows > p.max_rows;
  const std::uint32_t n = beyond ? 0u : static_cast<std::uint32_t>(rows);
  const std::uint32_t kk = min(p.k, n);
  std::int32_t* out = p.out + static_cast<std::uint64_t>(token) * p.out_stride;
  if (beyond || kk == 0) {
    if (rank == 0) {
      for (std::uint32_t i = tid; i < p.k; i += kThreads) out[i] = beyond ? kTopkBeyondBound : -1;
    }
    return;
  }
  const float* sc = p.scores + static_cast<std::uint64_t>(token) * p.score_stride;
  // Shares are whole groups of 4 scores, so that every block's share starts 16-byte aligned when its token's
  // scores do (the bulk copies' condition).
  const std::uint32_t per = ((n + Cluster - 1) / Cluster + 3u) & ~3u;
  const std::uint32_t begin = min(n, rank * per), end = min(n, begin + per);
  const std::uint32_t bulk_rows = (end - begin) & ~3u;  // the copies' rows; the last 0-3 are loaded by threads
  const bool bulk = end - begin <= kStageCap && end - begin >= kBulkMinRows &&
                    (reinterpret_cast<std::uintptr_t>(sc + begin) & 15u) == 0;
  const std::uint32_t chunk_rows = ((bulk_rows + kBulkChunks - 1) / kBulkChunks + 3u) & ~3u;
  // Chunk c's rows [first, second) of the share (empty from some chunk on when the share is short).
  auto chunk = [&](unsigned c) {
    const std::uint32_t r0 = min(bulk_rows, c * chunk_rows);
    return std::pair<std::uint32_t, std::uint32_t>{r0, min(bulk_rows, r0 + chunk_rows)};
  };
  namespace tqd = tq::detail;
  if (tid == 0) {
    sm.chosen_count = 0;
    sm.list_count = 0;
    if (bulk) {
      for (unsigned c = 0; c < kBulkChunks; ++c) tqd::mbar_init(&sm.chunk_landed[c], 1);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      for (unsigned c = 0; c < kBulkChunks; ++c) {
        const auto [r0, r1] = chunk(c);
        if (r1 == r0) break;
        tqd::mbar_arrive_expect_tx(&sm.chunk_landed[c], (r1 - r0) * 4u);
        tqd::bulk_copy(&sm.staged[r0], sc + begin + r0, (r1 - r0) * 4u, &sm.chunk_landed[c]);
      }
    }
  }
  // This block's rows as f(valid, index, order key): from the keys the first digit staged in shared memory
  // when they fit (a short loop: shared memory's latency needs no deep unrolling), else from the scores.
  const bool stage = end - begin <= kStageCap;
  bool staged = false;
  auto for_each_row_key = [&](auto in_flight, auto&& f) {
    if (staged) {
      const std::uint32_t m = end - begin;
#pragma unroll 2
      for (std::uint32_t j0 = 0; j0 < m; j0 += kThreads) {
        const std::uint32_t j = j0 + tid;
        f(j < m, begin + j, j < m ? sm.staged[j] : 0u);
      }
    } else {
      for_each_row<decltype(in_flight)::value>(sc, begin, end, f);
    }
  };
  using Hot = std::integral_constant<unsigned, kInFlight>;
  using Cold = std::integral_constant<unsigned, kColdInFlight>;
  // This block's keys: from the list once it holds them, else from its rows (the later digits and the
  // selection; the list holds the keys unless it overflowed, or the first digit's bin was taken whole).
  bool listed = false;
  auto for_each_key = [&](auto&& f) {
    if (listed) {
      const std::uint32_t m = sm.list_count;
      for (std::uint32_t j0 = 0; j0 < m; j0 += kThreads) {
        const std::uint32_t j = j0 + tid;
        f(j < m, j < m ? sm.list[j] : 0ull);
      }
    } else {
      for_each_row_key(Cold{}, [&](bool valid, std::uint32_t i, std::uint32_t u) { f(valid, composite(u, i)); });
    }
  };

  // ---- 1. radix select: afterwards the kk best keys are those with (key >> shift) >= prefix.
  std::uint64_t prefix = 0;
  std::uint32_t krem = kk;
  std::uint32_t bin_count = n;  // the cluster's keys in the boundary bin of the digits so far
  unsigned shift = 64;
  bool whole = kk == n;
  for (unsigned b = tid; b < kBins; b += kThreads) sm.total[0][b] = sm.total[1][b] = 0;
  arrive_cluster();  // this block's totals and counters are zero (no block adds or appends to them before its wait)
  for (unsigned digit = 0; digit < 6 && !whole; ++digit) {
    const unsigned bits = digit % 3 == 2 ? 10u : 11u;
    shift -= bits;
    std::uint32_t* hist = sm.hist[digit & 1u];
    for (unsigned b = tid; b < kBins; b += kThreads) hist[b] = 0;
    if (digit == 0) {
      __syncthreads();
      if (bulk) {
        // Each chunk as it lands: its scores become order keys in place, counted. The last 0-3 rows come by loads.
        for (unsigned c = 0; c < kBulkChunks; ++c) {
          const auto [r0, r1] = chunk(c);
          if (r1 == r0) break;
          tqd::mbar_wait(&sm.chunk_landed[c], 0);
          for (std::uint32_t j = r0 + tid; j < r1; j += kThreads) {
            const std::uint32_t u = order_key(__uint_as_float(sm.staged[j]));
            count_key(true, u >> 21, hist);
            sm.staged[j] = u;
          }
        }
        if (bulk_rows + tid < end - begin) {
          const std::uint32_t u = order_key(__ldg(sc + begin + bulk_rows + tid));
          count_key(true, u >> 21, hist);
          sm.staged[bulk_rows + tid] = u;
        }
      } else {
        for_each_row(sc, begin, end, [&](bool valid, std::uint32_t i, std::uint32_t u) {
          count_key(valid, u >> 21, hist);
          if (stage && valid) sm.staged[i - begin] = u;
        });
      }
      staged = stage;
    } else if (digit == 1) {
      // Keep the keys at or above the first digit's boundary bin if this block's share of them fits.
      const std::uint32_t b0 = static_cast<std::uint32_t>(prefix);
      const unsigned t0 = kBins - 1 - 2 * tid, t1 = kBins - 2 - 2 * tid;
      const std::uint32_t mine = (t0 >= b0 ? sm.hist[0][t0] : 0u) + (t1 >= b0 ? sm.hist[0][t1] : 0u);
      std::uint32_t ignored = 0, at_or_above = 0;
      BlockScan(sm.scan).ExclusiveSum(mine, ignored, at_or_above);
      const bool fill = at_or_above <= kListCap;
      __syncthreads();
      for_each_row_key(Hot{}, [&](bool valid, std::uint32_t i, std::uint32_t u) {
        const std::uint32_t top = u >> 21;
        count_key(valid && top == b0, (u >> 10) & (kBins - 1), hist);
        if (fill) append_warp(valid && top >= b0, composite(u, i), &sm.list_count, sm.list);
      });
      listed = fill;
    } else {
      // A block whose keys at or above the first digit's boundary bin did not fit its list (many of its keys in
      // that bin) keeps the keys at or above the prefix in this pass instead: the cluster holds kk - krem of them above the prefix's bin and bin_count in it, which fit
      // unless scores tie massively, so the later digits and the selection scan the list, not every row again.
      const bool fill = !listed && kk - krem + bin_count <= kListCap;
      __syncthreads();
      const std::uint64_t match = prefix;
      const unsigned high = shift + bits;
      for_each_key([&](bool valid, std::uint64_t key) {
        const std::uint64_t lead = key >> high;
        count_key(valid && lead == match, static_cast<std::uint32_t>(key >> shift) & ((1u << bits) - 1u), hist);
        if (fill) append_warp(valid && lead >= match, key, &sm.list_count, sm.list);
      });
      listed = listed || fill;
    }
    __syncthreads();  // this block's histogram (and list) is complete
    finish_arrival();  // (digit 0: every block's totals are zero)
    // The cluster's histogram: every block adds its nonzero bins into every block's total with remote atomics
    // (a token's keys fall into few bins of a digit, so this is a few hundred to a few thousand atomics per
    // block; reading every block's whole histogram instead made distributed shared memory this kernel's
    // bottleneck at batch 1). The next digit's total is zeroed here: its last reader was the previous digit's
    // scan, and no block adds to it before the barrier below.
    std::uint32_t* total = sm.total[digit & 1u];
    for (unsigned b = tid; b < kBins; b += kThreads) {
      const std::uint32_t v = hist[b];
      if (v != 0) {
#pragma unroll
        for (unsigned c = 0; c < Cluster; ++c) atomicAdd(remote(total, c) + b, v);
      }
      sm.total[(digit + 1) & 1u][b] = 0;
    }
    sync_cluster();  // every block's total of this digit is complete
    // Thread t owns bins 2047 - 2t and 2046 - 2t: an inclusive scan in thread order counts the keys in
    // higher-or-equal bins.
    const std::uint32_t c0 = total[kBins - 1 - 2 * tid], c1 = total[kBins - 2 - 2 * tid];
    std::uint32_t incl = 0;
    BlockScan(sm.scan).InclusiveSum(c0 + c1, incl);
    const std::uint32_t excl = incl - c0 - c1;
    const unsigned parity = digit & 1u;
    if (excl < krem && krem <= incl) {
      const bool first = excl + c0 >= krem;
      sm.bin[parity] = first ? kBins - 1 - 2 * tid : kBins - 2 - 2 * tid;
      sm.above[parity] = first ? excl : excl + c0;
      sm.cnt[parity] = first ? c0 : c1;
    }
    __syncthreads();
    krem -= sm.above[parity];
    prefix = (prefix << bits) | sm.bin[parity];
    bin_count = sm.cnt[parity];
    whole = bin_count == krem;
  }

  // ---- 2. gather this block's selected keys (the cluster's are exactly kk: the keys are distinct) and tell
  // every block their count.
  finish_arrival();  // (when no digit ran)
  {
    const std::uint64_t bound = prefix;
    const unsigned sh = shift;
    for_each_key([&](bool valid, std::uint64_t key) {
      append_warp(valid && (sh == 64 || (key >> sh) >= bound), key, &sm.chosen_count, sm.chosen);
    });
  }
  __syncthreads();  // chosen_count is final
  if (tid < Cluster) remote(sm.chosen_counts, tid)[rank] = sm.chosen_count;
  sync_cluster();  // every block's chosen keys and count are visible to the cluster

  // ---- 3. every block copies the kk keys (block 0's, then block 1's, ...) and places its share: position =
  // number of larger keys.
  for (std::uint32_t j = tid; j < kk; j += kThreads) {
    unsigned from = 0;
    std::uint32_t at = j;
    while (from + 1 < Cluster && at >= sm.chosen_counts[from]) at -= sm.chosen_counts[from++];  // (they add up to kk)
    sm.keys[j] = remote(sm.chosen, from)[at];
  }
  sync_cluster();  // (also: every block's chosen stays readable until every block has copied it)
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

// Launch with `Cluster` blocks per token (a runtime cluster dimension; 16 needs the non-portable size).
// attr must hold two attributes: the cluster shape and the overlap with the previous kernel (pdl.cuh).
template <unsigned Cluster>
cudaLaunchConfig_t cluster_config(const TopkParams& p, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(Cluster, p.count);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = sizeof(TopkSmem);
  config.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = Cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1] = overlap_with_previous_attribute();
  config.attrs = attr;
  config.numAttrs = 2;
  return config;
}

template <unsigned Cluster>
cudaError_t set_kernel_attributes() {
  cudaError_t e = cudaFuncSetAttribute(topk_kernel<Cluster>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(sizeof(TopkSmem)));
  if (e == cudaSuccess && Cluster > 8) e = cudaFuncSetAttribute(topk_kernel<Cluster>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  return e;
}

// Clusters of this size that can run at once on the current device (0 when it cannot place one, or when the
// query failed: then the next call asks again). Asked once per device (cuda/per_device.hpp).
template <unsigned Cluster>
int max_active_clusters() {
  static kvcompact::cuda::detail::PerDevice<int> active;
  int n = 0;
  const cudaError_t err = active.get(n, [](int, int& clusters) {
    const cudaError_t e = set_kernel_attributes<Cluster>();
    if (e != cudaSuccess) return e;
    TopkParams probe{};
    probe.count = 1;
    cudaLaunchAttribute attr[2]{};
    cudaLaunchConfig_t config = cluster_config<Cluster>(probe, nullptr, attr);
    config.numAttrs = 1;  // (the cluster shape only)
    return cudaOccupancyMaxActiveClusters(&clusters, topk_kernel<Cluster>, &config);
  });
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

template <unsigned Cluster>
cudaError_t launch_clusters(const TopkParams& p, cudaStream_t stream) {
  const cudaError_t e = set_kernel_attributes<Cluster>();
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attr[2]{};
  const cudaLaunchConfig_t config = cluster_config<Cluster>(p, stream, attr);
  return cudaLaunchKernelEx(&config, topk_kernel<Cluster>, p);
}

}  // namespace

cudaError_t launch_topk(const TopkParams& p, std::uint32_t multiprocessors, cudaStream_t stream) {
  if (p.count == 0) return cudaSuccess;
  // Few tokens: as many multiprocessors per token as fit at once (16 where a GPC can host such a cluster, the
  // H200's can); many tokens: one block each.
  if (std::uint64_t{p.count} * 16 <= multiprocessors && static_cast<std::uint32_t>(max_active_clusters<16>()) >= p.count) {
    return launch_clusters<16>(p, stream);
  }
  // (On the H200 the occupancy query reports 7 clusters of 10 to 16 such blocks at once, so batch 8 takes the
  // 8-block path below; scripts/gpu/cluster_occupancy.cu prints the query's answers.)
  if (std::uint64_t{p.count} * 12 <= multiprocessors &&
      static_cast<std::uint32_t>(max_active_clusters<12>()) >= p.count) {
    return launch_clusters<12>(p, stream);
  }
  if (std::uint64_t{p.count} * 8 <= 2ull * multiprocessors) return launch_clusters<8>(p, stream);
  const cudaError_t e = set_kernel_attributes<1>();
  if (e != cudaSuccess) return e;
  return launch_after_previous(topk_kernel<1>, dim3(p.count), dim3(kThreads), sizeof(TopkSmem), stream, p);
}

}  // namespace kvcompact::cuda::dsv4::detail
