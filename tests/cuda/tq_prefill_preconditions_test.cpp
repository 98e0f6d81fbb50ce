// prefill_attention with device values that break its preconditions (PrefillArgs): the host cannot check them,
// so the kernels do, and the result must be loud, not a plausible wrong answer. One launch holds a valid entry,
// one whose last rows sit at positions beyond the sequence's length (those rows NaN), one with a sequence index
// out of range (every row NaN, nothing read) and one with more rows than the plan's max_rows (the rows past it
// untouched); PrefillArgs::status must carry the three flags, and every valid row must be within 1e-3 of the
// float64 oracle. Then the valid entries alone: no flag, no NaN. Both kernels, the warpgroup one with and
// without a key split, and the exact window; and with folded QJL keys, rows that need keys past the plan's
// max_length (NaN, kPrefillKeysBeyondPlan). Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/cuda/tq_prefill.hpp"
#include "kvcompact/tq/attention_oracle.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::take;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::testing::fresh_seed;
using kvcompact::tq::testing::random_rows;

// One batch entry as the device sees it, and how many of its rows (from the first) are valid and computed.
struct DeviceEntry {
  std::uint32_t seq, first, rows, valid_rows;
};

struct PreconditionCase {
  std::string mode;
  std::uint32_t window;
  PrefillKernel kernel;
  int multiprocessors;  // 1: no key split; large: as many splits as the keys allow (warpgroup kernel)
  // The plan's max_length (0: the capacity). Below the device lengths, folded keys (the warpgroup kernel's in
  // Fast precision) have no tiles for the keys past it: rows that need them are NaN (kPrefillKeysBeyondPlan).
  std::uint32_t plan_length = 0;
};

DeviceBuffer upload_u32(const std::vector<std::uint32_t>& v) {
  auto b = take(DeviceBuffer::allocate(4ull * v.size()));
  EXPECT_OK(b.upload(v.data(), 4ull * v.size()));
  return b;
}

