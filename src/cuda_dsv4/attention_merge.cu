// DeepSeek-V4 sparse attention, merge kernel: combines a (token, head)'s split partials (unnormalised O, running
// max in log2 units, sum; attention.cu and attention_wgmma.cu write them) with the sink, normalises, and applies
// the inverse RoPE to the output's last 64 dims.
//
// Built as one round trip to memory per split, with no block barrier before the sum. Block (head, token, part)
// covers dims [512 part / parts, 512 (part + 1) / parts) with 4 / parts "dim warps" of 128 dims (4 per lane) times
// `split_warps` warps over the splits: warp (dw, sw) sums splits sw, sw + split_warps, ... Each warp
//   1. issues the loads of its first 8 splits' partial rows (a round; more splits than 8 per warp take further
//      rounds),
//   2. computes the (token, head)'s overall max M and denominator itself, from all splits' pairs read lane-strided
//      (every warp gets the same bits: same loads, same order, same shuffles), while those loads are in flight,
//   3. adds w_s O_s (w_s = 2^(m_s - M), 0 for a split without rows) in its split order.
// Then warps sw > 0 hand their sums to warp sw = 0 through shared memory (one barrier), which adds them in sw
// order. At batch 1 the grid of heads alone (64 blocks) would leave most multiprocessors idle and a block's
// threads a chain of dependent round trips (the previous form: maxima to shared memory, a barrier, weights by one
// warp, a barrier, then the sums, 12.5 us for 130 splits under Nsight Compute); dim parts and split warps spread
// the loads over 4x the blocks and up to 16 warps each (launch_attention_merge picks both).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention_rows.cuh"
#include "kernels_device.cuh"
#include "kernels_params.hpp"
#include "multiprocessors.hpp"
#include "pdl.cuh"

