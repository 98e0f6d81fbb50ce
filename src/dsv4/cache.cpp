// Deepseek4Cache on the CPU backend: per-layer host buffers allocated exactly as planned (then counted
// a second time against the plan), and the step / prefill / cohort commit protocol with poisoning.
#include "kvcompact/dsv4/cache.hpp"

#include <algorithm>
#include <limits>
#include <new>

#include "cache_access.hpp"
#include "kvcompact/core/checked.hpp"

namespace kvcompact::dsv4 {

namespace {

template <typename T>
std::uint64_t vector_bytes(const std::vector<T>& v) {
  return static_cast<std::uint64_t>(v.size()) * sizeof(T);
}

std::uint64_t layer_allocated_bytes(const LayerBuffers& b) {
  return vector_bytes(b.attention) + vector_bytes(b.indexer) + vector_bytes(b.kv_state) +
         vector_bytes(b.score_state) + vector_bytes(b.indexer_kv_state) + vector_bytes(b.indexer_score_state);
}

}  // namespace

void Deepseek4Cache::Impl::fill_states() {
  for (LayerBuffers& b : layers) {
    std::fill(b.kv_state.begin(), b.kv_state.end(), 0.0f);
    std::fill(b.score_state.begin(), b.score_state.end(), -std::numeric_limits<float>::infinity());
    std::fill(b.indexer_kv_state.begin(), b.indexer_kv_state.end(), 0.0f);
    std::fill(b.indexer_score_state.begin(), b.indexer_score_state.end(), -std::numeric_limits<float>::infinity());
  }
}

Status check_accounting(const CachePlan& plan, std::span<const std::uint64_t> allocated_per_layer) {
  if (allocated_per_layer.size() != plan.layers.size()) {
    return make_error(ErrorCode::Accounting, "{} layers allocated for a plan of {} layers", allocated_per_layer.size(),
                      plan.layers.size());
  }
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < plan.layers.size(); ++i) {
    if (allocated_per_layer[i] != plan.layers[i].resident_bytes) {
      Error e = make_error(ErrorCode::Accounting, "layer {} allocated {} bytes but its plan says {}", i,
                           allocated_per_layer[i], plan.layers[i].resident_bytes);
      e.expected = static_cast<std::int64_t>(plan.layers[i].resident_bytes);
      e.actual = static_cast<std::int64_t>(allocated_per_layer[i]);
      return e;
    }
    KVC_ASSIGN_OR_RETURN(total, checked_add(total, allocated_per_layer[i]));
  }
  if (total != plan.total_bytes) {
    return make_error(ErrorCode::Accounting, "allocated {} bytes in total but the plan says {}", total,
                      plan.total_bytes);
  }
  return ok_status();
}

Result<Deepseek4Cache> Deepseek4Cache::create(const CachePlan& given) {
  // Buffers are sized from a plan re-derived from the given one's model, context and storage, so a
  // hand-edited plan can never make a view reach past its buffer; the accounting check below then
  // compares the real allocations with the plan the caller passed in.
  KVC_ASSIGN_OR_RETURN(CachePlan plan, plan_cache(given.model, given.context, given.storage));
  if (plan.total_bytes > std::numeric_limits<std::size_t>::max() / 2) {
    return make_error(ErrorCode::CapacityExceeded, "plan of {} bytes does not fit this host's address space",
                      plan.total_bytes);
  }
  auto impl = std::make_unique<Impl>();
  impl->id = CacheBookkeeping::next_id();
  try {
    impl->layers.resize(plan.layers.size());
    for (std::size_t i = 0; i < plan.layers.size(); ++i) {
      const LayerPlan& l = plan.layers[i];
      LayerBuffers& b = impl->layers[i];
      b.attention.assign(static_cast<std::size_t>(l.attention_bytes), 0);
      b.indexer.assign(static_cast<std::size_t>(l.indexer_bytes), 0);
      b.kv_state.resize(static_cast<std::size_t>(l.state_bytes / sizeof(float)));
      b.score_state.resize(static_cast<std::size_t>(l.state_bytes / sizeof(float)));
      b.indexer_kv_state.resize(static_cast<std::size_t>(l.indexer_state_bytes / sizeof(float)));
      b.indexer_score_state.resize(static_cast<std::size_t>(l.indexer_state_bytes / sizeof(float)));
    }
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::CapacityExceeded, "host allocation of {} bytes failed", plan.total_bytes);
  } catch (const std::length_error&) {
    return make_error(ErrorCode::CapacityExceeded, "host allocation of {} bytes failed", plan.total_bytes);
  }
  impl->fill_states();
  std::vector<std::uint64_t> counted;
  counted.reserve(impl->layers.size());
  for (const LayerBuffers& b : impl->layers) counted.push_back(layer_allocated_bytes(b));
  KVC_TRY(check_accounting(given, counted));
  impl->plan = std::move(plan);
  return Deepseek4Cache(std::move(impl));
}

