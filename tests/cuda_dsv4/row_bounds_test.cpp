// Tokens beyond their call's row bound ("Row bounds" in kvcompact/cuda/dsv4_kernels.hpp): the bounds are host
// arguments, the positions device data, so a token may have more rows than its call was sized for. Each kernel
// must then read and write nothing past the bound and say so in its outputs — NaN score rows (indexer_scores),
// kTopkBeyondBound in every slot (indexer_topk), NaN outputs (sparse_attention, which also answers NaN for a
// ratio-4 index outside [-1, visible rows)) — while the other tokens of the call keep their bits. Each case runs a
// clean variant (every token within the bounds) and a dirty one (some tokens beyond them) of the same call and
// compares them. Small enough for the sanitizers (the *Small* suites under memcheck and racecheck).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernel_cases.hpp"

namespace kvcompact::cuda::dsv4 {
namespace {

namespace kd = kvcompact::dsv4;
using namespace kernel_cases;  // the shared helpers and cases of these tests

constexpr float kGuard = 12345.0f;  // fills the score buffer's unwritten entries and the guard behind it

bool all_nan(const float* x, std::size_t n) {
  return std::all_of(x, x + n, [](float v) { return std::isnan(v); });
}
bool all_finite(const float* x, std::size_t n) {
  return std::all_of(x, x + n, [](float v) { return std::isfinite(v); });
}

// Indexer scores and top-k. Tokens (visible rows = (position + 1) / 4, max_visible 128): A within (100 rows),
// B beyond (300), C within (50), E a negative position, D beyond and last in the buffer (1000), so that writes past
// its row would land in the guard. Clean variant: B, D, E at in-bound positions.
TEST(CudaDsv4RowBoundsSmall, IndexerScoresAndTopkAnswerTokensBeyondTheirBound) {
  SKIP_WITHOUT_GPU();
  arm_watchdog();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr std::uint32_t kHeads = 64, kMaxVisible = 128, kK = 16, kGuardFloats = 4096;
  const std::vector<std::int64_t> clean = {399, 499, 199, 299, 511};
  const std::vector<std::int64_t> dirty = {399, 1199, 199, -5, 3999};
  const std::vector<bool> beyond = {false, true, false, true, true};
  const auto count = static_cast<std::uint32_t>(clean.size());
  // MXFP4 rows: the encoding rounds them onto the FP4 grid, so the scores take the tensor cores (off-grid BF16
  // rows take the scalar path, which ran for 40 s under racecheck).
  const kd::IndexerStorage storage = kd::IndexerStorage::Mxfp4;
  const std::size_t rb = kd::indexer_row_bytes(storage);
  // One set of indexer rows for every token, as many as the largest position sees (rows past a token's visible
  // count exist, so a kernel that read them would not fault: only the outputs can tell).
  std::vector<std::uint8_t> rows(1000 * rb);
  for (std::size_t r = 0; r < 1000; ++r) {
    std::vector<float> v = normal(rng, 128);
    ASSERT_TRUE(kd::encode_indexer_row(v, storage, std::span<std::uint8_t>(rows.data() + r * rb, rb)).ok());
  }
  DeviceBuffer d_rows = upload(rows);
  DeviceBuffer d_q = upload(normal(rng, std::size_t{count} * kHeads * 128));
  DeviceBuffer d_w = upload(normal(rng, std::size_t{count} * kHeads, 0.01f));
  const std::uint64_t qws_bytes = indexer_query_workspace_bytes(count);
  DeviceBuffer d_qws = alloc(qws_bytes);
  check(indexer_prepare_queries(static_cast<const float*>(d_q.data()), count, kHeads, false, d_qws.data(), qws_bytes,
                                nullptr),
        "indexer_prepare_queries");

  struct Run {
    std::vector<float> scores;       // count x kMaxVisible, then the guard
    std::vector<std::int32_t> topk;  // from positions, count x kK
    std::vector<std::int32_t> topk_counts;  // from counts (the positions' row counts), count x kK
  };
  // (The top-k runs on the dirty variant only: under racecheck each top-k launch takes seconds.)
  auto run = [&](const std::vector<std::int64_t>& positions, bool with_topk) {
    std::vector<TokenRows> tokens(count);
    std::vector<std::uint32_t> counts(count);
    for (std::uint32_t i = 0; i < count; ++i) {
      tokens[i].indexer_rows = d_rows.data();
      tokens[i].position = positions[i];
      counts[i] = positions[i] < 0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>((positions[i] + 1) / 4);
    }
    DeviceBuffer d_tokens = upload(tokens), d_counts = upload(counts);
    const std::size_t n_scores = std::size_t{count} * kMaxVisible + kGuardFloats;
    DeviceBuffer d_scores = upload(std::vector<float>(n_scores, kGuard));
    DeviceBuffer d_idx = alloc(std::uint64_t{count} * kK * 4), d_idx_counts = alloc(std::uint64_t{count} * kK * 4);
    IndexerScoreArgs sa;
    sa.tokens = static_cast<const TokenRows*>(d_tokens.data());
    sa.count = count;
    sa.heads = kHeads;
    sa.weights = static_cast<const float*>(d_w.data());
    sa.query_workspace = d_qws.data();
    sa.query_workspace_bytes = qws_bytes;
    sa.storage = storage;
    sa.max_visible = kMaxVisible;
    sa.scores = static_cast<float*>(d_scores.data());
    sa.score_stride = kMaxVisible;
    check(indexer_scores(sa, nullptr), "indexer_scores");
    if (!with_topk) {
      check(synchronize(), "synchronize");
      return Run{download<float>(d_scores, n_scores), {}, {}};
    }
    TopkArgs ta;
    ta.scores = sa.scores;
    ta.score_stride = kMaxVisible;
    ta.count = count;
    ta.tokens = sa.tokens;
    ta.ratio = 4;
    ta.max_rows = kMaxVisible;
    ta.k = kK;
    ta.out = static_cast<std::int32_t*>(d_idx.data());
    ta.out_stride = kK;
    check(indexer_topk(ta, nullptr, 0, nullptr), "indexer_topk");
    ta.counts = static_cast<const std::uint32_t*>(d_counts.data());
    ta.out = static_cast<std::int32_t*>(d_idx_counts.data());
    check(indexer_topk(ta, nullptr, 0, nullptr), "indexer_topk (counts)");
    check(synchronize(), "synchronize");
    return Run{download<float>(d_scores, n_scores), download<std::int32_t>(d_idx, std::size_t{count} * kK),
               download<std::int32_t>(d_idx_counts, std::size_t{count} * kK)};
  };
  const Run a = run(clean, false), b = run(dirty, true);

  kd::TopkScratch scratch;
  for (std::uint32_t i = 0; i < count; ++i) {
    SCOPED_TRACE("token " + std::to_string(i) + " position " + std::to_string(dirty[i]));
    const std::size_t visible = static_cast<std::size_t>((clean[i] + 1) / 4);
    const float* row_a = a.scores.data() + std::size_t{i} * kMaxVisible;
    const float* row_b = b.scores.data() + std::size_t{i} * kMaxVisible;
    // The clean run: scores over the visible rows, the rest of the row untouched.
    EXPECT_TRUE(all_finite(row_a, visible));
    EXPECT_TRUE(std::all_of(row_a + visible, row_a + kMaxVisible, [](float v) { return v == kGuard; }));
    if (beyond[i]) {
      EXPECT_TRUE(all_nan(row_b, kMaxVisible)) << "a token beyond max_visible: its whole score row is NaN";
      for (const auto* out : {&b.topk, &b.topk_counts}) {
        EXPECT_TRUE(std::all_of(out->begin() + std::size_t{i} * kK, out->begin() + std::size_t{i + 1} * kK,
                                [](std::int32_t x) { return x == kTopkBeyondBound; }));
      }
    } else {  // the same scores as in the clean run, and the CPU's top-k of them
      for (std::size_t s = 0; s < kMaxVisible; ++s) ASSERT_EQ(bits(row_a[s]), bits(row_b[s])) << "row " << s;
      std::vector<std::int32_t> cpu(kK);
      const std::size_t n = kd::indexer_topk(cpu.data(), kK, row_a, visible, scratch);
      std::fill(cpu.begin() + static_cast<std::ptrdiff_t>(n), cpu.end(), -1);
      EXPECT_TRUE(std::equal(cpu.begin(), cpu.end(), b.topk.begin() + std::size_t{i} * kK));
      EXPECT_TRUE(std::equal(cpu.begin(), cpu.end(), b.topk_counts.begin() + std::size_t{i} * kK));
    }
  }
  for (const Run* r : {&a, &b}) {
    EXPECT_TRUE(std::all_of(r->scores.end() - kGuardFloats, r->scores.end(), [](float v) { return v == kGuard; }))
        << "nothing is written past the last token's row";
  }
}

// Sparse attention at ratio 4, max_rows 160, over repeats of four tokens: T0 within its bound; T1 with one index
// past its visible rows; T2 with kTopkBeyondBound in every slot; T3 at position 600 (128 + 64 rows > 160). Clean
// variant: valid indices and T3 at position 130 (128 + 32 rows). Token counts 4 (16-head blocks and the merge),
// 40 (64-head warpgroup blocks, 3 splits and the merge) and 1024 (one split per token: the warpgroup kernel writes
// the output itself) — the plans of 132 multiprocessors (H100, H200), checked through the workspace sizes.
TEST(CudaDsv4RowBoundsSmall, SparseAttentionAnswersTokensBeyondItsBoundAndStrayIndices) {
  SKIP_WITHOUT_GPU();
  arm_watchdog();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr std::uint32_t kHeads = 64, kTopk = 64, kMaxRows = 160, kCompressed = 150;
  const kd::RowStorage storage = kd::RowStorage::Bf16;
  const std::size_t rb = kd::attention_row_bytes(storage);
  auto rows_of = [&](std::size_t n) {
    std::vector<std::uint8_t> bytes(n * rb);
    for (std::size_t r = 0; r < n; ++r) {
      const std::vector<float> v = normal(rng, 512);
      EXPECT_TRUE(kd::encode_attention_row(v, storage, std::span<std::uint8_t>(bytes.data() + r * rb, rb)).ok());
    }
    return bytes;
  };
  DeviceBuffer d_ring = upload(rows_of(128)), d_comp = upload(rows_of(kCompressed));
  DeviceBuffer d_sink = upload(normal(rng, kHeads));
  std::array<float, 32> inv_freq{};
  for (std::size_t i = 0; i < 32; ++i) inv_freq[i] = std::pow(10000.0f, -static_cast<float>(i) / 32.0f);

  const auto props = device_properties(0);
  const bool pinned_plans = props.ok() && props->multiprocessors == 132;
  for (const std::uint32_t count : {4u, 40u, 1024u}) {
    SCOPED_TRACE("tokens " + std::to_string(count));
    if (pinned_plans) {  // (workspace: count x 64 heads x splits x (512 + 2) floats, 256-byte aligned arrays)
      const std::uint64_t ws = attention_workspace_bytes(count, kHeads, kMaxRows);
      const std::uint64_t expected = count == 40 ? 40u * 64 * 3 * 512 * 4 + 40u * 64 * 3 * 2 * 4 : 0u;
      if (count == 4) {
        EXPECT_GT(ws, 0u) << "16-head blocks, split + merge";
      } else {
        EXPECT_EQ(ws, expected) << "40: three splits + merge; 1024: direct output";
      }
    }
    const std::vector<std::int64_t> clean_pos = {100, 120, 110, 130}, dirty_pos = {100, 120, 110, 600};
    std::vector<std::int32_t> clean_idx(std::size_t{count} * kTopk, -1);
    for (std::uint32_t i = 0; i < count; ++i) {
      const std::size_t visible = static_cast<std::size_t>((clean_pos[i % 4] + 1) / 4);
      std::vector<std::int32_t> perm(visible);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::copy_n(perm.begin(), std::min<std::size_t>(kTopk, visible), clean_idx.begin() + std::size_t{i} * kTopk);
    }
    std::vector<std::int32_t> dirty_idx = clean_idx;
    for (std::uint32_t i = 0; i < count; ++i) {
      std::int32_t* row = dirty_idx.data() + std::size_t{i} * kTopk;
      const auto visible = static_cast<std::int32_t>((dirty_pos[i % 4] + 1) / 4);
      if (i % 4 == 1) {
        row[rng() % static_cast<std::uint32_t>(visible)] = visible + static_cast<std::int32_t>(rng() % 5);
      }
      if (i % 4 == 2) std::fill_n(row, kTopk, kTopkBeyondBound);
    }
    DeviceBuffer d_q = upload(normal(rng, std::size_t{count} * kHeads * 512));
    const std::uint64_t ws_bytes = attention_workspace_bytes(count, kHeads, kMaxRows);
    DeviceBuffer d_ws = alloc(ws_bytes);
    auto run = [&](const std::vector<std::int64_t>& positions, const std::vector<std::int32_t>& indices) {
      std::vector<TokenRows> tokens(count);
      for (std::uint32_t i = 0; i < count; ++i) {
        tokens[i].window_ring = d_ring.data();
        tokens[i].compressed_rows = d_comp.data();
        tokens[i].position = positions[i % 4];
      }
      DeviceBuffer d_tokens = upload(tokens), d_idx = upload(indices);
      DeviceBuffer d_out = alloc(std::uint64_t{count} * kHeads * 512 * 4);
      AttentionArgs at;
      at.tokens = static_cast<const TokenRows*>(d_tokens.data());
      at.count = count;
      at.heads = kHeads;
      at.q = static_cast<const float*>(d_q.data());
      at.sink = static_cast<const float*>(d_sink.data());
      at.storage = storage;
      at.ratio = 4;
      at.indices = static_cast<const std::int32_t*>(d_idx.data());
      at.index_stride = kTopk;
      at.index_topk = kTopk;
      at.inv_freq = inv_freq;
      at.max_rows = kMaxRows;
      at.out = static_cast<float*>(d_out.data());
      check(sparse_attention(at, ws_bytes > 0 ? d_ws.data() : nullptr, ws_bytes, nullptr), "sparse_attention");
      check(synchronize(), "synchronize");
      return download<float>(d_out, std::size_t{count} * kHeads * 512);
    };
    const std::vector<float> a = run(clean_pos, clean_idx), b = run(dirty_pos, dirty_idx);
    constexpr std::size_t kTokenFloats = std::size_t{kHeads} * 512;
    for (std::uint32_t i = 0; i < count; ++i) {
      SCOPED_TRACE("token " + std::to_string(i));
      const float* ta = a.data() + i * kTokenFloats;
      const float* tb = b.data() + i * kTokenFloats;
      EXPECT_TRUE(all_finite(ta, kTokenFloats));
      if (i % 4 == 0) {
        for (std::size_t j = 0; j < kTokenFloats; ++j) ASSERT_EQ(bits(ta[j]), bits(tb[j])) << "element " << j;
      } else {
        EXPECT_TRUE(all_nan(tb, kTokenFloats)) << (i % 4 == 3 ? "beyond max_rows" : "an index outside [-1, visible)");
      }
    }
  }
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4
