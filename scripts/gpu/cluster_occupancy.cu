// How many thread-block clusters of each size (1-16) the GPU can hold at once for a kernel shaped like the
// DeepSeek-V4 top-k (1024 threads, one block per multiprocessor by its shared memory): the answer of
// cudaOccupancyMaxActiveClusters, which launch_topk (src/cuda_dsv4/topk.cu) consults before it picks a cluster
// size. Build and run on the GPU machine: nvcc -arch=sm_90a -o /tmp/co scripts/gpu/cluster_occupancy.cu && /tmp/co
// [DYNAMIC_SHARED_BYTES]   (default 138624, the top-k's TopkSmem).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

__global__ void __launch_bounds__(1024, 1) probe_kernel(int* out) {
  extern __shared__ int smem[];
  smem[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (out != nullptr) out[blockIdx.x] = smem[(threadIdx.x + 1) % blockDim.x];
}

int main(int argc, char** argv) {
  const int smem = argc > 1 ? std::atoi(argv[1]) : 138624;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 1;
  std::printf("%s: %d multiprocessors; kernel of 1024 threads, %d bytes of dynamic shared memory\n", prop.name,
              prop.multiProcessorCount, smem);
  cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int size = 1; size <= 16; ++size) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(size, 1);
    config.blockDim = dim3(1024);
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = size;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    int clusters = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, probe_kernel, &config);
    std::printf("cluster size %2d: %3d clusters at once (%3d blocks)%s%s\n", size, clusters, clusters * size,
                e != cudaSuccess ? "  error: " : "", e != cudaSuccess ? cudaGetErrorString(e) : "");
    (void)cudaGetLastError();
  }
  return 0;
}
