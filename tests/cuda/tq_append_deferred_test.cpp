// DeviceCache::append_deferred / finish_appends (a decode step's appends with one wait per step): random steps
// over several layers must leave the bytes and lengths of a CPU TurboQuantCache appending one by one, and decode
// queued right after a layer's deferred append — before finish_appends — must already see the new tokens; bad
// input is settled at finish_appends (first rejected append in call order); the rules of a pending step are
// typed errors. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/append_inputs.hpp"
#include "cuda/cuda_test_util.hpp"
#include "cuda/device_cache_checks.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq_cache.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::AppendInput;
using kvcompact::cuda::testing::expect_decode_matches_oracle;
using kvcompact::cuda::testing::expect_same_snapshot;
using kvcompact::cuda::testing::make_append_input;
using kvcompact::cuda::testing::take;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;

TEST(CudaAppendDeferred, StepsMatchTheCpuCacheAndDecodeSeesThePendingTokens) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  for (const char* mode : {"k=mse4,v=mse3,nc,w=8", "k=prod3,v=mse2"}) {
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string("mode ") + mode + " seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const QuantConfig config = *QuantConfig::parse(mode, seed);
    // Layer 1 has no attention (0 KV heads) in between.
    const CacheShape shape{.head_dim = 128, .kv_heads = {2, 0, 4}, .sequences = 5, .capacity = 96};
    auto cpu = take(TurboQuantCache::create(shape, config));
    auto gpu = take(DeviceCache::create(shape, config));
    const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
    for (int step = 0; step < 8; ++step) {
      std::vector<AppendInput> inputs;
      inputs.reserve(2 * shape.sequences);
      for (std::uint32_t layer : {0u, 2u}) {
        const std::uint32_t heads = shape.kv_heads[layer];
        const std::vector<std::uint32_t> seqs = kvcompact::cuda::testing::random_sequence_subset(rng, shape.sequences);
        std::vector<AppendRequest> requests;
        for (std::uint32_t s : seqs) {
          const std::uint32_t length = cpu.length(layer, s);
          // Single rows (a decode step) and, in the first step, a prompt of up to 20 rows; sometimes 0 rows.
          const std::uint32_t rows = step == 0 ? static_cast<std::uint32_t>(rng() % 21) : (rng() % 6 == 0 ? 0u : 1u);
          const DType dtype = dtypes[rng() % 3];
          inputs.push_back(make_append_input(rng, rows, heads, shape.head_dim, dtype));
          const AppendInput& in = inputs.back();
          ASSERT_TRUE(cpu.append(layer, s, length, rows, dtype, in.keys.data(), in.values.data()).ok());
          requests.push_back({s, length, rows, dtype, in.device_keys.data(), in.device_values.data()});
        }
        const Status st = gpu.append_deferred(layer, requests);
        ASSERT_TRUE(st.ok()) << st.error().to_string();
        for (std::uint32_t s = 0; s < shape.sequences; ++s) {
          EXPECT_EQ(gpu.length(layer, s), cpu.length(layer, s)) << "pending length, layer " << layer << " seq " << s;
        }
        // Queued behind the pending appends on the same stream: the device lengths already include them.
        expect_decode_matches_oracle(cpu, gpu, layer, 2 * heads, rng);
      }
      EXPECT_TRUE(gpu.appends_pending());
      const Status done = gpu.finish_appends();
      ASSERT_TRUE(done.ok()) << done.error().to_string();
      EXPECT_FALSE(gpu.appends_pending());
      for (std::uint32_t layer : {0u, 2u}) {
        for (std::uint32_t s = 0; s < shape.sequences; ++s) {
          expect_same_snapshot(take(cpu.snapshot(layer, s)), take(gpu.snapshot(layer, s)),
                               "step " + std::to_string(step) + " layer " + std::to_string(layer) + " seq " +
                                   std::to_string(s));
        }
      }
    }
  }
}

