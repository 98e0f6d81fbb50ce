// Internal: the current device's multiprocessor count, which sizes the DeepSeek-V4 kernels' grids (attention
// splits, indexer blocks per token). Host code only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/per_device.hpp"

namespace kvcompact::cuda::dsv4::detail {

// Read once per device (cuda/per_device.hpp). It only sizes grids (work per block), never what is computed, so a
// failed query takes the H200's 132 instead of failing a launch (the launch itself reports a missing device); the
// failure is not remembered.
inline int multiprocessors() {
  static kvcompact::cuda::detail::PerDevice<int> counts;
  int sms = 0;
  const cudaError_t err = counts.get(sms, [](int device, int& count) {
    return cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  });
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 132;
  }
  return std::max(sms, 1);
}

}  // namespace kvcompact::cuda::dsv4::detail
