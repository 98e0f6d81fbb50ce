// DeviceCache after replays of a captured append_at_length that sync_lengths has not seen (the documented
// contract asks for a sync first; these check that breaking it is loud, not silent): the replays advance the
// device lengths while the host keeps the last sync's. A decode outside the graph with a plan for those stale
// lengths answers NaN (its kernels check the device lengths against the plan); append, truncate, reset and
// snapshot return InvalidArgument naming sync_lengths and change nothing (they read the device's commit
// counter); append_deferred stores nothing (its encode checks the position on the device) and finish_appends
// names sync_lengths; after the sync everything equals a CPU cache that received the same appends; reset_all takes the
// replays as seen. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/append_inputs.hpp"
#include "cuda/cuda_test_util.hpp"
#include "cuda/device_cache_checks.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/cuda/tq_cache.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::AppendInput;
using kvcompact::cuda::testing::expect_decode_output_matches_oracle;
using kvcompact::cuda::testing::expect_layers_match;
using kvcompact::cuda::testing::make_append_input;
using kvcompact::cuda::testing::take;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;
using kvcompact::tq::testing::random_rows;

template <typename R>
void expect_stale(const R& result, const char* what) {
  ASSERT_FALSE(result.ok()) << what << " must refuse while replays are unsynced";
  EXPECT_EQ(result.error().code, ErrorCode::InvalidArgument) << what;
  EXPECT_NE(result.error().message.find("sync_lengths"), std::string::npos) << result.error().message;
}

TEST(CudaUnsyncedReplays, DecodeIsLoudAndHostCallsRefuseUntilSync) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = *QuantConfig::parse("k=mse4,v=mse3,nc,w=4", seed);
  const CacheShape shape{.head_dim = 128, .kv_heads = {2}, .sequences = 2, .capacity = 64};
  const std::uint32_t d = shape.head_dim, heads = 2, q_heads = 4, prompt = 10;
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  auto append_both = [&](std::uint32_t s, std::uint32_t rows) {  // the host path, on both caches
    const AppendInput in = make_append_input(rng, rows, heads, d, DType::BF16);
    const std::uint32_t at = cpu.length(0, s);
    ASSERT_OK(cpu.append(0, s, at, rows, DType::BF16, in.keys.data(), in.values.data()));
    ASSERT_OK(gpu.append(0, s, at, rows, DType::BF16, in.device_keys.data(), in.device_values.data()));
  };
  for (std::uint32_t s = 0; s < shape.sequences; ++s) append_both(s, prompt);

  // A captured step: one token per sequence at the device lengths.
  const std::size_t row_bytes = std::size_t{heads} * d * 2;
  auto token_k = take(DeviceBuffer::allocate(shape.sequences * row_bytes));
  auto token_v = take(DeviceBuffer::allocate(shape.sequences * row_bytes));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  std::vector<LengthAppend> requests;
  for (std::uint32_t s = 0; s < shape.sequences; ++s) {
    requests.push_back({s, 1, DType::BF16, static_cast<std::uint8_t*>(token_k.data()) + s * row_bytes,
                        static_cast<std::uint8_t*>(token_v.data()) + s * row_bytes});
  }
  const Status captured = gpu.append_at_length(0, requests, shape.capacity, stream);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_OK(captured);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  auto replay = [&] {  // one token per sequence, mirrored in the CPU cache
    const AppendInput in = make_append_input(rng, shape.sequences, heads, d, DType::BF16);  // row s: sequence s
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      ASSERT_OK(cpu.append(0, s, cpu.length(0, s), 1, DType::BF16, in.keys.data() + s * row_bytes,
                           in.values.data() + s * row_bytes));
    }
    ASSERT_OK(token_k.upload(in.keys.data(), in.keys.size()));
    ASSERT_OK(token_v.upload(in.values.data(), in.values.size()));
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  };
  replay();
  ASSERT_OK(gpu.sync_lengths(stream));
  ASSERT_EQ(gpu.length(0, 0), prompt + 1);
  replay();
  replay();  // the device lengths are now prompt + 3; the host still says prompt + 1
  ASSERT_FALSE(gpu.lengths_on_device());

  const auto q = random_rows(rng, std::size_t{shape.sequences} * q_heads, d, 1.0f, false);
  auto dq = take(DeviceBuffer::allocate(q.size() * 4));
  ASSERT_OK(dq.upload(q.data(), q.size() * 4));
  auto dout = take(DeviceBuffer::allocate(q.size() * 4));
  auto dstatus = take(DeviceBuffer::allocate(4));
  std::uint32_t decode_status = 0;
  auto decode = [&](std::uint32_t max_length) {
    auto plan = take(gpu.plan_decode(0, q_heads, max_length));
    auto ws = take(DeviceBuffer::allocate(plan.workspace_bytes));
    EXPECT_OK(dout.fill(0));
    EXPECT_OK(dstatus.fill(0));
    EXPECT_OK(gpu.decode(0, plan, static_cast<const float*>(dq.data()), nullptr, 0.0f,
                         static_cast<float*>(dout.data()), ws.data(), stream,
                         static_cast<std::uint32_t*>(dstatus.data())));
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<float> out(q.size());
    EXPECT_OK(dout.download(out.data(), out.size() * 4));
    EXPECT_OK(dstatus.download(&decode_status, 4));
    return out;
  };
  std::size_t nan = 0;
  for (float x : decode(prompt + 1)) nan += std::isnan(x) ? 1 : 0;
  EXPECT_EQ(nan, q.size()) << "a plan for the host's stale lengths must give NaN, not a shorter attention";
  EXPECT_EQ(decode_status, kDecodeLengthBeyondPlan) << "DeviceCache::decode's status word";

  // The host-path calls refuse and change nothing.
  const AppendInput extra = make_append_input(rng, 1, heads, d, DType::BF16);
  expect_stale(gpu.append(0, 0, prompt + 1, 1, DType::BF16, extra.device_keys.data(), extra.device_values.data(),
                          stream),
               "append");
  expect_stale(gpu.truncate(0, 5), "truncate");
  expect_stale(gpu.reset(1), "reset");
  expect_stale(gpu.snapshot(0, 0), "snapshot");
  // append_deferred has no wait in which to read the counter: its encode checks the position against the device
  // length, stores nothing (the replayed token at prompt + 1 stays: the layers match below), and finish_appends
  // names sync_lengths.
  const AppendRequest deferred{0, prompt + 1, 1, DType::BF16, extra.device_keys.data(), extra.device_values.data()};
  ASSERT_OK(gpu.append_deferred(0, {&deferred, 1}, stream));
  expect_stale(gpu.finish_appends(), "append_deferred (finish_appends)");
  EXPECT_EQ(gpu.length(0, 0), prompt + 1) << "the host keeps the last sync's length";

  ASSERT_OK(gpu.sync_lengths(stream));
  ASSERT_EQ(gpu.length(0, 1), prompt + 3);
  expect_layers_match(cpu, gpu, {0u}, "after the sync");
  expect_decode_output_matches_oracle(cpu, 0, q_heads, q, decode(prompt + 3), "after the sync");
  EXPECT_EQ(decode_status, 0u) << "a plan that covers the lengths sets no status bit";
  append_both(0, 2);  // the host path works again
  expect_layers_match(cpu, gpu, {0u}, "after a host append");

  // reset_all takes unsynced replays as seen: the host path works after it.
  replay();
  gpu.reset_all();
  cpu.reset_all();
  append_both(1, 3);
  expect_layers_match(cpu, gpu, {0u}, "after reset_all");
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace kvcompact::cuda::tq
