// Hopper bulk copies (cp.async.bulk, "TMA" without a tensor map) from global to shared memory, completed on an
// mbarrier by byte count: the decode kernel's tile stages (tq_decode.cu), the warp-specialised prefill
// kernel's staging buffers (tq_prefill_wgmma.cu) and the DeepSeek-V4 FP8 score kernel's per-warp rows
// (cuda_dsv4/indexer_scores_wgmma.cu). One thread issues a copy; the barrier's phase completes when
// its expected bytes (mbar_arrive_expect_tx) have landed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mbarrier.cuh"
#include "region_span.hpp"

namespace kvcompact::cuda::tq::detail {

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) and counts them on `bar`.
__device__ inline void bulk_copy(void* dst, const void* src, std::uint32_t bytes, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// The 16-byte chunks covering `tokens` packed records of `bpt` bytes of one region from token p0, as a bulk copy
// needs them (16-byte aligned source and size; region_span.hpp): up to 15 bytes past the last record are read,
// inside the next region or the layer buffer's documented slack.
struct RegionCopy {
  const void* src;
  std::uint32_t bytes;
};
__device__ inline RegionCopy region_copy(const std::uint8_t* region, std::uint64_t p0, std::uint32_t tokens,
                                         std::uint32_t bpt) {
  const RegionSpan span = region_span(
      reinterpret_cast<std::uintptr_t>(region) + static_cast<std::uintptr_t>(p0) * bpt, tokens, bpt);
  return RegionCopy{reinterpret_cast<const void*>(span.aligned), span.bytes};
}

}  // namespace kvcompact::cuda::tq::detail
