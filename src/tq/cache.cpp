// TurboQuantCache: per-layer packed storage (one buffer laid out by plan_layer_layout), per-(layer, seq)
// lengths and window bookkeeping, append / truncate / reset / snapshot / restore. Attention itself lives
// in attention.cpp; the cache only hands it a LayerView.
#include "kvcompact/tq/cache.hpp"
#include "kvcompact/tq/append_check.hpp"
#include "kvcompact/tq/snapshot_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/core/checked.hpp"
#include "kvcompact/core/parallel.hpp"

namespace kvcompact::tq {

namespace {

struct AlignedDelete {
  void operator()(std::uint8_t* p) const { ::operator delete[](p, std::align_val_t{kRegionAlignment}); }
};
using AlignedBuffer = std::unique_ptr<std::uint8_t[], AlignedDelete>;

// Empty when the host cannot allocate `bytes` (the nothrow form: under AddressSanitizer a throwing new reports a
// failed allocation as a fatal error instead of throwing std::bad_alloc).
AlignedBuffer allocate_zeroed(std::uint64_t bytes) {
  if (bytes > std::numeric_limits<std::size_t>::max()) return AlignedBuffer();
  auto* p = static_cast<std::uint8_t*>(
      ::operator new[](bytes == 0 ? 1 : bytes, std::align_val_t{kRegionAlignment}, std::nothrow));
  if (p == nullptr) return AlignedBuffer();
  std::memset(p, 0, bytes);
  return AlignedBuffer(p);
}

}  // namespace

struct TurboQuantCache::Layer {
  std::uint32_t index = 0;
  std::uint32_t kv_heads = 0;  // 0: no attention in this layer
  LayerLayout layout{};
  std::unique_ptr<LayerCodec> codec;
  AlignedBuffer data;
  std::vector<std::uint32_t> lengths;        // [sequences]
  std::vector<std::uint32_t> window_begins;  // [sequences]: positions below this are not in the ring

