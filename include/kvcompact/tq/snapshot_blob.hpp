// Per-layer snapshots of a TurboQuantCache as blobs: one KVCB blob for the keys and one for the values of
// a (layer, sequence). Restoring checks every header field against the cache (seed, layer, mode, shape,
// window) so a blob from another configuration is a Mismatch error, never silently wrong attention.
// The seed system's TQK1 / TQV1 blobs restore too, into a cache configured with the seed preset.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcompact/core/error.hpp"
#include "kvcompact/tq/blob.hpp"
#include "kvcompact/tq/cache.hpp"

namespace kvcompact::tq {

struct LayerBlobs {
  std::vector<std::uint8_t> keys;
  std::vector<std::uint8_t> values;
};

// LayerSnapshot <-> blob contents (pure conversions, no cache).
Result<LayerBlob> snapshot_to_blob(const LayerSnapshot& snapshot, BlobKind kind);
// Joins a key blob and a value blob of the same layer into one snapshot; they must agree on seed, layer,
// head_dim, kv_heads, length, window and norm correction.
Result<LayerSnapshot> blobs_to_snapshot(const LayerBlob& keys, const LayerBlob& values);

// Encodes (layer, seq) of `cache` as KVCB blobs.
Result<LayerBlobs> snapshot_layer_blobs(const TurboQuantCache& cache, std::uint32_t layer, std::uint32_t seq);

// Restores (layer, seq) from two blobs, each either KVCB or the seed's TQK1 / TQV1 (which carry no seed:
// the cache's own seed and the layer index are assumed, so the cache must use the seed preset). Nothing
// in the cache changes unless both blobs decode and match.
Status restore_layer_blobs(TurboQuantCache& cache, std::uint32_t layer, std::uint32_t seq,
                           std::span<const std::uint8_t> key_blob, std::span<const std::uint8_t> value_blob);

}  // namespace kvcompact::tq
