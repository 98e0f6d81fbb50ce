// Device self-test of the FP8 row decode of the attention kernels: e4m3x8_scaled_to_half8 in both its forms
// (kernels_device.cuh, the function the kernels call) against the scalar formula it replaced
// (e4m3x8_scaled_to_half8_scalar: ldexpf(e4m3_to_f32(code), e) rounded to fp16 by pack_half2), compared bit for
// bit. Run by tests/cuda_dsv4/fp8_decode_test.cpp.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels_device.cuh"
#include "kernels_params.hpp"

namespace kvcompact::cuda::dsv4::detail {

namespace {

constexpr unsigned kSelftestThreads = 256;  // 32 pieces of 8 codes x 8 rotations of the codes in a piece

// Block: exponent e = blockIdx.x - 127 (a runtime value, as in the kernel). Thread: piece t % 32 holds codes
// [8 (t % 32), 8 (t % 32) + 8) rotated by t / 32 places, so every code is tried at every byte position.
__global__ void __launch_bounds__(kSelftestThreads) fp8_decode_selftest_kernel(Fp8DecodeSelftest* out) {
  const int e = static_cast<int>(blockIdx.x) - 127;
  const unsigned piece = threadIdx.x % 32, rot = threadIdx.x / 32;
  std::uint32_t code[8];
  uint2 codes = make_uint2(0, 0);
#pragma unroll
  for (unsigned b = 0; b < 8; ++b) {
    code[b] = 8 * piece + (b + rot) % 8;
    if (b < 4) {
      codes.x |= code[b] << (8 * b);
    } else {
      codes.y |= code[b] << (8 * (b - 4));
    }
  }
  const uint4 ref4 = e4m3x8_scaled_to_half8_scalar(codes, e);  // the decode the kernel had before the fast path
  const std::uint32_t ref[4] = {ref4.x, ref4.y, ref4.z, ref4.w};
  auto is_nan = [](std::uint32_t h) { return (h & 0x7FFFu) > 0x7C00u; };
  // Both forms of the fast decode (the high codes shifted down, or converted in place) against the reference.
  const uint4 forms[2] = {e4m3x8_scaled_to_half8<false>(codes, e), e4m3x8_scaled_to_half8<true>(codes, e)};
#pragma unroll
  for (unsigned f = 0; f < 2; ++f) {
    const std::uint32_t fast[4] = {forms[f].x, forms[f].y, forms[f].z, forms[f].w};
#pragma unroll
    for (unsigned b = 0; b < 8; ++b) {
      const std::uint32_t hf = (fast[b / 2] >> (16 * (b % 2))) & 0xFFFFu;
      const std::uint32_t hr = (ref[b / 2] >> (16 * (b % 2))) & 0xFFFFu;
      if (hf == hr) continue;
      atomicAdd(is_nan(hf) && is_nan(hr) ? &out->nan_mismatches : &out->mismatches, 1u);
      const unsigned long long key = static_cast<unsigned long long>(blockIdx.x) << 40 |
                                     static_cast<unsigned long long>(code[b]) << 32 | hf << 16 | hr;
      atomicMin(&out->first, key);
    }
  }
}

}  // namespace

cudaError_t launch_fp8_decode_selftest(Fp8DecodeSelftest* out, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(out, 0, sizeof(Fp8DecodeSelftest), stream);
  if (err != cudaSuccess) return err;
  err = cudaMemsetAsync(&out->first, 0xFF, sizeof(out->first), stream);
  if (err != cudaSuccess) return err;
  fp8_decode_selftest_kernel<<<256, kSelftestThreads, 0, stream>>>(out);
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::dsv4::detail
