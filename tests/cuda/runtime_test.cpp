// DeviceBuffer::upload and fill have finished on the device when they return: a copy on a non-blocking stream
// issued right after reads the new bytes. (cudaMemset of device memory returns before it runs, and cudaMemcpy
// from pageable memory once the bytes are staged; both are ordered on the default stream only, which a
// non-blocking stream does not wait for.) The same protocol on the raw calls is run beside them and its count
// of stale reads printed — not asserted: whether the race shows is the driver's timing — so a run's log says
// whether the test could have seen the difference. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "kvcompact/cuda/runtime.hpp"

namespace kvcompact::cuda {
namespace {

using kvcompact::cuda::testing::take;

constexpr std::uint64_t kFillBytes = 256ull << 20;   // a memset of ≈ 0.1 ms on an H200
constexpr std::uint64_t kUploadBytes = 32ull << 20;  // a pageable copy staged in many chunks
constexpr std::uint64_t kProbeBytes = 4096;          // the tail that the other stream reads
constexpr int kRounds = 8;

struct Probe {
  cudaStream_t stream = nullptr;
  DeviceBuffer tail;
  Probe() : tail(take(DeviceBuffer::allocate(kProbeBytes))) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  }
  ~Probe() { (void)cudaStreamDestroy(stream); }
  // The last kProbeBytes of `buffer`, copied on the non-blocking stream right away.
  std::vector<std::uint8_t> read_tail(const DeviceBuffer& buffer) {
    const auto* src = static_cast<const std::uint8_t*>(buffer.data()) + buffer.size() - kProbeBytes;
    EXPECT_EQ(cudaMemcpyAsync(tail.data(), src, kProbeBytes, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<std::uint8_t> host(kProbeBytes);
    EXPECT_EQ(cudaMemcpy(host.data(), tail.data(), kProbeBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

bool all_bytes(const std::vector<std::uint8_t>& bytes, std::uint8_t value) {
  for (std::uint8_t b : bytes) {
    if (b != value) return false;
  }
  return true;
}

TEST(CudaRuntime, FillIsDoneForNonBlockingStreams) {
  SKIP_WITHOUT_GPU();
  auto buffer = take(DeviceBuffer::allocate(kFillBytes));
  Probe probe;
  int raw_stale = 0;
  for (int round = 0; round < kRounds; ++round) {
    const auto a = static_cast<std::uint8_t>(2 * round + 1), b = static_cast<std::uint8_t>(2 * round + 2);
    ASSERT_OK(buffer.fill(a));
    EXPECT_TRUE(all_bytes(probe.read_tail(buffer), a)) << "round " << round << ": fill was not done";
    ASSERT_EQ(cudaMemset(buffer.data(), b, kFillBytes), cudaSuccess);  // the raw call, for the log
    raw_stale += all_bytes(probe.read_tail(buffer), b) ? 0 : 1;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  std::printf("[ info ] raw cudaMemset: %d of %d reads on a non-blocking stream saw stale bytes\n", raw_stale,
              kRounds);
}

TEST(CudaRuntime, UploadIsDoneForNonBlockingStreams) {
  SKIP_WITHOUT_GPU();
  auto buffer = take(DeviceBuffer::allocate(kUploadBytes));
  Probe probe;
  std::vector<std::uint8_t> host(kUploadBytes);  // pageable
  int raw_stale = 0;
  for (int round = 0; round < kRounds; ++round) {
    const auto a = static_cast<std::uint8_t>(2 * round + 1), b = static_cast<std::uint8_t>(2 * round + 2);
    std::fill(host.begin(), host.end(), a);
    ASSERT_OK(buffer.upload(host.data(), host.size()));
    EXPECT_TRUE(all_bytes(probe.read_tail(buffer), a)) << "round " << round << ": upload was not done";
    std::fill(host.begin(), host.end(), b);
    ASSERT_EQ(cudaMemcpy(buffer.data(), host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    raw_stale += all_bytes(probe.read_tail(buffer), b) ? 0 : 1;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  std::printf("[ info ] raw cudaMemcpy from pageable memory: %d of %d reads on a non-blocking stream saw stale "
              "bytes\n",
              raw_stale, kRounds);
}

}  // namespace
}  // namespace kvcompact::cuda