TEST(CudaAppendDeferred, RejectedAppendsAreSettledAtFinish) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = *QuantConfig::parse("k=mse4,v=mse3,nc,w=8", seed);
  const CacheShape shape{.head_dim = 64, .kv_heads = {2, 2}, .sequences = 4, .capacity = 32};
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  const std::uint32_t heads = 2, d = 64;
  // 10 rows everywhere first (the window of 8 is full), through the ordinary append.
  for (std::uint32_t layer : {0u, 1u}) {
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      const AppendInput in = make_append_input(rng, 10, heads, d, DType::F32);
      ASSERT_TRUE(cpu.append(layer, s, 0, 10, DType::F32, in.keys.data(), in.values.data()).ok());
      ASSERT_TRUE(gpu.append(layer, s, 0, 10, DType::F32, in.device_keys.data(), in.device_values.data()).ok());
    }
  }
  // A step: layer 0 gets an overflowing value at sequence 2, layer 1 a NaN key at sequence 1; the rest is good.
  std::vector<AppendInput> inputs;
  inputs.reserve(8);
  for (std::uint32_t layer : {0u, 1u}) {
    std::vector<AppendRequest> requests;
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      AppendInput in = make_append_input(rng, 1, heads, d, DType::F32);
      if (layer == 0 && s == 2) {
        const float big = 3.0e38f;
        for (std::size_t i = 0; i < in.values.size() / 4; ++i) std::memcpy(in.values.data() + 4 * i, &big, 4);
      }
      if (layer == 1 && s == 1) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(in.keys.data() + 4 * 5, &nan, 4);
      }
      ASSERT_TRUE(in.device_keys.upload(in.keys.data(), in.keys.size()).ok());
      ASSERT_TRUE(in.device_values.upload(in.values.data(), in.values.size()).ok());
      const bool bad = (layer == 0 && s == 2) || (layer == 1 && s == 1);
      EXPECT_EQ(cpu.append(layer, s, 10, 1, DType::F32, in.keys.data(), in.values.data()).ok(), !bad);
      requests.push_back({s, 10, 1, DType::F32, in.device_keys.data(), in.device_values.data()});
      inputs.push_back(std::move(in));
    }
    ASSERT_TRUE(gpu.append_deferred(layer, requests).ok());
  }
  EXPECT_EQ(gpu.length(0, 2), 11u);  // as if accepted until the step is finished
  const Status done = gpu.finish_appends();
  ASSERT_FALSE(done.ok());
  EXPECT_EQ(done.error().code, ErrorCode::OutOfRange);  // layer 0's came first
  EXPECT_NE(done.error().message.find("layer 0 sequence 2 "), std::string::npos) << done.error().message;
  for (std::uint32_t layer : {0u, 1u}) {
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      const bool bad = (layer == 0 && s == 2) || (layer == 1 && s == 1);
      const auto a = take(cpu.snapshot(layer, s));
      const auto b = take(gpu.snapshot(layer, s));
      ASSERT_EQ(b.length, bad ? 10u : 11u) << "layer " << layer << " seq " << s;
      // A rejected append stored nothing, its full exact window included: the CPU's bytes everywhere.
      expect_same_snapshot(a, b, "layer " + std::to_string(layer) + " seq " + std::to_string(s));
    }
  }
  // The device agrees: the next step appends at the settled lengths and decodes every good sequence correctly.
  const AppendInput next = make_append_input(rng, 1, heads, d, DType::BF16);
  ASSERT_TRUE(cpu.append(0, 0, 11, 1, DType::BF16, next.keys.data(), next.values.data()).ok());
  const AppendRequest again[] = {{0, 11, 1, DType::BF16, next.device_keys.data(), next.device_values.data()},
                                 {2, 10, 1, DType::BF16, next.device_keys.data(), next.device_values.data()}};
  ASSERT_TRUE(cpu.append(0, 2, 10, 1, DType::BF16, next.keys.data(), next.values.data()).ok());
  ASSERT_TRUE(gpu.append_deferred(0, again).ok());
  ASSERT_TRUE(gpu.finish_appends().ok());
  EXPECT_EQ(gpu.length(0, 0), 12u);
  EXPECT_EQ(gpu.length(0, 2), 11u);
  const auto a = take(cpu.snapshot(0, 0));
  expect_same_snapshot(a, take(gpu.snapshot(0, 0)), "layer 0 seq 0 after the next step");
}