namespace kvcompact::cuda::dsv4::detail {

namespace {

constexpr unsigned kMergeMaxWarps = 16;
constexpr unsigned kSplitsPerWarp = 8;  // one split warp per 8 splits

__device__ __forceinline__ void add_weighted(float4& acc, float w, const float4& v) {
  if (w != 0.0f) {  // (a split without rows has w = 0 and unwritten partial rows: 0 times a stale NaN is NaN)
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
}

// kInFlight: partial rows per warp and round (independent loads): kSplitsPerWarp, or 2 for plans of at most two
// splits (a decode step's window layers; a many-token chunk that the split kernel's direct output does not
// cover, i.e. one of 16- or 32-head blocks), whose blocks have one split warp: that instance is held to 40
// registers, so 12 of its 4-warp blocks fit per multiprocessor instead of 8; the other to 64 (two 16-warp blocks).
template <unsigned kInFlight>
__global__ void __launch_bounds__(kMergeMaxWarps * 32, kInFlight <= 2 ? 3 : 2)
    attention_merge_kernel(AttentionParams p, unsigned split_warps) {
  wait_for_previous_grid();
  __shared__ float4 handed[kMergeMaxWarps][32];  // warp (dw, sw > 0)'s sum, at [warp][lane]
  const unsigned dim_warps = 4u / gridDim.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned dw = warp % dim_warps, sw = warp / dim_warps;
  const unsigned d0 = (blockIdx.z * dim_warps + dw) * 128 + 4 * lane;
  const std::uint32_t h = blockIdx.x, token = blockIdx.y;
  const TokenRowsDev d = p.tokens[token];
  float* out = p.out + (static_cast<std::uint64_t>(token) * p.heads + h) * kHeadDim + d0;
  if (token_beyond_bound(p, d)) {  // (its splits wrote nothing)
    if (sw == 0) *reinterpret_cast<float4*>(out) = make_float4(quiet_nan(), quiet_nan(), quiet_nan(), quiet_nan());
    return;
  }
  const std::uint32_t n = window_count(d.position) + compressed_count(d.position, p.ratio, p.index_topk);
  const std::uint32_t used = min(p.splits, (n + p.split_rows - 1) / p.split_rows);
  const std::uint64_t base = (static_cast<std::uint64_t>(token) * p.heads + h) * p.splits;
  const float2* ml = reinterpret_cast<const float2*>(p.part_ml) + base;
  const float* part_o = p.part_o + base * kHeadDim + d0;

  // Rounds of up to kInFlight of this warp's splits (sw + split_warps k): the loads first, then their weights and
  // sums. Round 0's loads are in flight while the statistics (2.) are computed.
  const float sink2 = sink_log2(p, h);
  float mx = sink2, den = 0.0f;
  bool poisoned = false;  // a split met an index outside [-1, visible rows) (its sum is NaN): the output is NaN
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (std::uint32_t s0 = sw; s0 < used || s0 == sw; s0 += split_warps * kInFlight) {
    float4 v[kInFlight];
#pragma unroll
    for (unsigned k = 0; k < kInFlight; ++k) {
      const std::uint32_t s = s0 + split_warps * k;
      if (s < used) v[k] = __ldg(reinterpret_cast<const float4*>(part_o + std::uint64_t{s} * kHeadDim));
    }
    if (s0 == sw) {
      // 2. M over the sink and the splits with rows, then the denominator: lane-strided sums, then a fixed
      // xor-shuffle tree (the same bits in every warp).
#pragma unroll 4
      for (std::uint32_t s = lane; s < used; s += 32) {
        const float2 x = __ldg(ml + s);
        if (x.y > 0.0f) mx = fmaxf(mx, x.x);
        poisoned = poisoned || x.y != x.y;
      }
      poisoned = __any_sync(0xFFFFFFFFu, poisoned);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
#pragma unroll 4
      for (std::uint32_t s = lane; s < used; s += 32) {
        const float2 x = __ldg(ml + s);
        if (x.y > 0.0f) den += x.y * exp2f(x.x - mx);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xFFFFFFFFu, den, o);
      if (p.sink != nullptr && mx != -INFINITY) den += exp2f(sink2 - mx);
    }
    // 3. w_s O_s in split order (the pairs again: the statistics' loads left them in L1).
#pragma unroll
    for (unsigned k = 0; k < kInFlight; ++k) {
      const std::uint32_t s = s0 + split_warps * k;
      if (s < used) {
        const float2 x = __ldg(ml + s);
        add_weighted(acc, x.y > 0.0f ? exp2f(x.x - mx) : 0.0f, v[k]);
      }
    }
  }
  if (split_warps > 1) {
    if (sw != 0) handed[warp][lane] = acc;
    __syncthreads();
    if (sw != 0) return;
    for (unsigned y = 1; y < split_warps; ++y) {
      const float4 x = handed[dw + dim_warps * y][lane];
      acc.x += x.x;
      acc.y += x.y;
      acc.z += x.z;
      acc.w += x.w;
    }
  }
  const float inv = den > 0.0f ? 1.0f / den : 0.0f;
  float r[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
  if (p.inverse_rope != 0 && d0 >= kHeadDim - 64) {
    const unsigned pair = (d0 - (kHeadDim - 64)) / 2;
    inverse_rope_rotate(inverse_rope_cos_sin(p, d.position, pair), r[0], r[1]);
    inverse_rope_rotate(inverse_rope_cos_sin(p, d.position, pair + 1), r[2], r[3]);
  }
  *reinterpret_cast<float4*>(out) =
      poisoned ? make_float4(quiet_nan(), quiet_nan(), quiet_nan(), quiet_nan()) : make_float4(r[0], r[1], r[2], r[3]);
}

}  // namespace

// Dim parts: 4 (one 128-dim warp per split warp) while the grid of (head, token) pairs does not cover the
// multiprocessors twice, else 2 or 1, so that a decode step of one or two sequences spreads its loads over ~4x
// the blocks and a prefill chunk's thousands of tokens keep whole-head blocks. Split warps: one per 8 splits (one
// round of loads each), at most 16 warps per block (130 splits: two warps take a second round).
cudaError_t launch_attention_merge(const AttentionParams& p, cudaStream_t stream) {
  const std::uint64_t pairs = std::uint64_t{p.count} * p.heads;
  const auto sms = static_cast<std::uint64_t>(multiprocessors());
  const unsigned parts = pairs * 2 <= sms ? 4u : pairs <= sms ? 2u : 1u;
  const unsigned dim_warps = 4u / parts;
  const unsigned split_warps =
      std::min<unsigned>(kMergeMaxWarps / dim_warps, std::max<unsigned>(1u, (p.splits + kSplitsPerWarp - 1) / kSplitsPerWarp));
  const dim3 grid(p.heads, p.count, parts), block(32 * dim_warps * split_warps);
  if (p.splits <= 2) return launch_after_previous(attention_merge_kernel<2>, grid, block, 0, stream, p, split_warps);
  return launch_after_previous(attention_merge_kernel<kSplitsPerWarp>, grid, block, 0, stream, p, split_warps);
}

}  // namespace kvcompact::cuda::dsv4::detail
