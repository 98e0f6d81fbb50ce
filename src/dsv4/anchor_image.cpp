// Anchor image encode / decode / hydrate (layout in anchor_image.hpp and docs/deepseek-v4.md). The
// decoder treats the bytes as hostile: every count is compared with what the header implies and every
// length is computed with checked arithmetic and compared with the bytes left before anything is read.
#include "kvcompact/dsv4/anchor_image.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "cache_access.hpp"
#include "kvcompact/core/checked.hpp"
#include "kvcompact/core/checksum.hpp"

namespace kvcompact::dsv4 {

namespace {

struct Writer {
  std::vector<std::uint8_t> out;
  void u8(std::uint8_t v) { out.push_back(v); }
  void u16(std::uint16_t v) {
    for (int i = 0; i < 2; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void bytes(std::span<const std::uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); }
  void patch_u64(std::size_t at, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out[at + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
  }
};

std::uint64_t load_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

// Bounds-checked cursor over the image.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  std::uint64_t remaining() const { return bytes_.size() - at_; }
  std::uint64_t offset() const { return at_; }
  Result<std::span<const std::uint8_t>> take(std::uint64_t n, const char* what) {
    if (n > remaining()) {
      return make_error(ErrorCode::Truncated, "anchor image ends inside {}: needs {} bytes at offset {}, {} left",
                        what, n, at_, remaining());
    }
    auto s = bytes_.subspan(at_, static_cast<std::size_t>(n));
    at_ += static_cast<std::size_t>(n);
    return s;
  }
  Result<std::uint64_t> uint(int n, const char* what) {
    KVC_ASSIGN_OR_RETURN(auto s, take(static_cast<std::uint64_t>(n), what));
    return load_le(s.data(), n);
  }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t at_ = 0;
};

Error corrupt(std::string message) { return Error{ErrorCode::Corrupt, std::move(message), 0, 0}; }

// Decodes and checks the 80-byte fixed header (and the total size it implies).
Result<AnchorImageHeader> decode_header(Reader& r, std::uint64_t total_size) {
  KVC_ASSIGN_OR_RETURN(auto magic, r.take(8, "the magic"));
  if (std::memcmp(magic.data(), kAnchorImageMagic, 8) != 0) return corrupt("not an anchor image (bad magic)");
  AnchorImageHeader h;
  KVC_ASSIGN_OR_RETURN(std::uint64_t version, r.uint(4, "the version"));
  if (version != kAnchorImageVersion) {
    return make_error(ErrorCode::Unsupported, "anchor image version {} (this build reads version {})", version,
                      kAnchorImageVersion);
  }
  h.version = static_cast<std::uint32_t>(version);
  KVC_ASSIGN_OR_RETURN(std::uint64_t header_bytes, r.uint(4, "the header size"));
  if (header_bytes != kAnchorImageHeaderBytes) {
    return corrupt(fmt::format("header size {} (version 1 has {})", header_bytes, kAnchorImageHeaderBytes));
  }
  KVC_ASSIGN_OR_RETURN(h.model_fingerprint, r.uint(8, "the model fingerprint"));
  KVC_ASSIGN_OR_RETURN(std::uint64_t layers, r.uint(4, "the layer count"));
  KVC_ASSIGN_OR_RETURN(std::uint64_t head_dim, r.uint(4, "head_dim"));
  KVC_ASSIGN_OR_RETURN(std::uint64_t window, r.uint(4, "sliding_window"));
  KVC_ASSIGN_OR_RETURN(std::uint64_t index_dim, r.uint(4, "index_head_dim"));
  KVC_ASSIGN_OR_RETURN(std::uint64_t attention_storage, r.uint(1, "the attention storage"));
  KVC_ASSIGN_OR_RETURN(std::uint64_t indexer_storage, r.uint(1, "the indexer storage"));
  KVC_ASSIGN_OR_RETURN(std::uint64_t reserved16, r.uint(2, "a reserved field"));
  KVC_ASSIGN_OR_RETURN(std::uint64_t reserved32, r.uint(4, "a reserved field"));
  KVC_ASSIGN_OR_RETURN(h.source_context, r.uint(8, "the source context"));
  KVC_ASSIGN_OR_RETURN(h.position, r.uint(8, "the position"));
  KVC_ASSIGN_OR_RETURN(std::uint64_t ledger_count, r.uint(8, "the ledger count"));
  KVC_ASSIGN_OR_RETURN(h.payload_bytes, r.uint(8, "the payload size"));

  if (layers == 0 || layers > kAnchorImageMaxLayers) {
    return corrupt(fmt::format("layer count {} outside [1, {}]", layers, kAnchorImageMaxLayers));
  }
  h.num_layers = static_cast<std::uint32_t>(layers);
  if (head_dim != kHeadDim || window != kSlidingWindow || index_dim != kIndexerHeadDim) {
    return make_error(ErrorCode::Unsupported, "anchor image shape head_dim {}, sliding_window {}, index_head_dim {}",
                      head_dim, window, index_dim);
  }
  if (attention_storage > 1 || indexer_storage > 2) {
    return corrupt(fmt::format("unknown storage codes {} / {}", attention_storage, indexer_storage));
  }
  h.storage.attention = static_cast<RowStorage>(attention_storage);
  h.storage.indexer = static_cast<IndexerStorage>(indexer_storage);
  if (reserved16 != 0 || reserved32 != 0) return corrupt("reserved header fields are not zero");
  if (h.source_context == 0 || h.position > h.source_context) {
    return corrupt(fmt::format("position {} outside source context {}", h.position, h.source_context));
  }
  if (ledger_count != h.position) {
    return corrupt(fmt::format("ledger of {} tokens for position {}", ledger_count, h.position));
  }
  // Size implied by the header against the real size: shorter is truncation, longer is damage.
  auto expected_total = checked_sum({kAnchorImageHeaderBytes, h.payload_bytes, kAnchorImageChecksumBytes});
  if (!expected_total.ok()) return corrupt(fmt::format("payload size {} overflows", h.payload_bytes));
  if (*expected_total > total_size) {
    return make_error(ErrorCode::Truncated, "anchor image of {} bytes, its header says {}", total_size,
                      *expected_total);
  }
  if (*expected_total < total_size) {
    return corrupt(fmt::format("anchor image of {} bytes, its header says {}", total_size, *expected_total));
  }
  return h;
}

struct LayerShape {
  std::uint64_t window = 0, compressed = 0, indexer = 0, state_floats = 0, indexer_state_floats = 0;
};

LayerShape expected_shape(std::uint32_t m, std::uint64_t position) {
  LayerShape s;
  s.window = std::min<std::uint64_t>(position, kSlidingWindow);
  if (m != 0) {
    std::uint64_t coff = m == 4 ? 2 : 1;
    s.compressed = position / m;
    s.state_floats = coff * m * coff * kHeadDim;
  }
  if (m == 4) {
    s.indexer = position / 4;
    s.indexer_state_floats = 8 * 2 * kIndexerHeadDim;
  }
  return s;
}

Result<std::span<const std::uint8_t>> take_rows(Reader& r, std::uint64_t rows, std::uint64_t row_bytes,
                                                const char* what) {
  auto n = checked_mul(rows, row_bytes);
  if (!n.ok()) return corrupt(fmt::format("{}: {} rows of {} bytes overflow", what, rows, row_bytes));
  return r.take(*n, what);
}

std::vector<float> load_floats(std::span<const std::uint8_t> bytes) {
  std::vector<float> out(bytes.size() / 4);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(load_le(bytes.data() + 4 * i, 4)));
  }
  return out;
}

}  // namespace

