// Snapshot / restore on the same live cache, and migration of a cache into another context length.
#include "kvcompact/dsv4/snapshot.hpp"

#include <algorithm>
#include <cstring>

#include "cache_access.hpp"

namespace kvcompact::dsv4 {

namespace {

// Copies the window rows of positions [position - valid, position) out of the ring, oldest first.
std::vector<std::uint8_t> gather_window(const Deepseek4Cache::Impl& c, std::size_t layer) {
  const LayerPlan& lp = c.plan.layers[layer];
  const std::uint64_t cap = c.plan.window_capacity;
  const std::uint64_t valid = std::min(c.position, cap);
  const std::uint64_t stride = lp.attention_row_bytes;
  std::vector<std::uint8_t> out(valid * stride);
  for (std::uint64_t k = 0; k < valid; ++k) {
    std::uint64_t q = c.position - valid + k;
    std::memcpy(out.data() + k * stride, c.layers[layer].attention.data() + (q % cap) * stride, stride);
  }
  return out;
}

// Writes rows gathered by gather_window (for positions ending at `position`) into the ring of `c`.
void scatter_window(Deepseek4Cache::Impl& c, std::size_t layer, std::span<const std::uint8_t> rows,
                    std::uint64_t position) {
  const std::uint64_t stride = c.plan.layers[layer].attention_row_bytes;
  const std::uint64_t cap = c.plan.window_capacity;
  const std::uint64_t valid = rows.size() / stride;
  KVC_ASSERT(valid <= cap && valid <= position, "window rows do not fit the ring");
  for (std::uint64_t k = 0; k < valid; ++k) {
    std::uint64_t q = position - valid + k;
    std::memcpy(c.layers[layer].attention.data() + (q % cap) * stride, rows.data() + k * stride, stride);
  }
}

}  // namespace

Result<Snapshot> take_snapshot(const Deepseek4Cache& cache) {
  const auto& c = detail::CacheAccess::impl(cache);
  if (c.poisoned) {
    return make_error(ErrorCode::Poisoned, "cannot snapshot a poisoned cache ({})", c.poison_reason);
  }
  Snapshot s;
  s.plan = c.plan;
  s.cache_id = c.id;
  s.rewinds_seen = c.rewind_floors.size();
  s.position = c.position;
  s.layers.resize(c.layers.size());
  for (std::size_t i = 0; i < c.layers.size(); ++i) {
    s.layers[i].window = gather_window(c, i);
    s.layers[i].kv_state = c.layers[i].kv_state;
    s.layers[i].score_state = c.layers[i].score_state;
    s.layers[i].indexer_kv_state = c.layers[i].indexer_kv_state;
    s.layers[i].indexer_score_state = c.layers[i].indexer_score_state;
  }
  return s;
}

Status restore_snapshot(Deepseek4Cache& cache, const Snapshot& snapshot) {
  auto& c = detail::CacheAccess::impl(cache);
  KVC_TRY(c.check_snapshot_restore(snapshot));  // every check before the first write (shared with the GPU cache)
  for (std::size_t i = 0; i < c.layers.size(); ++i) {
    const LayerSnapshot& ls = snapshot.layers[i];
    LayerBuffers& b = c.layers[i];
    scatter_window(c, i, ls.window, snapshot.position);
    std::copy(ls.kv_state.begin(), ls.kv_state.end(), b.kv_state.begin());
    std::copy(ls.score_state.begin(), ls.score_state.end(), b.score_state.begin());
    std::copy(ls.indexer_kv_state.begin(), ls.indexer_kv_state.end(), b.indexer_kv_state.begin());
    std::copy(ls.indexer_score_state.begin(), ls.indexer_score_state.end(), b.indexer_score_state.begin());
  }
  c.position = snapshot.position;
  c.poisoned = false;
  c.poison_reason.clear();
  c.rewind_floors.push_back(snapshot.position);
  return ok_status();
}

Status migrate_into(const Deepseek4Cache& source, Deepseek4Cache& destination) {
  const auto& s = detail::CacheAccess::impl(source);
  auto& d = detail::CacheAccess::impl(destination);
  if (&s == &d) return make_error(ErrorCode::InvalidArgument, "cannot migrate a cache into itself");
  if (s.poisoned) return make_error(ErrorCode::Poisoned, "cannot migrate a poisoned cache ({})", s.poison_reason);
  if (s.plan.model_fingerprint != d.plan.model_fingerprint || !(s.plan.storage == d.plan.storage)) {
    return make_error(ErrorCode::Mismatch,
                      "migration needs the same model and storage: source model {:016x} ({}/{}), destination "
                      "model {:016x} ({}/{})",
                      s.plan.model_fingerprint, row_storage_name(s.plan.storage.attention),
                      indexer_storage_name(s.plan.storage.indexer), d.plan.model_fingerprint,
                      row_storage_name(d.plan.storage.attention), indexer_storage_name(d.plan.storage.indexer));
  }
  if (d.plan.context < s.position) {
    Error e = make_error(ErrorCode::ContextBound, "destination context {} is below the source position {}",
                         d.plan.context, s.position);
    e.expected = static_cast<std::int64_t>(d.plan.context);
    e.actual = static_cast<std::int64_t>(s.position);
    return e;
  }
  for (std::size_t i = 0; i < s.layers.size(); ++i) {
    const LayerPlan& lp = s.plan.layers[i];
    const LayerBuffers& sb = s.layers[i];
    LayerBuffers& db = d.layers[i];
    std::vector<std::uint8_t> window = gather_window(s, i);
    scatter_window(d, i, window, s.position);
    if (lp.ratio != 0 && s.position >= lp.ratio) {
      const std::uint64_t rows = s.position / lp.ratio;
      const std::uint64_t stride = lp.attention_row_bytes;
      const LayerPlan& dp = d.plan.layers[i];
      std::memcpy(db.attention.data() + dp.compressed_offset, sb.attention.data() + lp.compressed_offset,
                  rows * stride);
    }
    if (lp.ratio == 4 && s.position >= 4) {
      std::memcpy(db.indexer.data(), sb.indexer.data(), (s.position / 4) * lp.indexer_row_bytes);
    }
    db.kv_state = sb.kv_state;
    db.score_state = sb.score_state;
    db.indexer_kv_state = sb.indexer_kv_state;
    db.indexer_score_state = sb.indexer_score_state;
  }
  d.position = s.position;
  d.poisoned = false;
  d.poison_reason.clear();
  d.rewind_floors.push_back(0);  // every row was replaced: no earlier snapshot of the destination restores
  return ok_status();
}

Result<Deepseek4Cache> migrate(const Deepseek4Cache& source, std::uint64_t context) {
  const auto& s = detail::CacheAccess::impl(source);
  if (s.poisoned) return make_error(ErrorCode::Poisoned, "cannot migrate a poisoned cache ({})", s.poison_reason);
  if (context < s.position) {
    Error e = make_error(ErrorCode::ContextBound, "migration context {} is below the source position {}", context,
                         s.position);
    e.expected = static_cast<std::int64_t>(context);
    e.actual = static_cast<std::int64_t>(s.position);
    return e;
  }
  KVC_ASSIGN_OR_RETURN(Deepseek4Cache destination, Deepseek4Cache::create(s.plan.model, context, s.plan.storage));
  KVC_TRY(migrate_into(source, destination));
  return destination;
}

}  // namespace kvcompact::dsv4