TEST(CudaAppendDeferred, PendingStepRulesAreTypedErrors) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const QuantConfig config = QuantConfig::seed_system(9);
  const CacheShape shape{.head_dim = 64, .kv_heads = {1, 1}, .sequences = 3, .capacity = 16};
  auto gpu = take(DeviceCache::create(shape, config));
  std::vector<float> rows(4 * 64, 0.25f);
  auto drows = take(DeviceBuffer::allocate(rows.size() * 4));
  ASSERT_TRUE(drows.upload(rows.data(), rows.size() * 4).ok());
  const void* dv = drows.data();
  EXPECT_TRUE(gpu.finish_appends().ok());  // nothing pending
  const AppendRequest first{0, 0, 2, DType::F32, dv, dv};
  ASSERT_TRUE(gpu.append_deferred(0, {&first, 1}).ok());
  EXPECT_TRUE(gpu.appends_pending());
  EXPECT_EQ(gpu.length(0, 0), 2u);
  auto expect_pending_error = [](const Status& st, const char* what) {
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_EQ(st.error().code, ErrorCode::InvalidArgument) << what;
    EXPECT_NE(st.error().message.find("finish_appends"), std::string::npos) << what << ": " << st.error().message;
  };
  expect_pending_error(gpu.append(1, 0, 0, 1, DType::F32, dv, dv), "append");
  expect_pending_error(gpu.append_batch(1, {&first, 1}), "append_batch");
  expect_pending_error(gpu.truncate(0, 0), "truncate");
  expect_pending_error(gpu.truncate_layer(0, 0, 0), "truncate_layer");
  expect_pending_error(gpu.reset(1), "reset");
  const auto snap = gpu.snapshot(0, 1);
  ASSERT_FALSE(snap.ok());
  EXPECT_EQ(snap.error().code, ErrorCode::InvalidArgument);
  // A second append to (layer 0, sequence 0) in the same step, at the pending length: refused.
  const AppendRequest second{0, 2, 1, DType::F32, dv, dv};
  expect_pending_error(gpu.append_deferred(0, {&second, 1}), "same slot twice");
  // Another stream than the step's.
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  const AppendRequest layer1{0, 0, 1, DType::F32, dv, dv};
  const Status on_other = gpu.append_deferred(1, {&layer1, 1}, other);
  EXPECT_EQ(on_other.error().code, ErrorCode::InvalidArgument);
  ASSERT_EQ(cudaStreamDestroy(other), cudaSuccess);
  // The host checks see the pending length: position 0 is no longer the end of sequence 0.
  const AppendRequest stale{0, 0, 1, DType::F32, dv, dv};
  EXPECT_EQ(gpu.append_deferred(0, {&stale, 1}).error().code, ErrorCode::OutOfRange);
  // The same sequence in another layer is another slot.
  ASSERT_TRUE(gpu.append_deferred(1, {&layer1, 1}).ok());
  ASSERT_TRUE(gpu.finish_appends().ok());
  EXPECT_FALSE(gpu.appends_pending());
  EXPECT_EQ(gpu.length(0, 0), 2u);
  EXPECT_EQ(gpu.length(1, 0), 1u);
  EXPECT_TRUE(gpu.snapshot(0, 0).ok());
  // reset_all drops a pending step (and empties everything).
  ASSERT_TRUE(gpu.append_deferred(0, {&second, 1}).ok());
  gpu.reset_all();
  EXPECT_FALSE(gpu.appends_pending());
  EXPECT_EQ(gpu.length(0, 0), 0u);
  EXPECT_TRUE(gpu.append(0, 0, 0, 1, DType::F32, dv, dv).ok());
}

}  // namespace
}  // namespace kvcompact::cuda::tq