std::vector<std::uint32_t> AnchorImageView::ledger() const {
  std::vector<std::uint32_t> out(ledger_bytes.size() / 4);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint32_t>(load_le(ledger_bytes.data() + 4 * i, 4));
  return out;
}

bool looks_like_anchor_image(std::span<const std::uint8_t> bytes) {
  return bytes.size() >= 8 && std::memcmp(bytes.data(), kAnchorImageMagic, 8) == 0;
}

Result<std::vector<std::uint8_t>> write_anchor_image(const CachePlan& plan, std::uint64_t position,
                                                     std::span<const std::uint32_t> tokens,
                                                     const AnchorImageLayerSource& source) {
  if (tokens.size() != position) {
    return make_error(ErrorCode::InvalidArgument, "token ledger of {} ids for a cache at position {}", tokens.size(),
                      position);
  }
  // The decoder's bound: an image it would refuse is not written.
  if (plan.layers.empty() || plan.layers.size() > kAnchorImageMaxLayers) {
    return make_error(ErrorCode::Unsupported, "an anchor image holds 1 to {} layers; the cache has {}",
                      kAnchorImageMaxLayers, plan.layers.size());
  }
  const std::uint64_t p = position;
  Writer w;
  w.out.reserve(kAnchorImageHeaderBytes + 4 * tokens.size());
  w.bytes(std::span<const std::uint8_t>(kAnchorImageMagic, 8));
  w.u32(kAnchorImageVersion);
  w.u32(static_cast<std::uint32_t>(kAnchorImageHeaderBytes));
  w.u64(plan.model_fingerprint);
  w.u32(static_cast<std::uint32_t>(plan.layers.size()));
  w.u32(kHeadDim);
  w.u32(kSlidingWindow);
  w.u32(kIndexerHeadDim);
  w.u8(static_cast<std::uint8_t>(plan.storage.attention));
  w.u8(static_cast<std::uint8_t>(plan.storage.indexer));
  w.u16(0);
  w.u32(0);
  w.u64(plan.context);
  w.u64(p);
  w.u64(tokens.size());
  const std::size_t payload_at = w.out.size();
  w.u64(0);  // payload size, patched below
  KVC_ASSERT(w.out.size() == kAnchorImageHeaderBytes, "anchor image header size");
  for (std::uint32_t t : tokens) w.u32(t);
  for (std::uint32_t i = 0; i < plan.layers.size(); ++i) {
    const LayerPlan& lp = plan.layers[i];
    const LayerShape s = expected_shape(lp.ratio, p);
    AnchorImageLayerData d;
    KVC_TRY(source(i, d));
    if (d.window_rows.size() != s.window * lp.attention_row_bytes ||
        d.compressed_rows.size() != s.compressed * lp.attention_row_bytes ||
        d.indexer_rows.size() != s.indexer * lp.indexer_row_bytes || d.kv_state.size() != s.state_floats ||
        d.score_state.size() != s.state_floats || d.indexer_kv_state.size() != s.indexer_state_floats ||
        d.indexer_score_state.size() != s.indexer_state_floats) {
      return make_error(ErrorCode::Internal, "layer {} handed the image writer contents of the wrong size", i);
    }
    w.u32(lp.ratio);
    w.u32(0);
    w.u64(s.window);
    w.u64(s.compressed);
    w.u64(s.indexer);
    w.u64(s.state_floats);
    w.u64(s.indexer_state_floats);
    w.bytes(d.window_rows);
    w.bytes(d.compressed_rows);
    w.bytes(d.indexer_rows);
    for (std::span<const float> state : {d.kv_state, d.score_state, d.indexer_kv_state, d.indexer_score_state}) {
      for (float f : state) w.u32(std::bit_cast<std::uint32_t>(f));
    }
  }
  w.patch_u64(payload_at, w.out.size() - kAnchorImageHeaderBytes);
  std::uint64_t sum = xxh64(w.out);
  w.u64(sum);
  return std::move(w.out);
}

