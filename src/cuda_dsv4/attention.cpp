// Host side of the DeepSeek-V4 sparse attention kernels: argument checks, the split plan (rows per split
// from the device's multiprocessor count) and the launch through attention.cu. Allocates nothing.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cuda/align.hpp"
#include "cuda/check.hpp"
#include "cuda/per_device.hpp"
#include "kernels_params.hpp"
#include "kvcompact/cuda/dsv4_kernels.hpp"
#include "multiprocessors.hpp"

namespace kvcompact::cuda::dsv4 {

static_assert(sizeof(TokenRows) == sizeof(detail::TokenRowsDev));
static_assert(offsetof(TokenRows, window_ring) == offsetof(detail::TokenRowsDev, window_ring));
static_assert(offsetof(TokenRows, chunk_rows) == offsetof(detail::TokenRowsDev, chunk_rows));
static_assert(offsetof(TokenRows, compressed_rows) == offsetof(detail::TokenRowsDev, compressed_rows));
static_assert(offsetof(TokenRows, indexer_rows) == offsetof(detail::TokenRowsDev, indexer_rows));
static_assert(offsetof(TokenRows, position) == offsetof(detail::TokenRowsDev, position));
static_assert(offsetof(TokenRows, chunk_start) == offsetof(detail::TokenRowsDev, chunk_start));
static_assert(offsetof(TokenRows, ring_capacity) == offsetof(detail::TokenRowsDev, ring_capacity));

namespace {

struct SplitPlan {
  std::uint32_t splits = 1;
  std::uint32_t split_rows = detail::kAttnTileRows;
};

// The split count from a cost model of the grid. One 512-thread block runs per multiprocessor and blocks run
// in whole waves; a block costs a fixed kFixedTiles (query load and conversion, the first tile's latency, the
// partial stores) plus one unit per 64-row tile; the merge costs kMergeTiles per split of each (token, head
// block). Fitted on the H200 (batch 8, ratio-128 layers): fixed ~12 us, a tile ~6.6 us, merge ~0.04 us per
// split. The cheapest tiles-per-split wins. (The old rule, "about two waves", rounded 8 tokens x 130 tiles to 17
// splits: 136 blocks, a second wave of 4; 15 splits of 9 tiles fit in one wave of 120.)
constexpr double kFixedTiles = 2.0;
constexpr double kMergeTiles = 0.006;

SplitPlan plan_splits(std::uint32_t count, std::uint32_t heads, std::uint32_t max_rows) {
  const std::uint64_t tiles = std::max<std::uint64_t>(1, (std::uint64_t{max_rows} + detail::kAttnTileRows - 1) / detail::kAttnTileRows);
  const std::uint64_t head_blocks = (heads + detail::kAttnBlockHeads - 1) / detail::kAttnBlockHeads;
  const std::uint64_t base = std::max<std::uint64_t>(1, std::uint64_t{count} * head_blocks);
  const auto sms = static_cast<std::uint64_t>(detail::multiprocessors());
  // Candidates: for each split count s (at most kAttnMaxSplits), its fewest tiles per split, in ascending order of
  // tiles per split (a larger one with the same split count only costs more). Ties keep the fewer tiles per split.
  std::uint64_t best_per_split = tiles;
  double best_cost = -1.0;
  for (std::uint64_t s = std::min<std::uint64_t>(tiles, detail::kAttnMaxSplits); s >= 1; --s) {
    const std::uint64_t per_split = (tiles + s - 1) / s;
    const std::uint64_t splits = (tiles + per_split - 1) / per_split;
    const std::uint64_t waves = (base * splits + sms - 1) / sms;
    const double cost = static_cast<double>(waves) * (kFixedTiles + static_cast<double>(per_split)) +
                        kMergeTiles * static_cast<double>(base * splits);
    if (best_cost < 0.0 || cost < best_cost) {
      best_cost = cost;
      best_per_split = per_split;
    }
  }
  SplitPlan plan;
  plan.splits = static_cast<std::uint32_t>((tiles + best_per_split - 1) / best_per_split);
  plan.split_rows = static_cast<std::uint32_t>(best_per_split * detail::kAttnTileRows);
  return plan;
}

// Heads per block: 64 (each row tile read once for all of them) unless the grid would leave most
// multiprocessors idle (a decode step of one or a few sequences over a short row list, e.g. a ratio-4 layer's
// 640 rows): then the fewest heads per block, 16 or 32, whose grid still fits in one wave (one block per
// multiprocessor). A head's arithmetic does not depend on the heads beside it, so the outputs are the same.
std::uint32_t pick_block_heads(std::uint32_t count, std::uint32_t heads, std::uint32_t splits) {
  const auto resident = static_cast<std::uint64_t>(detail::multiprocessors());
  for (std::uint32_t bh : {16u, 32u}) {
    const std::uint64_t blocks = std::uint64_t{count} * splits * ((heads + bh - 1) / bh);
    if (bh < heads && blocks <= resident) return bh;
  }
  return detail::kAttnBlockHeads;
}

// A call's plan: its splits, heads per block, and whether the split kernel writes the output itself (one split
// per token in 64-head blocks, which take the warpgroup kernel: no partials, no merge, no workspace).
struct AttnPlan {
  SplitPlan split;
  std::uint32_t block_heads = detail::kAttnBlockHeads;
  bool direct_output = false;
};
AttnPlan plan_attention(std::uint32_t count, std::uint32_t heads, std::uint32_t max_rows) {
  AttnPlan plan;
  plan.split = plan_splits(count, heads, max_rows);
  plan.block_heads = pick_block_heads(count, heads, plan.split.splits);
  plan.direct_output = plan.split.splits == 1 && plan.block_heads == detail::kAttnBlockHeads &&
                       heads % detail::kAttnBlockHeads == 0;
  return plan;
}

struct AttnWorkspace {
  std::uint64_t part_o = 0, part_ml = 0, total = 0;
};
AttnWorkspace attn_layout(std::uint32_t count, std::uint32_t heads, const AttnPlan& plan) {
  AttnWorkspace w;
  if (plan.direct_output) return w;
  const std::uint64_t parts = std::uint64_t{count} * heads * plan.split.splits;
  w.part_ml = kvcompact::cuda::detail::align256(parts * detail::kHeadDim * 4);
  w.total = w.part_ml + kvcompact::cuda::detail::align256(parts * 2 * 4);
  return w;
}

}  // namespace

std::uint64_t attention_workspace_bytes(std::uint32_t count, std::uint32_t heads, std::uint32_t max_rows) {
  return attn_layout(count, heads, plan_attention(count, heads, max_rows)).total;
}

Status sparse_attention(const AttentionArgs& a, void* workspace, std::uint64_t workspace_bytes, void* stream) {
  if (a.count == 0) return ok_status();
  if (a.heads == 0 || a.heads % detail::kAttnHeadGroup != 0 || a.heads > 128) {
    return make_error(ErrorCode::InvalidArgument, "sparse_attention: heads {} must be a multiple of 16 in [16, 128]",
                      a.heads);
  }
  if (a.count > kMaxTokensPerCall) {
    return make_error(ErrorCode::InvalidArgument, "sparse_attention: count {} exceeds {} tokens per call", a.count,
                      kMaxTokensPerCall);
  }
  if (a.ratio != 0 && a.ratio != 4 && a.ratio != 128) {
    return make_error(ErrorCode::InvalidArgument, "sparse_attention: ratio {} is not 0, 4 or 128", a.ratio);
  }
  if (a.tokens == nullptr || a.q == nullptr || a.out == nullptr) {
    return make_error(ErrorCode::InvalidArgument, "sparse_attention needs tokens, q and out");
  }
  if (reinterpret_cast<std::uintptr_t>(a.q) % 16 != 0 || reinterpret_cast<std::uintptr_t>(a.out) % 16 != 0 ||
      reinterpret_cast<std::uintptr_t>(workspace) % 16 != 0) {
    return make_error(ErrorCode::InvalidArgument, "sparse_attention: q, out and the workspace must be 16-byte aligned");
  }
  if (a.ratio == 4 && (a.indices == nullptr || a.index_stride < a.index_topk || a.index_topk == 0)) {
    return make_error(ErrorCode::InvalidArgument,
                      "sparse_attention: ratio 4 needs indices with index_stride {} >= index_topk {} > 0",
                      a.index_stride, a.index_topk);
  }
  if (a.storage != RowStorage::Bf16 && a.storage != RowStorage::Fp8) {
    return make_error(ErrorCode::InvalidArgument, "sparse_attention: unknown row storage {}",
                      static_cast<int>(a.storage));
  }
  if (a.max_rows == 0) return make_error(ErrorCode::InvalidArgument, "sparse_attention: max_rows is 0");
  // (The split plan and the kernels' row indices are 32-bit: a split of 2^32 rows would wrap to 0 rows.)
  if (a.max_rows > kMaxAttentionRows) {
    return make_error(ErrorCode::Unsupported, "sparse_attention: max_rows {} exceeds the limit {}", a.max_rows,
                      kMaxAttentionRows);
  }
  for (float f : a.inv_freq) {
    if (!std::isfinite(f)) return make_error(ErrorCode::InvalidArgument, "sparse_attention: inv_freq {} is not finite", f);
  }
  const AttnPlan plan = plan_attention(a.count, a.heads, a.max_rows);
  const AttnWorkspace lay = attn_layout(a.count, a.heads, plan);
  if (lay.total > 0 && (workspace == nullptr || workspace_bytes < lay.total)) {
    return make_error(ErrorCode::InvalidArgument, "sparse_attention: workspace of {} bytes{}, {} needed",
                      workspace == nullptr ? 0 : workspace_bytes, workspace == nullptr ? " (null)" : "", lay.total);
  }
  detail::AttentionParams p{};
  p.tokens = reinterpret_cast<const detail::TokenRowsDev*>(a.tokens);
  p.q = a.q;
  p.sink = a.sink;
  p.indices = a.indices;
  p.out = a.out;
  auto* base = static_cast<std::uint8_t*>(workspace);
  p.part_o = reinterpret_cast<float*>(base + lay.part_o);
  p.part_ml = reinterpret_cast<float*>(base + lay.part_ml);
  for (std::size_t i = 0; i < 32; ++i) p.inv_freq[i] = a.inv_freq[i];
  p.count = a.count;
  p.heads = a.heads;
  p.storage = a.storage == RowStorage::Bf16 ? detail::kRowBf16 : detail::kRowFp8;
  p.row_bytes = static_cast<std::uint32_t>(kvcompact::dsv4::attention_row_bytes(a.storage));
  p.ratio = a.ratio;
  p.index_stride = a.index_stride;
  p.index_topk = a.index_topk;
  p.splits = plan.split.splits;
  p.split_rows = plan.split.split_rows;
  p.block_heads = plan.block_heads;
  p.direct_output = plan.direct_output ? 1u : 0u;
  p.inverse_rope = a.inverse_rope ? 1u : 0u;
  p.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(512.0));
  p.max_rows = a.max_rows;
  // The kernels' shared-memory attributes, set once per device (they belong to that device's context).
  static kvcompact::cuda::detail::PerDevice<bool> prepared;
  bool done = false;
  KVC_CUDA_TRY(prepared.get(done, [](int, bool& set) {
    set = true;
    return detail::prepare_attention();
  }));
  KVC_CUDA_TRY(detail::launch_attention(p, static_cast<cudaStream_t>(stream)));
  return ok_status();
}

}  // namespace kvcompact::cuda::dsv4
