// Versioned, checksummed blobs for one layer's keys or values of one sequence ("KVCB" v1), and the
// seed system's TQK1 / TQV1 blobs. Byte layouts: docs/formats.md. Decoders never read out of bounds:
// every size comes from checked arithmetic on header fields and is compared with the input length.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvcompact/core/error.hpp"
#include "kvcompact/tq/config.hpp"

namespace kvcompact::tq {

enum class BlobKind : std::uint8_t { Keys = 0, Values = 1 };

inline constexpr std::uint16_t kBlobVersion = 1;
inline constexpr std::size_t kBlobHeaderBytes = 64;
inline constexpr std::size_t kBlobChecksumBytes = 8;

struct BlobHeader {
  BlobKind kind = BlobKind::Keys;
  KeyMode key_mode = KeyMode::Mse;  // keys only; Mse for value blobs
  std::uint8_t bits = 0;            // key_bits (total, incl. QJL) or value_bits
  bool norm_correction = false;
  std::uint32_t head_dim = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t seq_len = 0;
  std::uint32_t layer_index = 0;
  std::uint32_t codebook_id = 0;
  std::uint64_t seed = 0;
  std::uint32_t exact_window = 0;           // the cache's configured W
  std::uint32_t window_rows = 0;            // exact rows stored per head
  std::uint32_t window_first_position = 0;  // position of the first stored exact row

  std::uint32_t code_bits() const { return kind == BlobKind::Keys && key_mode == KeyMode::Prod ? bits - 1u : bits; }
  bool has_qjl() const { return kind == BlobKind::Keys && key_mode == KeyMode::Prod; }
};

// The content of one blob. Arrays are head-major, then time: [kv_heads][seq_len][...].
struct LayerBlob {
  BlobHeader header;
  std::vector<std::uint8_t> codes;            // [kv_heads][seq_len][head_dim·code_bits/8]
  std::vector<std::uint8_t> signs;            // [kv_heads][seq_len][head_dim/8]   (prod keys)
  std::vector<float> norms;                   // [kv_heads][seq_len]
  std::vector<std::uint16_t> residual_norms;  // [kv_heads][seq_len] f16 bits    (prod keys)
  std::vector<float> window;                  // [kv_heads][window_rows][head_dim] exact rows
};

// Header for a blob of `kind` written under `config` (codebook id looked up for head_dim).
Result<BlobHeader> make_blob_header(BlobKind kind, const QuantConfig& config, std::uint32_t head_dim,
                                    std::uint32_t kv_heads, std::uint32_t seq_len, std::uint32_t layer_index);

// Byte sizes of each array for a header (checked); used by encoders, decoders and the cache.
struct BlobSizes {
  std::uint64_t code_bytes = 0, sign_bytes = 0, norm_count = 0, residual_count = 0, window_floats = 0;
  std::uint64_t payload_bytes = 0;  // all arrays, as laid out in the blob
};
Result<BlobSizes> blob_sizes(const BlobHeader& header);

// Checks that the arrays have the header's sizes and the header is self-consistent.
Status validate_blob(const LayerBlob& blob);

Result<std::vector<std::uint8_t>> encode_layer_blob(const LayerBlob& blob);

// What a restore expects; any difference is a Mismatch error naming both values.
struct BlobExpectation {
  BlobKind kind = BlobKind::Keys;
  QuantConfig config;
  std::uint32_t head_dim = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t layer_index = 0;
};
Status check_blob_matches(const BlobHeader& header, const BlobExpectation& expected);

// Decodes and verifies (magic, version, sizes, checksum, codebook id); with `expected` also checks it.
Result<LayerBlob> decode_layer_blob(std::span<const std::uint8_t> bytes,
                                    const std::optional<BlobExpectation>& expected = std::nullopt);

// --- The seed system's formats (cera 0.4.0): TQK1 (prod3 keys) and TQV1 (mse2 values). ---
// They carry no seed, mode or layer, so the caller supplies them; norms are f16 there.
inline constexpr std::size_t kSeedBlobHeaderBytes = 16;
bool is_seed_blob(std::span<const std::uint8_t> bytes);
// Fails with OutOfRange when a norm does not fit the format's f16, and Unsupported for other modes.
Result<std::vector<std::uint8_t>> encode_seed_blob(const LayerBlob& blob);
Result<LayerBlob> decode_seed_blob(std::span<const std::uint8_t> bytes, std::uint64_t seed, std::uint32_t layer_index);

// Human-readable header + verification verdict for `kvcompact inspect` (either format).
std::string describe_blob(std::span<const std::uint8_t> bytes);
bool is_layer_blob(std::span<const std::uint8_t> bytes);

}  // namespace kvcompact::tq
