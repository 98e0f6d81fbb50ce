// Anchor image: the complete, portable state of a Deepseek4Cache at one position (header, token ledger,
// per layer the window rows, the compressed and indexer rows valid at the anchor and the four state
// buffers, closed by an xxh64 checksum). It hydrates a fresh cache of the same model in another
// process or with a larger context. Byte layout (version 1, little-endian) in docs/deepseek-v4.md.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvcompact/core/error.hpp"
#include "kvcompact/dsv4/cache.hpp"
#include "kvcompact/dsv4/plan.hpp"

namespace kvcompact::dsv4 {

inline constexpr std::uint8_t kAnchorImageMagic[8] = {'K', 'V', 'C', 'D', 'S', 'V', '4', 'A'};
inline constexpr std::uint32_t kAnchorImageVersion = 1;
inline constexpr std::size_t kAnchorImageHeaderBytes = 80;
inline constexpr std::size_t kAnchorImageLayerHeaderBytes = 48;
inline constexpr std::size_t kAnchorImageChecksumBytes = 8;
inline constexpr std::uint32_t kAnchorImageMaxLayers = 4096;

struct AnchorImageHeader {
  std::uint32_t version = kAnchorImageVersion;
  std::uint64_t model_fingerprint = 0;
  std::uint32_t num_layers = 0;
  StorageConfig storage;
  std::uint64_t source_context = 0;  // context of the cache that wrote it (informational)
  std::uint64_t position = 0;        // tokens covered; the ledger holds exactly this many ids
  std::uint64_t payload_bytes = 0;   // bytes between the header and the checksum
};

// One layer of a decoded image; spans point into the image bytes. States are raw little-endian f32.
struct AnchorImageLayer {
  std::uint32_t ratio = 0;
  std::uint64_t window_count = 0;      // min(position, 128) rows, oldest position first
  std::uint64_t compressed_count = 0;  // position / m
  std::uint64_t indexer_count = 0;     // position / 4 for m = 4
  std::uint64_t state_floats = 0;      // per main state buffer: (coff*m) * (coff*512)
  std::uint64_t indexer_state_floats = 0;  // per indexer state buffer: 8 * 256 for m = 4
  std::span<const std::uint8_t> window_rows;
  std::span<const std::uint8_t> compressed_rows;
  std::span<const std::uint8_t> indexer_rows;
  std::span<const std::uint8_t> kv_state;
  std::span<const std::uint8_t> score_state;
  std::span<const std::uint8_t> indexer_kv_state;
  std::span<const std::uint8_t> indexer_score_state;
};

struct AnchorImageView {
  AnchorImageHeader header;
  std::span<const std::uint8_t> ledger_bytes;  // position x u32 little-endian
  std::vector<AnchorImageLayer> layers;
  std::uint64_t checksum = 0;
  std::vector<std::uint32_t> ledger() const;
};

// Poisoned for a poisoned cache; InvalidArgument unless tokens.size() == cache.position().
Result<std::vector<std::uint8_t>> encode_anchor_image(const Deepseek4Cache& cache, std::span<const std::uint32_t> tokens);

// What one layer contributes to an image: the window rows valid at the anchor (oldest position first), the
// valid compressed and indexer rows, and the four state buffers. Spans may point into the cache itself or
// into the storage vectors, where a backend gathers or downloads what is not contiguous on the host.
struct AnchorImageLayerData {
  std::span<const std::uint8_t> window_rows, compressed_rows, indexer_rows;
  std::span<const float> kv_state, score_state, indexer_kv_state, indexer_score_state;
  std::vector<std::uint8_t> storage;
  std::vector<float> state_storage;
};
using AnchorImageLayerSource = std::function<Status(std::uint32_t layer, AnchorImageLayerData& out)>;

// The one image writer every backend's encode_anchor_image uses: header, ledger, then for each layer its
// header and what `source` fills (called once per layer, in order; Internal when a size differs from what the
// plan and the position imply), then the checksum. InvalidArgument unless tokens.size() == position.
Result<std::vector<std::uint8_t>> write_anchor_image(const CachePlan& plan, std::uint64_t position,
                                                     std::span<const std::uint32_t> tokens,
                                                     const AnchorImageLayerSource& source);

// Validates everything before handing out a view: Truncated (shorter than its lengths say), Corrupt
// (bad magic, a count that contradicts the header, trailing bytes, checksum mismatch), Unsupported
// (another version or shape). Never reads outside `bytes`; the view borrows `bytes`.
Result<AnchorImageView> decode_anchor_image(std::span<const std::uint8_t> bytes);

// Replaces the contents of `cache` with the image: Mismatch when the model fingerprint, the storage or a
// layer's ratio differ; ContextBound when the cache's context is below the image's position. Clears
// poison; earlier snapshots of `cache` no longer restore. The ledger goes to `tokens` when given.
Status hydrate_from_anchor_image(Deepseek4Cache& cache, std::span<const std::uint8_t> bytes,
                                 std::vector<std::uint32_t>* tokens = nullptr);

// For `kvcompact inspect`: a human-readable header summary and the verification result. An error only
// when not even the fixed header can be read; a damaged body is reported in the text.
Result<std::string> describe_anchor_image(std::span<const std::uint8_t> bytes);
// True when `bytes` start with the anchor-image magic.
bool looks_like_anchor_image(std::span<const std::uint8_t> bytes);

}  // namespace kvcompact::dsv4
