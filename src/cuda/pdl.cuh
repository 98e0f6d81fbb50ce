// Programmatic dependent launch (sm_90) for kernels that run back to back on one stream — a DeepSeek-V4 layer
// step (query preparation, scores, top-k, attention split, merge, then the next layer's) and a TurboQuant decode
// step (per layer the encode, the commit and the decode attention): a kernel launched with launch_after_previous
// may be scheduled while the kernel before it finishes, so its launch and block placement overlap that kernel's
// tail instead of following its completion. Every such kernel calls wait_for_previous_grid() first, before it
// touches any memory: the wait returns once the previous grid has completed and its memory operations are
// visible, so the order of all memory effects is the plain stream order. The kernels do not trigger the next
// launch early (griddepcontrol.launch_dependents, which lets the next kernel launch once every block of this one
// has started): a version that did was slower in whole-step CUDA graphs of DeepSeek-V4 at 1M (round 8 in
// docs/cuda-dsv4-kernels-history.md), likely from the next kernel's blocks waiting resident beside running ones;
// without it the next kernel is launched as this one's blocks exit (the implicit trigger), which measured 1.3-3.8 %
// faster per step there (round 9). A trigger where each block's main work ends (round 30, on an H100) gained 1-4 %
// at batch 1 and lost 5 % at BF16 batch 8 x 1M, and nothing in the TurboQuant step; under a batch-1 condition it
// kept the batch-1 gain but measured up to 1.8 % slower at FP8 batch 8: not kept either. On a kernel
// launched without the attribute, or with no kernel before it, the wait returns at once.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace kvcompact::cuda::detail {

__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// The launch attribute that allows the overlap.
inline cudaLaunchAttribute overlap_with_previous_attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

// kernel<<<grid, block, smem, stream>>>(args...) with the overlap attribute.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_after_previous(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t smem,
                                  cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute = overlap_with_previous_attribute();
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kvcompact::cuda::detail