Result<std::vector<std::uint8_t>> encode_anchor_image(const Deepseek4Cache& cache,
                                                      std::span<const std::uint32_t> tokens) {
  if (cache.poisoned()) {
    return make_error(ErrorCode::Poisoned, "cannot write an anchor image of a poisoned cache ({})",
                      cache.poison_reason());
  }
  const auto& impl = detail::CacheAccess::impl(cache);
  const auto layer_contents = [&](std::uint32_t i, AnchorImageLayerData& d) -> Status {
    const CachePlan& plan = cache.plan();
    const LayerPlan& lp = plan.layers[i];
    const LayerShape s = expected_shape(lp.ratio, cache.position());
    ConstAttentionRows window = cache.window_rows(i);
    for (std::uint64_t q = cache.window_start_position(); q < cache.position(); ++q) {
      const auto row = window.row(cache.window_slot(q));
      d.storage.insert(d.storage.end(), row.begin(), row.end());
    }
    d.window_rows = d.storage;
    d.compressed_rows = cache.compressed_rows(i).bytes.first(s.compressed * lp.attention_row_bytes);
    d.indexer_rows = cache.indexer_rows(i).bytes.first(s.indexer * lp.indexer_row_bytes);
    d.kv_state = impl.layers[i].kv_state;
    d.score_state = impl.layers[i].score_state;
    d.indexer_kv_state = impl.layers[i].indexer_kv_state;
    d.indexer_score_state = impl.layers[i].indexer_score_state;
    return ok_status();
  };
  return write_anchor_image(cache.plan(), cache.position(), tokens, layer_contents);
}

