// DeviceCache::attention plans for the keys its requests see, not for the cache's capacity: with the seed mode
// (QJL keys, folded into 512 bytes per token and KV head of workspace in the default precision) a short prompt in
// a 128K-token cache must not grow the cache-owned workspace to capacity size (512 MiB here), and requests that
// end before their sequence's length (or on a sequence shorter than another) must still match the CPU cache.
// Skips without a CUDA device.
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
using kvcompact::cuda::testing::worst_row_error;
using kvcompact::tq::AttentionOptions;
using kvcompact::tq::AttentionRequest;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;
using kvcompact::tq::testing::random_rows;

std::size_t free_device_bytes() {
  std::size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

TEST(CudaCacheWorkspace, AttentionWorkspaceFollowsTheRequestsNotTheCapacity) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = QuantConfig::seed_system(seed);
  const CacheShape shape{.head_dim = 128, .kv_heads = {8}, .sequences = 2, .capacity = 131072};
  const std::uint32_t d = shape.head_dim, heads = 8, q_heads = 32;
  const std::size_t row_floats = std::size_t{q_heads} * d;
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  const std::uint32_t lengths[2] = {700, 230};
  for (std::uint32_t seq = 0; seq < 2; ++seq) {
    ASSERT_TRUE(append_same_random_rows(rng, cpu, gpu, 0, seq, 0, lengths[seq], heads, d));
  }
  ASSERT_OK(synchronize());
  // Three calls: the end of the longer sequence; a chunk in the middle of it (keys past the chunk exist but are
  // not the request's); both sequences together, the shorter one's chunk at its end.
  struct Span {
    std::uint32_t seq, first, rows;
  };
  const std::vector<std::vector<Span>> calls = {
      {{0, 572, 128}}, {{0, 100, 61}}, {{1, 150, 80}, {0, 300, 33}}};
  const std::size_t before = free_device_bytes();
  for (std::size_t c = 0; c < calls.size(); ++c) {
    SCOPED_TRACE("call " + std::to_string(c));
    std::size_t total_rows = 0;
    for (const Span& s : calls[c]) total_rows += s.rows;
    const auto q = random_rows(rng, total_rows * q_heads, d, 1.0f, false);
    std::vector<float> want(q.size()), got(q.size());
    auto dq = take(DeviceBuffer::allocate(q.size() * 4));
    ASSERT_OK(dq.upload(q.data(), q.size() * 4));
    auto dout = take(DeviceBuffer::allocate(q.size() * 4));
    ASSERT_OK(dout.fill(0xFF));
    std::vector<AttentionRequest> device, host;
    std::size_t offset = 0;
    for (const Span& s : calls[c]) {
      AttentionRequest r;
      r.seq = s.seq;
      r.first_position = s.first;
      r.rows = s.rows;
      r.queries = static_cast<const float*>(dq.data()) + offset;
      r.output = static_cast<float*>(dout.data()) + offset;
      device.push_back(r);
      r.queries = q.data() + offset;
      r.output = want.data() + offset;
      host.push_back(r);
      offset += std::size_t{s.rows} * row_floats;
    }
    AttentionOptions options;
    options.q_heads = q_heads;
    ASSERT_OK(gpu.attention(0, device, options));
    ASSERT_OK(synchronize());
    ASSERT_OK(dout.download(got.data(), got.size() * 4));
    ASSERT_OK(cpu.attention(0, host, options));
    const std::vector<double> want_d(want.begin(), want.end());
    EXPECT_LE(worst_row_error(got, want_d, row_floats), 1e-3);
  }
  // The workspace of the largest call (700 keys: 11 folded tiles of 32 KiB per KV head) and the argument buffer
  // are a few MiB; a capacity-sized plan would take 512 B × 131072 × 8 = 512 MiB. (Allocations round to 2 MiB
  // pages; other processes on the card could only make the drop look larger.)
  const std::size_t after = free_device_bytes();
  const std::size_t grown = before > after ? before - after : 0;
  EXPECT_LT(grown, std::size_t{64} << 20) << "the attention calls took " << (grown >> 20) << " MiB of device memory";
}

}  // namespace
}  // namespace kvcompact::cuda::tq
