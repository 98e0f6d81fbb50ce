// Internal to the decode attention (tq_decode.cu): combining the splits' partials — the fused kernel's in-kernel
// merge by the block that completes an item (merge_if_last), and for layouts with an exact window the window
// kernel (the f32 rows) and the merge kernel that run after it. Included by tq_decode.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "decode_device_ops.cuh"
#include "decode_shape.cuh"
#include "params.hpp"

namespace kvcompact::cuda::tq::detail {

namespace {

// The high half of an arrival word of the in-kernel merge (merge_if_last).
inline constexpr std::uint32_t kArrivalTag = 0x4B564344u;  // "KVCD"

// What merge_if_last reads of DecodeParams, by value: a reference to the kernel's parameters would make the caller
// copy all of them to the stack.
struct SplitMerge {
  const float* part_o;
  const float* part_lse;
  const float* sinks;
  float* output;
  unsigned long long* arrivals;
  const std::uint32_t* lengths;
  std::uint32_t* status;
  std::uint32_t splits, q_heads, max_length;
};

__device__ __forceinline__ SplitMerge split_merge(const DecodeParams& p) {
  return SplitMerge{p.part_o, p.part_lse, p.sinks,  p.output,     p.arrivals,
                    p.lengths, p.status,  p.splits, p.q_heads, p.max_length};
}

// A sequence whose device length is beyond the plan's max_length (DecodeArgs): its splits read nothing, and the
// merge writes NaN to the output rows [row0, row0 + rows) of d floats and flags `status`, so the caller sees a
// loud result instead of an attention that silently left the later tokens out.
__device__ inline void write_beyond_plan(float* output, std::uint32_t* status, std::uint64_t row0, std::uint32_t rows,
                                         std::uint32_t d, unsigned threads) {
  for (std::uint32_t i = threadIdx.x; i < rows * d; i += threads) output[row0 * d + i] = __int_as_float(0x7fc00000);
  if (threadIdx.x == 0 && status != nullptr) atomicOr(status, kStatusLengthBeyondPlan);
}

// The in-kernel merge (layouts without an exact window; with one, window_kernel and merge_kernel run after this
// kernel). Every block of an item (sequence, KV head, head group) has written its split's partial; the block that
// completes the item's set merges the partials, applies R⁻¹ and writes the output, which saves the merge kernel's
// launch and its dependent chain of loads at small batches.
//
// Arrival counter: one 64-bit word per item in the workspace, (kArrivalTag, splits arrived so far) in its high and
// low halves; every completed launch leaves (kArrivalTag, 0) behind. A word whose high half is not the tag (zeroed,
// poisoned or reused memory) counts as zero arrivals, so the workspace needs no initialisation: a block that finds
// one replaces it with (tag, 1) or, if another block did that first, counts itself on top (a compare-and-swap loop,
// only on a workspace's first use). Normally arriving is one atomicAdd. Left to chance: memory whose word already
// holds the tag with a nonzero count before its first use (2⁻³² for random bits; never zeros or 0xFF bytes).
// Which block merges does not change a bit: it reads every partial back in split order. Not inlined: one copy
// serves both exits of the kernel and stays out of the main loop's register allocation.
template <int D, unsigned kBlockSize>
__device__ __noinline__ void merge_if_last(const SplitMerge p, const Tables* tables, float* scratch, std::uint32_t seq,
                                           std::uint32_t qh0, std::uint32_t nh) {
  const Tables& t = *tables;
  constexpr unsigned kWarps = kBlockSize / 32;
  const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  float* x = scratch;                            // [nh][D] merged outputs (rotated space)
  float* stats = scratch + kGroup * D;           // [nh] (max, sum) of the weights
  unsigned* last = reinterpret_cast<unsigned*>(stats + 2 * kGroup);
  float sign[D / 32];  // R⁻¹'s signs and scale, needed last, loaded while the arrival's atomics are under way
  detail::load_lane_signs<D>(sign, t.main_signs, lane);
  const float scale = t.block_scale[0];
  __syncthreads();  // the block's partial is written and the scratch area free
  if (tid == 0) {
    // Release: the fence is cumulative, so after the barrier it orders every thread's partial before the arrival
    // (the pattern of a grid-wide barrier: one thread fences and counts for the block).
    __threadfence();
    unsigned long long* word = p.arrivals + (static_cast<std::uint64_t>(seq) * gridDim.y + blockIdx.y);
    constexpr unsigned long long tag = static_cast<unsigned long long>(kArrivalTag) << 32;
    unsigned long long now = atomicAdd(word, 1ull) + 1u;
    if ((now >> 32) != kArrivalTag || (now & 0xffffffffull) == 0u) {  // not a word of ours (first use)
      for (;;) {
        const unsigned long long next = (now >> 32) == kArrivalTag && (now & 0xffffffffull) != 0u ? now + 1u : tag + 1u;
        const unsigned long long prev = atomicCAS(word, now, next);
        if (prev == now) {
          now = next;
          break;
        }
        now = prev;
      }
    }
    const bool complete = (now & 0xffffffffull) == p.splits;
    if (complete) {
      atomicExch(word, tag);
      __threadfence();  // the other blocks' partials are read after their arrivals
    }
    *last = complete ? 1u : 0u;
  }
  __syncthreads();
  if (*last == 0u) return;
  if (p.lengths[seq] > p.max_length) {
    write_beyond_plan(p.output, p.status, static_cast<std::uint64_t>(seq) * p.q_heads + qh0, nh, D, kBlockSize);
    return;
  }
  // Per head: the largest log-sum-exp (with the sink) and the weights' sum, one warp per head.
  for (unsigned h = warp; h < nh; h += kWarps) {
    const std::uint64_t base = (static_cast<std::uint64_t>(seq) * p.q_heads + qh0 + h) * (p.splits + 1);
    const float sink = p.sinks != nullptr ? p.sinks[qh0 + h] * 1.4426950408889634f : -INFINITY;
    float m = -INFINITY;
    for (std::uint32_t s = lane; s < p.splits; s += 32) m = fmaxf(m, __ldcg(p.part_lse + base + s));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    m = fmaxf(m, sink);
    float l = 0.0f;
    if (m != -INFINITY) {
      for (std::uint32_t s = lane; s < p.splits; s += 32) l += exp2f(__ldcg(p.part_lse + base + s) - m);
      for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
      if (sink != -INFINITY) l += exp2f(sink - m);
    }
    if (lane == 0) {
      stats[2 * h] = m;
      stats[2 * h + 1] = l;
    }
  }
  __syncthreads();
  for (std::uint32_t i = tid; i < nh * D; i += kBlockSize) {
    const std::uint32_t h = i / D, j = i % D;
    const float m = stats[2 * h], l = stats[2 * h + 1];
    float o = 0.0f;
    if (m != -INFINITY) {  // then the largest weight is 1, so l ≥ 1
      const std::uint64_t base = (static_cast<std::uint64_t>(seq) * p.q_heads + qh0 + h) * (p.splits + 1);
#pragma unroll 8
      for (std::uint32_t s = 0; s < p.splits; ++s) {
        o += exp2f(__ldcg(p.part_lse + base + s) - m) * __ldcg(p.part_o + (base + s) * D + j);
      }
      o /= l;
    }
    x[i] = o;
  }
  __syncthreads();
  for (unsigned h = warp; h < nh; h += kWarps) {
    float v[D / 32];
#pragma unroll
    for (int i = 0; i < D / 32; ++i) v[i] = x[h * D + lane + 32 * i];
    detail::rotate_inverse_in_registers<D>(v, sign, scale, lane);
    float* out = p.output + (static_cast<std::uint64_t>(seq) * p.q_heads + qh0 + h) * D;
#pragma unroll
    for (int i = 0; i < D / 32; ++i) out[lane + 32 * i] = v[i];
  }
}


// The exact window: positions [exact_begin, length) from the f32 rows, one block per (sequence, query head).
__global__ void __launch_bounds__(kThreads) window_kernel(DecodeParams p) {
  extern __shared__ float wsm[];  // [d] query, then [W] scores
  const std::uint32_t seq = blockIdx.y, qh = blockIdx.x;
  const std::uint32_t d = p.head_dim;
  const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const std::uint32_t device_length = p.lengths[seq];
  const std::uint32_t length = device_length <= p.max_length ? device_length : 0u;  // beyond the plan: NaN (merge)
  const std::uint32_t wb = p.window_begins != nullptr ? p.window_begins[seq] : 0u;
  const std::uint32_t first = exact_begin(length, wb, p.window);
  const std::uint32_t n = length - first;
  const std::uint64_t part = (static_cast<std::uint64_t>(seq) * p.q_heads + qh) * (p.splits + 1) + p.splits;
  float* q = wsm;
  float* sc = wsm + d;
  __shared__ float red[kThreads / 32];
  if (n == 0) {
    for (std::uint32_t j = tid; j < d; j += kThreads) p.part_o[part * d + j] = 0.0f;
    if (tid == 0) p.part_lse[part] = -INFINITY;
    return;
  }
  const std::uint32_t kvh = qh / p.group;
  const float* qs = p.queries + (static_cast<std::uint64_t>(seq) * p.q_heads + qh) * d;
  for (std::uint32_t j = tid; j < d; j += kThreads) q[j] = qs[j];
  __syncthreads();
  const std::uint64_t ring0 = (static_cast<std::uint64_t>(seq) * p.kv_heads + kvh) * p.window;
  const float* wk = reinterpret_cast<const float*>(p.layer + p.window_keys);
  const float* wv = reinterpret_cast<const float*>(p.layer + p.window_values);
  for (std::uint32_t i = warp; i < n; i += kThreads / 32) {
    const float* k = wk + (ring0 + (first + i) % p.window) * d;
    float s = 0.0f;
    for (std::uint32_t j = lane; j < d; j += 32) s += q[j] * k[j];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) sc[i] = s * p.scale_log2;
  }
  __syncthreads();
  float m = -INFINITY;
  for (std::uint32_t i = tid; i < n; i += kThreads) m = fmaxf(m, sc[i]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
  __syncthreads();
  float l = 0.0f;
  for (std::uint32_t i = tid; i < n; i += kThreads) {
    sc[i] = exp2f(sc[i] - m);
    l += sc[i];
  }
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  if (lane == 0) red[warp] = l;
  __syncthreads();
  l = red[0] + red[1] + red[2] + red[3];
  for (std::uint32_t j = tid; j < d; j += kThreads) {
    float o = 0.0f;
    for (std::uint32_t i = 0; i < n; ++i) o += sc[i] * wv[(ring0 + (first + i) % p.window) * d + j];
    p.part_o[part * d + j] = o / l;
  }
  if (tid == 0) p.part_lse[part] = m + log2f(l);
}

// Combines the splits' partials (rotated space) and the window partial (original space) with the sink,
// applying R⁻¹ once. One block per (sequence, query head): warp w sums splits w, w + 4, ...
__global__ void __launch_bounds__(kThreads) merge_kernel(DecodeParams p) {
  extern __shared__ float msm[];  // [4][d] partial sums, then [splits] weights
  __shared__ float red[kThreads / 32];
  const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const std::uint64_t item = blockIdx.x;
  const std::uint32_t d = p.head_dim;
  const std::uint32_t qh = static_cast<std::uint32_t>(item % p.q_heads);
  const Tables& t = *p.tables;
  float* wts = msm + 4 * d;
  const std::uint64_t base = item * (p.splits + 1);
  const std::uint32_t parts = p.window > 0 ? p.splits + 1 : p.splits;  // the window partial is the last one
  const float sink = p.sinks != nullptr ? p.sinks[qh] * 1.4426950408889634f : -INFINITY;
  float m = -INFINITY;
  for (std::uint32_t s = tid; s < parts; s += kThreads) m = fmaxf(m, p.part_lse[base + s]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = fmaxf(fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3])), sink);
  __syncthreads();
  float* out = p.output + item * d;
  if (p.lengths[item / p.q_heads] > p.max_length) {
    write_beyond_plan(p.output, p.status, item, 1, d, kThreads);
    return;
  }
  if (m == -INFINITY) {
    for (std::uint32_t j = tid; j < d; j += kThreads) out[j] = 0.0f;
    return;
  }
  float l = 0.0f;
  for (std::uint32_t s = tid; s < parts; s += kThreads) {
    const float w = exp2f(p.part_lse[base + s] - m);
    wts[s] = w;
    l += w;
  }
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  if (lane == 0) red[warp] = l;
  __syncthreads();
  l = red[0] + red[1] + red[2] + red[3] + (sink == -INFINITY ? 0.0f : exp2f(sink - m));
  float* x = msm + warp * d;
  for (std::uint32_t j = lane; j < d; j += 32) x[j] = 0.0f;
  for (std::uint32_t s = warp; s < p.splits; s += 4) {
    const float w = wts[s];
    if (w == 0.0f) continue;
    const float* o = p.part_o + (base + s) * d;
    for (std::uint32_t j = lane; j < d; j += 32) x[j] += w * o[j];
  }
  __syncthreads();
  if (warp != 0) return;
  for (std::uint32_t j = lane; j < d; j += 32) x[j] = x[j] + msm[d + j] + msm[2 * d + j] + msm[3 * d + j];
  __syncwarp();
  detail::warp_rotate_inverse(x, t, t.main_signs, lane);
  const float fw = p.window > 0 ? wts[p.splits] : 0.0f;
  const float* ow = p.part_o + (base + p.splits) * d;
  for (std::uint32_t j = lane; j < d; j += 32) out[j] = (x[j] + (fw != 0.0f ? fw * ow[j] : 0.0f)) / l;
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