Result<AnchorImageView> decode_anchor_image(std::span<const std::uint8_t> bytes) {
  Reader r(bytes);
  AnchorImageView view;
  KVC_ASSIGN_OR_RETURN(view.header, decode_header(r, bytes.size()));
  const AnchorImageHeader& h = view.header;
  const std::uint64_t row_bytes = attention_row_bytes(h.storage.attention);
  const std::uint64_t index_bytes = indexer_row_bytes(h.storage.indexer);
  KVC_ASSIGN_OR_RETURN(view.ledger_bytes, take_rows(r, h.position, 4, "the token ledger"));
  for (std::uint32_t i = 0; i < h.num_layers; ++i) {
    if (r.remaining() < kAnchorImageLayerHeaderBytes) {
      return make_error(ErrorCode::Truncated, "anchor image ends inside layer {}'s header", i);
    }
    AnchorImageLayer l;
    KVC_ASSIGN_OR_RETURN(std::uint64_t ratio, r.uint(4, "a layer ratio"));
    KVC_ASSIGN_OR_RETURN(std::uint64_t reserved, r.uint(4, "a reserved field"));
    KVC_ASSIGN_OR_RETURN(l.window_count, r.uint(8, "a window count"));
    KVC_ASSIGN_OR_RETURN(l.compressed_count, r.uint(8, "a compressed count"));
    KVC_ASSIGN_OR_RETURN(l.indexer_count, r.uint(8, "an indexer count"));
    KVC_ASSIGN_OR_RETURN(l.state_floats, r.uint(8, "a state size"));
    KVC_ASSIGN_OR_RETURN(l.indexer_state_floats, r.uint(8, "an indexer state size"));
    if (ratio != 0 && ratio != 4 && ratio != 128) return corrupt(fmt::format("layer {} has ratio {}", i, ratio));
    if (reserved != 0) return corrupt(fmt::format("layer {} reserved field is not zero", i));
    l.ratio = static_cast<std::uint32_t>(ratio);
    LayerShape s = expected_shape(l.ratio, h.position);
    if (l.window_count != s.window || l.compressed_count != s.compressed || l.indexer_count != s.indexer ||
        l.state_floats != s.state_floats || l.indexer_state_floats != s.indexer_state_floats) {
      return corrupt(fmt::format(
          "layer {} (ratio {}) counts window {} / compressed {} / indexer {} / state {} / indexer state {} do not "
          "match position {} (expected {} / {} / {} / {} / {})",
          i, l.ratio, l.window_count, l.compressed_count, l.indexer_count, l.state_floats, l.indexer_state_floats,
          h.position, s.window, s.compressed, s.indexer, s.state_floats, s.indexer_state_floats));
    }
    KVC_ASSIGN_OR_RETURN(l.window_rows, take_rows(r, l.window_count, row_bytes, "window rows"));
    KVC_ASSIGN_OR_RETURN(l.compressed_rows, take_rows(r, l.compressed_count, row_bytes, "compressed rows"));
    KVC_ASSIGN_OR_RETURN(l.indexer_rows, take_rows(r, l.indexer_count, index_bytes, "indexer rows"));
    KVC_ASSIGN_OR_RETURN(l.kv_state, take_rows(r, l.state_floats, 4, "a kv state"));
    KVC_ASSIGN_OR_RETURN(l.score_state, take_rows(r, l.state_floats, 4, "a score state"));
    KVC_ASSIGN_OR_RETURN(l.indexer_kv_state, take_rows(r, l.indexer_state_floats, 4, "an indexer kv state"));
    KVC_ASSIGN_OR_RETURN(l.indexer_score_state, take_rows(r, l.indexer_state_floats, 4, "an indexer score state"));
    view.layers.push_back(l);
  }
  if (r.remaining() != kAnchorImageChecksumBytes) {
    return corrupt(fmt::format("{} bytes between the last layer and the end; expected the {}-byte checksum",
                               r.remaining(), kAnchorImageChecksumBytes));
  }
  const std::uint64_t body = r.offset();
  KVC_ASSIGN_OR_RETURN(view.checksum, r.uint(8, "the checksum"));
  const std::uint64_t actual = xxh64(bytes.first(static_cast<std::size_t>(body)));
  if (actual != view.checksum) {
    return corrupt(fmt::format("checksum {:016x} does not match the contents ({:016x})", view.checksum, actual));
  }
  return view;
}

