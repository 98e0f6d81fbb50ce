// DeepSeek-V4 cache plan and step arithmetic (see plan.hpp). Every byte count goes through checked
// arithmetic: contexts come from users and config files.
#include "kvcompact/dsv4/plan.hpp"

#include <algorithm>

#include "kvcompact/core/checked.hpp"

namespace kvcompact::dsv4 {

namespace {

constexpr std::uint64_t kIndexerStateRows = 8;   // coff (2) * m (4)
constexpr std::uint64_t kIndexerStateCols = 2 * kIndexerHeadDim;  // coff * 128

Result<LayerPlan> plan_layer(std::uint32_t index, std::uint32_t m, std::uint64_t context, StorageConfig storage) {
  LayerPlan l;
  l.layer = index;
  l.ratio = m;
  l.kind = static_cast<LayerKind>(m);
  l.coff = m == 4 ? 2u : (m == 0 ? 0u : 1u);
  l.window_rows = std::min<std::uint64_t>(context, kSlidingWindow);
  l.compressed_rows = m == 0 ? 0 : context / m;
  l.attention_rows = l.window_rows + l.compressed_rows;
  l.attention_row_bytes = attention_row_bytes(storage.attention);
  KVC_ASSIGN_OR_RETURN(l.window_bytes, checked_mul(l.window_rows, l.attention_row_bytes));
  KVC_ASSIGN_OR_RETURN(l.compressed_bytes, checked_mul(l.compressed_rows, l.attention_row_bytes));
  KVC_ASSIGN_OR_RETURN(l.attention_bytes, checked_add(l.window_bytes, l.compressed_bytes));
  l.window_offset = 0;
  l.compressed_offset = l.window_bytes;
  if (m == 4) {
    l.indexer_rows = context / 4;
    l.indexer_row_bytes = indexer_row_bytes(storage.indexer);
    KVC_ASSIGN_OR_RETURN(l.indexer_bytes, checked_mul(l.indexer_rows, l.indexer_row_bytes));
    l.indexer_state_rows = kIndexerStateRows;
    l.indexer_state_cols = kIndexerStateCols;
    l.indexer_state_bytes = kIndexerStateRows * kIndexerStateCols * sizeof(float);
  }
  if (m != 0) {
    l.state_rows = std::uint64_t{l.coff} * m;
    l.state_cols = std::uint64_t{l.coff} * kHeadDim;
    KVC_ASSIGN_OR_RETURN(l.state_bytes, checked_product({l.state_rows, l.state_cols, sizeof(float)}));
  }
  KVC_ASSIGN_OR_RETURN(l.resident_bytes, checked_sum({l.attention_bytes, l.indexer_bytes, l.state_bytes,
                                                      l.state_bytes, l.indexer_state_bytes,
                                                      l.indexer_state_bytes}));
  return l;
}

}  // namespace

const char* layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::Window: return "window";
    case LayerKind::Csa: return "csa";
    case LayerKind::Hca: return "hca";
  }
  return "?";
}

Result<CachePlan> plan_cache(const ModelConfig& model, std::uint64_t context, StorageConfig storage) {
  if (context == 0) return make_error(ErrorCode::EmptyContext, "context length is 0");
  if (context > model.max_position_embeddings) {
    Error e = make_error(ErrorCode::ContextBound, "context {} exceeds the model's max_position_embeddings {}",
                         context, model.max_position_embeddings);
    e.expected = static_cast<std::int64_t>(model.max_position_embeddings);
    e.actual = static_cast<std::int64_t>(std::min<std::uint64_t>(context, INT64_MAX));
    return e;
  }
  KVC_TRY(model.validate());
  CachePlan plan;
  plan.model = model;
  plan.model_fingerprint = model.fingerprint();
  plan.context = context;
  plan.storage = storage;
  plan.window_capacity = std::min<std::uint64_t>(context, kSlidingWindow);
  plan.layers.reserve(model.compress_ratios.size());
  for (std::uint32_t i = 0; i < model.num_hidden_layers; ++i) {
    KVC_ASSIGN_OR_RETURN(LayerPlan l, plan_layer(i, model.compress_ratios[i], context, storage));
    KVC_ASSIGN_OR_RETURN(plan.total_bytes, checked_add(plan.total_bytes, l.resident_bytes));
    plan.layers.push_back(l);
  }
  return plan;
}

