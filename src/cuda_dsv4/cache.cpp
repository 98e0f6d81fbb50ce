// DeviceDeepseek4Cache: the plan's buffers in device memory (allocated exactly as planned, then counted a
// second time against the plan with the CPU's check_accounting), the step protocol on the bookkeeping the
// CPU cache uses (src/dsv4/cache_bookkeeping.*), device views for the kernels and host copies for tests.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "cache_internal.hpp"
#include "cache_params.hpp"
#include "cuda/check.hpp"
#include "kvcompact/core/assert.hpp"
#include "kvcompact/dsv4/cache.hpp"

namespace kvcompact::cuda::dsv4 {

namespace {

Result<DeviceBuffer> allocate(std::uint64_t bytes, std::uint32_t layer, const char* what) {
  auto buffer = DeviceBuffer::allocate(bytes);
  if (!buffer.ok()) {
    return make_error(ErrorCode::CapacityExceeded, "device allocation of {} bytes for layer {}'s {} failed: {}", bytes,
                      layer, what, buffer.error().message);
  }
  return std::move(buffer).value();
}

Status fill_floats(DeviceBuffer& buffer, float value) {
  if (buffer.size() == 0) return ok_status();
  std::vector<float> host(buffer.size() / sizeof(float), value);
  return buffer.upload(host.data(), buffer.size());
}

}  // namespace

Status DeviceDeepseek4Cache::Impl::fill_states() {
  for (DeviceLayerBuffers& b : layers) {
    KVC_TRY(fill_floats(b.kv_state, 0.0f));
    KVC_TRY(fill_floats(b.score_state, -std::numeric_limits<float>::infinity()));
    KVC_TRY(fill_floats(b.indexer_kv_state, 0.0f));
    KVC_TRY(fill_floats(b.indexer_score_state, -std::numeric_limits<float>::infinity()));
  }
  return ok_status();
}

std::vector<RingRun> ring_runs(std::uint64_t position, std::uint64_t rows, std::uint64_t capacity) {
  std::vector<RingRun> runs;
  KVC_ASSERT(rows <= capacity && rows <= position, "ring rows do not fit the ring");
  std::uint64_t k = 0;
  while (k < rows) {
    const std::uint64_t slot = (position - rows + k) % capacity;
    const std::uint64_t n = std::min(rows - k, capacity - slot);
    runs.push_back(RingRun{slot, k, n});
    k += n;
  }
  return runs;
}

Result<DeviceDeepseek4Cache> DeviceDeepseek4Cache::create(const kd::CachePlan& given) {
  // As on the CPU: buffers sized from a plan re-derived from the given one's model, context and storage,
  // then the real allocations counted against the plan the caller passed in.
  KVC_ASSIGN_OR_RETURN(kd::CachePlan plan, kd::plan_cache(given.model, given.context, given.storage));
  if (device_count() == 0) return make_error(ErrorCode::Unsupported, "no CUDA device for a DeviceDeepseek4Cache");
  auto impl = std::make_unique<Impl>();
  impl->id = kd::CacheBookkeeping::next_id();
  impl->layers.resize(plan.layers.size());
  for (std::size_t i = 0; i < plan.layers.size(); ++i) {
    const kd::LayerPlan& l = plan.layers[i];
    DeviceLayerBuffers& b = impl->layers[i];
    const auto li = static_cast<std::uint32_t>(i);
    KVC_ASSIGN_OR_RETURN(b.attention, allocate(l.attention_bytes, li, "attention rows"));
    KVC_ASSIGN_OR_RETURN(b.indexer, allocate(l.indexer_bytes, li, "indexer rows"));
    KVC_ASSIGN_OR_RETURN(b.kv_state, allocate(l.state_bytes, li, "kv state"));
    KVC_ASSIGN_OR_RETURN(b.score_state, allocate(l.state_bytes, li, "score state"));
    KVC_ASSIGN_OR_RETURN(b.indexer_kv_state, allocate(l.indexer_state_bytes, li, "indexer kv state"));
    KVC_ASSIGN_OR_RETURN(b.indexer_score_state, allocate(l.indexer_state_bytes, li, "indexer score state"));
    KVC_TRY(b.attention.fill(0));
    KVC_TRY(b.indexer.fill(0));
  }
  KVC_TRY(impl->fill_states());
  auto status = DeviceBuffer::allocate(sizeof(std::uint32_t));
  if (!status.ok()) {
    return make_error(ErrorCode::CapacityExceeded, "device allocation of the 4-byte status word failed: {}",
                      status.error().message);
  }
  impl->status = std::move(status).value();
  KVC_TRY(impl->status.fill(0));
  std::vector<std::uint64_t> counted;
  counted.reserve(impl->layers.size());
  for (const DeviceLayerBuffers& b : impl->layers) counted.push_back(b.allocated());
  KVC_TRY(kd::check_accounting(given, counted));
  impl->plan = std::move(plan);
  return DeviceDeepseek4Cache(std::move(impl));
}

Result<DeviceDeepseek4Cache> DeviceDeepseek4Cache::create(const kd::ModelConfig& model, std::uint64_t context,
                                                          kd::StorageConfig storage) {
  KVC_ASSIGN_OR_RETURN(kd::CachePlan plan, kd::plan_cache(model, context, storage));
  return create(plan);
}

DeviceDeepseek4Cache::DeviceDeepseek4Cache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceDeepseek4Cache::DeviceDeepseek4Cache(DeviceDeepseek4Cache&&) noexcept = default;
DeviceDeepseek4Cache& DeviceDeepseek4Cache::operator=(DeviceDeepseek4Cache&&) noexcept = default;
DeviceDeepseek4Cache::~DeviceDeepseek4Cache() = default;

const kd::CachePlan& DeviceDeepseek4Cache::plan() const { return impl_->plan; }
std::uint64_t DeviceDeepseek4Cache::position() const { return impl_->position; }
std::uint32_t DeviceDeepseek4Cache::num_layers() const { return impl_->num_layers(); }
bool DeviceDeepseek4Cache::poisoned() const { return impl_->poisoned; }
const std::string& DeviceDeepseek4Cache::poison_reason() const { return impl_->poison_reason; }
std::uint64_t DeviceDeepseek4Cache::id() const { return impl_->id; }
std::uint64_t DeviceDeepseek4Cache::allocated_bytes() const {
  std::uint64_t total = 0;
  for (const DeviceLayerBuffers& b : impl_->layers) total += b.allocated();
  return total;
}
std::uint64_t DeviceDeepseek4Cache::window_valid() const { return impl_->window_valid(); }
std::uint64_t DeviceDeepseek4Cache::window_start_position() const { return impl_->window_start_position(); }
std::uint64_t DeviceDeepseek4Cache::window_slot(std::uint64_t absolute_position) const {
  return impl_->window_slot(absolute_position);
}
std::uint64_t DeviceDeepseek4Cache::compressed_valid(std::uint32_t layer) const {
  return impl_->compressed_valid(layer);
}
std::uint64_t DeviceDeepseek4Cache::indexer_valid(std::uint32_t layer) const { return impl_->indexer_valid(layer); }

DeviceLayerView DeviceDeepseek4Cache::layer_view(std::uint32_t layer) const {
  KVC_ASSERT(layer < impl_->layers.size(), "layer index out of range");
  const kd::LayerPlan& lp = impl_->plan.layers[layer];
  DeviceLayerBuffers& b = impl_->layers[layer];
  DeviceLayerView v;
  v.layer = layer;
  v.ratio = lp.ratio;
  v.coff = lp.coff;
  v.attention_storage = impl_->plan.storage.attention;
  v.indexer_storage = impl_->plan.storage.indexer;
  v.attention = static_cast<std::uint8_t*>(b.attention.data());
  v.attention_rows = lp.attention_rows;
  v.attention_row_bytes = lp.attention_row_bytes;
  v.window = v.attention == nullptr ? nullptr : v.attention + lp.window_offset;
  v.window_rows = lp.window_rows;
  v.compressed = lp.compressed_rows == 0 ? nullptr : v.attention + lp.compressed_offset;
  v.compressed_rows = lp.compressed_rows;
  v.indexer = static_cast<std::uint8_t*>(b.indexer.data());
  v.indexer_rows = lp.indexer_rows;
  v.indexer_row_bytes = lp.indexer_row_bytes;
  v.kv_state = static_cast<float*>(b.kv_state.data());
  v.score_state = static_cast<float*>(b.score_state.data());
  v.state_rows = lp.state_rows;
  v.state_cols = lp.state_cols;
  v.indexer_kv_state = static_cast<float*>(b.indexer_kv_state.data());
  v.indexer_score_state = static_cast<float*>(b.indexer_score_state.data());
  v.indexer_state_rows = lp.indexer_state_rows;
  v.indexer_state_cols = lp.indexer_state_cols;
  return v;
}

std::uint32_t* DeviceDeepseek4Cache::status_word() const { return static_cast<std::uint32_t*>(impl_->status.data()); }

// ---- Protocol: the shared bookkeeping ----

Result<kd::StepPlan> DeviceDeepseek4Cache::plan_next_step() const { return impl_->plan_next_step(); }
Status DeviceDeepseek4Cache::commit_step(std::uint64_t position) { return impl_->commit_step(position); }
Result<kd::PrefillPlan> DeviceDeepseek4Cache::plan_prefill(std::uint64_t start, std::uint64_t count) const {
  return impl_->plan_prefill(start, count);
}
Status DeviceDeepseek4Cache::commit_prefill(std::uint64_t start, std::uint64_t count) {
  return impl_->commit_prefill(start, count);
}
void DeviceDeepseek4Cache::poison(std::string reason) { impl_->poison(std::move(reason)); }

Status DeviceDeepseek4Cache::reset() {
  Status filled = impl_->fill_states();
  if (!filled.ok()) {
    impl_->poison("reset failed to refill the device states: " + filled.error().to_string());
    return filled;
  }
  impl_->rewind(0, 0);
  return ok_status();
}

Status commit_cohort(std::span<DeviceDeepseek4Cache* const> caches, std::uint64_t position) {
  std::vector<kd::CacheBookkeeping*> members(caches.size(), nullptr);
  for (std::size_t i = 0; i < caches.size(); ++i) {
    if (caches[i] != nullptr) members[i] = &CacheAccessDevice::impl(*caches[i]);
  }
  return kd::commit_cohort_bookkeeping(members, position);
}

// ---- Host copies ----

namespace {
Status check_download_layer(std::uint32_t layer, std::size_t layers) {
  if (layer >= layers) {
    return make_error(ErrorCode::InvalidArgument, "layer {} is out of range: the cache has {} layers", layer, layers);
  }
  return ok_status();
}
}  // namespace

Result<std::vector<std::uint8_t>> DeviceDeepseek4Cache::download_attention(std::uint32_t layer) const {
  KVC_TRY(check_download_layer(layer, impl_->layers.size()));
  const DeviceBuffer& b = impl_->layers[layer].attention;
  std::vector<std::uint8_t> out(b.size());
  KVC_TRY(b.download(out.data(), out.size()));
  return out;
}

Result<std::vector<std::uint8_t>> DeviceDeepseek4Cache::download_indexer(std::uint32_t layer) const {
  KVC_TRY(check_download_layer(layer, impl_->layers.size()));
  const DeviceBuffer& b = impl_->layers[layer].indexer;
  std::vector<std::uint8_t> out(b.size());
  KVC_TRY(b.download(out.data(), out.size()));
  return out;
}

Result<std::vector<float>> DeviceDeepseek4Cache::download_state(std::uint32_t layer, int which) const {
  KVC_TRY(check_download_layer(layer, impl_->layers.size()));
  if (which < 0 || which > 3) return make_error(ErrorCode::InvalidArgument, "state index {} outside [0, 3]", which);
  const DeviceLayerBuffers& l = impl_->layers[layer];
  const DeviceBuffer* b = which == 0 ? &l.kv_state
                          : which == 1 ? &l.score_state
                          : which == 2 ? &l.indexer_kv_state
                                       : &l.indexer_score_state;
  std::vector<float> out(b->size() / sizeof(float));
  KVC_TRY(b->download(out.data(), b->size()));
  return out;
}

// ---- Launcher checks ----

Status validate_spans(std::span<const LayerSpan> spans, std::uint32_t layer) {
  if (spans.empty()) return make_error(ErrorCode::InvalidArgument, "no spans to work on");
  std::unordered_set<const DeviceDeepseek4Cache*> seen;
  const DeviceDeepseek4Cache* first = spans[0].cache;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const LayerSpan& s = spans[i];
    if (s.cache == nullptr) return make_error(ErrorCode::InvalidArgument, "span {} has no cache", i);
    if (!seen.insert(s.cache).second) {
      return make_error(ErrorCode::InvalidArgument, "span {} repeats an earlier span's cache", i);
    }
    const auto& c = CacheAccessDevice::impl(*s.cache);
    if (layer >= c.plan.layers.size()) {
      return make_error(ErrorCode::InvalidArgument, "layer {} is out of range: the cache has {} layers", layer,
                        c.plan.layers.size());
    }
    if (c.plan.model_fingerprint != first->plan().model_fingerprint || !(c.plan.storage == first->plan().storage) ||
        c.plan.window_capacity != first->plan().window_capacity) {
      return make_error(ErrorCode::Mismatch,
                        "span {}'s cache differs from span 0's in model, storage or window capacity; a batch shares "
                        "one layer's weights and layout",
                        i);
    }
    KVC_ASSIGN_OR_RETURN(const kd::PrefillPlan planned, c.plan_prefill(c.position, s.count));
    (void)planned;
    if (s.kv == nullptr) return make_error(ErrorCode::InvalidArgument, "span {} has no kv rows", i);
    if (reinterpret_cast<std::uintptr_t>(s.chunk_rows) % 2 != 0) {
      return make_error(ErrorCode::InvalidArgument, "span {}: chunk_rows must be 2-byte aligned", i);
    }
    const std::uint32_t m = c.plan.layers[layer].ratio;
    if (m != 0 && (s.compressor_kv == nullptr || s.compressor_score == nullptr)) {
      return make_error(ErrorCode::InvalidArgument, "span {}: layer {} (ratio {}) needs compressor_kv and "
                        "compressor_score", i, layer, m);
    }
    if (m == 4 && (s.indexer_kv == nullptr || s.indexer_score == nullptr)) {
      return make_error(ErrorCode::InvalidArgument, "span {}: layer {} (ratio 4) needs indexer_kv and indexer_score",
                        i, layer);
    }
  }
  return ok_status();
}

