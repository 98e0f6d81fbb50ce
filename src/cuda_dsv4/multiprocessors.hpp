// Internal: the current device's multiprocessor count, which sizes the DeepSeek-V4 kernels' grids (attention
// splits, indexer blocks per token). Host code only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

namespace kvcompact::cuda::dsv4::detail {

// Read once per process. It only sizes grids (work per block), never what is computed, so a failed query
// takes the H200's 132 instead of failing a launch (the launch itself reports a missing device).
inline int multiprocessors() {
  static const int count = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 132;
    }
    return std::max(sms, 1);
  }();
  return count;
}

}  // namespace kvcompact::cuda::dsv4::detail
