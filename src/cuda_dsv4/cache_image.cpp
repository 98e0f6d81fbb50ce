// Snapshots and anchor images of a DeviceDeepseek4Cache in the CPU cache's formats: the device buffers are
// downloaded into a dsv4::Snapshot / the version-1 anchor-image bytes (docs/deepseek-v4.md), and restores /
// hydrates make every check of the CPU's (shared bookkeeping, dsv4::decode_anchor_image) before the first
// upload, so the two backends' snapshots and images are interchangeable.
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "cache_internal.hpp"
#include "kvcompact/core/checksum.hpp"
#include "kvcompact/dsv4/anchor_image.hpp"

namespace kvcompact::cuda::dsv4 {

namespace {

// The visible window rows of a layer, oldest position first (one download of the ring, then a gather).
Result<std::vector<std::uint8_t>> gather_window(const DeviceDeepseek4Cache::Impl& c, std::size_t layer) {
  const kd::LayerPlan& lp = c.plan.layers[layer];
  const std::uint64_t valid = c.window_valid();
  const std::uint64_t stride = lp.attention_row_bytes;
  std::vector<std::uint8_t> out(valid * stride);
  for (const RingRun& r : ring_runs(c.position, valid, c.plan.window_capacity)) {
    KVC_TRY(c.layers[layer].attention.download(out.data() + r.first_row * stride, r.rows * stride,
                                               lp.window_offset + r.slot * stride));
  }
  return out;
}

// Writes rows gathered as above (positions ending at `position`) into the ring.
Status scatter_window(DeviceDeepseek4Cache::Impl& c, std::size_t layer, std::span<const std::uint8_t> rows,
                      std::uint64_t position) {
  const kd::LayerPlan& lp = c.plan.layers[layer];
  const std::uint64_t stride = lp.attention_row_bytes;
  const std::uint64_t valid = rows.size() / stride;
  for (const RingRun& r : ring_runs(position, valid, c.plan.window_capacity)) {
    KVC_TRY(c.layers[layer].attention.upload(rows.data() + r.first_row * stride, r.rows * stride,
                                             lp.window_offset + r.slot * stride));
  }
  return ok_status();
}

Result<std::vector<float>> download_floats(const DeviceBuffer& b) {
  std::vector<float> out(b.size() / sizeof(float));
  KVC_TRY(b.download(out.data(), b.size()));
  return out;
}


// Device buffer <- little-endian f32 bytes of an image (the device is little-endian, as is the format).
Status upload_le_floats(DeviceBuffer& b, std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return ok_status();
  if constexpr (std::endian::native == std::endian::little) {
    return b.upload(bytes.data(), bytes.size());
  } else {
    std::vector<std::uint8_t> swapped(bytes.begin(), bytes.end());
    for (std::size_t i = 0; i + 4 <= swapped.size(); i += 4) {
      std::swap(swapped[i], swapped[i + 3]);
      std::swap(swapped[i + 1], swapped[i + 2]);
    }
    return b.upload(swapped.data(), swapped.size());
  }
}

}  // namespace

Result<kd::Snapshot> take_snapshot(const DeviceDeepseek4Cache& cache) {
  const auto& c = CacheAccessDevice::impl(cache);
  if (c.poisoned) return make_error(ErrorCode::Poisoned, "cannot snapshot a poisoned cache ({})", c.poison_reason);
  kd::Snapshot s;
  s.plan = c.plan;
  s.cache_id = c.id;
  s.rewinds_seen = c.rewind_floors.size();
  s.position = c.position;
  s.layers.resize(c.layers.size());
  for (std::size_t i = 0; i < c.layers.size(); ++i) {
    KVC_ASSIGN_OR_RETURN(s.layers[i].window, gather_window(c, i));
    KVC_ASSIGN_OR_RETURN(s.layers[i].kv_state, download_floats(c.layers[i].kv_state));
    KVC_ASSIGN_OR_RETURN(s.layers[i].score_state, download_floats(c.layers[i].score_state));
    KVC_ASSIGN_OR_RETURN(s.layers[i].indexer_kv_state, download_floats(c.layers[i].indexer_kv_state));
    KVC_ASSIGN_OR_RETURN(s.layers[i].indexer_score_state, download_floats(c.layers[i].indexer_score_state));
  }
  return s;
}

Status restore_snapshot(DeviceDeepseek4Cache& cache, const kd::Snapshot& snapshot) {
  auto& c = CacheAccessDevice::impl(cache);
  KVC_TRY(c.check_snapshot_restore(snapshot));  // everything is checked before the first upload
  Status uploaded = [&]() -> Status {
    for (std::size_t i = 0; i < c.layers.size(); ++i) {
      const kd::LayerSnapshot& ls = snapshot.layers[i];
      DeviceLayerBuffers& b = c.layers[i];
      KVC_TRY(scatter_window(c, i, ls.window, snapshot.position));
      KVC_TRY(b.kv_state.upload(ls.kv_state.data(), ls.kv_state.size() * sizeof(float)));
      KVC_TRY(b.score_state.upload(ls.score_state.data(), ls.score_state.size() * sizeof(float)));
      KVC_TRY(b.indexer_kv_state.upload(ls.indexer_kv_state.data(), ls.indexer_kv_state.size() * sizeof(float)));
      KVC_TRY(b.indexer_score_state.upload(ls.indexer_score_state.data(),
                                           ls.indexer_score_state.size() * sizeof(float)));
    }
    return ok_status();
  }();
  if (!uploaded.ok()) {
    c.poison("restore failed while uploading: " + uploaded.error().to_string());
    return uploaded;
  }
  c.rewind(snapshot.position, snapshot.position);
  return ok_status();
}

Result<std::vector<std::uint8_t>> encode_anchor_image(const DeviceDeepseek4Cache& cache,
                                                      std::span<const std::uint32_t> tokens) {
  const auto& c = CacheAccessDevice::impl(cache);
  if (c.poisoned) {
    return make_error(ErrorCode::Poisoned, "cannot write an anchor image of a poisoned cache ({})", c.poison_reason);
  }
  const auto layer_contents = [&](std::uint32_t i, kd::AnchorImageLayerData& d) -> Status {
    const kd::LayerPlan& lp = c.plan.layers[i];
    const DeviceLayerBuffers& b = c.layers[i];
    const std::uint64_t compressed = lp.ratio == 0 ? 0 : c.position / lp.ratio;
    const std::uint64_t indexer = lp.ratio == 4 ? c.position / 4 : 0;
    // storage = window rows, then compressed rows, then indexer rows (downloads); the states likewise.
    KVC_ASSIGN_OR_RETURN(d.storage, gather_window(c, i));
    const std::size_t window_bytes = d.storage.size();
    const std::size_t compressed_bytes = compressed * lp.attention_row_bytes;
    d.storage.resize(window_bytes + compressed_bytes + indexer * lp.indexer_row_bytes);
    KVC_TRY(b.attention.download(d.storage.data() + window_bytes, compressed_bytes, lp.compressed_offset));
    KVC_TRY(b.indexer.download(d.storage.data() + window_bytes + compressed_bytes,
                               d.storage.size() - window_bytes - compressed_bytes));
    const std::span<const std::uint8_t> all(d.storage);
    d.window_rows = all.first(window_bytes);
    d.compressed_rows = all.subspan(window_bytes, compressed_bytes);
    d.indexer_rows = all.subspan(window_bytes + compressed_bytes);
    std::size_t sizes[4];
    std::size_t k = 0;
    for (const DeviceBuffer* state : {&b.kv_state, &b.score_state, &b.indexer_kv_state, &b.indexer_score_state}) {
      KVC_ASSIGN_OR_RETURN(std::vector<float> values, download_floats(*state));
      sizes[k++] = values.size();
      d.state_storage.insert(d.state_storage.end(), values.begin(), values.end());
    }
    const std::span<const float> states(d.state_storage);
    d.kv_state = states.first(sizes[0]);
    d.score_state = states.subspan(sizes[0], sizes[1]);
    d.indexer_kv_state = states.subspan(sizes[0] + sizes[1], sizes[2]);
    d.indexer_score_state = states.subspan(sizes[0] + sizes[1] + sizes[2], sizes[3]);
    return ok_status();
  };
  return kd::write_anchor_image(c.plan, c.position, tokens, layer_contents);
}

Status hydrate_from_anchor_image(DeviceDeepseek4Cache& cache, std::span<const std::uint8_t> bytes,
                                 std::vector<std::uint32_t>* tokens) {
  KVC_ASSIGN_OR_RETURN(kd::AnchorImageView view, kd::decode_anchor_image(bytes));
  auto& c = CacheAccessDevice::impl(cache);
  KVC_TRY(c.check_image_target(view));  // everything is checked before the first upload
  const std::uint64_t position = view.header.position;
  Status uploaded = [&]() -> Status {
    for (std::size_t i = 0; i < view.layers.size(); ++i) {
      const kd::AnchorImageLayer& l = view.layers[i];
      const kd::LayerPlan& lp = c.plan.layers[i];
      DeviceLayerBuffers& b = c.layers[i];
      KVC_TRY(scatter_window(c, i, l.window_rows, position));
      if (!l.compressed_rows.empty()) {
        KVC_TRY(b.attention.upload(l.compressed_rows.data(), l.compressed_rows.size(), lp.compressed_offset));
      }
      if (!l.indexer_rows.empty()) KVC_TRY(b.indexer.upload(l.indexer_rows.data(), l.indexer_rows.size()));
      KVC_TRY(upload_le_floats(b.kv_state, l.kv_state));
      KVC_TRY(upload_le_floats(b.score_state, l.score_state));
      KVC_TRY(upload_le_floats(b.indexer_kv_state, l.indexer_kv_state));
      KVC_TRY(upload_le_floats(b.indexer_score_state, l.indexer_score_state));
    }
    return ok_status();
  }();
  if (!uploaded.ok()) {
    // Compressed and indexer rows of earlier layers may already hold the image's: no earlier snapshot may
    // restore over them (the poison alone would let one).
    c.poison_rows_rewritten("hydrate failed while uploading: " + uploaded.error().to_string());
    return uploaded;
  }
  c.rewind(position, 0);
  if (tokens != nullptr) *tokens = view.ledger();
  return ok_status();
}

}  // namespace kvcompact::cuda::dsv4
