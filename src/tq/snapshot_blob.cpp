// Bridges TurboQuantCache snapshots and KVCB / TQK1 / TQV1 blobs.
#include "kvcompact/tq/snapshot_blob.hpp"

#include <cstring>

namespace kvcompact::tq {

namespace {

std::vector<float> bytes_to_floats(const std::vector<std::uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / 4);
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}
std::vector<std::uint16_t> bytes_to_halves(const std::vector<std::uint8_t>& bytes) {
  std::vector<std::uint16_t> out(bytes.size() / 2);
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 2);
  return out;
}
template <typename T>
std::vector<std::uint8_t> to_bytes(const std::vector<T>& values) {
  std::vector<std::uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

}  // namespace

Result<LayerBlob> snapshot_to_blob(const LayerSnapshot& s, BlobKind kind) {
  if (s.kv_heads == 0) {
    return make_error(ErrorCode::InvalidArgument, "layer {} has no attention: there is nothing to write as a blob",
                      s.layer_index);
  }
  if (s.window_begin > s.length) {
    return make_error(ErrorCode::InvalidArgument, "snapshot window begins at {} beyond its length {}", s.window_begin,
                      s.length);
  }
  LayerBlob blob;
  KVC_ASSIGN_OR_RETURN(blob.header, make_blob_header(kind, s.config, s.head_dim, s.kv_heads, s.length, s.layer_index));
  blob.header.window_rows = s.length - s.window_begin;
  blob.header.window_first_position = s.window_begin;
  if (kind == BlobKind::Keys) {
    blob.codes = s.key_codes;
    blob.signs = s.key_signs;
    blob.norms = bytes_to_floats(s.key_norms);
    blob.residual_norms = bytes_to_halves(s.key_residual_norms);
    blob.window = s.window_keys;
  } else {
    blob.codes = s.value_codes;
    blob.norms = bytes_to_floats(s.value_norms);
    blob.window = s.window_values;
  }
  KVC_TRY(validate_blob(blob));
  return blob;
}

Result<LayerSnapshot> blobs_to_snapshot(const LayerBlob& keys, const LayerBlob& values) {
  const BlobHeader& k = keys.header;
  const BlobHeader& v = values.header;
  if (k.kind != BlobKind::Keys || v.kind != BlobKind::Values) {
    return make_error(ErrorCode::Mismatch, "expected a key blob and a value blob, got kinds {} and {}",
                      static_cast<int>(k.kind), static_cast<int>(v.kind));
  }
  const auto differ = [](std::string_view field, auto a, auto b) {
    return make_error(ErrorCode::Mismatch, "key and value blobs disagree on {}: {} vs {}", field, a, b);
  };
  if (k.seed != v.seed) return differ("seed", k.seed, v.seed);
  if (k.layer_index != v.layer_index) return differ("layer index", k.layer_index, v.layer_index);
  if (k.head_dim != v.head_dim) return differ("head_dim", k.head_dim, v.head_dim);
  if (k.kv_heads != v.kv_heads) return differ("kv_heads", k.kv_heads, v.kv_heads);
  if (k.seq_len != v.seq_len) return differ("length", k.seq_len, v.seq_len);
  if (k.exact_window != v.exact_window) return differ("exact window", k.exact_window, v.exact_window);
  if (k.window_rows != v.window_rows) return differ("window rows", k.window_rows, v.window_rows);
  // Prod keys cannot be norm-corrected, so the value blob's flag is the configuration's then.
  const bool nc = k.has_qjl() ? v.norm_correction : k.norm_correction;
  if (!k.has_qjl() && k.norm_correction != v.norm_correction) {
    return differ("norm correction", k.norm_correction, v.norm_correction);
  }
  LayerSnapshot s;
  s.layer_index = k.layer_index;
  s.head_dim = k.head_dim;
  s.kv_heads = k.kv_heads;
  s.config.key_mode = k.key_mode;
  s.config.key_bits = k.bits;
  s.config.value_bits = v.bits;
  s.config.norm_correction = nc;
  s.config.seed = k.seed;
  s.config.exact_window = k.exact_window;
  KVC_TRY(s.config.validate());
  s.token = token_bytes(s.head_dim, s.config);
  s.length = k.seq_len;
  s.key_codes = keys.codes;
  s.key_signs = keys.signs;
  s.key_norms = to_bytes(keys.norms);
  s.key_residual_norms = to_bytes(keys.residual_norms);
  s.value_codes = values.codes;
  s.value_norms = to_bytes(values.norms);
  s.window_begin = k.window_rows > 0 ? k.window_first_position : k.seq_len;
  s.window_keys = keys.window;
  s.window_values = values.window;
  return s;
}

Result<LayerBlobs> snapshot_layer_blobs(const TurboQuantCache& cache, std::uint32_t layer, std::uint32_t seq) {
  KVC_ASSIGN_OR_RETURN(LayerSnapshot snapshot, cache.snapshot(layer, seq));
  KVC_ASSIGN_OR_RETURN(LayerBlob key_blob, snapshot_to_blob(snapshot, BlobKind::Keys));
  KVC_ASSIGN_OR_RETURN(LayerBlob value_blob, snapshot_to_blob(snapshot, BlobKind::Values));
  LayerBlobs out;
  KVC_ASSIGN_OR_RETURN(out.keys, encode_layer_blob(key_blob));
  KVC_ASSIGN_OR_RETURN(out.values, encode_layer_blob(value_blob));
  return out;
}

namespace {

// Decodes one blob of either format and checks it against the cache.
Result<LayerBlob> decode_for_cache(const TurboQuantCache& cache, std::uint32_t layer, BlobKind kind,
                                   std::span<const std::uint8_t> bytes) {
  if (layer >= cache.num_layers()) {
    return make_error(ErrorCode::OutOfRange, "layer {} is outside the cache's {} layers", layer, cache.num_layers());
  }
  const std::uint32_t kv_heads = cache.kv_heads(layer);
  if (kv_heads == 0) {
    return make_error(ErrorCode::InvalidArgument, "layer {} of {} has no attention to restore into", layer,
                      cache.num_layers());
  }
  BlobExpectation expected{kind, cache.config(), cache.head_dim(), kv_heads, layer};
  if (is_seed_blob(bytes)) {
    KVC_ASSIGN_OR_RETURN(LayerBlob blob, decode_seed_blob(bytes, cache.config().seed, layer));
    KVC_TRY(check_blob_matches(blob.header, expected));
    return blob;
  }
  return decode_layer_blob(bytes, expected);
}

}  // namespace

Status restore_layer_blobs(TurboQuantCache& cache, std::uint32_t layer, std::uint32_t seq,
                           std::span<const std::uint8_t> key_blob, std::span<const std::uint8_t> value_blob) {
  KVC_ASSIGN_OR_RETURN(LayerBlob keys, decode_for_cache(cache, layer, BlobKind::Keys, key_blob));
  KVC_ASSIGN_OR_RETURN(LayerBlob values, decode_for_cache(cache, layer, BlobKind::Values, value_blob));
  KVC_ASSIGN_OR_RETURN(LayerSnapshot snapshot, blobs_to_snapshot(keys, values));
  return cache.restore(layer, seq, snapshot);
}

}  // namespace kvcompact::tq
