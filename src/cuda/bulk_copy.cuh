// Hopper bulk copies (cp.async.bulk, "TMA" without a tensor map) from global to shared memory, completed on an
// mbarrier by byte count: the decode kernel's tile stages (tq_decode.cu), the warp-specialised prefill
// kernel's staging buffers (tq_prefill_wgmma.cu) and the DeepSeek-V4 FP8 score kernel's per-warp rows
// (cuda_dsv4/indexer_scores_wgmma.cu). One thread issues a copy; the barrier's phase completes when
// its expected bytes (mbar_arrive_expect_tx) have landed.
// And the other way, shared to global memory in bulk groups (the DeepSeek-V4 attention's partial outputs,
// cuda_dsv4/attention_wgmma.cu and attention.cu): the issuing thread commits its copies as a group and waits until
// the group has read its shared memory before the block may reuse or release it.
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

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared to global memory in the issuing
// thread's current bulk group. The shared source must be written and made visible to the async proxy first
// (fence.proxy.async.shared::cta after the writes and a barrier over the writers).
__device__ inline void bulk_store(void* dst, const void* src, std::uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_addr(src)),
               "r"(bytes)
               : "memory");
}
// Closes the thread's current bulk group, then waits until every group it committed has finished reading shared
// memory (the writes to global memory complete on their own, visible to later kernels in the stream).
__device__ inline void bulk_store_commit_and_wait_read() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
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