Result<Deepseek4Cache> Deepseek4Cache::create(const ModelConfig& model, std::uint64_t context, StorageConfig storage) {
  KVC_ASSIGN_OR_RETURN(CachePlan plan, plan_cache(model, context, storage));
  return create(plan);
}

Deepseek4Cache::Deepseek4Cache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Deepseek4Cache::Deepseek4Cache(Deepseek4Cache&&) noexcept = default;
Deepseek4Cache& Deepseek4Cache::operator=(Deepseek4Cache&&) noexcept = default;
Deepseek4Cache::~Deepseek4Cache() = default;

const CachePlan& Deepseek4Cache::plan() const { return impl_->plan; }
std::uint64_t Deepseek4Cache::position() const { return impl_->position; }
std::uint32_t Deepseek4Cache::num_layers() const { return static_cast<std::uint32_t>(impl_->layers.size()); }
bool Deepseek4Cache::poisoned() const { return impl_->poisoned; }
const std::string& Deepseek4Cache::poison_reason() const { return impl_->poison_reason; }
std::uint64_t Deepseek4Cache::id() const { return impl_->id; }

std::uint64_t Deepseek4Cache::allocated_bytes() const {
  std::uint64_t total = 0;
  for (const LayerBuffers& b : impl_->layers) total += layer_allocated_bytes(b);
  return total;
}

std::uint64_t Deepseek4Cache::window_valid() const { return impl_->window_valid(); }
std::uint64_t Deepseek4Cache::window_start_position() const { return impl_->window_start_position(); }
std::uint64_t Deepseek4Cache::window_slot(std::uint64_t absolute_position) const {
  return impl_->window_slot(absolute_position);
}
std::uint64_t Deepseek4Cache::compressed_valid(std::uint32_t layer) const { return impl_->compressed_valid(layer); }
std::uint64_t Deepseek4Cache::indexer_valid(std::uint32_t layer) const { return impl_->indexer_valid(layer); }

// ---- Views ----

#define KVC_LAYER(layer)                                                          \
  KVC_ASSERT((layer) < impl_->layers.size(), "layer index out of range");         \
  const LayerPlan& lp = impl_->plan.layers[layer];                                \
  auto& buffers = impl_->layers[layer]

AttentionRows Deepseek4Cache::attention_rows(std::uint32_t layer) {
  KVC_LAYER(layer);
  return {std::span<std::uint8_t>(buffers.attention), lp.attention_rows, lp.attention_row_bytes,
          impl_->plan.storage.attention};
}
AttentionRows Deepseek4Cache::window_rows(std::uint32_t layer) {
  KVC_LAYER(layer);
  return {std::span<std::uint8_t>(buffers.attention).subspan(lp.window_offset, lp.window_bytes), lp.window_rows,
          lp.attention_row_bytes, impl_->plan.storage.attention};
}
AttentionRows Deepseek4Cache::compressed_rows(std::uint32_t layer) {
  KVC_LAYER(layer);
  return {std::span<std::uint8_t>(buffers.attention).subspan(lp.compressed_offset, lp.compressed_bytes),
          lp.compressed_rows, lp.attention_row_bytes, impl_->plan.storage.attention};
}
IndexerRows Deepseek4Cache::indexer_rows(std::uint32_t layer) {
  KVC_LAYER(layer);
  return {std::span<std::uint8_t>(buffers.indexer), lp.indexer_rows, lp.indexer_row_bytes,
          impl_->plan.storage.indexer};
}
StateBuffer Deepseek4Cache::kv_state(std::uint32_t layer) {
  KVC_LAYER(layer);
  return {std::span<float>(buffers.kv_state), lp.state_rows, lp.state_cols};
}
StateBuffer Deepseek4Cache::score_state(std::uint32_t layer) {
  KVC_LAYER(layer);
  return {std::span<float>(buffers.score_state), lp.state_rows, lp.state_cols};
}
StateBuffer Deepseek4Cache::indexer_kv_state(std::uint32_t layer) {
  KVC_LAYER(layer);
  return {std::span<float>(buffers.indexer_kv_state), lp.indexer_state_rows, lp.indexer_state_cols};
}
StateBuffer Deepseek4Cache::indexer_score_state(std::uint32_t layer) {
  KVC_LAYER(layer);
  return {std::span<float>(buffers.indexer_score_state), lp.indexer_state_rows, lp.indexer_state_cols};
}

