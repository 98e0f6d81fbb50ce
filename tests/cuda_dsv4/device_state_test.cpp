// The DeepSeek-V4 launchers' per-device state (cuda/per_device.hpp): every launcher on each of two devices, and
// before and after cudaDeviceReset, against the CPU oracle.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kernel_cases.hpp"

namespace kvcompact::cuda::dsv4 {
namespace {

namespace kd = kvcompact::dsv4;
using namespace kernel_cases;  // the shared helpers and cases of these tests

// Every launcher that keeps state per device (cuda/per_device.hpp), each against the CPU oracle: the indexer
// (every storage), the top-k (its cluster path for one token) and the attention (16-head blocks at ratio 4, and a
// 140-token prefill chunk of FP8 rows at ratio 128, whose 64-head blocks take the warpgroup kernel). What it can
// catch: the attention kernels' shared-memory attributes (225 KB for the warpgroup kernel) fail the launch on a
// device, or in a context, where they are not set. The indexer's (≈ 34 KB) fit the 48 KB default, the top-k sets
// its attributes at every launch, and occupancy answers and multiprocessor counts stay right on a like device, so
// a stale value there would pass; PerDevice's own CPU tests (tests/cuda/per_device_test.cpp) cover the slots.
void run_every_stateful_launcher(const std::string& label) {
  IndexerCase indexer;
  indexer.positions = {3, 42, 300};
  indexer.k = 16;
  run_indexer_case_per_storage(indexer, label + "-");
  run_topk_case(label, {{1.0f, 3.0f, 2.0f, 2.0f, -1.0f, 0.5f, 4.0f, 0.0f, 1.0f}}, 4);
  AttnCase attention;
  attention.name = label + "-ratio-4";
  attention.heads = 64;
  attention.topk = 8;
  attention.ratio = 4;
  attention.positions = {50, 5};
  run_attention_case(attention);
  AttnCase chunk;  // as AttentionDirectOutput: more 16- or 32-head blocks than multiprocessors
  chunk.name = label + "-fp8-ratio-128-warpgroup";
  chunk.storage = kd::RowStorage::Fp8;
  chunk.ratio = 128;
  chunk.prefill = true;
  chunk.check_every = 7;
  for (std::int64_t t = 1000; t < 1140; ++t) chunk.positions.push_back(t);
  run_attention_case(chunk);
}

// On the first device, then on the second and on the first again. Needs two devices (the nvidia-h100-x2 kind);
// skips otherwise.
TEST(CudaDsv4KernelsMultiDevice, EveryLauncherRunsOnEachDevice) {
  const int devices = device_count();
  if (devices < 2) GTEST_SKIP() << "needs two CUDA devices (" << devices << " present)";
  struct BackToDeviceZero {  // also when an assertion returns early, so later tests run where they expect
    ~BackToDeviceZero() { (void)cudaSetDevice(0); }
  } restore;
  for (const int device : {0, 1, 0}) {
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    SCOPED_TRACE("device " + std::to_string(device));
    run_every_stateful_launcher("device-" + std::to_string(device));
  }
}

// Before and after cudaDeviceReset, which destroys the device's primary context; the runtime makes a new one on the
// next call. The launchers set their attributes once per device (PerDevice), so this holds only while the runtime
// keeps attributes set through cudaFuncSetAttribute for the new context, as CUDA 13.0 does
// (scripts/gpu/attribute_after_reset.cu; docs/cuda.md, "Several devices"). The test binary keeps no device memory
// across tests, so the reset takes nothing from later tests.
TEST(CudaDsv4KernelsDeviceReset, EveryLauncherRunsAfterAReset) {
  SKIP_WITHOUT_GPU();
  run_every_stateful_launcher("before-reset");
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  run_every_stateful_launcher("after-reset");
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4
