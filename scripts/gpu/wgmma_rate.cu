// Microbenchmark: cycles per warpgroup MMA (wgmma, f16 in, f32 accumulate) on one H200 multiprocessor, for
// the shapes the DeepSeek-V4 attention kernel uses (attention_wgmma.cu) and the ones a redesign would. Each of
// W warpgroups issues chains of C dependent instructions (fence, C x wgmma, commit, wait), R times; the block's
// cycles (the first warpgroup's clock from start to end, all warpgroups starting after one barrier) give the
// multiprocessor's rate: FLOP per cycle and operand bytes read from shared memory per cycle (A 64 x 16 and
// B 16 x N, f16, both from shared memory; A from registers where marked RS).
// Build: nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -I src scripts/gpu/wgmma_rate.cu -o wgmma_rate; run: ./wgmma_rate
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda/wgmma.cuh"

using namespace kvcompact::cuda;

namespace {

template <int N>
struct Acc {
  float d[N / 2];
};

template <int N, bool kRs>
__device__ __forceinline__ void mma(Acc<N>& acc, GmmaDesc a, const std::uint32_t (&ar)[4], GmmaDesc b) {
  float (&d)[N / 2] = acc.d;
  if constexpr (N == 64 && !kRs) {
    wgmma_m64n64k16_ss<0>(d, a, b, true);
  } else if constexpr (N == 64 && kRs) {
    wgmma_m64n64k16_rs<0>(d, ar, b, true);
  } else if constexpr (N == 32) {
    wgmma_m64n32k16_ss(d, a, b, true);
  } else if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .b64 da, db;\nmov.b64 da, {%8, %9};\nmov.b64 db, {%10, %11};\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, da, db, 1, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a.lo), "r"(a.hi), "r"(b.lo), "r"(b.hi));
  } else if constexpr (N == 128) {
    float(&d2)[2][32] = *reinterpret_cast<float(*)[2][32]>(d);
    wgmma_m64n128k16_rs<0>(d2, ar, b, true);
  }
}

template <int W, int N, int C, bool kRs>
__global__ void __launch_bounds__(512, 1) rate_kernel(int reps, long long* cycles, float* sink) {
  extern __shared__ std::uint8_t smem_raw[];
  std::uint8_t* base = smem_raw + ((1024u - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  for (unsigned i = threadIdx.x; i < 192 * 1024 / 4; i += blockDim.x) reinterpret_cast<std::uint32_t*>(base)[i] = 0u;
  fence_shared_for_async();
  __syncthreads();
  const unsigned x = threadIdx.x / 128;
  const GmmaDesc a = sw128_descriptor(base, 16, 1024);
  const GmmaDesc b = sw128_descriptor(base + 64 * 1024 + x * 8192, 16, 1024);
  std::uint32_t ar[8][4];
  for (int k = 0; k < 8; ++k) ar[k][0] = ar[k][1] = ar[k][2] = ar[k][3] = threadIdx.x * (k + 1) & 0x3C003C00u;
  Acc<N> acc{};
  __syncthreads();
  const long long t0 = clock64();
  if (x < W) {
    for (int r = 0; r < reps; ++r) {
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < C; ++k) mma<N, kRs>(acc, a.at((k / 4) * 8192 + (k % 4) * 32), ar[k % 8], b.at((k / 4) * 8192 + (k % 4) * 32));
      wgmma_commit();
      wgmma_wait<0>();
    }
  }
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  float s = 0.0f;
  for (int i = 0; i < N / 2; ++i) s += acc.d[i];
  if (s == 12345.0f) sink[threadIdx.x] = s;
}

template <int W, int N, int C, bool kRs>
void run(const char* what) {
  constexpr int kSmem = 192 * 1024 + 1024;
  cudaFuncSetAttribute(rate_kernel<W, N, C, kRs>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  long long* cycles;
  float* sink;
  cudaMalloc(&cycles, 132 * sizeof(long long));
  cudaMalloc(&sink, 512 * sizeof(float));
  const int reps = 200;
  rate_kernel<W, N, C, kRs><<<1, 512, kSmem>>>(reps, cycles, sink);  // warm-up
  rate_kernel<W, N, C, kRs><<<1, 512, kSmem>>>(reps, cycles, sink);
  long long c = 0;
  cudaMemcpy(&c, cycles, sizeof c, cudaMemcpyDeviceToHost);
  const cudaError_t e = cudaDeviceSynchronize();
  const double per_chain = static_cast<double>(c) / reps;
  const double instr = static_cast<double>(W) * C;
  const double flop = instr * 64.0 * N * 16 * 2;
  const double bytes = instr * ((kRs ? 0 : 2048) + N * 32.0);
  std::printf("%-34s W=%d N=%3d C=%2d %s: %7.1f cycles/chain, %6.1f cycles/instr (per WG %6.1f), %6.0f FLOP/clk, %5.0f B/clk%s\n",
              what, W, N, C, kRs ? "RS" : "SS", per_chain, per_chain / instr, per_chain / C, flop / per_chain,
              bytes / per_chain, e == cudaSuccess ? "" : cudaGetErrorString(e));
  cudaFree(cycles);
  cudaFree(sink);
}

}  // namespace

int main() {
  run<2, 32, 32, false>("S now (2 WGs, m64n32k16)");
  run<1, 32, 32, false>("S on one WG, m64n32k16");
  run<4, 16, 32, false>("S before round 25 (4 WGs, m64n16k16)");
  run<1, 64, 32, false>("S on one WG, m64n64k16");
  run<2, 64, 32, false>("two WGs, m64n64k16 each");
  run<4, 64, 8, false>("PV now (4 WGs, 8 x m64n64k16)");
  run<4, 64, 32, false>("4 WGs, 32 x m64n64k16");
  run<1, 64, 8, true>("one WG, 8 x m64n64k16 RS (scores)");
  run<4, 64, 8, true>("4 WGs, 8 x m64n64k16 RS");
  run<1, 128, 8, true>("one WG, 8 x m64n128k16 RS");
  run<4, 128, 8, true>("4 WGs, m64n128k16 RS");
  run<4, 16, 8, false>("4 WGs, 8 x m64n16k16");
  run<4, 32, 8, false>("4 WGs, 8 x m64n32k16");
  return 0;
}