Status finish_launches(std::span<const LayerSpan> spans, std::uint32_t layer, const char* what,
                       const KernelOptions& options, void* stream) {
  if (!options.check_finite) return ok_status();
  auto poison_all = [&](const std::string& why) {
    for (const LayerSpan& s : spans) {
      if (!s.cache->poisoned()) s.cache->poison(why);
    }
  };
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  std::vector<std::uint32_t> flags(spans.size(), 0);
  Status copied = [&]() -> Status {
    for (std::size_t i = 0; i < spans.size(); ++i) {
      KVC_CUDA_TRY(cudaMemcpyAsync(&flags[i], spans[i].cache->status_word(), sizeof(std::uint32_t),
                                   cudaMemcpyDeviceToHost, st));
      KVC_CUDA_TRY(cudaMemsetAsync(spans[i].cache->status_word(), 0, sizeof(std::uint32_t), st));
    }
    KVC_CUDA_TRY(cudaStreamSynchronize(st));
    return ok_status();
  }();
  if (!copied.ok()) {
    poison_all(fmt::format("layer {} {} failed on the device: {}", layer, what, copied.error().to_string()));
    return copied;
  }
  for (std::size_t i = 0; i < spans.size(); ++i) {
    if ((flags[i] & detail::kFlagNonFinite) != 0) {
      Error e = make_error(ErrorCode::NonFinite, "layer {} {}: span {} (at position {}) holds a NaN or inf input", layer,
                           what, i, spans[i].cache->position());
      poison_all(fmt::format("layer {} {} wrote non-finite inputs: {}", layer, what, e.to_string()));
      return e;
    }
  }
  return ok_status();
}

}  // namespace kvcompact::cuda::dsv4
