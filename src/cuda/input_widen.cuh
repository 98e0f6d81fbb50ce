// Internal, device code: one coordinate of an append's input rows (f32 / f16 / bf16) widened to f32 exactly as
// the CPU cache widens it (a copy, f16_to_f32, bf16_to_f32) — an f16 NaN keeps its payload. Shared by the general
// encode kernel, which quantises the widened row, and the commit kernel, which writes accepted rows to the
// exact-window ring (the ring stores the widened row; snapshots compare it byte for byte with the CPU's).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace kvcompact::cuda::tq::detail {

// dtype: EncodeParams::dtype's codes (0 f32, 1 f16, 2 bf16).
__device__ inline float load_input(const void* base, std::uint64_t index, std::uint32_t dtype) {
  if (dtype == 0) return static_cast<const float*>(base)[index];
  const std::uint16_t bits = static_cast<const std::uint16_t*>(base)[index];
  if (dtype == 1) {
    if ((bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu) != 0) {
      return __uint_as_float(((bits & 0x8000u) << 16) | 0x7fc00000u | ((bits & 0x3ffu) << 13));
    }
    return __half2float(__ushort_as_half(bits));
  }
  return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
}

}  // namespace kvcompact::cuda::tq::detail
