// DeviceCache's plan / run form of chunked prefill (plan_prefill / prefill), end to end: a plan bounded by
// max_length below the capacity (smaller workspace than the capacity's plan in the default precision, whose keys
// are folded), one launch of two entries against the CPU cache's attention (≤ 1e-3 per row), the same launch
// captured in a CUDA graph (bit-identical replay), and the OutOfRange refusal once a sequence outgrows the plan.
// Both key kinds (QJL and MSE). Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "cuda/device_cache_checks.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq_cache.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::append_same_random_rows;
using kvcompact::cuda::testing::take;
using kvcompact::cuda::testing::worst_row_error;
using kvcompact::tq::AttentionOptions;
using kvcompact::tq::AttentionRequest;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;
using kvcompact::tq::testing::random_rows;

template <typename T>
DeviceBuffer device_copy(const std::vector<T>& host) {
  auto buffer = take(DeviceBuffer::allocate(host.size() * sizeof(T)));
  EXPECT_OK(buffer.upload(host.data(), host.size() * sizeof(T)));
  return buffer;
}

TEST(CudaCachePrefillPlan, BoundedPlanRunsCapturesAndRefusesLongerSequences) {
  SKIP_WITHOUT_GPU();
  for (const char* mode : {"k=prod3,v=mse2", "k=mse4,v=mse3,nc"}) {
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string(mode) + " seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const QuantConfig config = *QuantConfig::parse(mode, seed);
    const CacheShape shape{.head_dim = 128, .kv_heads = {2}, .sequences = 2, .capacity = 2048};
    const std::uint32_t d = shape.head_dim, heads = 2, q_heads = 8, max_length = 1024;
    const std::size_t row_floats = std::size_t{q_heads} * d;
    auto cpu = take(TurboQuantCache::create(shape, config));
    auto gpu = take(DeviceCache::create(shape, config));
    ASSERT_TRUE(append_same_random_rows(rng, cpu, gpu, 0, 0, 0, 300, heads, d));
    ASSERT_TRUE(append_same_random_rows(rng, cpu, gpu, 0, 1, 0, 900, heads, d));
    ASSERT_OK(synchronize());

    const PrefillPlan plan = take(gpu.plan_prefill(0, q_heads, 64, kDefaultPrefillPrecision, 2, max_length));
    const PrefillPlan capacity_plan = take(gpu.plan_prefill(0, q_heads, 64, kDefaultPrefillPrecision, 2));
    EXPECT_EQ(plan.max_length, max_length);
    EXPECT_EQ(capacity_plan.max_length, shape.capacity);
    EXPECT_TRUE(plan.folded_keys);  // (the default precision folds both key kinds on the warpgroup kernel)
    EXPECT_LT(plan.workspace_bytes, capacity_plan.workspace_bytes);
    EXPECT_EQ(gpu.plan_prefill(0, q_heads, 64, kDefaultPrefillPrecision, 2, shape.capacity + 1).error().code,
              ErrorCode::OutOfRange);

    // Two entries: the last 64 positions of sequence 0, 40 positions in the middle of sequence 1.
    const std::vector<std::uint32_t> seqs = {0, 1}, firsts = {236, 500}, rows = {64, 40};
    const auto q = random_rows(rng, std::size_t{64 + 40} * q_heads, d, 1.0f, false);
    auto dseqs = device_copy(seqs), dfirsts = device_copy(firsts), drows = device_copy(rows), dq = device_copy(q);
    auto dout = take(DeviceBuffer::allocate(q.size() * 4));
    auto workspace = take(DeviceBuffer::allocate(plan.workspace_bytes));
    ASSERT_OK(dout.fill(0xFF));
    ASSERT_OK(workspace.fill(0xFF));
    PrefillArgs args;
    args.batch = 2;
    args.seqs = static_cast<const std::uint32_t*>(dseqs.data());
    args.first_positions = static_cast<const std::uint32_t*>(dfirsts.data());
    args.rows = static_cast<const std::uint32_t*>(drows.data());
    args.queries = static_cast<const float*>(dq.data());
    args.output = static_cast<float*>(dout.data());
    ASSERT_OK(gpu.prefill(0, plan, args, workspace.data()));
    ASSERT_OK(synchronize());
    std::vector<float> got(q.size()), want(q.size());
    ASSERT_OK(dout.download(got.data(), got.size() * 4));
    std::vector<AttentionRequest> host;
    for (std::size_t e = 0, offset = 0; e < 2; offset += std::size_t{rows[e]} * row_floats, ++e) {
      host.push_back({seqs[e], firsts[e], rows[e], q.data() + offset, want.data() + offset});
    }
    AttentionOptions options;
    options.q_heads = q_heads;
    ASSERT_OK(cpu.attention(0, host, options));
    EXPECT_LE(worst_row_error(got, std::vector<double>(want.begin(), want.end()), row_floats), 1e-3);

    // The same launch captured in a graph and replayed: the same bits.
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_OK(dout.fill(0xFF));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const Status captured = gpu.prefill(0, plan, args, workspace.data(), stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_OK(captured);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<float> replayed(q.size());
    ASSERT_OK(dout.download(replayed.data(), replayed.size() * 4));
    EXPECT_EQ(std::memcmp(replayed.data(), got.data(), got.size() * 4), 0) << "graph replay differs";
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);

    // Sequence 1 grows past the plan's max_length: refused on the host, before any launch.
    ASSERT_TRUE(append_same_random_rows(rng, cpu, gpu, 0, 1, 900, 200, heads, d));
    const Status beyond = gpu.prefill(0, plan, args, workspace.data());
    ASSERT_FALSE(beyond.ok());
    EXPECT_EQ(beyond.error().code, ErrorCode::OutOfRange) << beyond.error().to_string();
  }
}

}  // namespace
}  // namespace kvcompact::cuda::tq
