// Host side of the DeepSeek-V4 indexer kernels: query preparation, scores and top-k (argument checks, grid and
// chunk sizing, workspaces) launching indexer_prepare.cu, indexer_scores.cu and topk.cu. Allocates nothing.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/check.hpp"
#include "cuda/per_device.hpp"
#include "kernels_params.hpp"
#include "kvcompact/cuda/dsv4_kernels.hpp"
#include "multiprocessors.hpp"

namespace kvcompact::cuda::dsv4 {

namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

}  // namespace

std::uint64_t indexer_query_workspace_bytes(std::uint32_t tokens) { return detail::query_layout(tokens).total; }

Status indexer_prepare_queries(const float* q, std::uint32_t tokens, std::uint32_t heads, bool already_prepared,
                               void* query_workspace, std::uint64_t workspace_bytes, void* stream) {
  if (tokens == 0) return ok_status();
  if (heads == 0 || heads > kMaxIndexerHeads) {
    return make_error(ErrorCode::InvalidArgument, "indexer_prepare_queries: heads {} not in [1, {}]", heads,
                      kMaxIndexerHeads);
  }
  if (q == nullptr || query_workspace == nullptr) {
    return make_error(ErrorCode::InvalidArgument, "indexer_prepare_queries needs q and a workspace");
  }
  if (!aligned16(q) || !aligned16(query_workspace)) {
    return make_error(ErrorCode::InvalidArgument, "indexer_prepare_queries: q and the workspace must be 16-byte aligned");
  }
  const detail::QueryLayout lay = detail::query_layout(tokens);
  if (workspace_bytes < lay.total) {
    return make_error(ErrorCode::InvalidArgument, "indexer_prepare_queries: workspace of {} bytes, {} needed",
                      workspace_bytes, lay.total);
  }
  detail::PrepareParams p{};
  p.q = q;
  p.ws = static_cast<std::uint8_t*>(query_workspace);
  p.layout = lay;
  p.tokens = tokens;
  p.heads = heads;
  p.already_prepared = already_prepared ? 1u : 0u;
  p.hadamard_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(detail::kIndexerDim)));
  KVC_CUDA_TRY(detail::launch_prepare_queries(p, static_cast<cudaStream_t>(stream)));
  return ok_status();
}

Status indexer_scores(const IndexerScoreArgs& a, void* stream) {
  if (a.count == 0) return ok_status();
  if (a.heads == 0 || a.heads > kMaxIndexerHeads) {
    return make_error(ErrorCode::InvalidArgument, "indexer_scores: heads {} not in [1, {}]", a.heads, kMaxIndexerHeads);
  }
  if (a.count > kMaxTokensPerCall) {
    return make_error(ErrorCode::InvalidArgument, "indexer_scores: count {} exceeds {} tokens per call", a.count,
                      kMaxTokensPerCall);
  }
  if (a.tokens == nullptr || a.weights == nullptr || a.query_workspace == nullptr || a.scores == nullptr) {
    return make_error(ErrorCode::InvalidArgument, "indexer_scores needs tokens, weights, the query workspace and scores");
  }
  if (!aligned16(a.query_workspace)) {
    return make_error(ErrorCode::InvalidArgument, "indexer_scores: the query workspace must be 16-byte aligned");
  }
  if (const std::uint64_t needed = detail::query_layout(a.count).total; a.query_workspace_bytes < needed) {
    return make_error(ErrorCode::InvalidArgument,
                      "indexer_scores: query workspace of {} bytes, {} needed for {} tokens "
                      "(indexer_query_workspace_bytes)",
                      a.query_workspace_bytes, needed, a.count);
  }
  if (a.score_stride < a.max_visible) {
    return make_error(ErrorCode::InvalidArgument, "indexer_scores: score_stride {} < max_visible {}", a.score_stride,
                      a.max_visible);
  }
  std::uint32_t storage = 0;
  switch (a.storage) {
    case IndexerStorage::Bf16: storage = detail::kIdxBf16; break;
    case IndexerStorage::Fp8: storage = detail::kIdxFp8; break;
    case IndexerStorage::Mxfp4: storage = detail::kIdxMxfp4; break;
    default:
      return make_error(ErrorCode::InvalidArgument, "indexer_scores: unknown indexer storage {}",
                        static_cast<int>(a.storage));
  }
  detail::ScoreParams p{};
  p.tokens = reinterpret_cast<const detail::TokenRowsDev*>(a.tokens);
  p.weights = a.weights;
  p.ws = static_cast<const std::uint8_t*>(a.query_workspace);
  p.layout = detail::query_layout(a.count);
  p.scores = a.scores;
  p.fallback_rows = a.fallback_rows;
  p.count = a.count;
  p.heads = a.heads;
  p.storage = storage;
  p.row_bytes = static_cast<std::uint32_t>(kvcompact::dsv4::indexer_row_bytes(a.storage));
  p.score_stride = a.score_stride;
  p.max_visible = a.max_visible;
  // The score kernels' attributes and resident blocks, once per device (cuda/per_device.hpp).
  static kvcompact::cuda::detail::PerDevice<detail::ScoreKernelInfo> prepared;
  detail::ScoreKernelInfo kernel;
  KVC_CUDA_TRY(prepared.get(kernel, [](int, detail::ScoreKernelInfo& info) {
    info = detail::prepare_indexer_scores();
    return info.error;
  }));
  // As many blocks as are resident at once, split evenly over the tokens (rounded down); a block loops over its
  // token's tiles (the next tile's bytes load while the current one is scored). Rounding up would leave a few
  // blocks for a second wave that then runs their whole tile loop alone: at batch 8 x 1M context that made the
  // kernel 1.75x slower than its busy time (Nsight Compute: SMs active 57 % of the elapsed cycles).
  const std::uint64_t tiles = (std::uint64_t{a.max_visible} + detail::kScoreTileRows - 1) / detail::kScoreTileRows;
  const std::uint64_t resident =
      static_cast<std::uint64_t>(std::max(kernel.blocks_per_sm, 1)) * static_cast<std::uint64_t>(detail::multiprocessors());
  const std::uint64_t want = std::max<std::uint64_t>(resident / a.count, 1);
  p.blocks_per_token = static_cast<std::uint32_t>(std::min<std::uint64_t>(tiles, want));
  if (p.blocks_per_token == 0) return ok_status();
  KVC_CUDA_TRY(detail::launch_indexer_scores(p, static_cast<cudaStream_t>(stream)));
  return ok_status();
}

