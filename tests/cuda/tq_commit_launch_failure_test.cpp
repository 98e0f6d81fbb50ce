// DeviceCache after a commit launch fails part-way (a CUDA error a working device never gives, injected with
// detail::fail_commit_launch_for_testing): append_batch, append_deferred and append_at_length launch one commit
// per 32 requests, and the launches before a failed one have run. Their requests must be committed exactly as
// their verdicts say — a bad row refused, the others stored with their exact windows intact — and the later
// requests not at all: every byte equal to a CPU cache that appended only the launched requests, the error
// saying how many were committed, and the next step appending and decoding as usual. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/append_commit.hpp"
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
using kvcompact::cuda::testing::expect_layers_match;
using kvcompact::cuda::testing::make_append_input;
using kvcompact::cuda::testing::take;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;

constexpr std::uint32_t kHeads = 2, kDim = 64;
constexpr std::uint32_t kSequences = 40;  // more than one commit launch takes (kEncodeBatchMax = 32)
constexpr std::uint32_t kLaunched = 32;   // the requests of the first launch, the one that runs

// Arms the injected failure for the commit launch after `launches_before` successful ones; disarms on exit.
class InjectedCommitFailure {
 public:
  explicit InjectedCommitFailure(int launches_before) { detail::fail_commit_launch_for_testing(launches_before); }
  ~InjectedCommitFailure() { detail::fail_commit_launch_for_testing(-1); }
  InjectedCommitFailure(const InjectedCommitFailure&) = delete;
  InjectedCommitFailure& operator=(const InjectedCommitFailure&) = delete;
};

// A CPU and a GPU cache of two layers, 40 sequences and an exact window of 8, each sequence holding 10 rows
// (its window full, so a commit that wrote a ring slot wrongly would show in the bytes).
struct Caches {
  TurboQuantCache cpu;
  DeviceCache gpu;
};

Caches filled_caches(std::mt19937_64& rng, std::uint64_t seed) {
  const QuantConfig config = *QuantConfig::parse("k=mse4,v=mse3,nc,w=8", seed);
  const CacheShape shape{.head_dim = kDim, .kv_heads = {kHeads, kHeads}, .sequences = kSequences, .capacity = 32};
  Caches c{take(TurboQuantCache::create(shape, config)), take(DeviceCache::create(shape, config))};
  for (std::uint32_t layer : {0u, 1u}) {
    std::vector<AppendInput> inputs;
    inputs.reserve(kSequences);
    std::vector<AppendRequest> requests;
    for (std::uint32_t s = 0; s < kSequences; ++s) {
      inputs.push_back(make_append_input(rng, 10, kHeads, kDim, DType::F32));
      const AppendInput& in = inputs.back();
      EXPECT_TRUE(c.cpu.append(layer, s, 0, 10, DType::F32, in.keys.data(), in.values.data()).ok());
      requests.push_back({s, 0, 10, DType::F32, in.device_keys.data(), in.device_values.data()});
    }
    EXPECT_TRUE(c.gpu.append_batch(layer, requests).ok());
  }
  return c;
}

// One step's rows for every sequence of a layer, in a random order: 1–3 rows per request, random dtypes; the
// request at index `bad` (if < kSequences) has a NaN key in its last row. The CPU cache appends the first
// `cpu_appends` requests (the bad one refused), as the device should commit them.
struct Step {
  std::vector<AppendInput> inputs;
  std::vector<AppendRequest> requests;
};

Step make_step(std::mt19937_64& rng, TurboQuantCache& cpu, std::uint32_t layer, std::uint32_t bad,
               std::uint32_t cpu_appends) {
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
  std::vector<std::uint32_t> order(kSequences);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), rng);
  Step step;
  step.inputs.reserve(kSequences);
  for (std::uint32_t i = 0; i < kSequences; ++i) {
    const std::uint32_t s = order[i], rows = 1 + static_cast<std::uint32_t>(rng() % 3);
    const DType dtype = i == bad ? DType::F32 : dtypes[rng() % 3];  // (the bad row's NaN is written as f32)
    AppendInput typed = make_append_input(rng, rows, kHeads, kDim, dtype);
    if (i == bad) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(typed.keys.data() + 4 * (std::size_t{kHeads} * kDim * (rows - 1) + 7), &nan, 4);
      EXPECT_TRUE(typed.device_keys.upload(typed.keys.data(), typed.keys.size()).ok());
    }
    const std::uint32_t position = cpu.length(layer, s);
    if (i < cpu_appends) {
      const Status c = cpu.append(layer, s, position, rows, dtype, typed.keys.data(), typed.values.data());
      EXPECT_EQ(c.ok(), i != bad) << "request " << i;
    }
    step.requests.push_back({s, position, rows, dtype, typed.device_keys.data(), typed.device_values.data()});
    step.inputs.push_back(std::move(typed));
  }
  return step;
}

std::vector<LengthAppend> at_length(const Step& step) {
  std::vector<LengthAppend> out;
  for (const AppendRequest& r : step.requests) out.push_back({r.seq, r.rows, r.dtype, r.keys, r.values});
  return out;
}

void expect_message_has(const Status& st, const std::string& part) {
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find(part), std::string::npos) << st.error().message;
}

