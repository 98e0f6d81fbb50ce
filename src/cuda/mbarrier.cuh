// Shared-memory mbarriers (sm_90) for the TurboQuant kernels — the decode kernel's bulk-copy stages
// (tq_decode.cu) and the warp-specialised prefill kernel's tile ring (tq_prefill_wgmma.cu) — and the DeepSeek-V4
// FP8 score kernel's per-warp stages (cuda_dsv4/indexer_scores_wgmma.cu, through tq::detail). A barrier completes
// a phase when its arrival count (and, with expect_tx, its byte count) is reached; wait(parity) returns once the
// phase with that parity has completed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvcompact::cuda::tq::detail {

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Adds `bytes` to the current phase's expected transaction count without arriving (a thread that issues a bulk
// copy onto a barrier whose arrivals come later, from the threads that fill the rest of the stage).
__device__ __forceinline__ void mbar_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(std::uint64_t* bar, std::uint32_t parity) {
  std::uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, std::uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
// The same wait with the retry loop inside one asm block (the prefill kernel's form; its SASS differs from
// mbar_wait's by a few instructions and each kernel was measured on the H200 with its own form).
__device__ __forceinline__ void mbar_spin_wait(std::uint64_t* bar, std::uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

}  // namespace kvcompact::cuda::tq::detail
