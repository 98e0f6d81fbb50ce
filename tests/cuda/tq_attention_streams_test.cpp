// DeviceCache::attention on two streams, back to back: the cache owns the requests' argument buffer and the key
// splits' workspace, so the second call (on an idle stream) must not rewrite them while the first call's kernels,
// still queued on the other stream, read them. Every output row of both calls must match the CPU cache's
// attention. (Before the cache waited for the previous call's kernels on any stream, the second call's argument
// upload could run at once on its idle stream while the first call's later kernels still read the buffer — a race
// by CUDA's stream semantics that did not show on the H200 in three runs of this test without the wait, 2026-12-05:
// the test checks two-stream use end to end, it does not reproduce the race.) Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "cuda/device_cache_checks.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq_cache.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::append_same_random_rows;
using kvcompact::cuda::testing::take;
using kvcompact::tq::AttentionOptions;
using kvcompact::tq::AttentionRequest;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;
using kvcompact::tq::testing::random_rows;

// One call's requests with their device queries and outputs.
struct Call {
  std::vector<AttentionRequest> device, host;
  std::vector<float> queries, want;
  DeviceBuffer device_queries, device_output;
};

// `count` requests of `rows` query rows on sequence `seq`, ending at its length, spread over its last positions.
Call make_call(std::mt19937_64& rng, const TurboQuantCache& cpu, std::uint32_t seq, std::uint32_t count,
               std::uint32_t rows, std::uint32_t q_heads, std::uint32_t d) {
  Call c;
  const std::uint32_t length = cpu.length(0, seq);
  const std::size_t row_floats = std::size_t{q_heads} * d;
  c.queries = random_rows(rng, std::size_t{count} * rows * q_heads, d, 1.0f, false);
  c.want.assign(c.queries.size(), 0.0f);
  c.device_queries = take(DeviceBuffer::allocate(c.queries.size() * 4));
  EXPECT_OK(c.device_queries.upload(c.queries.data(), c.queries.size() * 4));
  c.device_output = take(DeviceBuffer::allocate(c.queries.size() * 4));
  EXPECT_OK(c.device_output.fill(0xFF));
  for (std::uint32_t i = 0; i < count; ++i) {
    AttentionRequest r;
    r.seq = seq;
    r.first_position = length - rows - i * (length - rows) / count;
    r.rows = rows;
    r.queries = static_cast<const float*>(c.device_queries.data()) + i * rows * row_floats;
    r.output = static_cast<float*>(c.device_output.data()) + i * rows * row_floats;
    c.device.push_back(r);
    r.queries = c.queries.data() + i * rows * row_floats;
    r.output = c.want.data() + i * rows * row_floats;
    c.host.push_back(r);
  }
  return c;
}

double worst_relative_row_error(const Call& c, std::size_t row_floats) {
  std::vector<float> got(c.queries.size());
  EXPECT_OK(c.device_output.download(got.data(), got.size() * 4));
  double worst = 0.0;
  for (std::size_t r = 0; r * row_floats < got.size(); ++r) {
    double diff = 0.0, top = 0.0;
    for (std::size_t j = r * row_floats; j < (r + 1) * row_floats; ++j) {
      const double delta = static_cast<double>(got[j]) - c.want[j];
      if (std::isnan(delta)) return delta;
      diff = std::max(diff, std::fabs(delta));
      top = std::max(top, std::fabs(static_cast<double>(c.want[j])));
    }
    worst = std::max(worst, top > 0.0 ? diff / top : diff);
  }
  return worst;
}

TEST(CudaCacheStreams, AttentionCallsOnTwoStreamsDoNotShareTheirArguments) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = QuantConfig::recommended(seed);
  const CacheShape shape{.head_dim = 128, .kv_heads = {2}, .sequences = 2, .capacity = 4096};
  const std::uint32_t d = shape.head_dim, heads = 2, q_heads = 8;
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  // Sequence 0 long (its requests' kernels take a while), sequence 1 short.
  for (const auto& [seq, rows] : {std::pair{0u, 4000u}, std::pair{1u, 300u}}) {
    ASSERT_TRUE(append_same_random_rows(rng, cpu, gpu, 0, seq, 0, rows, heads, d));
  }
  cudaStream_t streams[2] = {};
  for (cudaStream_t& s : streams) ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  AttentionOptions options;
  options.q_heads = q_heads;
  const std::size_t row_floats = std::size_t{q_heads} * d;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Call first = make_call(rng, cpu, 0, 24, 96, q_heads, d);
    Call second = make_call(rng, cpu, 1, 4, 16, q_heads, d);
    ASSERT_OK(gpu.attention(0, first.device, options, streams[round % 2]));
    ASSERT_OK(gpu.attention(0, second.device, options, streams[(round + 1) % 2]));
    for (cudaStream_t s : streams) ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_OK(cpu.attention(0, first.host, options));
    ASSERT_OK(cpu.attention(0, second.host, options));
    EXPECT_LE(worst_relative_row_error(first, row_floats), 1e-3);
    EXPECT_LE(worst_relative_row_error(second, row_floats), 1e-3);
  }
  for (cudaStream_t s : streams) ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

}  // namespace
}  // namespace kvcompact::cuda::tq