// `call` (an append of 40 requests) with its second commit launch failing: the launch error (Internal).
template <typename Call>
Status with_second_commit_launch_failing(Call&& call) {
  const InjectedCommitFailure failure(1);
  const Status st = call();
  EXPECT_FALSE(st.ok());
  if (!st.ok()) {
    EXPECT_EQ(st.error().code, ErrorCode::Internal) << st.error().message;
  }
  return st;
}

// Each test starts from filled_caches, with a fresh seed that failures name.
class CudaCommitLaunchFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
    seed_ = fresh_seed();
    rng_.seed(seed_);
    caches_ = std::make_unique<Caches>(filled_caches(rng_, seed_));
  }
  std::string seed_trace() const { return "seed " + std::to_string(seed_); }

  std::uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::unique_ptr<Caches> caches_;
};

TEST_F(CudaCommitLaunchFailure, AppendBatchCommitsTheLaunchesBeforeIt) {
  SCOPED_TRACE(seed_trace());
  Caches& c = *caches_;
  const std::uint32_t bad = static_cast<std::uint32_t>(rng_() % kLaunched);  // refused inside the launch that runs
  const Step step = make_step(rng_, c.cpu, 0, bad, kLaunched);
  const Status st = with_second_commit_launch_failing([&] { return c.gpu.append_batch(0, step.requests); });
  expect_message_has(st, "the first 32 of the batch's 40 requests");
  expect_layers_match(c.cpu, c.gpu, {0, 1}, "after the failed launch");
  // The next step appends where each sequence stands and decodes over every exact window.
  const Step next = make_step(rng_, c.cpu, 0, kSequences, kSequences);
  ASSERT_TRUE(c.gpu.append_batch(0, next.requests).ok());
  expect_layers_match(c.cpu, c.gpu, {0}, "after the next step");
  expect_decode_matches_oracle(c.cpu, c.gpu, 0, 2 * kHeads, rng_);
}

TEST_F(CudaCommitLaunchFailure, AppendDeferredSettlesTheStepAndCommitsTheLaunchesBeforeIt) {
  SCOPED_TRACE(seed_trace());
  Caches& c = *caches_;
  // Layer 0's call is pending with a refused request; layer 1's call then fails at its second commit launch.
  const std::uint32_t bad = static_cast<std::uint32_t>(rng_() % kSequences);
  const Step first = make_step(rng_, c.cpu, 0, bad, kSequences);
  ASSERT_TRUE(c.gpu.append_deferred(0, first.requests).ok());
  const Step second = make_step(rng_, c.cpu, 1, kSequences, kLaunched);
  const Status st = with_second_commit_launch_failing([&] { return c.gpu.append_deferred(1, second.requests); });
  expect_message_has(st, "this call's first 32 of 40 appends");
  // The earlier call's refusal, which finish_appends would have returned, is in the message.
  expect_message_has(st, "layer 0 sequence " + std::to_string(first.requests[bad].seq) + " ");
  EXPECT_FALSE(c.gpu.appends_pending());
  expect_layers_match(c.cpu, c.gpu, {0, 1}, "after the failed launch");
  // No status word was left set: the next step is accepted everywhere.
  const Step next0 = make_step(rng_, c.cpu, 0, kSequences, kSequences);
  const Step next1 = make_step(rng_, c.cpu, 1, kSequences, kSequences);
  ASSERT_TRUE(c.gpu.append_deferred(0, next0.requests).ok());
  ASSERT_TRUE(c.gpu.append_deferred(1, next1.requests).ok());
  ASSERT_TRUE(c.gpu.finish_appends().ok());
  expect_layers_match(c.cpu, c.gpu, {0, 1}, "after the next step");
  expect_decode_matches_oracle(c.cpu, c.gpu, 1, 2 * kHeads, rng_);
}

TEST_F(CudaCommitLaunchFailure, AppendAtLengthCommitsTheLaunchesBeforeIt) {
  SCOPED_TRACE(seed_trace());
  Caches& c = *caches_;
  const std::uint32_t bad = static_cast<std::uint32_t>(rng_() % kLaunched);
  const Step step = make_step(rng_, c.cpu, 0, bad, kLaunched);
  const Status st = with_second_commit_launch_failing([&] { return c.gpu.append_at_length(0, at_length(step), 32); });
  expect_message_has(st, "the first 32 of 40 appends");
  // sync_lengths brings the committed lengths back and reports the launched request's refusal.
  const Status synced = c.gpu.sync_lengths();
  ASSERT_FALSE(synced.ok());
  EXPECT_EQ(synced.error().code, ErrorCode::NonFinite);
  expect_message_has(synced, "layer 0 sequence " + std::to_string(step.requests[bad].seq) + " ");
  expect_layers_match(c.cpu, c.gpu, {0, 1}, "after the failed launch");
  const Step next = make_step(rng_, c.cpu, 0, kSequences, kSequences);
  ASSERT_TRUE(c.gpu.append_at_length(0, at_length(next), 32).ok());
  ASSERT_TRUE(c.gpu.sync_lengths().ok());
  expect_layers_match(c.cpu, c.gpu, {0}, "after the next step");
  expect_decode_matches_oracle(c.cpu, c.gpu, 0, 2 * kHeads, rng_);
}

}  // namespace
}  // namespace kvcompact::cuda::tq
