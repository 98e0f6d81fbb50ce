// Kernels behind fill.hpp: counter-based random numbers (SplitMix64 of index ^ seed), so every launch is
// deterministic and needs no state.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fill.hpp"

namespace kvcompact::bench {
namespace {

__device__ inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ inline float unit(std::uint64_t x) { return static_cast<float>(mix(x) >> 40) * (1.0f / 16777216.0f); }

__global__ void fill_bytes(std::uint8_t* p, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < (n + 7) / 8;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t v = mix(i ^ seed);
    for (int b = 0; b < 8 && 8 * i + b < n; ++b) p[8 * i + b] = static_cast<std::uint8_t>(v >> (8 * b));
  }
}
__global__ void fill_norms(float* p, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x)
    p[i] = 0.5f + 1.5f * unit(i ^ seed);
}
__global__ void fill_rho(__half* p, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x)
    p[i] = __float2half_rn(unit(i ^ seed));
}
__global__ void fill_bf16(__nv_bfloat16* p, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) {
    const float u = unit(i ^ seed) + unit(i ^ seed ^ 0x5555ull) + unit(i ^ seed ^ 0xAAAAull) - 1.5f;
    p[i] = __float2bfloat16(2.0f * u);
  }
}

// One thread per 8 bytes of a row's value bytes (256 / 128 / 64 of them): a bit of mix(row, word) per value.
__global__ void flip_signs(std::uint8_t* rows, std::uint64_t count, int format, std::uint64_t row_bytes,
                           std::uint64_t seed) {
  const unsigned value_bytes = format == 0 ? 256u : format == 1 ? 128u : 64u, words = value_bytes / 8;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count * words;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    std::uint8_t* b = rows + (i / words) * row_bytes + (i % words) * 8;
    const std::uint64_t r = mix(i ^ seed);
    for (unsigned k = 0; k < 8; ++k) {
      if (format == 0) {  // bf16: the sign is bit 7 of the pair's high byte
        if (k % 2 == 1 && ((r >> k) & 1u) != 0 && ((b[k] & 0x7Fu) | b[k - 1]) != 0) b[k] ^= 0x80u;
      } else if (format == 1) {  // e4m3: bit 7
        if (((r >> k) & 1u) != 0 && (b[k] & 0x7Fu) != 0) b[k] ^= 0x80u;
      } else {  // two e2m1 nibbles: bit 3 of each
        if (((r >> (2 * k)) & 1u) != 0 && (b[k] & 0x07u) != 0) b[k] ^= 0x08u;
        if (((r >> (2 * k + 1)) & 1u) != 0 && (b[k] & 0x70u) != 0) b[k] ^= 0x80u;
      }
    }
  }
}

}  // namespace

int flip_indexer_signs(void* rows, std::uint64_t count, int format, std::uint64_t row_bytes, std::uint64_t seed) {
  flip_signs<<<1024, 256>>>(static_cast<std::uint8_t*>(rows), count, format, row_bytes, seed);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  return static_cast<int>(err);
}

int fill_layer_random(void* layer, const FillRegions& r, std::uint64_t seed) {
  auto* base = static_cast<std::uint8_t*>(layer);
  for (int k = 0; k < 4; ++k) {
    if (r.bytes_count[k] != 0) fill_bytes<<<1024, 256>>>(base + r.bytes_offset[k], r.bytes_count[k], seed + 11 * k);
  }
  for (int k = 0; k < 2; ++k) {
    if (r.f32_count[k] != 0)
      fill_norms<<<1024, 256>>>(reinterpret_cast<float*>(base + r.f32_offset[k]), r.f32_count[k], seed + 101 * k);
  }
  if (r.f16_count != 0) fill_rho<<<1024, 256>>>(reinterpret_cast<__half*>(base + r.f16_offset), r.f16_count, seed + 7);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  return static_cast<int>(err);
}

int fill_bf16_random(void* data, std::uint64_t count, std::uint64_t seed) {
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(data), count, seed);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  return static_cast<int>(err);
}

}  // namespace kvcompact::bench
