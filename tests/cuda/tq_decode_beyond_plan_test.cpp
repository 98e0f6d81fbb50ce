// Decode attention with a device length beyond the plan's max_length: the host cannot see device lengths, so
// the kernels check them. Such a sequence must get NaN in every output element (not an attention that left its
// later tokens out), DecodeArgs::status must get kDecodeLengthBeyondPlan, and every other sequence must be
// unaffected (within 1e-3 of the float64 oracle). Covers the fused kernel's in-kernel merge (wide and narrow
// variants) and the exact-window path (window and merge kernels); DeviceCache::decode after graph replays the
// host has not synced is in tq_unsynced_replays_test.cpp. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/tq/attention_oracle.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::take;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::testing::fresh_seed;
using kvcompact::tq::testing::random_rows;

// The rows of `out` (host [sequences, q_heads, d]) for sequence `seq`.
std::vector<float> rows_of(const std::vector<float>& out, std::uint32_t seq, std::size_t row) {
  return {out.begin() + seq * row, out.begin() + (seq + 1) * row};
}

std::size_t count_nan(const std::vector<float>& x) {
  return static_cast<std::size_t>(std::count_if(x.begin(), x.end(), [](float v) { return std::isnan(v); }));
}

struct BeyondCase {
  std::string mode;
  std::uint32_t window;
  int multiprocessors;  // 0: the device's (4-bit keys at d = 128 then run the wide variant); 1: the narrow kernel
};

// Sequences 0 and 2 are stored beyond the plan, sequence 4 is empty but its device length is beyond the capacity;
// 1 and 3 are within the plan.
void check_beyond_plan(const BeyondCase& c, std::uint64_t seed) {
  SCOPED_TRACE("mode " + c.mode + " window " + std::to_string(c.window) + " multiprocessors " +
               std::to_string(c.multiprocessors) + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  QuantConfig config = *QuantConfig::parse(c.mode, seed);
  config.exact_window = c.window;
  const std::uint32_t d = 128, kv_heads = 2, q_heads = 8, capacity = 1300, plan_length = 600;
  const std::vector<std::uint32_t> stored = {900, 300, 1200, 50, 0};
  const auto seqs = static_cast<std::uint32_t>(stored.size());
  auto cache = testing::random_cpu_cache(rng, config, d, kv_heads, stored, capacity);
  const auto view = cache.view(0);
  auto codec = take(DeviceCodec::create(*view.codec));
  auto layer = testing::upload_layer(view);
  std::vector<std::uint32_t> device_lengths = stored;
  device_lengths[4] = 5000;
  auto dlen = take(DeviceBuffer::allocate(4ull * seqs));
  ASSERT_OK(dlen.upload(device_lengths.data(), 4ull * seqs));
  auto dbeg = take(DeviceBuffer::allocate(4ull * seqs));
  ASSERT_OK(dbeg.upload(view.window_begins, 4ull * seqs));
  const auto q = random_rows(rng, std::size_t{seqs} * q_heads, d, 1.0f, false);
  auto dq = take(DeviceBuffer::allocate(q.size() * 4));
  ASSERT_OK(dq.upload(q.data(), q.size() * 4));
  auto dout = take(DeviceBuffer::allocate(q.size() * 4));
  auto dstatus = take(DeviceBuffer::allocate(4));
  const int sms = c.multiprocessors != 0 ? c.multiprocessors : take(device_properties(0)).multiprocessors;
  auto plan = take(plan_decode(*view.layout, config, q_heads, plan_length, sms));
  ASSERT_GT(std::uint64_t{plan.chunk} * plan.splits, plan_length) << "a plan that covers more than it promises";
  auto ws = take(DeviceBuffer::allocate(plan.workspace_bytes));
  DecodeArgs args;
  args.queries = static_cast<const float*>(dq.data());
  args.lengths = static_cast<const std::uint32_t*>(dlen.data());
  args.window_begins = static_cast<const std::uint32_t*>(dbeg.data());
  args.output = static_cast<float*>(dout.data());
  const std::size_t row = std::size_t{q_heads} * d;

  // The oracle's rows for the sequences within the plan.
  std::vector<kvcompact::tq::AttentionRequest> requests;
  std::vector<float> unused(row);  // the oracle checks for an output pointer but returns its rows
  for (const std::uint32_t s : {1u, 3u}) {
    kvcompact::tq::AttentionRequest r;
    r.seq = s;
    r.first_position = stored[s] - 1;
    r.rows = 1;
    r.queries = q.data() + s * row;
    r.output = unused.data();
    requests.push_back(r);
  }
  kvcompact::tq::AttentionOptions options;
  options.q_heads = q_heads;
  const auto ref = take(kvcompact::tq::attention_oracle(view, requests, options));

  // One launch: the output and the status word (zeroed before; left alone when not passed).
  auto run = [&](const DecodePlan& run_plan, DeviceBuffer& workspace, bool with_status) {
    EXPECT_OK(dout.fill(0));
    EXPECT_OK(dstatus.fill(0));
    args.status = with_status ? static_cast<std::uint32_t*>(dstatus.data()) : nullptr;
    EXPECT_OK(decode_attention(run_plan, codec, layer.data(), args, workspace.data()));
    EXPECT_OK(synchronize());
    std::pair<std::vector<float>, std::uint32_t> got{std::vector<float>(q.size()), 0u};
    EXPECT_OK(dout.download(got.first.data(), got.first.size() * 4));
    EXPECT_OK(dstatus.download(&got.second, 4));
    return got;
  };
  for (const bool with_status : {true, false}) {
    SCOPED_TRACE(with_status ? "with a status word" : "without a status word");
    const auto [out, status] = run(plan, ws, with_status);
    EXPECT_EQ(status, with_status ? kDecodeLengthBeyondPlan : 0u);
    for (const std::uint32_t s : {0u, 2u, 4u}) {
      EXPECT_EQ(count_nan(rows_of(out, s, row)), row)
          << "sequence " << s << " (device length " << device_lengths[s] << ", plan " << plan_length << ")";
    }
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const std::uint32_t s = requests[i].seq;
      EXPECT_LE(kvcompact::tq::testing::max_row_relative_error(rows_of(out, s, row), ref[i], row), 1e-3)
          << "sequence " << s << " within the plan";
    }
  }

  // The same lengths under a plan that covers them: no flag, no NaN.
  device_lengths[4] = 0;
  ASSERT_OK(dlen.upload(device_lengths.data(), 4ull * seqs));
  auto full = take(plan_decode(*view.layout, config, q_heads, capacity, sms));
  auto full_ws = take(DeviceBuffer::allocate(full.workspace_bytes));
  const auto [out, status] = run(full, full_ws, true);
  EXPECT_EQ(status, 0u);
  EXPECT_EQ(count_nan(out), 0u);
}

TEST(CudaDecodeBeyondPlan, NaNRowsAndAFlagForLengthsBeyondThePlan) {
  SKIP_WITHOUT_GPU();
  const std::vector<BeyondCase> cases = {
      {"k=mse4,v=mse3,nc", 0, 0},  // in-kernel merge, wide variant
      {"k=mse4,v=mse3,nc", 0, 1},  // in-kernel merge, narrow kernel
      {"k=prod3,v=mse2", 0, 0},    // QJL keys, 2-bit values
      {"k=prod3,v=mse2", 16, 0},   // exact window: window and merge kernels
  };
  for (const BeyondCase& c : cases) check_beyond_plan(c, fresh_seed());
}

}  // namespace
}  // namespace kvcompact::cuda::tq
