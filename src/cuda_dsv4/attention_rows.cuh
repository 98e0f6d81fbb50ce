// Device helpers shared by the two sparse-attention split kernels (attention.cu: mma.sync for 16- and 32-head
// blocks; attention_wgmma.cu: warpgroup MMAs for 64-head blocks): where a token's row j lives, bf16 pairs as fp16
// pairs, and the output arithmetic of a (token, head) — sink, normalisation, inverse RoPE — that the merge kernel
// (attention_merge.cu) and the warpgroup kernel's direct output share.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels_device.cuh"
#include "kernels_params.hpp"

namespace kvcompact::cuda::dsv4::detail {

// Both split kernels' epilogues stage their outputs in shared memory as float rows padded by this many floats
// before bulk-copying them out: rows of 128, 256 or 512 floats then start 8 banks apart, so a warp's 8-byte stores
// of 8 rows x 4 lanes fall on every bank pair twice (the minimum of two wavefronts for 256 bytes), and every row
// stays a multiple of 16 bytes, as a bulk copy needs.
inline constexpr unsigned kStagedRowPad = 8;

// Row j of a token's list: the window (oldest first: the chunk's own rows from chunk_start, the ring before),
// then the compressed rows (ratio 4: the top-k list, null for a -1 slot; ratio 128: all visible). An index outside
// [-1, visible rows) — kTopkBeyondBound from a top-k call whose bound the token exceeded, or a stray value — is
// not read: the row is null and `bad_index` is set, which makes the token's output NaN.
__device__ __forceinline__ const std::uint8_t* attention_row_pointer(const AttentionParams& p, const TokenRowsDev& d,
                                                                     std::uint32_t token, std::uint32_t j,
                                                                     std::uint32_t nw, bool& bad_index) {
  if (j < nw) {
    const std::int64_t pos = d.position - static_cast<std::int64_t>(nw) + 1 + j;
    if (d.chunk_rows != nullptr && pos >= d.chunk_start) {
      return d.chunk_rows + static_cast<std::uint64_t>(pos - d.chunk_start) * p.row_bytes;
    }
    return d.window_ring + static_cast<std::uint64_t>(pos % d.ring_capacity) * p.row_bytes;
  }
  const std::uint32_t c = j - nw;
  if (p.ratio == 4) {
    const std::int32_t idx = p.indices[static_cast<std::uint64_t>(token) * p.index_stride + c];
    if (idx >= 0 && static_cast<std::uint64_t>(idx) < visible_rows(d.position, 4)) {
      return d.compressed_rows + static_cast<std::uint64_t>(idx) * p.row_bytes;
    }
    bad_index = bad_index || idx != -1;
    return nullptr;
  }
  return d.compressed_rows + static_cast<std::uint64_t>(c) * p.row_bytes;
}

// A block's split of its token's row list: the list has the window's nw rows, then the compressed ones (n in
// all); the split starts at row begin (past n: an empty split) and ends at end() (for a split that is not empty).
struct SplitRows {
  std::uint32_t nw, n, begin, split_rows;
  __device__ __forceinline__ bool empty() const { return begin >= n; }
  __device__ __forceinline__ std::uint32_t end() const { return min(n, begin + split_rows); }
};
__device__ __forceinline__ SplitRows split_rows(const AttentionParams& p, const TokenRowsDev& d, std::uint32_t split) {
  const std::uint32_t nw = window_count(d.position);
  return SplitRows{nw, nw + compressed_count(d.position, p.ratio, p.index_topk), split * p.split_rows, p.split_rows};
}

// A token whose row list is longer than the call's max_rows (or whose position is negative): its splits read
// nothing and its output is NaN (the merge, or the split kernel's direct output, writes it).
__device__ __forceinline__ bool token_beyond_bound(const AttentionParams& p, const TokenRowsDev& d) {
  return attention_rows_beyond_bound(d.position, p.ratio, p.index_topk, p.max_rows);
}

// Index of the partial (token, head h0 + h, split) in part_o (times 512) and part_ml (times 2).
__device__ __forceinline__ std::uint64_t partial_index(const AttentionParams& p, std::uint32_t token, std::uint32_t h0,
                                                       std::uint32_t h, std::uint32_t split) {
  return (static_cast<std::uint64_t>(token) * p.heads + h0 + h) * p.splits + split;
}

// A split without rows: maximum -inf and sum 0 for heads [h0, h0 + heads), one thread per head; with kDirect
// (direct_output: the split is the token's only one), the heads' output rows are zero, as the merge would write.
template <bool kDirect = false>
__device__ __forceinline__ void write_empty_split(const AttentionParams& p, std::uint32_t token, std::uint32_t h0,
                                                  std::uint32_t heads, std::uint32_t split) {
  if constexpr (kDirect) {
    float4* out = reinterpret_cast<float4*>(p.out + (static_cast<std::uint64_t>(token) * p.heads + h0) * kHeadDim);
    for (unsigned i = threadIdx.x; i < heads * kHeadDim / 4; i += blockDim.x) out[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  } else if (threadIdx.x < heads) {
    p.part_ml[partial_index(p, token, h0, threadIdx.x, split) * 2] = -INFINITY;
    p.part_ml[partial_index(p, token, h0, threadIdx.x, split) * 2 + 1] = 0.0f;
  }
}

// ---- the output of a (token, head): the merge kernel's arithmetic, shared with the split kernel's direct output.
// The sink in log2 units (-inf without one).
__device__ __forceinline__ float sink_log2(const AttentionParams& p, std::uint32_t h) {
  return p.sink != nullptr ? p.sink[h] * 1.4426950408889634f : -INFINITY;
}

// The inverse RoPE of the output's last 64 dims (rope.cpp: angle float(float(t) * inv_freq[i]); cos / sin in
// double rounded to float; the inverse rotation): the cosine and the negated sine of pair i (dims 448 + 2 i, + 1),
// then the rotation of a pair.
__device__ __forceinline__ float2 inverse_rope_cos_sin(const AttentionParams& p, std::int64_t position, unsigned pair) {
  const float ang = __fmul_rn(static_cast<float>(position), p.inv_freq[pair]);
  double sd, cd;
  sincos(static_cast<double>(ang), &sd, &cd);
  return make_float2(static_cast<float>(cd), -static_cast<float>(sd));
}
__device__ __forceinline__ void inverse_rope_rotate(float2 cs, float& x0, float& x1) {
  const float a = x0, b = x1;
  x0 = a * cs.x - b * cs.y;
  x1 = a * cs.y + b * cs.x;
}

// A head whose row list is one split (direct_output): its unnormalised O times `weight` times `inv` is the
// output, as the merge computes them for one split: M = max(sink, m if the split has rows), denominator
// l 2^(m - M) + 2^(sink - M).
struct SingleSplitScale {
  float weight, inv;
  // (A head without rows has weight 0 and outputs 0, whatever O holds: 0 times a stale inf would be NaN.)
  __device__ __forceinline__ float apply(float o) const { return weight != 0.0f ? __fmul_rn(weight, o) * inv : 0.0f; }
};
__device__ __forceinline__ SingleSplitScale single_split_scale(const AttentionParams& p, std::uint32_t h, float m,
                                                               float l) {
  const float sink2 = sink_log2(p, h);
  float mx = sink2, den = 0.0f;
  if (l > 0.0f) {
    mx = fmaxf(mx, m);
    den = l * exp2f(m - mx);
  }
  if (p.sink != nullptr && mx != -INFINITY) den += exp2f(sink2 - mx);
  return SingleSplitScale{l > 0.0f ? exp2f(m - mx) : 0.0f, den > 0.0f ? 1.0f / den : 0.0f};
}

__device__ __forceinline__ std::uint32_t bf16x2_to_half2(std::uint32_t v) {
  return pack_half2(bf16_bits_to_f32(v & 0xFFFFu), bf16_bits_to_f32(v >> 16));
}

}  // namespace kvcompact::cuda::dsv4::detail