// The selection streams the scores from global memory and keeps only the k winners in shared memory, so the
// row count is bounded only by the int32 indices it returns.
static_assert(kTopkBeyondBound == detail::kTopkBeyondBound, "the kernels write the public constant");

std::uint32_t topk_max_rows(std::uint32_t k) { return k == 0 || k > detail::kTopkMaxK ? 0u : 0x7FFFFFFFu; }

std::uint64_t topk_workspace_bytes(std::uint32_t, std::uint32_t, std::uint32_t) { return 0; }

Status indexer_topk(const TopkArgs& a, void* /*workspace*/, std::uint64_t /*workspace_bytes*/, void* stream) {
  if (a.count == 0) return ok_status();
  if (a.k == 0 || a.k > detail::kTopkMaxK) {
    return make_error(ErrorCode::InvalidArgument, "indexer_topk: k {} not in [1, {}]", a.k, detail::kTopkMaxK);
  }
  if (a.max_rows > topk_max_rows(a.k)) {
    return make_error(ErrorCode::Unsupported, "indexer_topk: max_rows {} exceeds the limit {} for k {}", a.max_rows,
                      topk_max_rows(a.k), a.k);
  }
  if (a.scores == nullptr || a.out == nullptr || (a.counts == nullptr && a.tokens == nullptr)) {
    return make_error(ErrorCode::InvalidArgument, "indexer_topk needs scores, out, and counts or tokens");
  }
  if (a.counts == nullptr && a.ratio == 0) return make_error(ErrorCode::InvalidArgument, "indexer_topk: ratio 0");
  if (a.out_stride < a.k || a.score_stride < a.max_rows) {
    return make_error(ErrorCode::InvalidArgument, "indexer_topk: out_stride {} < k {} or score_stride {} < max_rows {}",
                      a.out_stride, a.k, a.score_stride, a.max_rows);
  }
  detail::TopkParams p{};
  p.scores = a.scores;
  p.counts = a.counts;
  p.tokens = reinterpret_cast<const detail::TokenRowsDev*>(a.tokens);
  p.out = a.out;
  p.count = a.count;
  p.score_stride = a.score_stride;
  p.k = a.k;
  p.out_stride = a.out_stride;
  p.ratio = a.ratio;
  p.max_rows = a.max_rows;
  KVC_CUDA_TRY(detail::launch_topk(p, static_cast<std::uint32_t>(detail::multiprocessors()), static_cast<cudaStream_t>(stream)));
  return ok_status();
}

}  // namespace kvcompact::cuda::dsv4
