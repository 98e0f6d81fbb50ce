// Host-side checks of the DeepSeek-V4 kernels that need no device (CI runs them): the attention's split plan as
// seen through its workspace size, argument checks, and the CPU half of the indexer's exactness argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kvcompact/cuda/dsv4_kernels.hpp"
#include "kvcompact/dsv4/fp_sim.hpp"
#include "kvcompact/dsv4/rope.hpp"
#include "dsv4/indexer_head_sum.hpp"
#include "dsv4/math_dot.hpp"

#include "kernel_cases.hpp"

namespace kvcompact::cuda::dsv4 {
namespace {

namespace kd = kvcompact::dsv4;
using namespace kernel_cases;  // the shared helpers and cases of these tests

// The attention's split plan, seen through the workspace it sizes: per token, splits x 64 heads x (512 floats, then
// max and sum), each array 256-byte aligned. The counts are those of 132 multiprocessors (the H200, and the
// fallback without a device), so CI checks them too.
TEST(CudaDsv4KernelsArgs, SplitPlanOfTheDecodeBenchmark) {
  if (device_count() > 0) {
    const auto props = device_properties(0);
    if (!props.ok() || props->multiprocessors != 132) GTEST_SKIP() << "the pinned plans are for 132 multiprocessors";
  }
  auto ws_heads = [](std::uint64_t heads, std::uint64_t count, std::uint64_t splits) {
    const std::uint64_t parts = count * heads * splits;
    auto align256 = [](std::uint64_t x) { return (x + 255) / 256 * 256; };
    return align256(parts * 512 * 4) + align256(parts * 2 * 4);
  };
  auto ws = [&](std::uint64_t count, std::uint64_t splits) { return ws_heads(64, count, splits); };
  auto ws16 = [&](std::uint64_t count, std::uint64_t splits) { return ws_heads(16, count, splits); };
  EXPECT_EQ(attention_workspace_bytes(8, 64, 8320), ws(8, 15));      // 1M, ratio 128: 15 splits of 9 tiles, one wave
  EXPECT_EQ(attention_workspace_bytes(8, 64, 2176), ws(8, 12));      // 256K, ratio 128: 12 splits of 3 tiles
  EXPECT_EQ(attention_workspace_bytes(8, 64, 640), ws(8, 10));       // ratio 4: one tile per split
  EXPECT_EQ(attention_workspace_bytes(1, 64, 8320), ws(1, 130));     // batch 1: one tile per split
  EXPECT_EQ(attention_workspace_bytes(4096, 64, 640), 0u);  // a prefill chunk: one split per token, written directly
  EXPECT_EQ(attention_workspace_bytes(4096, 16, 640), ws16(4096, 1));  // (16 heads: the mma.sync kernel and the merge)
  // A huge row bound is planned at once (at most 4096 candidates) and within 4096 splits.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_LE(attention_workspace_bytes(1, 64, 0xFFFFFFFFu), ws(1, 4096));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

// Host-side argument checks: no device needed (they fail before any CUDA call), so CI runs them too.
TEST(CudaDsv4KernelsArgs, InvalidArgumentsAreRejected) {
  EXPECT_EQ(topk_max_rows(512), 0x7FFFFFFFu);
  EXPECT_EQ(topk_max_rows(2048), 0x7FFFFFFFu);
  EXPECT_EQ(topk_max_rows(0), 0u);
  EXPECT_EQ(topk_max_rows(4096), 0u);
  alignas(16) static float dummy[64];
  auto code = [](const Status& st) { return st.ok() ? ErrorCode::Internal : st.error().code; };
  EXPECT_EQ(code(indexer_prepare_queries(dummy, 1, 65, false, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  EXPECT_EQ(code(indexer_prepare_queries(nullptr, 1, 64, false, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  EXPECT_EQ(code(indexer_prepare_queries(dummy + 1, 1, 64, false, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  EXPECT_EQ(code(indexer_prepare_queries(dummy, 2, 64, false, dummy, 16, nullptr)), ErrorCode::InvalidArgument);
  EXPECT_TRUE(indexer_prepare_queries(dummy, 0, 64, false, nullptr, 0, nullptr).ok());  // nothing to do
  IndexerScoreArgs sa;
  sa.count = 1;
  sa.heads = 0;
  EXPECT_EQ(code(indexer_scores(sa, nullptr)), ErrorCode::InvalidArgument);
  sa.heads = 64;
  EXPECT_EQ(code(indexer_scores(sa, nullptr)), ErrorCode::InvalidArgument);  // null pointers
  TopkArgs ta;
  ta.count = 1;
  ta.k = 0;
  EXPECT_EQ(code(indexer_topk(ta, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  ta.k = 512;
  ta.max_rows = 0x80000000u;
  EXPECT_EQ(code(indexer_topk(ta, dummy, 1 << 20, nullptr)), ErrorCode::Unsupported);
  ta.max_rows = 1000;
  EXPECT_EQ(code(indexer_topk(ta, nullptr, 0, nullptr)), ErrorCode::InvalidArgument);  // no scores / out
  AttentionArgs aa;
  aa.count = 1;
  aa.heads = 20;
  EXPECT_EQ(code(sparse_attention(aa, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  aa.heads = 64;
  aa.ratio = 8;
  EXPECT_EQ(code(sparse_attention(aa, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  aa.ratio = 4;  // tokens / q / out missing
  EXPECT_EQ(code(sparse_attention(aa, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  // A plan with partials (one token over 640 rows: 10 splits) and no workspace, or too small a one.
  aa.tokens = reinterpret_cast<const TokenRows*>(dummy);
  aa.q = dummy;
  aa.out = dummy;
  aa.indices = reinterpret_cast<const std::int32_t*>(dummy);
  aa.index_stride = 512;
  aa.max_rows = 640;
  ASSERT_GT(attention_workspace_bytes(1, 64, 640), 0u);
  auto workspace_error = [](const Status& st) {
    return !st.ok() && st.error().code == ErrorCode::InvalidArgument &&
           st.error().message.find("workspace of") != std::string::npos;
  };
  EXPECT_TRUE(workspace_error(sparse_attention(aa, nullptr, 0, nullptr)));
  EXPECT_TRUE(workspace_error(sparse_attention(aa, dummy, attention_workspace_bytes(1, 64, 640) - 1, nullptr)));
  // More tokens than a call's grid holds, or a row bound the 32-bit split plan cannot hold: typed errors before
  // any launch (otherwise an untyped CUDA error, or a split of 2^32 rows wrapped to 0 rows and a silent result).
  auto error_says = [](const Status& st, ErrorCode expected, const std::string& words) {
    return !st.ok() && st.error().code == expected && st.error().message.find(words) != std::string::npos;
  };
  AttentionArgs many = aa;
  many.count = kMaxTokensPerCall + 1;
  EXPECT_TRUE(error_says(sparse_attention(many, dummy, 1 << 20, nullptr), ErrorCode::InvalidArgument,
                         "tokens per call"));
  AttentionArgs huge = aa;
  for (const std::uint32_t max_rows : {kMaxAttentionRows + 1, 0xFFFFFFFFu}) {
    huge.max_rows = max_rows;
    EXPECT_TRUE(error_says(sparse_attention(huge, dummy, 1 << 20, nullptr), ErrorCode::Unsupported, "exceeds the limit"));
  }
  IndexerScoreArgs many_scores;
  many_scores.count = kMaxTokensPerCall + 1;
  many_scores.tokens = reinterpret_cast<const TokenRows*>(dummy);
  many_scores.weights = dummy;
  many_scores.query_workspace = dummy;
  many_scores.scores = dummy;
  EXPECT_TRUE(error_says(indexer_scores(many_scores, nullptr), ErrorCode::InvalidArgument, "tokens per call"));
  // A query workspace smaller than its count needs (say, prepared for fewer tokens): refused before any launch.
  IndexerScoreArgs small_workspace = many_scores;
  small_workspace.count = 3;
  small_workspace.query_workspace_bytes = indexer_query_workspace_bytes(3) - 1;
  EXPECT_TRUE(error_says(indexer_scores(small_workspace, nullptr), ErrorCode::InvalidArgument,
                         "query workspace of"));
  ASSERT_LT(indexer_query_workspace_bytes(2), indexer_query_workspace_bytes(3));
  small_workspace.query_workspace_bytes = indexer_query_workspace_bytes(2);
  EXPECT_TRUE(error_says(indexer_scores(small_workspace, nullptr), ErrorCode::InvalidArgument,
                         "query workspace of"));
}

// The CPU half of the exactness argument (docs/cuda-dsv4-kernels.md), checked on the CPU alone: for model
// data (Hadamard + FP4 queries and keys) the CPU's float32 dot equals the exact dot product, and its scores
// equal the head sum of exact dots in the CPU's order (head_block_sum, then + 0) — which is what the tensor-core
// scorer computes.
TEST(CudaDsv4KernelsArgs, CpuIndexerDotIsExactOnModelData) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::size_t H = 64, rows = 300;  // (one block of heads: head_block_sum)
  std::vector<float> q = normal(rng, H * 128, 1.0f);
  kd::prepare_indexer_query(q.data(), H);
  std::uniform_real_distribution<float> mag(0.01f, 100.0f);
  std::vector<float> keys;
  for (std::size_t r = 0; r < rows; ++r) {
    std::vector<float> k = normal(rng, 128, mag(rng));
    kd::simulate_indexer_row(k.data());
    keys.insert(keys.end(), k.begin(), k.end());
  }
  const std::vector<float> w = normal(rng, H, 0.01f);
  std::vector<float> scores(rows);
  kd::indexer_scores_contiguous(scores.data(), q.data(), w.data(), keys.data(), rows, H, 128);
  std::size_t inexact = 0, differ = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    float terms[64];
    for (std::size_t h = 0; h < H; ++h) {
      double exact = 0.0;  // products and sums of FP4-grid values are exact in double here
      for (std::size_t i = 0; i < 128; ++i) exact += static_cast<double>(q[h * 128 + i]) * keys[r * 128 + i];
      const float as_float = static_cast<float>(exact);
      inexact += static_cast<double>(as_float) != exact;
      differ += bits(kd::detail::dot_f32(&q[h * 128], &keys[r * 128], 128)) != bits(as_float);
      terms[h] = w[h] * std::max(as_float, 0.0f);
    }
    const float total = kd::detail::head_block_sum(terms) + 0.0f;
    differ += bits(total) != bits(scores[r]);
  }
  std::printf("[dsv4-kernels] cpu exactness: %zu dots not representable, %zu values differing (seed %llu)\n", inexact,
              differ, static_cast<unsigned long long>(seed));
  EXPECT_EQ(inexact, 0u);
  EXPECT_EQ(differ, 0u);
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4
