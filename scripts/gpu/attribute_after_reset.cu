// Whether a kernel's maximum dynamic shared memory, raised with cudaFuncSetAttribute, survives cudaDeviceReset:
// the assumption behind src/cuda/per_device.hpp, whose slots (and the attributes the DeepSeek-V4 launchers set
// once per device) outlive a reset. Prints the attribute as read back and whether a launch that needs it runs,
// fresh, after setting it and after a reset. Build and run on the GPU machine (both module loading modes):
//   nvcc -arch=sm_90a -o /tmp/ar scripts/gpu/attribute_after_reset.cu
//   CUDA_MODULE_LOADING=LAZY /tmp/ar; CUDA_MODULE_LOADING=EAGER /tmp/ar
// Measured 2026-12-05 (H100, CUDA 13.0, driver 580.159.04), both modes: 49152 / launch refused fresh, 204800 /
// launch runs after setting and again after the reset.
#include <cuda_runtime.h>

#include <cstdio>

constexpr int kSharedBytes = 200 * 1024;

__global__ void needs_large_shared(int* out) {
  extern __shared__ int smem[];
  smem[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) *out = smem[5];
}

static void report(const char* when) {
  cudaFuncAttributes attributes{};
  const cudaError_t read = cudaFuncGetAttributes(&attributes, needs_large_shared);
  int* out = nullptr;
  (void)cudaMalloc(&out, sizeof(int));
  needs_large_shared<<<1, 32, kSharedBytes>>>(out);
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t finished = cudaDeviceSynchronize();
  std::printf("%-12s read %s, max dynamic shared %d bytes; launch with %d bytes: %s, then %s\n", when,
              cudaGetErrorName(read), attributes.maxDynamicSharedSizeBytes, kSharedBytes, cudaGetErrorName(launched),
              cudaGetErrorName(finished));
  (void)cudaFree(out);
}

int main() {
  report("fresh");
  const cudaError_t set =
      cudaFuncSetAttribute(needs_large_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  std::printf("cudaFuncSetAttribute: %s\n", cudaGetErrorName(set));
  report("set");
  const cudaError_t reset = cudaDeviceReset();
  std::printf("cudaDeviceReset: %s\n", cudaGetErrorName(reset));
  report("after reset");
  return set == cudaSuccess && reset == cudaSuccess ? 0 : 1;
}