  std::uint8_t* region(std::uint64_t offset) { return data.get() + offset; }
};

TurboQuantCache::TurboQuantCache(TurboQuantCache&&) noexcept = default;
TurboQuantCache& TurboQuantCache::operator=(TurboQuantCache&&) noexcept = default;
TurboQuantCache::~TurboQuantCache() = default;

Status validate_cache_shape(const CacheShape& shape, const QuantConfig& config) {
  KVC_TRY(config.validate());
  KVC_TRY(validate_head_dim(shape.head_dim));
  if (shape.kv_heads.empty()) {
    return make_error(ErrorCode::InvalidArgument, "a cache needs at least one layer (kv_heads is empty)");
  }
  if (shape.sequences == 0 || shape.capacity == 0) {
    return make_error(ErrorCode::InvalidArgument, "a cache needs sequences and capacity > 0 (got {}, {})",
                      shape.sequences, shape.capacity);
  }
  return ok_status();
}

Result<TurboQuantCache> TurboQuantCache::create(const CacheShape& shape, const QuantConfig& config) {
  KVC_TRY(validate_cache_shape(shape, config));
  TurboQuantCache cache;
  cache.config_ = config;
  cache.head_dim_ = shape.head_dim;
  cache.sequences_ = shape.sequences;
  cache.capacity_ = shape.capacity;
  for (std::uint32_t l = 0; l < shape.kv_heads.size(); ++l) {
    auto layer = std::make_unique<Layer>();
    layer->index = l;
    layer->kv_heads = shape.kv_heads[l];
    if (layer->kv_heads > 0) {
      KVC_ASSIGN_OR_RETURN(layer->layout, plan_layer_layout(shape.head_dim, layer->kv_heads, shape.sequences,
                                                            shape.capacity, config));
      KVC_ASSIGN_OR_RETURN(LayerCodec codec, LayerCodec::create(shape.head_dim, config, l));
      layer->codec = std::make_unique<LayerCodec>(std::move(codec));
      layer->data = allocate_zeroed(layer->layout.total_bytes);
      if (!layer->data) {
        return make_error(ErrorCode::CapacityExceeded, "host allocation of {} bytes for layer {} failed",
                          layer->layout.total_bytes, l);
      }
      layer->lengths.assign(shape.sequences, 0);
      layer->window_begins.assign(shape.sequences, 0);
    }
    cache.layers_.push_back(std::move(layer));
  }
  return cache;
}

std::uint32_t TurboQuantCache::kv_heads(std::uint32_t layer) const {
  return layer < layers_.size() ? layers_[layer]->kv_heads : 0;
}

std::uint32_t TurboQuantCache::length(std::uint32_t layer, std::uint32_t seq) const {
  if (layer >= layers_.size() || layers_[layer]->kv_heads == 0 || seq >= sequences_) return 0;
  return layers_[layer]->lengths[seq];
}

std::uint64_t TurboQuantCache::layer_bytes(std::uint32_t layer) const {
  if (layer >= layers_.size() || layers_[layer]->kv_heads == 0) return 0;
  return layers_[layer]->layout.total_bytes;
}

std::uint64_t TurboQuantCache::total_bytes() const {
  std::uint64_t total = 0;
  for (std::uint32_t l = 0; l < layers_.size(); ++l) total += layer_bytes(l);
  return total;
}

const LayerLayout* TurboQuantCache::layout(std::uint32_t layer) const {
  if (layer >= layers_.size() || layers_[layer]->kv_heads == 0) return nullptr;
  return &layers_[layer]->layout;
}

const LayerCodec* TurboQuantCache::codec(std::uint32_t layer) const {
  if (layer >= layers_.size() || layers_[layer]->kv_heads == 0) return nullptr;
  return layers_[layer]->codec.get();
}

LayerView TurboQuantCache::view(std::uint32_t layer) const {
  LayerView v;
  if (layer >= layers_.size() || layers_[layer]->kv_heads == 0) return v;
  const Layer& l = *layers_[layer];
  v.layout = &l.layout;
  v.codec = l.codec.get();
  v.data = l.data.get();
  v.lengths = l.lengths.data();
  v.window_begins = l.window_begins.data();
  return v;
}

Status TurboQuantCache::check_layer_seq(std::uint32_t layer, std::uint32_t seq, bool need_attention) const {
  if (layer >= layers_.size()) {
    return make_error(ErrorCode::OutOfRange, "layer {} is outside the cache's {} layers", layer, layers_.size());
  }
  if (need_attention && layers_[layer]->kv_heads == 0) {
    return make_error(ErrorCode::InvalidArgument, "layer {} has no attention (0 KV heads) and stores nothing", layer);
  }
  if (seq >= sequences_) {
    return make_error(ErrorCode::OutOfRange, "sequence {} is outside the cache's {} sequences", seq, sequences_);
  }
  return ok_status();
}

Status TurboQuantCache::append(std::uint32_t layer, std::uint32_t seq, std::uint32_t position, std::uint32_t rows,
                               DType dtype, const void* keys, const void* values) {
  KVC_TRY(check_layer_seq(layer, seq, true));
  Layer& l = *layers_[layer];
  const std::uint32_t length = l.lengths[seq];
  KVC_TRY(validate_append(layer, seq, length, capacity_, position, rows, dtype, keys, values));
  if (rows == 0) return ok_status();
  const std::uint32_t d = head_dim_;
  const std::uint32_t heads = l.kv_heads;
  const std::uint64_t elements = static_cast<std::uint64_t>(rows) * heads * d;  // ≤ capacity·heads·d, planned
  std::vector<float> key_rows(elements);
  std::vector<float> value_rows(elements);
  KVC_TRY(convert_to_f32(dtype, keys, key_rows.data(), elements));
  KVC_TRY(convert_to_f32(dtype, values, value_rows.data(), elements));

  // Encode every (token, head) into its slot past the current length: nothing is visible until the
  // length moves, so a failure part-way leaves the cache as it was.
  const LayerLayout& lay = l.layout;
  const LayerCodec& codec = *l.codec;
  const bool qjl = config_.has_qjl();
  const std::size_t tasks = static_cast<std::size_t>(rows) * heads;
  std::vector<Status> errors;
  std::mutex error_mutex;
  parallel_for(0, tasks, 16, [&](std::size_t lo, std::size_t hi) {
    std::vector<float> scratch(2 * static_cast<std::size_t>(d));
    for (std::size_t task = lo; task < hi; ++task) {
      const std::uint32_t row = static_cast<std::uint32_t>(task / heads);
      const std::uint32_t head = static_cast<std::uint32_t>(task % heads);
      const std::uint64_t slot = lay.slot(seq, head, position + row);
      KeyRecord key;
      key.codes = l.region(lay.key_codes_offset) + slot * lay.token.key_codes;
      key.norm = reinterpret_cast<float*>(l.region(lay.key_norms_offset)) + slot;
      if (qjl) {
        key.signs = l.region(lay.key_signs_offset) + slot * lay.token.key_signs;
        key.residual_norm = reinterpret_cast<std::uint16_t*>(l.region(lay.key_residual_norms_offset)) + slot;
      }
      ValueRecord value;
      value.codes = l.region(lay.value_codes_offset) + slot * lay.token.value_codes;
      value.norm = reinterpret_cast<float*>(l.region(lay.value_norms_offset)) + slot;
      Status s = codec.encode_key({key_rows.data() + task * d, d}, key, scratch);
      if (s.ok()) s = codec.encode_value({value_rows.data() + task * d, d}, value, scratch);
      if (!s.ok()) {
        Error e = std::move(s).error();
        e.message = fmt::format("layer {} sequence {} position {} head {}: {}", layer, seq, position + row, head,
                                e.message);
        std::lock_guard<std::mutex> lock(error_mutex);
        errors.emplace_back(std::move(e));
        return;
      }
    }
  });
  if (!errors.empty()) return errors.front();

  // Window ring: only the last W rows of this append can still be in it afterwards.
  const std::uint32_t w = lay.exact_window;
  if (w > 0) {
    const std::uint32_t first = rows > w ? rows - w : 0;
    float* ring_keys = reinterpret_cast<float*>(l.region(lay.window_keys_offset));
    float* ring_values = reinterpret_cast<float*>(l.region(lay.window_values_offset));
    for (std::uint32_t row = first; row < rows; ++row) {
      for (std::uint32_t head = 0; head < heads; ++head) {
        const std::uint64_t ring = lay.window_row(seq, head, position + row) * d;
        const std::size_t src = (static_cast<std::size_t>(row) * heads + head) * d;
        std::memcpy(ring_keys + ring, key_rows.data() + src, d * sizeof(float));
        std::memcpy(ring_values + ring, value_rows.data() + src, d * sizeof(float));
      }
    }
  }
  l.lengths[seq] = position + rows;
  return ok_status();
}

Status TurboQuantCache::attention(std::uint32_t layer, std::span<const AttentionRequest> requests,
                                  const AttentionOptions& options) const {
  if (layer >= layers_.size()) {
    return make_error(ErrorCode::OutOfRange, "layer {} is outside the cache's {} layers", layer, layers_.size());
  }
  if (layers_[layer]->kv_heads == 0) {
    return make_error(ErrorCode::InvalidArgument, "layer {} has no attention (0 KV heads)", layer);
  }
  return attention_cpu(view(layer), requests, options);
}

Status TurboQuantCache::truncate_layer(std::uint32_t layer, std::uint32_t seq, std::uint32_t position) {
  KVC_TRY(check_layer_seq(layer, seq, false));
  Layer& l = *layers_[layer];
  if (l.kv_heads == 0) return ok_status();
  const std::uint32_t length = l.lengths[seq];
  if (position >= length) return ok_status();
  const std::uint32_t w = l.layout.exact_window;
  if (w > 0) l.window_begins[seq] = window_begin_after_truncate(length, l.window_begins[seq], w, position);
  l.lengths[seq] = position;
  return ok_status();
}

Status TurboQuantCache::truncate(std::uint32_t seq, std::uint32_t position) {
  if (seq >= sequences_) {
    return make_error(ErrorCode::OutOfRange, "sequence {} is outside the cache's {} sequences", seq, sequences_);
  }
  for (std::uint32_t l = 0; l < layers_.size(); ++l) KVC_TRY(truncate_layer(l, seq, position));
  return ok_status();
}

Status TurboQuantCache::reset(std::uint32_t seq) {
  if (seq >= sequences_) {
    return make_error(ErrorCode::OutOfRange, "sequence {} is outside the cache's {} sequences", seq, sequences_);
  }
  for (auto& layer : layers_) {
    if (layer->kv_heads == 0) continue;
    layer->lengths[seq] = 0;
    layer->window_begins[seq] = 0;
  }
  return ok_status();
}

void TurboQuantCache::reset_all() {
  for (std::uint32_t s = 0; s < sequences_; ++s) (void)reset(s);
}

Result<LayerSnapshot> TurboQuantCache::snapshot(std::uint32_t layer, std::uint32_t seq) const {
  KVC_TRY(check_layer_seq(layer, seq, false));
  const Layer& l = *layers_[layer];
  LayerSnapshot snap;
  snap.layer_index = layer;
  snap.head_dim = head_dim_;
  snap.kv_heads = l.kv_heads;
  snap.config = config_;
  snap.token = token_bytes(head_dim_, config_);
  if (l.kv_heads == 0) return snap;
  const LayerLayout& lay = l.layout;
  const std::uint32_t length = l.lengths[seq];
  snap.length = length;
  // Each region's bytes of this sequence are contiguous per head (slots of a head are consecutive).
  auto copy_region = [&](std::uint64_t offset, std::uint32_t bytes_per_token, std::vector<std::uint8_t>& out) {
    out.resize(static_cast<std::size_t>(l.kv_heads) * length * bytes_per_token);
    if (out.empty()) return;  // memcpy may not see the null data() of an empty vector
    for (std::uint32_t h = 0; h < l.kv_heads; ++h) {
      std::memcpy(out.data() + static_cast<std::size_t>(h) * length * bytes_per_token,
                  l.data.get() + offset + lay.slot(seq, h, 0) * bytes_per_token,
                  static_cast<std::size_t>(length) * bytes_per_token);
    }
  };
  copy_region(lay.key_codes_offset, lay.token.key_codes, snap.key_codes);
  copy_region(lay.key_signs_offset, lay.token.key_signs, snap.key_signs);
  copy_region(lay.key_norms_offset, lay.token.key_norm, snap.key_norms);
  copy_region(lay.key_residual_norms_offset, lay.token.key_residual_norm, snap.key_residual_norms);
  copy_region(lay.value_codes_offset, lay.token.value_codes, snap.value_codes);
  copy_region(lay.value_norms_offset, lay.token.value_norm, snap.value_norms);

  const std::uint32_t exact_begin = exact_window_begin(length, l.window_begins[seq], lay.exact_window);
  snap.window_begin = exact_begin;
  const std::uint32_t exact_rows = length - exact_begin;
  const std::uint32_t d = head_dim_;
  snap.window_keys.resize(static_cast<std::size_t>(l.kv_heads) * exact_rows * d);
  snap.window_values.resize(snap.window_keys.size());
  const float* ring_keys = reinterpret_cast<const float*>(l.data.get() + lay.window_keys_offset);
  const float* ring_values = reinterpret_cast<const float*>(l.data.get() + lay.window_values_offset);
  for (std::uint32_t h = 0; h < l.kv_heads; ++h) {
    for (std::uint32_t t = exact_begin; t < length; ++t) {
      const std::size_t dst = (static_cast<std::size_t>(h) * exact_rows + (t - exact_begin)) * d;
      const std::uint64_t src = lay.window_row(seq, h, t) * d;
      std::memcpy(snap.window_keys.data() + dst, ring_keys + src, d * sizeof(float));
      std::memcpy(snap.window_values.data() + dst, ring_values + src, d * sizeof(float));
    }
  }
  return snap;
}

Status TurboQuantCache::restore(std::uint32_t layer, std::uint32_t seq, const LayerSnapshot& snap) {
  KVC_TRY(check_layer_seq(layer, seq, false));
  Layer& l = *layers_[layer];
  KVC_TRY(validate_snapshot(snap, SnapshotTarget{layer, head_dim_, l.kv_heads, config_, capacity_,
                                                 config_.exact_window}));
  if (l.kv_heads == 0) return ok_status();
  const LayerLayout& lay = l.layout;
  const std::uint32_t length = snap.length;
  const std::uint32_t w = lay.exact_window;
  const std::uint32_t exact_rows = length - snap.window_begin;
  const auto regions = snapshot_regions(snap, lay);

  // All checks passed: copy in.
  for (const SnapshotRegion& r : regions) {
    if (r.per_token == 0 || length == 0) continue;
    for (std::uint32_t h = 0; h < l.kv_heads; ++h) {
      std::memcpy(l.region(r.offset) + lay.slot(seq, h, 0) * r.per_token,
                  r.bytes->data() + static_cast<std::size_t>(h) * length * r.per_token,
                  static_cast<std::size_t>(length) * r.per_token);
    }
  }
  const std::uint32_t d = head_dim_;
  float* ring_keys = reinterpret_cast<float*>(l.region(lay.window_keys_offset));
  float* ring_values = reinterpret_cast<float*>(l.region(lay.window_values_offset));
  for (std::uint32_t h = 0; h < l.kv_heads; ++h) {
    for (std::uint32_t t = snap.window_begin; t < length; ++t) {
      const std::size_t src = (static_cast<std::size_t>(h) * exact_rows + (t - snap.window_begin)) * d;
      const std::uint64_t dst = lay.window_row(seq, h, t) * d;
      std::memcpy(ring_keys + dst, snap.window_keys.data() + src, d * sizeof(float));
      std::memcpy(ring_values + dst, snap.window_values.data() + src, d * sizeof(float));
    }
  }
  l.lengths[seq] = length;
  l.window_begins[seq] = w > 0 ? snap.window_begin : 0;
  return ok_status();
}

}  // namespace kvcompact::tq