Status hydrate_from_anchor_image(Deepseek4Cache& cache, std::span<const std::uint8_t> bytes,
                                 std::vector<std::uint32_t>* tokens) {
  KVC_ASSIGN_OR_RETURN(AnchorImageView view, decode_anchor_image(bytes));
  auto& c = detail::CacheAccess::impl(cache);
  KVC_TRY(c.check_image_target(view));  // every check before the first write (shared with the GPU cache)
  const AnchorImageHeader& h = view.header;
  for (std::size_t i = 0; i < view.layers.size(); ++i) {
    const AnchorImageLayer& l = view.layers[i];
    const LayerPlan& lp = c.plan.layers[i];
    LayerBuffers& b = c.layers[i];
    const std::uint64_t cap = c.plan.window_capacity;
    const std::uint64_t stride = lp.attention_row_bytes;
    for (std::uint64_t k = 0; k < l.window_count; ++k) {
      std::uint64_t q = h.position - l.window_count + k;
      std::memcpy(b.attention.data() + lp.window_offset + (q % cap) * stride, l.window_rows.data() + k * stride,
                  stride);
    }
    if (!l.compressed_rows.empty()) {
      std::memcpy(b.attention.data() + lp.compressed_offset, l.compressed_rows.data(), l.compressed_rows.size());
    }
    if (!l.indexer_rows.empty()) std::memcpy(b.indexer.data(), l.indexer_rows.data(), l.indexer_rows.size());
    b.kv_state = load_floats(l.kv_state);
    b.score_state = load_floats(l.score_state);
    b.indexer_kv_state = load_floats(l.indexer_kv_state);
    b.indexer_score_state = load_floats(l.indexer_score_state);
  }
  c.position = h.position;
  c.poisoned = false;
  c.poison_reason.clear();
  c.rewind_floors.push_back(0);
  if (tokens != nullptr) *tokens = view.ledger();
  return ok_status();
}