double long_context_bytes_per_token(const ModelConfig& model, StorageConfig storage) {
  double total = 0;
  for (std::uint32_t m : model.compress_ratios) {
    if (m == 0) continue;
    total += static_cast<double>(attention_row_bytes(storage.attention)) / m;
    if (m == 4) total += static_cast<double>(indexer_row_bytes(storage.indexer)) / 4;
  }
  return total;
}

Result<std::uint64_t> uncompressed_bytes(const ModelConfig& model, std::uint64_t context) {
  return checked_product({model.num_hidden_layers, context, kAttentionRowBytesBf16});
}

Result<StepPlan> plan_step_at(const CachePlan& plan, std::uint64_t position) {
  if (position >= plan.context) {
    Error e = make_error(ErrorCode::ContextExhausted, "position {} is at or past the context length {}", position,
                         plan.context);
    e.expected = static_cast<std::int64_t>(plan.context);
    e.actual = static_cast<std::int64_t>(std::min<std::uint64_t>(position, INT64_MAX));
    return e;
  }
  const std::uint64_t n = position + 1;
  const std::uint64_t cap = plan.window_capacity;
  StepPlan s;
  s.position = position;
  s.window_write_slot = position % cap;
  s.window_valid_after = std::min(n, cap);
  s.window_start_position = n - s.window_valid_after;
  s.layers.reserve(plan.layers.size());
  for (const LayerPlan& l : plan.layers) {
    LayerStepPlan ls;
    ls.ratio = l.ratio;
    if (l.ratio != 0) {
      const std::uint64_t m = l.ratio;
      ls.compressed_valid_after = n / m;
      if (n % m == 0) ls.compressed_write_slot = n / m - 1;
      ls.state_write_row = (std::uint64_t{l.coff} - 1) * m + position % m;
      if (m == 4) {
        ls.indexer_valid_after = ls.compressed_valid_after;
        ls.indexer_write_slot = ls.compressed_write_slot;
      }
    }
    s.layers.push_back(ls);
  }
  return s;
}

Result<PrefillPlan> plan_prefill_at(const CachePlan& plan, std::uint64_t start, std::uint64_t count) {
  if (count == 0) return make_error(ErrorCode::EmptyPrefill, "prefill of 0 tokens at position {}", start);
  auto end = checked_add(start, count);
  if (!end.ok() || *end > plan.context) {
    Error e = make_error(ErrorCode::ContextBound, "prefill of {} tokens at position {} exceeds the context length {}",
                         count, start, plan.context);
    e.expected = static_cast<std::int64_t>(plan.context);
    e.actual = end.ok() ? static_cast<std::int64_t>(std::min<std::uint64_t>(*end, INT64_MAX)) : INT64_MAX;
    return e;
  }
  const std::uint64_t e = *end;
  const std::uint64_t cap = plan.window_capacity;
  PrefillPlan p;
  p.start = start;
  p.count = count;
  p.end = e;
  p.window_write_start = start % cap;
  p.window_valid_after = std::min(e, cap);
  p.window_start_position = e - p.window_valid_after;
  p.layers.reserve(plan.layers.size());
  for (const LayerPlan& l : plan.layers) {
    LayerPrefillPlan lp;
    lp.ratio = l.ratio;
    if (l.ratio != 0) {
      const std::uint64_t m = l.ratio;
      lp.compressed_write_start = start / m;
      lp.compressed_count = e / m - start / m;
      lp.compressed_valid_after = e / m;
      if (m == 4) {
        lp.indexer_write_start = lp.compressed_write_start;
        lp.indexer_count = lp.compressed_count;
        lp.indexer_valid_after = lp.compressed_valid_after;
      }
    }
    p.layers.push_back(lp);
  }
  return p;
}

}  // namespace kvcompact::dsv4
