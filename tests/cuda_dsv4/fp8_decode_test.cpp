// The attention kernel's FP8 row decode (cvt.rn.f16x2.e4m3x2 and a half2 multiply by the block scale 2^e, the
// scalar decode outside e in [-24, 15]) against the scalar decode it replaced, bit for bit on the device, for
// every e4m3 code at every byte position and every block exponent. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "cuda_dsv4/kernels_params.hpp"
#include "kvcompact/cuda/runtime.hpp"

namespace kvcompact::cuda::dsv4 {
namespace {

std::string describe_first(unsigned long long first) {
  if (first == ~0ull) return "no differing case";
  char buf[128];
  std::snprintf(buf, sizeof(buf), "first: code 0x%02X, e = %d, fast 0x%04X, scalar 0x%04X",
                static_cast<unsigned>((first >> 32) & 0xFFu), static_cast<int>(first >> 40) - 127,
                static_cast<unsigned>((first >> 16) & 0xFFFFu), static_cast<unsigned>(first & 0xFFFFu));
  return buf;
}

TEST(CudaDsv4Fp8DecodeSmall, FastDecodeMatchesScalarForEveryCodeAndScale) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  auto buf = DeviceBuffer::allocate(sizeof(detail::Fp8DecodeSelftest));
  ASSERT_TRUE(buf.ok()) << buf.error().to_string();
  DeviceBuffer dev = std::move(buf).value();
  auto* out = static_cast<detail::Fp8DecodeSelftest*>(dev.data());
  const cudaError_t err = detail::launch_fp8_decode_selftest(out, nullptr);
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  const Status st = synchronize();
  ASSERT_TRUE(st.ok()) << st.error().to_string();
  detail::Fp8DecodeSelftest host{};
  const Status dl = dev.download(&host, sizeof(host));
  ASSERT_TRUE(dl.ok()) << dl.error().to_string();
  EXPECT_EQ(host.mismatches, 0u) << describe_first(host.first);
  // NaN codes decode to NaN both ways; this checks the NaN bit patterns are the same too.
  EXPECT_EQ(host.nan_mismatches, 0u) << "NaN bit patterns differ; " << describe_first(host.first);
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4
