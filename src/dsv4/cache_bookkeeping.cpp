// The step protocol of a DeepSeek-V4 cache on its bookkeeping alone (see cache_bookkeeping.hpp): used by
// the CPU cache (cache.cpp) and the CUDA cache (src/cuda_dsv4/cache.cpp), so both fail the same way.
#include "cache_bookkeeping.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <unordered_set>

#include <fmt/format.h>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/dsv4/anchor_image.hpp"
#include "kvcompact/dsv4/snapshot.hpp"

namespace kvcompact::dsv4 {

std::uint64_t CacheBookkeeping::next_id() {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

std::uint64_t CacheBookkeeping::window_valid() const { return std::min(position, plan.window_capacity); }

std::uint64_t CacheBookkeeping::compressed_valid(std::uint32_t layer) const {
  KVC_ASSERT(layer < plan.layers.size(), "layer index out of range");
  const std::uint32_t m = plan.layers[layer].ratio;
  return m == 0 ? 0 : position / m;
}

std::uint64_t CacheBookkeeping::indexer_valid(std::uint32_t layer) const {
  KVC_ASSERT(layer < plan.layers.size(), "layer index out of range");
  return plan.layers[layer].ratio == 4 ? position / 4 : 0;
}

Error CacheBookkeeping::poisoned_error() const {
  return make_error(ErrorCode::Poisoned, "cache is poisoned ({}); reset or restore it first", poison_reason);
}

Status CacheBookkeeping::check_commit(std::uint64_t step_position) const {
  if (poisoned) return poisoned_error();
  if (step_position != position) {
    Error e = make_error(ErrorCode::StepOutOfOrder, "commit of position {} but the cache expects position {}",
                         step_position, position);
    e.expected = static_cast<std::int64_t>(position);
    e.actual = static_cast<std::int64_t>(std::min<std::uint64_t>(step_position, INT64_MAX));
    return e;
  }
  if (position >= plan.context) {
    Error e = make_error(ErrorCode::ContextExhausted, "position {} is at the context length {}", position,
                         plan.context);
    e.expected = static_cast<std::int64_t>(plan.context);
    e.actual = static_cast<std::int64_t>(position);
    return e;
  }
  return ok_status();
}

Result<StepPlan> CacheBookkeeping::plan_next_step() const {
  if (poisoned) return poisoned_error();
  return plan_step_at(plan, position);
}

Status CacheBookkeeping::commit_step(std::uint64_t step_position) {
  Status status = check_commit(step_position);
  if (!status.ok()) {
    if (!poisoned) poison("failed commit_step: " + status.error().to_string());
    return status;
  }
  ++position;
  return ok_status();
}

Result<PrefillPlan> CacheBookkeeping::plan_prefill(std::uint64_t start, std::uint64_t count) const {
  if (poisoned) return poisoned_error();
  return plan_prefill_at(plan, start, count);
}

Status CacheBookkeeping::commit_prefill(std::uint64_t start, std::uint64_t count) {
  auto fail = [&](Error e) -> Status {
    if (!poisoned) poison("failed commit_prefill: " + e.to_string());
    return e;
  };
  if (poisoned) return poisoned_error();
  if (count == 0) return fail(make_error(ErrorCode::EmptyPrefill, "commit of a 0-token prefill at {}", start));
  if (start != position) {
    Error e = make_error(ErrorCode::StepOutOfOrder, "prefill commit at position {} but the cache expects {}", start,
                         position);
    e.expected = static_cast<std::int64_t>(position);
    e.actual = static_cast<std::int64_t>(std::min<std::uint64_t>(start, INT64_MAX));
    return fail(std::move(e));
  }
  auto planned = plan_prefill_at(plan, start, count);
  if (!planned.ok()) return fail(std::move(planned).error());
  position = planned->end;
  return ok_status();
}

void CacheBookkeeping::poison(std::string reason) {
  poisoned = true;
  poison_reason = std::move(reason);
}

void CacheBookkeeping::poison_rows_rewritten(std::string reason) {
  rewind_floors.push_back(0);
  poison(std::move(reason));
}

void CacheBookkeeping::rewind(std::uint64_t to, std::uint64_t floor) {
  position = to;
  poisoned = false;
  poison_reason.clear();
  rewind_floors.push_back(floor);
}

Status CacheBookkeeping::check_snapshot_restore(const Snapshot& snapshot) const {
  if (!plan.same_as(snapshot.plan)) {
    return make_error(ErrorCode::Mismatch,
                      "snapshot of plan (model {:016x}, context {}) does not match the cache's (model {:016x}, "
                      "context {})",
                      snapshot.plan.model_fingerprint, snapshot.plan.context, plan.model_fingerprint, plan.context);
  }
  if (snapshot.cache_id != id) {
    return make_error(ErrorCode::Mismatch,
                      "snapshot was taken from cache {} and cannot restore cache {}: it does not carry the compressed "
                      "rows (use an anchor image to move a cache)",
                      snapshot.cache_id, id);
  }
  // (A snapshot's fields are public: one edited past the context would make restore set a position whose
  // compressed rows lie beyond the buffers.)
  if (snapshot.position > plan.context) {
    Error e = make_error(ErrorCode::ContextBound, "snapshot at position {} does not fit a cache of context {}",
                         snapshot.position, plan.context);
    e.expected = static_cast<std::int64_t>(plan.context);
    e.actual = static_cast<std::int64_t>(std::min<std::uint64_t>(snapshot.position, INT64_MAX));
    return e;
  }
  if (snapshot.rewinds_seen > rewind_floors.size() || snapshot.layers.size() != plan.layers.size()) {
    return make_error(ErrorCode::Mismatch, "snapshot bookkeeping does not match this cache");
  }
  for (std::size_t k = snapshot.rewinds_seen; k < rewind_floors.size(); ++k) {
    if (rewind_floors[k] < snapshot.position) {
      return make_error(ErrorCode::Mismatch,
                        "the cache rewound to position {} after this snapshot (position {}) was taken; its "
                        "compressed rows may have been rewritten",
                        rewind_floors[k], snapshot.position);
    }
  }
  for (std::size_t i = 0; i < plan.layers.size(); ++i) {
    const LayerSnapshot& ls = snapshot.layers[i];
    const LayerPlan& lp = plan.layers[i];
    const std::uint64_t state_floats = lp.state_bytes / sizeof(float);
    const std::uint64_t indexer_state_floats = lp.indexer_state_bytes / sizeof(float);
    if (ls.kv_state.size() != state_floats || ls.score_state.size() != state_floats ||
        ls.indexer_kv_state.size() != indexer_state_floats || ls.indexer_score_state.size() != indexer_state_floats ||
        ls.window.size() != std::min(snapshot.position, plan.window_capacity) * lp.attention_row_bytes) {
      return make_error(ErrorCode::Mismatch, "snapshot layer {} buffers do not match the cache's", i);
    }
  }
  return ok_status();
}

Status CacheBookkeeping::check_image_target(const AnchorImageView& view) const {
  const AnchorImageHeader& h = view.header;
  if (h.model_fingerprint != plan.model_fingerprint) {
    return make_error(ErrorCode::Mismatch, "anchor image of model {:016x} cannot hydrate a cache of model {:016x}",
                      h.model_fingerprint, plan.model_fingerprint);
  }
  if (!(h.storage == plan.storage)) {
    return make_error(ErrorCode::Mismatch, "anchor image storage {}/{} differs from the cache's {}/{}",
                      row_storage_name(h.storage.attention), indexer_storage_name(h.storage.indexer),
                      row_storage_name(plan.storage.attention), indexer_storage_name(plan.storage.indexer));
  }
  if (view.layers.size() != plan.layers.size()) {
    return make_error(ErrorCode::Mismatch, "anchor image of {} layers for a cache of {} layers", view.layers.size(),
                      plan.layers.size());
  }
  for (std::size_t i = 0; i < view.layers.size(); ++i) {
    if (view.layers[i].ratio != plan.layers[i].ratio) {
      return make_error(ErrorCode::Mismatch, "anchor image layer {} has ratio {}, the cache's has {}", i,
                        view.layers[i].ratio, plan.layers[i].ratio);
    }
  }
  if (h.position > plan.context) {
    Error e = make_error(ErrorCode::ContextBound, "anchor image at position {} does not fit a cache of context {}",
                         h.position, plan.context);
    e.expected = static_cast<std::int64_t>(plan.context);
    e.actual = static_cast<std::int64_t>(h.position);
    return e;
  }
  return ok_status();
}

Status commit_cohort_bookkeeping(std::span<CacheBookkeeping* const> members, std::uint64_t position) {
  std::unordered_set<const CacheBookkeeping*> seen;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i] == nullptr) return make_error(ErrorCode::InvalidArgument, "cohort member {} is null", i);
    if (!seen.insert(members[i]).second) {
      return make_error(ErrorCode::InvalidArgument, "cohort member {} repeats an earlier cache", i);
    }
  }
  for (std::size_t i = 0; i < members.size(); ++i) {
    Status status = members[i]->check_commit(position);
    if (!status.ok()) {
      Error e = std::move(status).error();
      e.message = fmt::format("cohort member {} of {}: {}", i, members.size(), e.message);
      for (CacheBookkeeping* c : members) {
        if (!c->poisoned) c->poison("failed cohort commit: " + e.to_string());
      }
      return e;
    }
  }
  for (CacheBookkeeping* c : members) ++c->position;
  return ok_status();
}

}  // namespace kvcompact::dsv4
