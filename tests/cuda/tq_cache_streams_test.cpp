// DeviceCache's device lengths reach kernels on a non-blocking stream: those append / append_batch write (their
// commit kernel, after the encode on the call's stream) and those truncate / reset / restore write (calls without
// a stream) have landed when the call returns. Each change is followed at once by a decode on a non-blocking
// stream, checked against the float64 oracle over a CPU cache that received the same calls. (Until 2026-12-03
// the lengths went through a pageable cudaMemcpy ordered on the default stream only, which a non-blocking stream
// does not wait for — CudaRuntime.* shows that race on the raw calls; whether it shows here is the driver's
// timing.) Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda/append_inputs.hpp"
#include "cuda/cuda_test_util.hpp"
#include "cuda/device_cache_checks.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/tq_cache.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::AppendInput;
using kvcompact::cuda::testing::expect_decode_matches_oracle;
using kvcompact::cuda::testing::make_append_input;
using kvcompact::cuda::testing::take;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;

TEST(CudaCacheStreams, LengthsReachNonBlockingStreams) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = *QuantConfig::parse("k=mse4,v=mse3,nc,w=8", seed);
  const CacheShape shape{.head_dim = 128, .kv_heads = {2}, .sequences = 3, .capacity = 200};
  const std::uint32_t d = shape.head_dim, heads = 2, q_heads = 8;
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto decode_now = [&](const std::string& after) {
    expect_decode_matches_oracle(cpu, gpu, 0, q_heads, rng, stream, "after " + after);
  };
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // append_batch on the non-blocking stream: a prompt in the first round, then one token per sequence.
    std::vector<AppendInput> inputs;
    inputs.reserve(shape.sequences + 1);  // (the requests point at their device rows)
    std::vector<AppendRequest> requests;
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      const std::uint32_t rows = round == 0 ? 20 + s : 1;
      const AppendInput& in = inputs.emplace_back(make_append_input(rng, rows, heads, d, DType::BF16));
      const std::uint32_t at = cpu.length(0, s);
      ASSERT_OK(cpu.append(0, s, at, rows, DType::BF16, in.keys.data(), in.values.data()));
      requests.push_back({s, at, rows, DType::BF16, in.device_keys.data(), in.device_values.data()});
    }
    ASSERT_OK(gpu.append_batch(0, requests, stream));
    decode_now("append_batch");
    // A snapshot to restore later, then truncate and reset (no stream).
    const std::uint32_t s = static_cast<std::uint32_t>(rng() % shape.sequences);
    const auto snapshot = take(cpu.snapshot(0, s));
    const std::uint32_t to = 1 + static_cast<std::uint32_t>(rng() % cpu.length(0, s));
    ASSERT_OK(cpu.truncate(s, to));
    ASSERT_OK(gpu.truncate(s, to));
    decode_now("truncate");
    const std::uint32_t r = (s + 1) % shape.sequences;
    ASSERT_OK(cpu.reset(r));
    ASSERT_OK(gpu.reset(r));
    decode_now("reset");
    ASSERT_OK(cpu.restore(0, s, snapshot));
    ASSERT_OK(gpu.restore(0, s, snapshot));
    decode_now("restore");
    // The reset sequence gets its prompt back through append (one request, the same stream).
    const AppendInput& again = inputs.emplace_back(make_append_input(rng, 5, heads, d, DType::F16));
    ASSERT_OK(cpu.append(0, r, 0, 5, DType::F16, again.keys.data(), again.values.data()));
    ASSERT_OK(gpu.append(0, r, 0, 5, DType::F16, again.device_keys.data(), again.device_values.data(), stream));
    decode_now("append");
  }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// An append on one non-blocking stream followed at once by calls ordered on other streams: a truncate (the
// default stream), an append on a second non-blocking stream, a decode on a third. The lengths the append leaves
// must be on the device when it returns — a copy of them still in flight could land after the truncate's and
// bring the dropped token back (the form before 2026-12-03's commit kernel queued that copy after its wait).
TEST(CudaCacheStreams, AppendLeavesNoLengthsInFlight) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = *QuantConfig::parse("k=mse3,v=mse2,w=4", seed);
  const CacheShape shape{.head_dim = 64, .kv_heads = {2}, .sequences = 2, .capacity = 64};
  const std::uint32_t d = shape.head_dim, heads = 2, q_heads = 4;
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  cudaStream_t streams[3] = {};
  for (cudaStream_t& s : streams) ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto append = [&](std::uint32_t seq, cudaStream_t stream) {
    const AppendInput in = make_append_input(rng, 1, heads, d, DType::F32);
    const std::uint32_t at = cpu.length(0, seq);
    ASSERT_OK(cpu.append(0, seq, at, 1, DType::F32, in.keys.data(), in.values.data()));
    ASSERT_OK(gpu.append(0, seq, at, 1, DType::F32, in.device_keys.data(), in.device_values.data(), stream));
  };
  append(0, streams[0]);
  append(1, streams[0]);
  for (int round = 0; round < 24; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // Two tokens, the second dropped at once: the device must end at the truncated length.
    append(0, streams[round % 2]);
    append(0, streams[round % 2]);
    const std::uint32_t to = cpu.length(0, 0) - 1;
    ASSERT_OK(cpu.truncate(0, to));
    ASSERT_OK(gpu.truncate(0, to));
    // Then the other sequence on the other stream, and the decode on a third.
    append(1, streams[(round + 1) % 2]);
    expect_decode_matches_oracle(cpu, gpu, 0, q_heads, rng, streams[2], "after append, truncate, append");
    if (::testing::Test::HasFailure()) break;
  }
  for (cudaStream_t s : streams) ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

}  // namespace
}  // namespace kvcompact::cuda::tq
