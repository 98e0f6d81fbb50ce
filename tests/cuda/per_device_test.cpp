// detail::PerDevice (src/cuda/per_device.hpp), host only — runs without a GPU: a value is computed once per
// device ordinal and reused, devices do not share values, a failure is returned and not remembered, racing
// threads compute once, and ordinals past the slots compute on every call.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "cuda/per_device.hpp"
#include "kvcompact/cuda/runtime.hpp"

namespace kvcompact::cuda::detail {
namespace {

TEST(PerDevice, ComputesOncePerDeviceAndKeepsDevicesApart) {
  PerDevice<int> cache;
  int calls = 0;
  auto compute = [&calls](int device, int& value) {
    ++calls;
    value = 100 + device;
    return cudaSuccess;
  };
  for (int round = 0; round < 3; ++round) {
    for (int device : {0, 1, 5, PerDevice<int>::kDevices - 1}) {
      int value = -1;
      ASSERT_EQ(cache.get(device, value, compute), cudaSuccess);
      EXPECT_EQ(value, 100 + device) << "device " << device << " round " << round;
    }
  }
  EXPECT_EQ(calls, 4);  // once per device, not per call
}

TEST(PerDevice, AFailureIsReturnedAndTriedAgain) {
  PerDevice<int> cache;
  int calls = 0;
  auto flaky = [&calls](int, int& value) {
    value = 7;  // written even though the call fails: must not be handed out
    return ++calls == 1 ? cudaErrorInvalidValue : cudaSuccess;
  };
  int value = -1;
  EXPECT_EQ(cache.get(2, value, flaky), cudaErrorInvalidValue);
  EXPECT_EQ(value, -1) << "a failed computation hands out no value";
  ASSERT_EQ(cache.get(2, value, flaky), cudaSuccess);
  EXPECT_EQ(value, 7);
  ASSERT_EQ(cache.get(2, value, flaky), cudaSuccess);
  EXPECT_EQ(calls, 2);
}

TEST(PerDevice, RacingThreadsComputeOnce) {
  PerDevice<long> cache;
  std::atomic<int> calls{0};
  std::atomic<bool> go{false};
  std::vector<long> seen(16, -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      long value = -1;
      if (cache.get(3, value, [&calls](int, long& v) {
            calls.fetch_add(1);
            std::this_thread::sleep_for(std::chrono::milliseconds(5));  // others arrive while it computes
            v = 42;
            return cudaSuccess;
          }) == cudaSuccess) {
        seen[static_cast<std::size_t>(t)] = value;
      }
    });
  }
  go.store(true);
  for (auto& th : threads) th.join();
  EXPECT_EQ(calls.load(), 1);
  for (long v : seen) EXPECT_EQ(v, 42);
}

TEST(PerDevice, OrdinalsPastTheSlotsComputeEveryTime) {
  PerDevice<int> cache;
  int calls = 0;
  auto compute = [&calls](int device, int& value) {
    ++calls;
    value = device;
    return cudaSuccess;
  };
  int value = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(cache.get(PerDevice<int>::kDevices, value, compute), cudaSuccess);
    EXPECT_EQ(value, PerDevice<int>::kDevices);
  }
  EXPECT_EQ(calls, 3);
  // A failure there leaves the caller's value as it was, as in a slot.
  auto failing = [](int, int& partial) {
    partial = 99;
    return cudaErrorInvalidValue;
  };
  EXPECT_EQ(cache.get(PerDevice<int>::kDevices, value, failing), cudaErrorInvalidValue);
  EXPECT_EQ(value, PerDevice<int>::kDevices);
}

// The current-device form: without a device it returns cudaGetDevice's error and computes nothing; with one,
// the value of the current device.
TEST(PerDevice, CurrentDeviceForm) {
  PerDevice<int> cache;
  int calls = 0;
  int value = -1;
  const cudaError_t err = cache.get(value, [&calls](int device, int& v) {
    ++calls;
    v = 1000 + device;
    return cudaSuccess;
  });
  if (::kvcompact::cuda::device_count() == 0) {
    EXPECT_NE(err, cudaSuccess);
    EXPECT_EQ(calls, 0);
    (void)cudaGetLastError();
    return;
  }
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(err, cudaSuccess);
  EXPECT_EQ(value, 1000 + device);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace kvcompact::cuda::detail
