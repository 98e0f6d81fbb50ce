// Exact top-k of the indexer scores with the CPU's order (higher score first, then lower index; NaN below
// every number; unavailable slots -1). Each (score, index) becomes one distinct 64-bit key
// (order-preserving score bits << 32 | ~index), so the order is a strict total order and the answer is
// unique. Stage 1: per chunk of rows, an MSB-first radix select in shared memory keeps the chunk's k best
// keys. Stage 2: per token, the same select over the chunks' candidates, then a bitonic sort of the k keys.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels_params.hpp"

namespace kvcompact::cuda::dsv4::detail {

namespace {

// Monotone map of a float to uint32 (larger float -> larger key); -0 is +0 (the CPU compares them equal);
// every NaN maps to 0, below every number (then the index decides, as on the CPU).
__device__ __forceinline__ std::uint32_t order_key(float s) {
  if (s != s) return 0u;
  if (s == 0.0f) s = 0.0f;
  const std::uint32_t b = __float_as_uint(s);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ std::uint64_t composite(float s, std::uint32_t index) {
  return (static_cast<std::uint64_t>(order_key(s)) << 32) | static_cast<std::uint64_t>(0xFFFFFFFFu - index);
}

__device__ std::uint32_t token_rows(const TopkParams& p, std::uint32_t token) {
  if (p.counts != nullptr) return p.counts[token];
  const std::int64_t t = p.tokens[token].position;
  return static_cast<std::uint32_t>((t + 1) / static_cast<std::int64_t>(p.ratio));
}

struct SelectResult {
  std::uint64_t prefix;
  unsigned shift;
};

// Block-wide MSB-first radix select over n distinct keys in shared memory: afterwards exactly `kk` keys
// satisfy (key >> shift) >= prefix (the kk largest). 8-bit digits; stops as soon as the boundary digit's
// bin is taken whole. `hist` has 256 entries, `sh` 5 (sh[3] is left to the caller). Once the boundary bin
// holds at most scratch_cap keys and a quarter of those still scanned, they are copied to `scratch` and the
// later digits scan only them instead of rescanning all keys (up to 8 passes when many scores tie, as in the
// benchmark's repeated rows; on the H200 this did not change the benchmark's time measurably).
__device__ SelectResult radix_select(const std::uint64_t* keys, std::uint32_t n, std::uint32_t kk,
                                     std::uint32_t* hist, std::uint32_t* sh, std::uint64_t* scratch,
                                     std::uint32_t scratch_cap) {
  std::uint64_t prefix = 0;
  std::uint32_t krem = kk;
  bool compacted = false;
  for (int d = 0; d < 8; ++d) {
    const unsigned shift = 56u - 8u * static_cast<unsigned>(d);
    for (unsigned i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    // When all counted lanes of a warp have the same digit (scores of one token share their leading bits, so
    // the first digits mostly do), one lane adds for all of them; otherwise each lane adds its own. (Grouping
    // lanes with __match_any_sync instead made its result the kernel's largest stall, 20 % of the samples.)
    for (std::uint32_t i0 = 0; i0 < n; i0 += blockDim.x) {
      const std::uint32_t i = i0 + threadIdx.x;
      bool counted = false;
      std::uint32_t bin = 0;
      if (i < n) {
        const std::uint64_t key = keys[i];
        counted = d == 0 || (key >> (shift + 8u)) == prefix;
        bin = static_cast<std::uint32_t>((key >> shift) & 0xFFu);
      }
      const unsigned voters = __ballot_sync(0xFFFFFFFFu, counted);
      const std::uint32_t lo = __reduce_min_sync(0xFFFFFFFFu, counted ? bin : 0xFFFFFFFFu);
      const std::uint32_t hi = __reduce_max_sync(0xFFFFFFFFu, counted ? bin : 0u);
      if (lo == hi) {
        if (voters != 0 && (threadIdx.x % 32) == static_cast<unsigned>(__ffs(static_cast<int>(voters)) - 1)) {
          atomicAdd(&hist[bin], static_cast<std::uint32_t>(__popc(voters)));
        }
      } else if (counted) {
        atomicAdd(&hist[bin], 1u);
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l owns bins 255 - 8l ... 248 - 8l (descending); an inclusive scan over lanes gives the count of
      // keys in higher bins.
      const unsigned lane = threadIdx.x;
      std::uint32_t c[8];
      std::uint32_t total = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = hist[255u - 8u * lane - static_cast<unsigned>(j)];
        total += c[j];
      }
      std::uint32_t incl = total;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const std::uint32_t v = __shfl_up_sync(0xFFFFFFFFu, incl, o);
        if (lane >= static_cast<unsigned>(o)) incl += v;
      }
      const std::uint32_t excl = incl - total;
      if (lane == 0) sh[4] = 0;
      if (excl < krem && krem <= incl) {
        std::uint32_t cum = excl;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (cum + c[j] >= krem) {
            sh[0] = 255u - 8u * lane - static_cast<unsigned>(j);
            sh[1] = cum;
            sh[2] = c[j];
            break;
          }
          cum += c[j];
        }
      }
    }
    __syncthreads();
    const std::uint32_t bin = sh[0], above = sh[1], cnt = sh[2];
    __syncthreads();
    krem -= above;
    prefix = (prefix << 8) | bin;
    if (cnt == krem) return SelectResult{prefix, shift};
    if (!compacted && cnt <= scratch_cap && 4 * cnt <= n) {
      for (std::uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        const std::uint64_t key = keys[i];
        if ((key >> shift) == prefix) scratch[atomicAdd(&sh[4], 1u)] = key;
      }
      __syncthreads();
      keys = scratch;
      n = cnt;
      compacted = true;
    }
  }
  return SelectResult{prefix, 0u};  // not reached for distinct keys (the last digit's bin holds one key)
}

constexpr unsigned kStage1Threads = 512;
constexpr unsigned kStage2Threads = 1024;
constexpr unsigned kSelectWords = 8;        // hist (256) is followed by sh (5 used)
constexpr unsigned kStage1Scratch = 512;    // keys of a boundary bin that stage 1 copies aside

// Stage 1: grid (chunks, tokens). Candidates of a chunk: its min(k, rows) best keys (unordered).
__global__ void __launch_bounds__(kStage1Threads) topk_stage1(TopkParams p) {
  extern __shared__ __align__(16) std::uint8_t smem[];
  std::uint64_t* keys = reinterpret_cast<std::uint64_t*>(smem);
  std::uint64_t* scratch = keys + p.chunk_rows;
  std::uint32_t* hist = reinterpret_cast<std::uint32_t*>(scratch + kStage1Scratch);
  std::uint32_t* sh = hist + 256;
  const std::uint32_t token = blockIdx.y, chunk = blockIdx.x;
  const std::uint32_t n = token_rows(p, token);
  const std::uint32_t c0 = chunk * p.chunk_rows;
  if (c0 >= n) return;
  const std::uint32_t m = min(p.chunk_rows, n - c0);
  const float* sc = p.scores + static_cast<std::uint64_t>(token) * p.score_stride + c0;
  std::uint64_t* cand = p.candidates + (static_cast<std::uint64_t>(token) * p.chunks + chunk) * p.k;
  if (m <= p.k) {
    for (std::uint32_t i = threadIdx.x; i < m; i += blockDim.x) cand[i] = composite(sc[i], c0 + i);
    return;
  }
#pragma unroll 4
  for (std::uint32_t i = threadIdx.x; i < m; i += blockDim.x) keys[i] = composite(sc[i], c0 + i);
  if (threadIdx.x == 0) sh[3] = 0;
  __syncthreads();
  const SelectResult sel = radix_select(keys, m, p.k, hist, sh, scratch, kStage1Scratch);
  for (std::uint32_t i = threadIdx.x; i < m; i += blockDim.x) {
    const std::uint64_t key = keys[i];
    if ((key >> sel.shift) >= sel.prefix) cand[atomicAdd(&sh[3], 1u)] = key;
  }
}

// Stage 2: one block per token: select the k best of all candidates, sort them, write indices and -1 fill.
__global__ void __launch_bounds__(kStage2Threads) topk_stage2(TopkParams p) {
  extern __shared__ __align__(16) std::uint8_t smem[];
  std::uint64_t* keys = reinterpret_cast<std::uint64_t*>(smem);
  std::uint64_t* best = keys + kTopkMaxCandidates;
  std::uint32_t* hist = reinterpret_cast<std::uint32_t*>(best + kTopkMaxK);
  std::uint32_t* sh = hist + 256;
  const std::uint32_t token = blockIdx.x;
  const std::uint32_t n = token_rows(p, token);
  const std::uint32_t kk = min(p.k, n);
  std::int32_t* out = p.out + static_cast<std::uint64_t>(token) * p.out_stride;
  if (kk == 0) {
    for (std::uint32_t i = threadIdx.x; i < p.k; i += blockDim.x) out[i] = -1;
    return;
  }
  const std::uint32_t chunks = (n + p.chunk_rows - 1) / p.chunk_rows;
  const std::uint32_t total = chunks * p.k;  // <= kTopkMaxCandidates (host check)
  const std::uint64_t* cand = p.candidates + static_cast<std::uint64_t>(token) * p.chunks * p.k;
#pragma unroll 4
  for (std::uint32_t j = threadIdx.x; j < total; j += blockDim.x) {
    const std::uint32_t c = j / p.k, i = j % p.k;
    const std::uint32_t rows_c = min(p.chunk_rows, n - c * p.chunk_rows);
    // Slots a chunk did not fill hold key 0, below every real key (real keys have ~index != 0).
    keys[j] = i < min(p.k, rows_c) ? cand[j] : 0ull;
  }
  if (threadIdx.x == 0) sh[3] = 0;
  __syncthreads();
  // (best is free until the select returns: it doubles as the select's scratch.)
  const SelectResult sel = radix_select(keys, total, kk, hist, sh, best, kTopkMaxK);
  for (std::uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
    const std::uint64_t key = keys[i];
    if ((key >> sel.shift) >= sel.prefix) best[atomicAdd(&sh[3], 1u)] = key;
  }
  __syncthreads();
  // Bitonic sort of the kk distinct keys, largest first, padded to a power of two with key 0 (below every real
  // key: ~index is never 0): O(k log^2 k) comparisons instead of ranking each key by counting the larger ones
  // (k^2 / 2, a third of the kernel's instructions at k = 512; the kernel's time did not change measurably,
  // it is latency-bound on its single block).
  std::uint32_t padded = 1;
  while (padded < kk) padded <<= 1;
  for (std::uint32_t i = kk + threadIdx.x; i < padded; i += blockDim.x) best[i] = 0;
  __syncthreads();
  for (std::uint32_t size = 2; size <= padded; size <<= 1) {
    for (std::uint32_t stride = size / 2; stride > 0; stride >>= 1) {
      for (std::uint32_t t = threadIdx.x; t < padded / 2; t += blockDim.x) {
        const std::uint32_t i = 2 * stride * (t / stride) + t % stride, j = i + stride;
        const bool descending = (i & size) == 0;  // the last merge (size = padded) is descending throughout
        const std::uint64_t a = best[i], b = best[j];
        if ((a < b) == descending) {
          best[i] = b;
          best[j] = a;
        }
      }
      __syncthreads();
    }
  }
  for (std::uint32_t i = threadIdx.x; i < kk; i += blockDim.x) {
    out[i] = static_cast<std::int32_t>(0xFFFFFFFFu - static_cast<std::uint32_t>(best[i] & 0xFFFFFFFFull));
  }
  for (std::uint32_t i = kk + threadIdx.x; i < p.k; i += blockDim.x) out[i] = -1;
}

}  // namespace

cudaError_t launch_topk(const TopkParams& p, cudaStream_t stream) {
  if (p.count == 0) return cudaSuccess;
  const std::size_t smem1 = (static_cast<std::size_t>(p.chunk_rows) + kStage1Scratch) * 8 + (256 + kSelectWords) * 4;
  const std::size_t smem2 = static_cast<std::size_t>(kTopkMaxCandidates + kTopkMaxK) * 8 + (256 + kSelectWords) * 4;
  // (Set on every launch: cheap, and valid whichever device is current.)
  cudaError_t e = cudaFuncSetAttribute(topk_stage1, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem1));
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(topk_stage2, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem2));
  if (e != cudaSuccess) return e;
  topk_stage1<<<dim3(p.chunks, p.count), kStage1Threads, smem1, stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  topk_stage2<<<p.count, kStage2Threads, smem2, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::dsv4::detail