#undef KVC_LAYER

namespace {
template <typename From, typename ToByte, typename S>
RowBlock<ToByte, S> as_const(const RowBlock<From, S>& v) {
  return {std::span<ToByte>(v.bytes.data(), v.bytes.size()), v.rows, v.row_stride, v.storage};
}
ConstStateBuffer as_const(const StateBuffer& v) {
  return {std::span<const float>(v.data.data(), v.data.size()), v.rows, v.cols};
}
}  // namespace

// The const views reuse the mutable ones: nothing is written through them.
ConstAttentionRows Deepseek4Cache::attention_rows(std::uint32_t layer) const {
  return as_const<std::uint8_t, const std::uint8_t>(const_cast<Deepseek4Cache*>(this)->attention_rows(layer));
}
ConstAttentionRows Deepseek4Cache::window_rows(std::uint32_t layer) const {
  return as_const<std::uint8_t, const std::uint8_t>(const_cast<Deepseek4Cache*>(this)->window_rows(layer));
}
ConstAttentionRows Deepseek4Cache::compressed_rows(std::uint32_t layer) const {
  return as_const<std::uint8_t, const std::uint8_t>(const_cast<Deepseek4Cache*>(this)->compressed_rows(layer));
}
ConstIndexerRows Deepseek4Cache::indexer_rows(std::uint32_t layer) const {
  return as_const<std::uint8_t, const std::uint8_t>(const_cast<Deepseek4Cache*>(this)->indexer_rows(layer));
}
ConstStateBuffer Deepseek4Cache::kv_state(std::uint32_t layer) const {
  return as_const(const_cast<Deepseek4Cache*>(this)->kv_state(layer));
}
ConstStateBuffer Deepseek4Cache::score_state(std::uint32_t layer) const {
  return as_const(const_cast<Deepseek4Cache*>(this)->score_state(layer));
}
ConstStateBuffer Deepseek4Cache::indexer_kv_state(std::uint32_t layer) const {
  return as_const(const_cast<Deepseek4Cache*>(this)->indexer_kv_state(layer));
}
ConstStateBuffer Deepseek4Cache::indexer_score_state(std::uint32_t layer) const {
  return as_const(const_cast<Deepseek4Cache*>(this)->indexer_score_state(layer));
}

// ---- Protocol (cache_bookkeeping.cpp, shared with the CUDA cache) ----

Result<StepPlan> Deepseek4Cache::plan_next_step() const { return impl_->plan_next_step(); }
Status Deepseek4Cache::commit_step(std::uint64_t position) { return impl_->commit_step(position); }
Result<PrefillPlan> Deepseek4Cache::plan_prefill(std::uint64_t start, std::uint64_t count) const {
  return impl_->plan_prefill(start, count);
}
Status Deepseek4Cache::commit_prefill(std::uint64_t start, std::uint64_t count) {
  return impl_->commit_prefill(start, count);
}
void Deepseek4Cache::poison(std::string reason) { impl_->poison(std::move(reason)); }

void Deepseek4Cache::reset() {
  impl_->fill_states();
  impl_->rewind(0, 0);
}

Status commit_cohort(std::span<Deepseek4Cache* const> caches, std::uint64_t position) {
  std::vector<CacheBookkeeping*> members(caches.size(), nullptr);
  for (std::size_t i = 0; i < caches.size(); ++i) {
    if (caches[i] != nullptr) members[i] = &detail::CacheAccess::impl(*caches[i]);
  }
  return commit_cohort_bookkeeping(members, position);
}

}  // namespace kvcompact::dsv4