Result<std::string> describe_anchor_image(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < kAnchorImageHeaderBytes) {
    return make_error(ErrorCode::Truncated, "{} bytes: too short for an anchor image header ({} bytes)", bytes.size(),
                      kAnchorImageHeaderBytes);
  }
  // Read the header fields plainly first so a damaged image still shows what it claims to be.
  if (!looks_like_anchor_image(bytes)) return corrupt("not an anchor image (bad magic)");
  std::string text;
  auto at = [&](std::size_t off, int n) { return load_le(bytes.data() + off, n); };
  const std::uint64_t position = at(56, 8);
  const std::uint64_t attention_code = at(40, 1);
  const std::uint64_t indexer_code = at(41, 1);
  auto storage_text = [](std::uint64_t code, bool indexer) -> std::string {
    if (!indexer && code <= 1) return std::string(row_storage_name(static_cast<RowStorage>(code)));
    if (indexer && code <= 2) return std::string(indexer_storage_name(static_cast<IndexerStorage>(code)));
    return fmt::format("unknown ({})", code);
  };
  text += "DeepSeek-V4 anchor image\n";
  text += fmt::format("  version            {}\n", at(8, 4));
  std::string known;
  for (const std::string& name : preset_names()) {
    if (preset_config(name)->fingerprint() == at(16, 8)) known = " (" + name + ")";
  }
  text += fmt::format("  model fingerprint  {:016x}{}\n", at(16, 8), known);
  text += fmt::format("  layers             {}\n", at(24, 4));
  text += fmt::format("  shape              head_dim {}, sliding_window {}, index_head_dim {}\n", at(28, 4), at(32, 4),
                      at(36, 4));
  text += fmt::format("  storage            attention {}, indexer {}\n", storage_text(attention_code, false),
                      storage_text(indexer_code, true));
  text += fmt::format("  source context     {}\n", at(48, 8));
  text += fmt::format("  position           {} tokens\n", position);
  const auto header_total = checked_sum({kAnchorImageHeaderBytes, at(72, 8), kAnchorImageChecksumBytes});
  text += fmt::format("  size               {} bytes (header says {})\n", bytes.size(),
                      header_total.ok() ? fmt::format("{}", *header_total)
                                        : fmt::format("a payload of {} bytes: beyond 2^64 in all", at(72, 8)));
  auto view = decode_anchor_image(bytes);
  if (!view.ok()) {
    text += fmt::format("  verification       FAILED: {}\n", view.error().to_string());
    return text;
  }
  std::uint32_t counts[3] = {0, 0, 0};
  std::uint64_t compressed = 0, indexer = 0;
  for (const AnchorImageLayer& l : view->layers) {
    counts[l.ratio == 0 ? 0 : (l.ratio == 4 ? 1 : 2)]++;
    compressed += l.compressed_count;
    indexer += l.indexer_count;
  }
  text += fmt::format("  layer types        {} window, {} csa (m=4), {} hca (m=128)\n", counts[0], counts[1], counts[2]);
  text += fmt::format("  rows               {} window per layer, {} compressed, {} indexer in total\n",
                      std::min<std::uint64_t>(position, kSlidingWindow), compressed, indexer);
  std::vector<std::uint32_t> ledger = view->ledger();
  std::string head;
  for (std::size_t i = 0; i < std::min<std::size_t>(ledger.size(), 8); ++i) head += fmt::format(" {}", ledger[i]);
  if (ledger.size() > 8) head += " ...";
  text += fmt::format("  token ledger       {} ids:{}\n", ledger.size(), head);
  text += fmt::format("  checksum           {:016x}\n", view->checksum);
  text += "  verification       ok\n";
  return text;
}

}  // namespace kvcompact::dsv4
