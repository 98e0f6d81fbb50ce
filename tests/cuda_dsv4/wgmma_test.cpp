// The wgmma helpers (src/cuda/wgmma.cuh) against a CPU product: S = Q K^T and O = P V from SW128
// shared-memory tiles, for several descriptor byte-offset conventions. Small integer fp16 inputs make every
// product and sum exact, so results must equal the CPU's exactly. The expected conventions are K-major
// (leading 16, stride 1024) and MN-major (leading 8192 = the next 64-column block, stride 1024); the test prints
// every variant's mismatch count, so a wrong guess shows which convention the hardware uses (the swapped variants
// are expected to differ, which shows the test can fail). Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_dsv4/kernels_params.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "test_seed.hpp"

namespace kvcompact::cuda::dsv4 {
namespace {

// fp16 bit pattern of a small integer (|v| <= 8).
std::uint16_t half_bits(int v) {
  if (v == 0) return 0;
  const std::uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned m = static_cast<unsigned>(v < 0 ? -v : v);
  int e = 0;
  while ((m >> e) > 1) ++e;
  const unsigned mant = (m << (10 - e)) & 0x3FFu;
  return static_cast<std::uint16_t>(sign | ((e + 15) << 10) | mant);
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  auto b = DeviceBuffer::allocate(v.size() * sizeof(T));
  EXPECT_TRUE(b.ok());
  DeviceBuffer d = std::move(b).value();
  EXPECT_TRUE(d.upload(v.data(), v.size() * sizeof(T)).ok());
  return d;
}

struct Variant {
  std::uint32_t kl, ks, ml, ms, regs;
};

TEST(CudaDsv4WgmmaSmall, ProductsMatchTheCpu) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const std::uint64_t seed = kvcompact::testing_support::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> val(-4, 4);
  std::vector<int> q(64 * 128), k(64 * 128), p(64 * 64);
  for (auto& x : q) x = val(rng);
  for (auto& x : k) x = val(rng);
  for (auto& x : p) x = val(rng);
  std::vector<std::uint16_t> qh(q.size()), kh(k.size()), ph(p.size());
  for (std::size_t i = 0; i < q.size(); ++i) qh[i] = half_bits(q[i]);
  for (std::size_t i = 0; i < k.size(); ++i) kh[i] = half_bits(k[i]);
  for (std::size_t i = 0; i < p.size(); ++i) ph[i] = half_bits(p[i]);
  std::vector<float> s_ref(64 * 64, 0.0f), o_ref(64 * 128, 0.0f);
  for (int m = 0; m < 64; ++m) {
    for (int n = 0; n < 64; ++n) {
      int acc = 0;
      for (int c = 0; c < 128; ++c) acc += q[m * 128 + c] * k[n * 128 + c];
      s_ref[m * 64 + n] = static_cast<float>(acc);
    }
    for (int n = 0; n < 128; ++n) {
      int acc = 0;
      for (int r = 0; r < 64; ++r) acc += p[m * 64 + r] * k[r * 128 + n];
      o_ref[m * 128 + n] = static_cast<float>(acc);
    }
  }
  DeviceBuffer dq = upload(qh), dk = upload(kh), dp = upload(ph);
  DeviceBuffer ds = upload(std::vector<float>(64 * 64)), dout = upload(std::vector<float>(64 * 128));
  DeviceBuffer dout128 = upload(std::vector<float>(64 * 128));
  const Variant variants[] = {
      {16, 1024, 8192, 1024, 0},  // the expected conventions, P from shared memory
      {16, 1024, 8192, 1024, 1},  // the same, P from registers
      {1024, 16, 1024, 8192, 0},  // offsets swapped
      {16, 1024, 1024, 8192, 0},  // MN-major swapped only
  };
  std::size_t expected_s = 1, expected_o = 1, expected_o128 = 1;
  for (const Variant& v : variants) {
    detail::WgmmaSelftestArgs a{};
    a.q = static_cast<const std::uint16_t*>(dq.data());
    a.k = static_cast<const std::uint16_t*>(dk.data());
    a.p = static_cast<const std::uint16_t*>(dp.data());
    a.s = static_cast<float*>(ds.data());
    a.o = static_cast<float*>(dout.data());
    a.o128 = static_cast<float*>(dout128.data());
    a.kmajor_leading = v.kl;
    a.kmajor_stride = v.ks;
    a.mnmajor_leading = v.ml;
    a.mnmajor_stride = v.ms;
    a.p_in_registers = v.regs;
    // Poisoned (NaN) before every variant, so that no variant can pass on an earlier one's results.
    ASSERT_TRUE(ds.fill(0xFF).ok());
    ASSERT_TRUE(dout.fill(0xFF).ok());
    ASSERT_TRUE(dout128.fill(0xFF).ok());
    const cudaError_t err = detail::launch_wgmma_selftest(a, nullptr);
    ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
    ASSERT_TRUE(synchronize().ok());
    std::vector<float> s(64 * 64), o(64 * 128), o128(64 * 128);
    ASSERT_TRUE(ds.download(s.data(), s.size() * 4).ok());
    ASSERT_TRUE(dout.download(o.data(), o.size() * 4).ok());
    ASSERT_TRUE(dout128.download(o128.data(), o128.size() * 4).ok());
    std::size_t s_bad = 0, o_bad = 0, o128_bad = 0;
    for (std::size_t i = 0; i < s.size(); ++i) s_bad += std::memcmp(&s[i], &s_ref[i], 4) != 0;
    for (std::size_t i = 0; i < o.size(); ++i) o_bad += std::memcmp(&o[i], &o_ref[i], 4) != 0;
    for (std::size_t i = 0; i < o128.size(); ++i) o128_bad += std::memcmp(&o128[i], &o_ref[i], 4) != 0;
    std::printf("[dsv4-wgmma] K-major (%u, %u), MN-major (%u, %u), P from %s: S %zu of 4096 differ, O %zu of 8192, "
                "O as m64n128k16 %zu of 8192\n",
                v.kl, v.ks, v.ml, v.ms, v.regs ? "registers" : "shared memory", s_bad, o_bad, o128_bad);
    if (&v == &variants[0]) {
      expected_s = s_bad;
      expected_o = o_bad;
      expected_o128 = o128_bad;
    }
    if (&v == &variants[1]) {
      EXPECT_EQ(o_bad, 0u) << "O with P from registers";
      EXPECT_EQ(o128_bad, 0u) << "O as m64n128k16 with P from registers";
    }
  }
  EXPECT_EQ(expected_s, 0u) << "S = Q K^T with the expected K-major descriptors";
  EXPECT_EQ(expected_o, 0u) << "O = P V with the expected MN-major descriptors";
  EXPECT_EQ(expected_o128, 0u) << "O = P V as m64n128k16 with the expected MN-major descriptors";
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4
