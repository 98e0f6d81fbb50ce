// Small DeepSeek-V4 kernel cases, quick enough for compute-sanitizer (scripts/gpu/run_all.sh runs the *Small*
// suites under memcheck and racecheck): indexer + top-k, top-k, attention (tiny, many splits, direct output).
// Every test skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernel_cases.hpp"

namespace kvcompact::cuda::dsv4 {
namespace {

namespace kd = kvcompact::dsv4;
using namespace kernel_cases;  // the shared helpers and cases of these tests

TEST(CudaDsv4KernelsSmall, IndexerScoresAndTopkTiny) {
  SKIP_WITHOUT_GPU();
  IndexerCase c;
  c.name = "small";
  c.positions = {3, 42, 250};
  c.k = 16;
  c.storage = kd::IndexerStorage::Mxfp4;
  run_indexer_case(c);
  // Every storage's path under the sanitizers: two tiles (one partial) of grid rows, and rows with NaN,
  // infinities and subnormals.
  IndexerCase tiles = c;
  tiles.positions = {300, 42};
  run_indexer_case_per_storage(tiles, "small-");
  tiles.special_values = true;
  tiles.fallback = IndexerCase::Fallback::Some;
  run_indexer_case_per_storage(tiles, "small-special-");
  c.name = "small-offgrid-bf16";
  c.storage = kd::IndexerStorage::Bf16;
  c.model_grid = false;
  c.positions = {7, 40};
  run_indexer_case(c);
}

TEST(CudaDsv4KernelsSmall, TopkTiny) {
  SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  run_topk_case("tiny", {{1.0f, nan, 2.0f, 2.0f, -0.0f, 0.0f, -inf, inf, 1.0f}, {5.0f}, {}}, 4);
}

// Shares of at least 4096 rows take the bulk copies into the staging area (topk.cu), under the sanitizers too:
// on 16-block clusters one token's 16-byte aligned rows split into shares of 4100 rows and a last one of 4099 (its
// last 3 rows loaded by threads), and the other token's rows start 12 bytes past a 16-byte boundary (the stride
// is 65599 scores), so its blocks take the threads' loads instead.
TEST(CudaDsv4KernelsSmall, TopkBulkStaged) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> first = normal(rng, 65599), second = normal(rng, 65537);
  for (std::size_t j = 7; j < first.size(); j += 1009) first[j] = first[j - 7];  // exact ties
  run_topk_case("bulk-staged", {first, second}, 512);
}

TEST(CudaDsv4KernelsSmall, AttentionTiny) {
  SKIP_WITHOUT_GPU();
  AttnCase c;
  c.name = "small";
  c.heads = 16;
  c.topk = 8;
  c.ratio = 4;
  c.positions = {50, 5};
  run_attention_case(c);
  c.name = "small-fp8-hca";
  c.storage = kd::RowStorage::Fp8;
  c.ratio = 128;
  c.positions = {300};
  run_attention_case(c);
  // 64 heads over a short row list: blocks of 16 heads (h0 = 16, 32, 48), under the sanitizers too.
  c.name = "small-64-heads";
  c.storage = kd::RowStorage::Bf16;
  c.heads = 64;
  c.ratio = 4;
  c.positions = {50, 5};
  run_attention_case(c);
  // Short contexts: rings of min(context, 128) rows, 100 (a remainder) and 64 (a mask).
  c.name = "small-ring-100";
  c.ring_capacity = 100;
  c.positions = {99, 37};
  run_attention_case(c);
  c.name = "small-ring-64";
  c.ring_capacity = 64;
  c.positions = {63, 20};
  run_attention_case(c);
}

// Long row lists: a ratio-128 token at 1M context (8320 rows in 130 splits: the merge's 16 split warps per
// quarter of the dims, two of them taking a second round of loads), then two tokens (65 splits, of which the token
// at 300000 uses 20: 8 split warps per half of the dims, one with a second round), under the sanitizers too.
TEST(CudaDsv4KernelsSmall, AttentionManySplits) {
  SKIP_WITHOUT_GPU();
  // The cases must reach that path: at least 64 splits of 64 heads x 512 floats per token (64-head blocks, so the
  // warpgroup-MMA split kernel).
  EXPECT_GE(attention_workspace_bytes(1, 64, 8320), std::uint64_t{64} * 64 * 512 * 4);
  EXPECT_GE(attention_workspace_bytes(2, 64, 8320), std::uint64_t{2} * 64 * 64 * 512 * 4);
  AttnCase c;
  c.name = "many-splits";
  c.ratio = 128;
  c.positions = {1048575};
  run_attention_case(c);
  c.positions = {300000, 1048575};
  run_attention_case(c);
  // FP8 rows in 64-head blocks (the warpgroup-MMA kernel's FP8 variant), so the sanitizers see it too.
  c.name = "many-splits-fp8";
  c.storage = kd::RowStorage::Fp8;
  run_attention_case(c);
}

// A prefill chunk's plan: one split per token in 64-head blocks, so the warpgroup kernel writes the output itself
// (normalised, sink, inverse RoPE; no merge). Both row formats, window-only and ratio-4 lists, with and without
// the sink, under the sanitizers too.
TEST(CudaDsv4KernelsSmall, AttentionDirectOutput) {
  SKIP_WITHOUT_GPU();
  // 140 tokens: more 16- or 32-head blocks than multiprocessors, so 64-head blocks; and one split each, so no
  // workspace (the plan's direct output).
  EXPECT_EQ(attention_workspace_bytes(140, 64, 192), 0u);
  EXPECT_EQ(attention_workspace_bytes(140, 64, 128), 0u);
  for (auto st : {kd::RowStorage::Bf16, kd::RowStorage::Fp8}) {
    AttnCase c;
    c.storage = st;
    c.prefill = true;
    c.check_every = 7;
    for (std::int64_t t = 1000; t < 1140; ++t) c.positions.push_back(t);
    c.name = "direct-window";
    c.ratio = 0;
    run_attention_case(c);
    c.name = "direct-csa-no-sink";
    c.ratio = 4;
    c.topk = 64;
    c.with_sink = false;
    run_attention_case(c);
  }
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4
