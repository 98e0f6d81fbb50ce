// Internal to the TurboQuant attention kernels (decode: decode_device_ops.cuh; prefill: prefill_device.cuh): where a
// sequence's exact recent window starts. The device form of kvcompact::tq::exact_window_begin (src/tq/attention.cpp),
// which the CPU cache and oracle use: positions in [exact_begin, length) are read from the exact f32 rows, the
// ones before it from the packed codes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvcompact::cuda::tq::detail {

__device__ inline std::uint32_t exact_begin(std::uint32_t length, std::uint32_t window_begin, std::uint32_t w) {
  if (w == 0) return length;
  const std::uint32_t recent = length > w ? length - w : 0u;
  return min(length, max(window_begin, recent));
}

}  // namespace kvcompact::cuda::tq::detail
