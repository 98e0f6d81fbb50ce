// Device helpers shared by the two sparse-attention split kernels (attention.cu: mma.sync for 16- and 32-head
// blocks; attention_wgmma.cu: warpgroup MMAs for 64-head blocks): where a token's row j lives, and bf16 pairs as
// fp16 pairs.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels_device.cuh"
#include "kernels_params.hpp"

namespace kvcompact::cuda::dsv4::detail {

// Row j of a token's list: the window (oldest first: the chunk's own rows from chunk_start, the ring before),
// then the compressed rows (ratio 4: the top-k list, null for a -1 slot; ratio 128: all visible).
__device__ __forceinline__ const std::uint8_t* attention_row_pointer(const AttentionParams& p, const TokenRowsDev& d,
                                                                     std::uint32_t token, std::uint32_t j,
                                                                     std::uint32_t nw) {
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
    return idx >= 0 ? d.compressed_rows + static_cast<std::uint64_t>(idx) * p.row_bytes : nullptr;
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

// Index of the partial (token, head h0 + h, split) in part_o (times 512) and part_ml (times 2).
__device__ __forceinline__ std::uint64_t partial_index(const AttentionParams& p, std::uint32_t token, std::uint32_t h0,
                                                       std::uint32_t h, std::uint32_t split) {
  return (static_cast<std::uint64_t>(token) * p.heads + h0 + h) * p.splits + split;
}

// A split without rows: maximum -inf and sum 0 for heads [h0, h0 + heads), one thread per head.
__device__ __forceinline__ void write_empty_split(const AttentionParams& p, std::uint32_t token, std::uint32_t h0,
                                                  std::uint32_t heads, std::uint32_t split) {
  if (threadIdx.x < heads) {
    p.part_ml[partial_index(p, token, h0, threadIdx.x, split) * 2] = -INFINITY;
    p.part_ml[partial_index(p, token, h0, threadIdx.x, split) * 2 + 1] = 0.0f;
  }
}

__device__ __forceinline__ std::uint32_t bf16x2_to_half2(std::uint32_t v) {
  return pack_half2(bf16_bits_to_f32(v & 0xFFFFu), bf16_bits_to_f32(v >> 16));
}

}  // namespace kvcompact::cuda::dsv4::detail