void check_preconditions(const PreconditionCase& c, std::uint64_t seed) {
  SCOPED_TRACE("mode " + c.mode + " window " + std::to_string(c.window) + " kernel " +
               std::to_string(static_cast<int>(c.kernel)) + " multiprocessors " + std::to_string(c.multiprocessors) +
               " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  QuantConfig config = *QuantConfig::parse(c.mode, seed);
  config.exact_window = c.window;
  const std::uint32_t d = 128, kv_heads = 2, q_heads = 8, capacity = 320, max_rows = 64;
  const std::vector<std::uint32_t> lengths = {300, 200, 150};
  auto cache = testing::random_cpu_cache(rng, config, d, kv_heads, lengths, capacity);
  const auto view = cache.view(0);
  auto codec = take(DeviceCodec::create(*view.codec));
  auto layer = testing::upload_layer(view);
  auto dlen = upload_u32(lengths);
  auto dbeg = upload_u32(std::vector<std::uint32_t>(view.window_begins, view.window_begins + lengths.size()));
  auto plan = take(plan_prefill(*view.layout, config, q_heads, max_rows, c.plan_length > 0 ? c.plan_length : capacity,
                                c.multiprocessors, kDefaultPrefillPrecision, c.kernel, 4));
  auto ws = take(DeviceBuffer::allocate(std::max<std::uint64_t>(plan.workspace_bytes, 16)));
  const std::size_t row = std::size_t{q_heads} * d;

  // Runs one launch of `entries` and checks it; `expected_status` is the flags it must raise.
  auto run = [&](const std::vector<DeviceEntry>& entries, std::uint32_t expected_status) {
    std::vector<std::uint32_t> seqs, firsts, rows;
    std::uint32_t total = 0;
    for (const DeviceEntry& e : entries) {
      seqs.push_back(e.seq);
      firsts.push_back(e.first);
      rows.push_back(e.rows);
      total += e.rows;
    }
    auto dseq = upload_u32(seqs), dfirst = upload_u32(firsts), drows = upload_u32(rows);
    const auto q = random_rows(rng, std::size_t{total} * q_heads, d, 1.0f, false);
    auto dq = take(DeviceBuffer::allocate(q.size() * 4));
    EXPECT_OK(dq.upload(q.data(), q.size() * 4));
    auto dout = take(DeviceBuffer::allocate(q.size() * 4));
    EXPECT_OK(dout.fill(0));  // rows that are not computed must stay 0
    auto dstatus = take(DeviceBuffer::allocate(4));
    EXPECT_OK(dstatus.fill(0));
    PrefillArgs args;
    args.batch = static_cast<std::uint32_t>(entries.size());
    args.seqs = static_cast<const std::uint32_t*>(dseq.data());
    args.first_positions = static_cast<const std::uint32_t*>(dfirst.data());
    args.rows = static_cast<const std::uint32_t*>(drows.data());
    args.lengths = static_cast<const std::uint32_t*>(dlen.data());
    args.window_begins = static_cast<const std::uint32_t*>(dbeg.data());
    args.queries = static_cast<const float*>(dq.data());
    args.output = static_cast<float*>(dout.data());
    args.status = static_cast<std::uint32_t*>(dstatus.data());
    EXPECT_OK(prefill_attention(plan, codec, layer.data(), args, ws.data()));
    EXPECT_OK(synchronize());
    std::vector<float> out(q.size());
    EXPECT_OK(dout.download(out.data(), out.size() * 4));
    std::uint32_t status = 0;
    EXPECT_OK(dstatus.download(&status, 4));
    EXPECT_EQ(status, expected_status);

    std::size_t base = 0;  // the entry's first output row
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const DeviceEntry& e = entries[i];
      SCOPED_TRACE("entry " + std::to_string(i));
      const std::uint32_t computed = std::min(e.rows, max_rows);
      if (e.valid_rows > 0) {
        kvcompact::tq::AttentionRequest r;
        r.seq = e.seq;
        r.first_position = e.first;
        r.rows = e.valid_rows;
        r.queries = q.data() + base * row;
        r.output = out.data();  // (the oracle returns its rows)
        kvcompact::tq::AttentionOptions options;
        options.q_heads = q_heads;
        const auto ref = take(kvcompact::tq::attention_oracle(view, {&r, 1}, options));
        const std::vector<float> got(out.begin() + base * row, out.begin() + (base + e.valid_rows) * row);
        EXPECT_LE(kvcompact::tq::testing::max_row_relative_error(got, ref[0], row), 1e-3);
      }
      for (std::uint32_t t = e.valid_rows; t < e.rows; ++t) {
        const auto first = out.begin() + (base + t) * row;
        const auto nan = std::count_if(first, first + row, [](float x) { return std::isnan(x); });
        const auto zero = std::count(first, first + row, 0.0f);
        if (t < computed) {
          EXPECT_EQ(static_cast<std::size_t>(nan), row) << "row " << t << " must be NaN";
        } else {
          EXPECT_EQ(static_cast<std::size_t>(zero), row) << "row " << t << " (past max_rows) must stay untouched";
        }
      }
      base += e.rows;
    }
  };
  if (c.plan_length > 0) {
    ASSERT_TRUE(plan.folded_keys);
    // Entry 0 needs keys up to position 289, past the folded tiles of max_length 128: every row NaN; entry 1
    // (keys below 90) is valid.
    run({{0, 250, 40, 0}, {2, 50, 40, 40}}, kPrefillKeysBeyondPlan);
    run({{2, 50, 40, 40}, {1, 20, max_rows, max_rows}}, 0u);
    return;
  }
  run({{0, 250, 40, 40},                      // valid
       {1, 180, 40, 20},                      // rows at positions 200..219 are beyond the length 200
       {7, 10, 10, 0},                        // sequence 7 does not exist
       {2, 50, max_rows + 6, max_rows}},      // six rows past the plan's max_rows
      kPrefillBadSequence | kPrefillRowsBeyondPlan | kPrefillPositionBeyondLength);
  run({{0, 250, 40, 40}, {2, 50, max_rows, max_rows}}, 0u);
}

TEST(CudaPrefillPreconditions, BrokenDeviceValuesAreLoud) {
  SKIP_WITHOUT_GPU();
  const int many = 1 << 20;
  const std::vector<PreconditionCase> cases = {
      {"k=mse4,v=mse3,nc", 0, PrefillKernel::Warpgroup, 1},
      {"k=mse4,v=mse3,nc", 0, PrefillKernel::Warpgroup, many},
      {"k=prod3,v=mse2", 16, PrefillKernel::Warpgroup, many},
      {"k=prod3,v=mse2", 16, PrefillKernel::Portable, 1},
      {"k=prod3,v=mse2", 0, PrefillKernel::Warpgroup, 1, 128},     // folded keys, lengths past max_length
      {"k=prod3,v=mse2", 16, PrefillKernel::Warpgroup, many, 128},
      {"k=mse4,v=mse3,nc", 16, PrefillKernel::Warpgroup, 1, 128},  // folded MSE keys
  };
  for (const PreconditionCase& c : cases) check_preconditions(c, fresh_seed());
}

}  // namespace
}  // namespace kvcompact::cuda::tq
