// DeviceCache: host bookkeeping (lengths, window starts) of a GPU-resident TurboQuant cache whose layer buffers
// live on the device; appends run the encode kernel and commit only after it completed without bad input,
// snapshots and restores copy the same bytes as the CPU cache (docs/cuda.md, "DeviceCache"); decode and
// chunked-prefill attention run the kernels of tq.hpp / tq_prefill.hpp over the layer buffers.
#include "kvcompact/cuda/tq_cache.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "append_commit.hpp"
#include "check.hpp"
#include "device_cache_layer.hpp"
#include "encode_records.hpp"
#include "kvcompact/tq/append_check.hpp"
#include "kvcompact/tq/attention.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/snapshot_check.hpp"

namespace kvcompact::cuda::tq {

namespace ktq = kvcompact::tq;

DeviceCache::DeviceCache(DeviceCache&&) noexcept = default;
DeviceCache& DeviceCache::operator=(DeviceCache&&) noexcept = default;
DeviceCache::~DeviceCache() = default;

Result<DeviceCache> DeviceCache::create(const ktq::CacheShape& shape, const ktq::QuantConfig& config) {
  KVC_TRY(ktq::validate_cache_shape(shape, config));
  DeviceCache cache;
  cache.config_ = config;
  cache.head_dim_ = shape.head_dim;
  cache.sequences_ = shape.sequences;
  cache.capacity_ = shape.capacity;
  KVC_ASSIGN_OR_RETURN(DeviceProperties props, device_properties(0));
  cache.multiprocessors_ = props.multiprocessors;
  KVC_ASSIGN_OR_RETURN(cache.status_, DeviceBuffer::allocate(4));
  const std::uint64_t position_bytes = 8ull * shape.kv_heads.size() * shape.sequences;
  KVC_ASSIGN_OR_RETURN(cache.positions_, DeviceBuffer::allocate(std::max<std::uint64_t>(position_bytes, 4)));
  KVC_TRY(cache.positions_.fill(0));
  for (std::uint32_t l = 0; l < shape.kv_heads.size(); ++l) {
    auto layer = std::make_unique<Layer>();
    layer->kv_heads = shape.kv_heads[l];
    if (layer->kv_heads > 0) {
      KVC_ASSIGN_OR_RETURN(layer->layout, ktq::plan_layer_layout(shape.head_dim, layer->kv_heads, shape.sequences,
                                                                 shape.capacity, config));
      KVC_ASSIGN_OR_RETURN(ktq::LayerCodec codec, ktq::LayerCodec::create(shape.head_dim, config, l));
      KVC_ASSIGN_OR_RETURN(DeviceCodec dcodec, DeviceCodec::create(codec));
      layer->codec = std::make_unique<DeviceCodec>(std::move(dcodec));
      KVC_ASSIGN_OR_RETURN(layer->data, DeviceBuffer::allocate(layer_buffer_bytes(layer->layout)));
      KVC_TRY(layer->data.fill(0));
      layer->lengths.assign(shape.sequences, 0);
      layer->window_begins.assign(shape.sequences, 0);
      layer->device_positions = static_cast<std::uint32_t*>(cache.positions_.data()) + 2ull * l * shape.sequences;
    }
    cache.layers_.push_back(std::move(layer));
    KVC_TRY(cache.sync_positions(l));
  }
  const std::size_t slots = cache.layers_.size() * std::size_t{shape.sequences};
  KVC_ASSIGN_OR_RETURN(cache.step_status_, DeviceBuffer::allocate(16 * slots + 4));  // + the commit counter
  KVC_TRY(cache.step_status_.fill(0));
  cache.pending_slots_.assign(slots, false);
  KVC_ASSIGN_OR_RETURN(cache.sync_staging_, PinnedBuffer::allocate(16 * slots + 4));
  cache.length_limits_.assign(cache.layers_.size(), 0u);
  return Result<DeviceCache>(std::move(cache));
}

std::uint32_t DeviceCache::kv_heads(std::uint32_t layer) const {
  return layer < layers_.size() ? layers_[layer]->kv_heads : 0u;
}

std::uint32_t DeviceCache::length(std::uint32_t layer, std::uint32_t seq) const {
  if (layer >= layers_.size() || seq >= sequences_ || layers_[layer]->kv_heads == 0) return 0;
  return layers_[layer]->lengths[seq];
}

const LayerLayout* DeviceCache::layout(std::uint32_t layer) const {
  if (layer >= layers_.size() || layers_[layer]->kv_heads == 0) return nullptr;
  return &layers_[layer]->layout;
}

std::uint64_t DeviceCache::device_bytes() const {
  std::uint64_t total = 0;
  for (const auto& l : layers_) total += l->data.size();
  return total;
}

Status DeviceCache::check_layer_seq(std::uint32_t layer, std::uint32_t seq, bool need_attention) const {
  if (layer >= layers_.size()) {
    return make_error(ErrorCode::OutOfRange, "layer {} is outside the cache's {} layers", layer, layers_.size());
  }
  if (seq >= sequences_) {
    return make_error(ErrorCode::OutOfRange, "sequence {} is outside the cache's {} sequences", seq, sequences_);
  }
  if (need_attention && layers_[layer]->kv_heads == 0) {
    return make_error(ErrorCode::InvalidArgument, "layer {} has no attention (0 KV heads)", layer);
  }
  return ok_status();
}

Status DeviceCache::sync_positions(std::uint32_t layer) {
  Layer& l = *layers_[layer];
  if (l.kv_heads == 0) return ok_status();
  std::vector<std::uint32_t> both(l.lengths);
  both.insert(both.end(), l.window_begins.begin(), l.window_begins.end());
  KVC_TRY(positions_.upload_async(both.data(), 4ull * both.size(), 8ull * layer * sequences_, nullptr));
  // Done on return (and any copies restore queued before it): a later call's kernels or copies on any stream
  // see these positions, and no copy of them is left in flight to land after a later one.
  KVC_CUDA_TRY(cudaStreamSynchronize(nullptr));
  return ok_status();
}

void DeviceCache::adopt_device_lengths(std::uint32_t layer, std::span<const std::uint32_t> launched, void* stream) {
  Layer& l = *layers_[layer];
  const auto s = static_cast<cudaStream_t>(stream);
  std::vector<std::uint32_t> device(l.lengths.size());
  cudaError_t err = cudaStreamSynchronize(s);  // the launches that ran, and their commits
  if (err == cudaSuccess) {
    err = cudaMemcpy(device.data(), l.device_lengths(), 4 * device.size(), cudaMemcpyDeviceToHost);
  }
  if (err == cudaSuccess) {
    l.lengths = device;
  } else if (l.layout.exact_window > 0) {
    for (std::uint32_t seq : launched) l.window_begins[seq] = l.lengths[seq];
  }
  (void)sync_positions(layer);  // best effort: the launch error is what the caller needs to see
}

Status DeviceCache::append(std::uint32_t layer, std::uint32_t seq, std::uint32_t position, std::uint32_t rows,
                           DType dtype, const void* keys, const void* values, void* stream) {
  const AppendRequest request{seq, position, rows, dtype, keys, values};
  return append_batch(layer, std::span<const AppendRequest>(&request, 1), stream);
}

Status DeviceCache::check_append_requests(std::uint32_t layer, std::span<const AppendRequest> requests,
                                          const char* caller) const {
  // The CPU cache's messages and order: the layer (TurboQuantCache::check_layer_seq), then per request in order
  // its sequence and tq/append_check.hpp; then each sequence at most once.
  if (layer >= layers_.size()) {
    return make_error(ErrorCode::OutOfRange, "layer {} is outside the cache's {} layers", layer, layers_.size());
  }
  if (layers_[layer]->kv_heads == 0) {
    return make_error(ErrorCode::InvalidArgument, "layer {} has no attention (0 KV heads) and stores nothing", layer);
  }
  std::vector<bool> seen(sequences_, false);
  for (const AppendRequest& r : requests) {
    KVC_TRY(check_layer_seq(layer, r.seq, true));
    KVC_TRY(ktq::validate_append(layer, r.seq, layers_[layer]->lengths[r.seq], capacity_, r.position, r.rows, r.dtype,
                                 r.keys, r.values));
    if (seen[r.seq]) {
      return make_error(ErrorCode::InvalidArgument, "{}: sequence {} appears more than once", caller, r.seq);
    }
    seen[r.seq] = true;
  }
  return ok_status();
}

Error DeviceCache::rejected_append(std::uint32_t layer, std::uint32_t seq, std::uint32_t position,
                                   std::uint32_t flags) {
  if (flags & kEncodeStalePosition) {
    return make_error(ErrorCode::InvalidArgument,
                      "append_deferred to layer {} sequence {} at position {}: the device's length differs from the "
                      "host's (replays of a captured append_at_length since the last sync_lengths); nothing stored: "
                      "call sync_lengths",
                      layer, seq, position);
  }
  return (flags & kEncodeNonFinite)
             ? make_error(ErrorCode::NonFinite,
                          "append to layer {} sequence {} at position {}: a key or value coordinate is NaN or inf",
                          layer, seq, position)
             : make_error(ErrorCode::OutOfRange,
                          "append to layer {} sequence {} at position {}: a norm (or, with norm correction, the "
                          "corrected norm) exceeds the float32 range", layer,
                          seq, position);
}

Status DeviceCache::append_batch(std::uint32_t layer, std::span<const AppendRequest> requests, void* stream) {
  KVC_TRY(check_host_lengths("append", stream));
  KVC_TRY(check_append_requests(layer, requests, "append_batch"));
  if (std::none_of(requests.begin(), requests.end(), [](const AppendRequest& r) { return r.rows > 0; })) {
    return ok_status();  // appends of 0 rows store nothing
  }
  Layer& l = *layers_[layer];
  const std::size_t n = requests.size();
  const auto s = static_cast<cudaStream_t>(stream);
  // [2][n]: each request's encode status word, then the verdict the commit kernel moves out of it.
  if (status_.size() < 8ull * n) {
    KVC_ASSIGN_OR_RETURN(status_, DeviceBuffer::allocate(8ull * n));
  }
  auto* status = static_cast<std::uint32_t*>(status_.data());
  KVC_CUDA_TRY(cudaMemsetAsync(status, 0, 4ull * n, s));
  // One encode_append_batch: the fast kernel's requests share launches (one per input dtype and 32 requests).
  std::vector<EncodeRequest> encodes(n);
  std::vector<detail::CommitRequest> commits(n);
  for (std::size_t i = 0; i < n; ++i) {
    const AppendRequest& r = requests[i];
    encodes[i] = EncodeRequest{r.seq, r.position, r.rows, r.dtype, r.keys, r.values, status + i};
    commits[i] = detail::commit_request(encodes[i]);
  }
  // The records go past the visible lengths; the ring rows wait for the commit kernel's verdicts.
  Status launched = detail::encode_records_batch(l.layout, *l.codec, l.data.data(), encodes, nullptr, nullptr, stream);
  std::uint32_t commits_launched = 0;  // leading requests whose commit launch succeeded
  if (launched.ok()) {
    // The device commits each request after its encode, in stream order, as append_deferred's do: the ring rows,
    // device lengths and window starts are final once the wait below returns, with no upload of them left in
    // flight (a copy queued here could land after a later call's on another stream).
    detail::CommitTargets targets = l.commit_targets();
    targets.verdict_offset = static_cast<std::uint32_t>(n);
    targets.slots = static_cast<std::uint32_t>(n);
    const cudaError_t err =
        detail::launch_commit_appends(commits.data(), static_cast<std::uint32_t>(n), targets, s, &commits_launched);
    if (err != cudaSuccess) {
      launched = make_error(ErrorCode::Internal, "commit_appends launch: {}", cudaGetErrorString(err));
    }
  }
  if (!launched.ok()) {
    // A launch failed (the checks above passed, so this is a CUDA error). After a failed encode launch nothing
    // of the batch is committed; after a failed commit launch, those before it (one per 32 requests) committed
    // their requests on the device, which the host takes over (adopt_device_lengths).
    std::vector<std::uint32_t> launched_seqs;
    for (std::size_t i = 0; i < commits_launched; ++i) {
      if (requests[i].rows > 0) launched_seqs.push_back(requests[i].seq);
    }
    adopt_device_lengths(layer, launched_seqs, stream);
    if (commits_launched == 0) return launched;
    return make_error(ErrorCode::Internal,
                      "{} (the first {} of the batch's {} requests, in launches before the failed one, were "
                      "committed as append would; the others were not)",
                      launched.error().message, commits_launched, n);
  }
  // One wait for all of them: the kernels' verdicts on the input, which the commit kernel has applied.
  std::vector<std::uint32_t> flags(n, 0);
  KVC_CUDA_TRY(cudaMemcpyAsync(flags.data(), status + n, 4ull * n, cudaMemcpyDeviceToHost, s));
  KVC_CUDA_TRY(cudaStreamSynchronize(s));
  Status first_error = ok_status();
  for (std::size_t i = 0; i < n; ++i) {
    const AppendRequest& r = requests[i];
    if (r.rows == 0) continue;
    if (flags[i] == 0) {
      l.lengths[r.seq] = r.position + r.rows;
      continue;
    }
    // Nothing changes: the length stays, and the commit kernel wrote no ring row (as the CPU cache).
    if (first_error.ok()) first_error = rejected_append(layer, r.seq, r.position, flags[i]);
  }
  return first_error;
}

Status DeviceCache::truncate_layer(std::uint32_t layer, std::uint32_t seq, std::uint32_t position) {
  KVC_TRY(check_host_lengths("truncate"));
  return truncate_checked(layer, seq, position);
}

Status DeviceCache::truncate_checked(std::uint32_t layer, std::uint32_t seq, std::uint32_t position) {
  KVC_TRY(check_layer_seq(layer, seq, false));
  Layer& l = *layers_[layer];
  if (l.kv_heads == 0) return ok_status();
  const std::uint32_t length = l.lengths[seq];
  if (position >= length) return ok_status();
  const std::uint32_t w = l.layout.exact_window;
  if (w > 0) l.window_begins[seq] = ktq::window_begin_after_truncate(length, l.window_begins[seq], w, position);
  l.lengths[seq] = position;
  return sync_positions(layer);
}

Status DeviceCache::truncate(std::uint32_t seq, std::uint32_t position) {
  if (seq >= sequences_) {
    return make_error(ErrorCode::OutOfRange, "sequence {} is outside the cache's {} sequences", seq, sequences_);
  }
  KVC_TRY(check_host_lengths("truncate"));  // once for all layers (it may read the device's commit counter)
  for (std::uint32_t l = 0; l < layers_.size(); ++l) KVC_TRY(truncate_checked(l, seq, position));
  return ok_status();
}

Status DeviceCache::reset(std::uint32_t seq) {
  KVC_TRY(check_host_lengths("reset"));
  return reset_checked(seq);
}

Status DeviceCache::reset_checked(std::uint32_t seq) {
  if (seq >= sequences_) {
    return make_error(ErrorCode::OutOfRange, "sequence {} is outside the cache's {} sequences", seq, sequences_);
  }
  for (std::uint32_t i = 0; i < layers_.size(); ++i) {
    Layer& l = *layers_[i];
    if (l.kv_heads == 0) continue;
    l.lengths[seq] = 0;
    l.window_begins[seq] = 0;
    KVC_TRY(sync_positions(i));
  }
  return ok_status();
}

void DeviceCache::reset_all() {
  // (It empties every sequence: the pending appends' verdicts and the device lengths' refusals no longer matter.)
  drop_pending_appends();
  drop_device_lengths();
  for (std::uint32_t s = 0; s < sequences_; ++s) (void)reset_checked(s);  // (nothing left to check)
}

Result<ktq::LayerSnapshot> DeviceCache::snapshot(std::uint32_t layer, std::uint32_t seq) const {
  KVC_TRY(check_host_lengths("snapshot"));
  KVC_TRY(check_layer_seq(layer, seq, false));
  const Layer& l = *layers_[layer];
  ktq::LayerSnapshot snap;
  snap.layer_index = layer;
  snap.head_dim = head_dim_;
  snap.kv_heads = l.kv_heads;
  snap.config = config_;
  snap.token = ktq::token_bytes(head_dim_, config_);
  if (l.kv_heads == 0) return snap;
  const LayerLayout& lay = l.layout;
  const std::uint32_t length = l.lengths[seq];
  snap.length = length;
  auto copy_region = [&](std::uint64_t offset, std::uint32_t per_token, std::vector<std::uint8_t>& out) -> Status {
    out.resize(static_cast<std::size_t>(l.kv_heads) * length * per_token);
    if (out.empty()) return ok_status();
    for (std::uint32_t h = 0; h < l.kv_heads; ++h) {
      KVC_TRY(l.data.download(out.data() + static_cast<std::size_t>(h) * length * per_token,
                              static_cast<std::uint64_t>(length) * per_token, offset + lay.slot(seq, h, 0) * per_token));
    }
    return ok_status();
  };
  KVC_TRY(copy_region(lay.key_codes_offset, lay.token.key_codes, snap.key_codes));
  KVC_TRY(copy_region(lay.key_signs_offset, lay.token.key_signs, snap.key_signs));
  KVC_TRY(copy_region(lay.key_norms_offset, lay.token.key_norm, snap.key_norms));
  KVC_TRY(copy_region(lay.key_residual_norms_offset, lay.token.key_residual_norm, snap.key_residual_norms));
  KVC_TRY(copy_region(lay.value_codes_offset, lay.token.value_codes, snap.value_codes));
  KVC_TRY(copy_region(lay.value_norms_offset, lay.token.value_norm, snap.value_norms));
  const std::uint32_t exact_begin = ktq::exact_window_begin(length, l.window_begins[seq], lay.exact_window);
  snap.window_begin = exact_begin;
  const std::uint32_t rows = length - exact_begin;
  const std::uint32_t d = head_dim_;
  snap.window_keys.resize(static_cast<std::size_t>(l.kv_heads) * rows * d);
  snap.window_values.resize(snap.window_keys.size());
  for (std::uint32_t h = 0; h < l.kv_heads; ++h) {
    for (std::uint32_t t = exact_begin; t < length; ++t) {
      const std::size_t dst = (static_cast<std::size_t>(h) * rows + (t - exact_begin)) * d;
      const std::uint64_t src = lay.window_row(seq, h, t) * d * 4ull;
      KVC_TRY(l.data.download(snap.window_keys.data() + dst, 4ull * d, lay.window_keys_offset + src));
      KVC_TRY(l.data.download(snap.window_values.data() + dst, 4ull * d, lay.window_values_offset + src));
    }
  }
  return snap;
}

Status DeviceCache::restore(std::uint32_t layer, std::uint32_t seq, const ktq::LayerSnapshot& snap) {
  KVC_TRY(check_host_lengths("restore"));
  KVC_TRY(check_layer_seq(layer, seq, false));
  Layer& l = *layers_[layer];
  // The same checks, in the same order, as the CPU cache (tq/snapshot_check.hpp).
  KVC_TRY(ktq::validate_snapshot(snap, ktq::SnapshotTarget{layer, head_dim_, l.kv_heads, config_, capacity_,
                                                           config_.exact_window}));
  if (l.kv_heads == 0) return ok_status();
  const LayerLayout& lay = l.layout;
  const std::uint32_t length = snap.length;
  const std::uint32_t w = lay.exact_window;
  const std::uint32_t rows = length - snap.window_begin;
  const auto regions = ktq::snapshot_regions(snap, lay);
  for (const ktq::SnapshotRegion& r : regions) {
    if (r.per_token == 0 || length == 0) continue;
    for (std::uint32_t h = 0; h < l.kv_heads; ++h) {
      KVC_TRY(l.data.upload_async(r.bytes->data() + static_cast<std::size_t>(h) * length * r.per_token,
                                  static_cast<std::uint64_t>(length) * r.per_token,
                                  r.offset + lay.slot(seq, h, 0) * r.per_token, nullptr));
    }
  }
  const std::uint32_t d = head_dim_;
  for (std::uint32_t h = 0; h < l.kv_heads; ++h) {
    for (std::uint32_t t = snap.window_begin; t < length; ++t) {
      const std::size_t src = (static_cast<std::size_t>(h) * rows + (t - snap.window_begin)) * d;
      const std::uint64_t dst = lay.window_row(seq, h, t) * d * 4ull;
      KVC_TRY(l.data.upload_async(snap.window_keys.data() + src, 4ull * d, lay.window_keys_offset + dst, nullptr));
      KVC_TRY(l.data.upload_async(snap.window_values.data() + src, 4ull * d, lay.window_values_offset + dst, nullptr));
    }
  }
  l.lengths[seq] = length;
  l.window_begins[seq] = w > 0 ? snap.window_begin : 0;
  return sync_positions(layer);  // waits for the default stream: the copies above have landed too
}

Result<DecodePlan> DeviceCache::plan_decode(std::uint32_t layer, std::uint32_t q_heads, std::uint32_t max_length) const {
  KVC_TRY(check_layer_seq(layer, 0, true));
  return tq::plan_decode(layers_[layer]->layout, config_, q_heads, max_length, multiprocessors_);
}

namespace {
bool same_layout(const LayerLayout& a, const LayerLayout& b) {
  auto fields = [](const LayerLayout& l) {
    return std::tie(l.head_dim, l.kv_heads, l.sequences, l.capacity, l.exact_window, l.token.key_codes,
                    l.token.key_signs, l.token.key_norm, l.token.key_residual_norm, l.token.value_codes,
                    l.token.value_norm, l.key_codes_offset, l.key_signs_offset, l.key_norms_offset,
                    l.key_residual_norms_offset, l.value_codes_offset, l.value_norms_offset, l.window_keys_offset,
                    l.window_values_offset, l.total_bytes);
  };
  return fields(a) == fields(b);
}
}  // namespace

// A plan carries the layout it was made for, and the kernels take the region offsets, heads, capacity and
// sequence count from it: a plan of another layer (or cache) would walk this layer's buffer with them.
Status DeviceCache::check_plan_layout(std::uint32_t layer, const LayerLayout& planned, const char* what) const {
  if (!same_layout(planned, layers_[layer]->layout)) {
    return make_error(ErrorCode::Mismatch, "the {} plan was made for another layout than layer {}", what, layer);
  }
  return ok_status();
}

Status DeviceCache::decode(std::uint32_t layer, const DecodePlan& plan, const float* queries, const float* sinks,
                           float scale, float* output, void* workspace, void* stream,
                           std::uint32_t* status) const {
  KVC_TRY(check_layer_seq(layer, 0, true));
  KVC_TRY(check_plan_layout(layer, plan.layout, "decode"));
  KVC_TRY(check_plan_covers(layer, plan.max_length));
  const Layer& l = *layers_[layer];
  DecodeArgs args;
  args.queries = queries;
  args.lengths = l.device_lengths();
  args.window_begins = l.device_window_begins();
  args.sinks = sinks;
  args.scale = scale;
  args.output = output;
  args.status = status;
  return decode_attention(plan, *l.codec, l.data.data(), args, workspace, stream);
}

Result<PrefillPlan> DeviceCache::plan_prefill(std::uint32_t layer, std::uint32_t q_heads, std::uint32_t max_rows,
                                              PrefillPrecision precision, std::uint32_t max_batch,
                                              std::uint32_t max_length) const {
  KVC_TRY(check_layer_seq(layer, 0, true));
  return tq::plan_prefill(layers_[layer]->layout, config_, q_heads, max_rows, max_length == 0 ? capacity_ : max_length,
                          multiprocessors_, precision, PrefillKernel::Auto, max_batch);
}

Status DeviceCache::prefill(std::uint32_t layer, const PrefillPlan& plan, PrefillArgs args, void* workspace,
                            void* stream) const {
  KVC_TRY(check_layer_seq(layer, 0, true));
  KVC_TRY(check_plan_layout(layer, plan.layout, "prefill"));
  const Layer& l = *layers_[layer];
  KVC_TRY(check_plan_covers(layer, plan.max_length));
  return prefill_unchecked(l, plan, args, workspace, stream);
}

Status DeviceCache::prefill_unchecked(const Layer& l, const PrefillPlan& plan, PrefillArgs args, void* workspace,
                                      void* stream) const {
  args.lengths = l.device_lengths();
  args.window_begins = l.device_window_begins();
  return prefill_attention(plan, *l.codec, l.data.data(), args, workspace, stream);
}

Status DeviceCache::attention(std::uint32_t layer, std::span<const ktq::AttentionRequest> requests,
                              const ktq::AttentionOptions& options, void* stream, PrefillPrecision precision) {
  KVC_TRY(check_host_lengths("attention", stream));
  KVC_TRY(check_layer_seq(layer, 0, true));
  const Layer& l = *layers_[layer];
  // tq::validate_attention's checks, in its order and with its messages (it needs a host LayerView).
  if (options.q_heads == 0 || options.q_heads % l.kv_heads != 0) {
    return make_error(ErrorCode::InvalidArgument, "q_heads {} must be a positive multiple of kv_heads {}",
                      options.q_heads, l.kv_heads);
  }
  if (!std::isfinite(options.scale)) {
    return make_error(ErrorCode::InvalidArgument, "softmax scale {} is not finite", options.scale);
  }
  KVC_TRY(ktq::validate_requests(sequences_, l.lengths.data(), requests));
  std::uint32_t max_rows = 0, max_end = 0;
  for (const ktq::AttentionRequest& req : requests) {
    if (req.rows == 0) continue;
    max_rows = std::max(max_rows, req.rows);
    max_end = std::max(max_end, req.first_position + req.rows);  // ≤ the length (validate_requests)
  }
  if (max_rows == 0) return ok_status();
  // Planned for the keys the requests see (a row at position p reads keys [0, p]), not for the capacity: the
  // folded keys' workspace (per token and KV head 512 B for QJL keys, 384 for MSE keys) is then bounded by the
  // prompt. The host lengths are current (check_host_lengths), so the device lengths need no plan covering them:
  // every kernel reads keys below first_position + rows only.
  KVC_ASSIGN_OR_RETURN(PrefillPlan plan,
                       tq::plan_prefill(l.layout, config_, options.q_heads, max_rows, max_end, multiprocessors_,
                                        precision, PrefillKernel::Auto, 1));
  const std::size_t n = requests.size();
  std::vector<std::uint32_t> host(3 * n);
  for (std::size_t r = 0; r < n; ++r) {
    host[r] = requests[r].seq;
    host[n + r] = requests[r].first_position;
    host[2 * n + r] = requests[r].rows;
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // A kernel of an earlier call may still read the argument buffer or the workspace: on this stream, or on
  // another one (attention_done_ marks the previous call's last kernel, whatever its stream).
  KVC_CUDA_TRY(cudaStreamSynchronize(s));
  KVC_TRY(attention_done_.synchronize());
  if (request_args_.size() < 4ull * host.size()) {
    KVC_ASSIGN_OR_RETURN(request_args_, DeviceBuffer::allocate(4ull * host.size()));
  }
  KVC_CUDA_TRY(cudaMemcpyAsync(request_args_.data(), host.data(), 4ull * host.size(), cudaMemcpyHostToDevice, s));
  // (Both waits above: no earlier kernel still uses the old workspace.)
  if (prefill_workspace_.size() < plan.workspace_bytes) {
    KVC_ASSIGN_OR_RETURN(prefill_workspace_, DeviceBuffer::allocate(plan.workspace_bytes));
  }
  void* const workspace = plan.workspace_bytes > 0 ? prefill_workspace_.data() : nullptr;
  const auto* dev = static_cast<const std::uint32_t*>(request_args_.data());
  Status launched = ok_status();
  for (std::size_t r = 0; r < n && launched.ok(); ++r) {
    if (requests[r].rows == 0) continue;
    PrefillArgs args;
    args.batch = 1;
    args.seqs = dev + r;
    args.first_positions = dev + n + r;
    args.rows = dev + 2 * n + r;
    args.queries = requests[r].queries;
    args.output = requests[r].output;
    args.sinks = options.sinks;
    args.scale = options.scale;
    launched = prefill_unchecked(l, plan, args, workspace, stream);
  }
  // Marks the kernels that read the buffers, also when a launch failed after others had been enqueued. (The host
  // vector may go away now: cudaMemcpyAsync from pageable memory returns once it is staged.)
  const Status recorded = attention_done_.record(stream);
  return launched.ok() ? recorded : launched;
}

}  // namespace kvcompact::cuda::tq
