// Shared pieces of the CUDA benchmarks (bench/cuda/*_bench.cpp): abort-on-error checks, CUDA-event median
// timing, the device line and the copy-bandwidth roofline, and the regions of a packed TurboQuant layer that fill_layer_random fills. Benchmarks are
// programs, so a failed call prints what failed and exits.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <utility>
#include <vector>

#include "fill.hpp"
#include "kvcompact/core/error.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/tq/config.hpp"
#include "kvcompact/tq/layout.hpp"

#define BENCH_CHECK(expr)                                                                  \
  do {                                                                                     \
    const auto bench_r_ = (expr);                                                          \
    if (!bench_r_.ok()) {                                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, bench_r_.error().to_string().c_str()); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)
#define CUDA_CHECK(expr)                                                            \
  do {                                                                              \
    const cudaError_t bench_e_ = (expr);                                            \
    if (bench_e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(bench_e_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

namespace kvcompact::bench {

template <typename T>
T take(Result<T>&& r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what, r.error().to_string().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

// Median of `iters` CUDA-event-timed calls of body after `warmup` untimed ones, in µs, with the events on
// `stream`. body() or body(i) (i counts every call, warm-up included, so a caller can rotate over buffer
// copies).
template <typename F>
double median_us(int warmup, int iters, F&& body, cudaStream_t stream = nullptr) {
  auto call = [&](int i) {
    if constexpr (std::is_invocable_v<F&, int>) {
      body(i);
    } else {
      (void)i;
      body();
    }
  };
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) call(i);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    call(warmup + i);
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Device 0's properties, after printing them; exits when there is no CUDA device.
inline cuda::DeviceProperties require_device() {
  if (cuda::device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    std::exit(1);
  }
  cuda::DeviceProperties props = take(cuda::device_properties(0), "device_properties");
  std::printf("device: %s, %d SMs, %.1f GiB, L2 %.0f MiB\n", props.name.c_str(), props.multiprocessors,
              props.global_memory / 1073741824.0, props.l2_bytes / 1048576.0);
  return props;
}

// The roofline of every benchmark: a device-to-device copy of `n` bytes (median of 10 after 2 warm-ups),
// counting bytes read + written; prints the bandwidth.
struct CopyBandwidth {
  double us = 0;
  std::uint64_t bytes = 0;  // read + written
  double gbps = 0;
};
inline CopyBandwidth measure_copy_bandwidth(std::uint64_t n) {
  auto src = take(cuda::DeviceBuffer::allocate(n), "allocate copy src");
  auto dst = take(cuda::DeviceBuffer::allocate(n), "allocate copy dst");
  BENCH_CHECK(src.fill(1));
  CopyBandwidth c;
  c.us = median_us(2, 10, [&] { CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), n, cudaMemcpyDeviceToDevice)); });
  c.bytes = 2 * n;
  c.gbps = static_cast<double>(c.bytes) / (c.us * 1e3);
  std::printf("copy bandwidth (read+write): %.0f GB/s\n", c.gbps);
  return c;
}

// The two TurboQuant modes every benchmark measures (issue 4's "default mode and the seed system's mode").
struct BenchMode {
  const char* name;
  tq::QuantConfig config;
};
inline std::vector<BenchMode> bench_modes() {
  return {{"recommended", tq::QuantConfig::recommended(1)}, {"seed", tq::QuantConfig::seed_system(1)}};
}
// The decode table's batches and contexts (Llama-3-8B heads: 8 KV heads × head_dim 128 in its bytes); the decode
// benchmark and the read ceiling measure the same cases.
inline std::vector<std::uint32_t> decode_table_batches() { return {1, 8, 32, 64}; }
inline std::vector<std::uint32_t> decode_table_contexts() { return {4096, 32768, 131072}; }

// The byte / f32 / f16 regions of a layer's packed records (every slot of every sequence and KV head).
inline FillRegions regions_of(const tq::LayerLayout& l) {
  const std::uint64_t slots = std::uint64_t{l.sequences} * l.kv_heads * l.capacity;
  FillRegions r{};
  r.bytes_offset[0] = l.key_codes_offset;
  r.bytes_count[0] = slots * l.token.key_codes;
  r.bytes_offset[1] = l.key_signs_offset;
  r.bytes_count[1] = slots * l.token.key_signs;
  r.bytes_offset[2] = l.value_codes_offset;
  r.bytes_count[2] = slots * l.token.value_codes;
  r.f32_offset[0] = l.key_norms_offset;
  r.f32_count[0] = slots;
  r.f32_offset[1] = l.value_norms_offset;
  r.f32_count[1] = slots;
  r.f16_offset = l.key_residual_norms_offset;
  r.f16_count = l.token.key_residual_norm != 0 ? slots : 0;
  return r;
}

}  // namespace kvcompact::bench
