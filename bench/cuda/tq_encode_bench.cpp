// CUDA encode benchmark: encode_append throughput per mode × head_dim × input dtype, as GB/s (input read +
// packed records written) and as % of the device-to-device copy bandwidth measured in the same run; the
// general one-warp-per-row kernel on the same shapes for comparison. Inputs are ≥ 64 MiB per kind (beyond L2).
// Usage: kvcompact_cuda_tq_encode_bench [--quick] [--csv FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../../src/cuda/encode_setup.hpp"
#include "bench_util.hpp"
#include "fill.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/config.hpp"
#include "kvcompact/tq/layout.hpp"

namespace {

using namespace kvcompact;

using bench::median_us;
using bench::regions_of;
using bench::take;

// The parameters encode_append builds, for calling the general kernel directly.
cuda::tq::detail::EncodeParams params_of(const tq::LayerLayout& layout, const cuda::tq::DeviceCodec& codec,
                                         void* layer, const cuda::tq::EncodeRequest& req, std::uint32_t dtype) {
  return cuda::tq::detail::make_encode_params(layout, codec, layer, req, dtype);
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv_path = argv[++i];
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
  }
  (void)bench::require_device();
  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (csv != nullptr) std::fprintf(csv, "kernel,mode,head_dim,dtype,rows,kv_heads,us,bytes,gbps,pct_copy\n");

  double copy_gbps = 1.0;
  {
    const bench::CopyBandwidth copy = bench::measure_copy_bandwidth(2ull << 30);
    copy_gbps = copy.gbps;
    if (csv != nullptr) std::fprintf(csv, "copy,-,0,-,0,0,%.3f,%llu,%.1f,100\n", copy.us, static_cast<unsigned long long>(copy.bytes), copy_gbps);
  }

  struct Mode {
    const char* name;
    tq::QuantConfig config;
  };
  std::vector<Mode> modes = {{"recommended", tq::QuantConfig::recommended(1)},
                             {"seed", tq::QuantConfig::seed_system(1)},
                             {"k=prod5,v=mse4", take(tq::QuantConfig::parse("k=prod5,v=mse4", 1), "parse")},
                             {"k=mse2,v=mse2", take(tq::QuantConfig::parse("k=mse2,v=mse2", 1), "parse")},
                             {"rec,w=128", take(tq::QuantConfig::parse("k=mse4,v=mse3,nc,w=128", 1), "parse")}};
  std::vector<std::uint32_t> dims = {128, 64, 256};
  struct DT {
    const char* name;
    DType dtype;
    std::uint32_t code, bytes;
  };
  std::vector<DT> dtypes = {{"bf16", DType::BF16, 2, 2}, {"f16", DType::F16, 1, 2}, {"f32", DType::F32, 0, 4}};
  if (quick) {
    modes.resize(2);
    dims = {128};
    dtypes.resize(1);
  }
  const std::uint32_t kv_heads = 8;
  std::printf("\n%-8s %-16s %4s %5s %7s %10s %9s %7s\n", "kernel", "mode", "d", "dtype", "rows", "us", "GB/s", "%copy");
  for (std::uint32_t d : dims) {
    // 32768 tokens × 8 heads at d = 128 (one Llama-3-8B layer's prefill); the same bytes at other head dims.
    const std::uint32_t rows = (quick ? 8192u : 32768u) * 128u / d;
    const std::uint64_t count = std::uint64_t{rows} * kv_heads * d;
    auto kbuf = take(cuda::DeviceBuffer::allocate(count * 4), "allocate keys");
    auto vbuf = take(cuda::DeviceBuffer::allocate(count * 4), "allocate values");
    CUDA_CHECK(static_cast<cudaError_t>(bench::fill_bf16_random(kbuf.data(), count * 2, 1)));
    CUDA_CHECK(static_cast<cudaError_t>(bench::fill_bf16_random(vbuf.data(), count * 2, 2)));
    // f32 and f16 runs read the same bytes: N(0, 1) bf16 pairs are finite f32 and (exponents near 127) finite f16.
    for (const DT& dt : dtypes) {
      if (d != 128 && dt.dtype != DType::BF16) continue;  // other head dims: bf16, two modes
      for (const Mode& mode : modes) {
        if (d != 128 && &mode - modes.data() >= 2) continue;
        auto codec = take(tq::LayerCodec::create(d, mode.config, 0), "LayerCodec::create");
        auto dcodec = take(cuda::tq::DeviceCodec::create(codec), "DeviceCodec::create");
        auto layout = take(tq::plan_layer_layout(d, kv_heads, 1, rows, mode.config), "plan_layer_layout");
        auto layer = take(cuda::DeviceBuffer::allocate(cuda::tq::layer_buffer_bytes(layout)), "allocate layer");
        cuda::tq::EncodeRequest req;
        req.rows = rows;
        req.dtype = dt.dtype;
        req.keys = kbuf.data();
        req.values = vbuf.data();
        const std::uint64_t window_bytes =
            std::uint64_t{std::min(rows, layout.exact_window)} * kv_heads * d * 4 * 2;
        const std::uint64_t bytes = count * dt.bytes * 2 + std::uint64_t{rows} * kv_heads * layout.token.total() + window_bytes;
        for (int kernel = 0; kernel < 2; ++kernel) {
          if (kernel == 1 && (quick || dt.dtype != DType::BF16 || d != 128)) continue;  // general: bf16, d 128
          const auto p = params_of(layout, dcodec, layer.data(), req, dt.code);
          const double us = median_us(2, quick ? 5 : 10, [&] {
            if (kernel == 0) {
              BENCH_CHECK(cuda::tq::encode_append(layout, dcodec, layer.data(), req));
            } else {
              CUDA_CHECK(cuda::tq::detail::launch_encode(p, nullptr, true));
            }
          });
          const char* kname = kernel == 0 ? (cuda::tq::detail::encode_path(p) == cuda::tq::detail::EncodePath::Fast ? "fast" : "general")
                                          : "general";
          const double gbps = bytes / (us * 1e3);
          std::printf("%-8s %-16s %4u %5s %7u %10.1f %9.0f %6.1f%%\n", kname, mode.name, d, dt.name, rows, us, gbps,
                      100.0 * gbps / copy_gbps);
          if (csv != nullptr) {
            std::fprintf(csv, "%s,%s,%u,%s,%u,%u,%.3f,%llu,%.1f,%.2f\n", kname, mode.name, d, dt.name, rows, kv_heads, us,
                         static_cast<unsigned long long>(bytes), gbps, 100.0 * gbps / copy_gbps);
            std::fflush(csv);
          }
        }
      }
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}
