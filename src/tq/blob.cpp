// KVCB v1 and seed-system TQK1 / TQV1 blob encoders and decoders (docs/formats.md).
#include "kvcompact/tq/blob.hpp"

#include <array>
#include <cmath>

#include "kvcompact/core/byte_io.hpp"
#include "kvcompact/core/checked.hpp"
#include "kvcompact/core/checksum.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/tq/codebook.hpp"
#include "kvcompact/tq/layout.hpp"

namespace kvcompact::tq {

namespace {

constexpr std::array<std::uint8_t, 4> kMagic = {'K', 'V', 'C', 'B'};
constexpr std::array<std::uint8_t, 4> kSeedKeyMagic = {'T', 'Q', 'K', '1'};
constexpr std::array<std::uint8_t, 4> kSeedValueMagic = {'T', 'Q', 'V', '1'};
constexpr std::uint8_t kFlagNormCorrection = 1;

bool has_magic(std::span<const std::uint8_t> bytes, const std::array<std::uint8_t, 4>& magic) {
  return bytes.size() >= 4 && std::equal(magic.begin(), magic.end(), bytes.begin());
}

const char* kind_name(BlobKind kind) { return kind == BlobKind::Keys ? "keys" : "values"; }

// The mode string of one blob kind, e.g. "prod3" or "mse2".
std::string mode_name(const BlobHeader& h) {
  return fmt::format("{}{}", h.has_qjl() ? "prod" : "mse", static_cast<unsigned>(h.bits));
}

// Structural checks on header fields alone (no codebook solve, no data).
Status validate_header_fields(const BlobHeader& h) {
  if (h.kind != BlobKind::Keys && h.kind != BlobKind::Values) {
    return make_error(ErrorCode::Corrupt, "blob kind {} is neither keys (0) nor values (1)", static_cast<int>(h.kind));
  }
  if (h.key_mode != KeyMode::Mse && h.key_mode != KeyMode::Prod) {
    return make_error(ErrorCode::Corrupt, "blob key mode {} is neither mse (0) nor prod (1)",
                      static_cast<int>(h.key_mode));
  }
  if (h.kind == BlobKind::Values && h.key_mode != KeyMode::Mse) {
    return make_error(ErrorCode::Corrupt, "a value blob declares key mode prod");
  }
  const bool keys = h.kind == BlobKind::Keys;
  if (keys ? (h.bits < 2 || h.bits > 5) : (h.bits < 2 || h.bits > 4)) {
    return make_error(ErrorCode::Corrupt, "{} blob has unsupported bit width {}", kind_name(h.kind),
                      static_cast<unsigned>(h.bits));
  }
  if (h.norm_correction && h.has_qjl()) {
    return make_error(ErrorCode::Corrupt, "prod key blob declares norm correction");
  }
  KVC_TRY(validate_head_dim(h.head_dim));
  if (h.kv_heads == 0) return make_error(ErrorCode::Corrupt, "blob has 0 kv_heads");
  if (h.window_rows > h.exact_window || h.window_rows > h.seq_len) {
    return make_error(ErrorCode::Corrupt, "blob stores {} exact rows but its window is {} and its length {}",
                      h.window_rows, h.exact_window, h.seq_len);
  }
  if (h.window_rows > 0 && static_cast<std::uint64_t>(h.window_first_position) + h.window_rows != h.seq_len) {
    return make_error(ErrorCode::Corrupt, "exact rows {}..{} do not end at the sequence length {}",
                      h.window_first_position, static_cast<std::uint64_t>(h.window_first_position) + h.window_rows,
                      h.seq_len);
  }
  return ok_status();
}

template <typename T>
Status check_size(const std::vector<T>& v, std::uint64_t expected, std::string_view what) {
  if (v.size() != expected) {
    return make_error(ErrorCode::InvalidArgument, "blob {} holds {} elements, the header implies {}", what, v.size(),
                      expected);
  }
  return ok_status();
}

// Norms and exact rows must be finite (and norms non-negative): NaN here would poison attention.
Status validate_blob_values(const LayerBlob& blob, ErrorCode code) {
  for (std::size_t i = 0; i < blob.norms.size(); ++i) {
    if (!std::isfinite(blob.norms[i]) || blob.norms[i] < 0.0f) {
      return make_error(code, "norm {} is {}; norms must be finite and non-negative", i, blob.norms[i]);
    }
  }
  for (std::size_t i = 0; i < blob.residual_norms.size(); ++i) {
    const float rho = f16_to_f32(blob.residual_norms[i]);
    if (!std::isfinite(rho) || rho < 0.0f) {
      return make_error(code, "residual norm {} is {}; it must be finite and non-negative", i, rho);
    }
  }
  for (std::size_t i = 0; i < blob.window.size(); ++i) {
    if (!std::isfinite(blob.window[i])) {
      return make_error(code, "exact window value {} is {}", i, blob.window[i]);
    }
  }
  return ok_status();
}

Status check_codebook_id(const BlobHeader& h) {
  KVC_ASSIGN_OR_RETURN(const Codebook* codebook, lloyd_max_codebook(h.head_dim, h.code_bits()));
  if (codebook->id() != h.codebook_id) {
    return make_error(ErrorCode::Mismatch,
                      "blob codebook id {:#010x} differs from this build's {:#010x} for head_dim {} at {} code bits",
                      h.codebook_id, codebook->id(), h.head_dim, h.code_bits());
  }
  return ok_status();
}

}  // namespace

Result<BlobHeader> make_blob_header(BlobKind kind, const QuantConfig& config, std::uint32_t head_dim,
                                    std::uint32_t kv_heads, std::uint32_t seq_len, std::uint32_t layer_index) {
  KVC_TRY(config.validate());
  KVC_TRY(validate_head_dim(head_dim));
  BlobHeader h;
  h.kind = kind;
  h.key_mode = kind == BlobKind::Keys ? config.key_mode : KeyMode::Mse;
  h.bits = kind == BlobKind::Keys ? config.key_bits : config.value_bits;
  h.norm_correction = config.norm_correction;
  h.head_dim = head_dim;
  h.kv_heads = kv_heads;
  h.seq_len = seq_len;
  h.layer_index = layer_index;
  h.seed = config.seed;
  h.exact_window = config.exact_window;
  KVC_ASSIGN_OR_RETURN(const Codebook* codebook, lloyd_max_codebook(head_dim, h.code_bits()));
  h.codebook_id = codebook->id();
  return h;
}

Result<BlobSizes> blob_sizes(const BlobHeader& h) {
  BlobSizes s;
  KVC_ASSIGN_OR_RETURN(std::uint64_t tokens, checked_mul(h.kv_heads, h.seq_len));
  KVC_ASSIGN_OR_RETURN(s.code_bytes, checked_mul(tokens, packed_code_bytes(h.head_dim, h.code_bits())));
  if (h.has_qjl()) {
    KVC_ASSIGN_OR_RETURN(s.sign_bytes, checked_mul(tokens, packed_sign_bytes(h.head_dim)));
    s.residual_count = tokens;
  }
  s.norm_count = tokens;
  KVC_ASSIGN_OR_RETURN(s.window_floats, checked_product({h.kv_heads, h.window_rows, h.head_dim}));
  KVC_ASSIGN_OR_RETURN(std::uint64_t norm_bytes, checked_mul(s.norm_count, 4));
  KVC_ASSIGN_OR_RETURN(std::uint64_t window_bytes, checked_mul(s.window_floats, 4));
  KVC_ASSIGN_OR_RETURN(s.payload_bytes,
                       checked_sum({s.code_bytes, s.sign_bytes, norm_bytes, s.residual_count * 2, window_bytes}));
  return s;
}

Status validate_blob(const LayerBlob& blob) {
  KVC_TRY(validate_header_fields(blob.header));
  KVC_ASSIGN_OR_RETURN(BlobSizes s, blob_sizes(blob.header));
  KVC_TRY(check_size(blob.codes, s.code_bytes, "codes"));
  KVC_TRY(check_size(blob.signs, s.sign_bytes, "signs"));
  KVC_TRY(check_size(blob.norms, s.norm_count, "norms"));
  KVC_TRY(check_size(blob.residual_norms, s.residual_count, "residual norms"));
  KVC_TRY(check_size(blob.window, s.window_floats, "window"));
  return validate_blob_values(blob, ErrorCode::InvalidArgument);
}

Result<std::vector<std::uint8_t>> encode_layer_blob(const LayerBlob& blob) {
  KVC_TRY(validate_blob(blob));
  KVC_ASSIGN_OR_RETURN(BlobSizes s, blob_sizes(blob.header));
  const BlobHeader& h = blob.header;
  ByteWriter w;
  w.reserve(kBlobHeaderBytes + s.payload_bytes + kBlobChecksumBytes);
  w.put_bytes(kMagic);
  w.put<std::uint16_t>(kBlobVersion);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(h.kind));
  w.put<std::uint8_t>(h.norm_correction ? kFlagNormCorrection : 0);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(h.key_mode));
  w.put<std::uint8_t>(h.bits);
  w.put<std::uint16_t>(0);
  w.put<std::uint32_t>(h.head_dim);
  w.put<std::uint32_t>(h.kv_heads);
  w.put<std::uint32_t>(h.seq_len);
  w.put<std::uint32_t>(h.layer_index);
  w.put<std::uint32_t>(h.codebook_id);
  w.put<std::uint64_t>(h.seed);
  w.put<std::uint32_t>(h.exact_window);
  w.put<std::uint32_t>(h.window_rows);
  w.put<std::uint32_t>(h.window_first_position);
  w.put<std::uint32_t>(0);
  w.put<std::uint64_t>(s.payload_bytes);
  KVC_ASSERT(w.size() == kBlobHeaderBytes, "blob header size");
  w.put_array<std::uint8_t>(blob.codes);
  w.put_array<std::uint8_t>(blob.signs);
  w.put_array<float>(blob.norms);
  w.put_array<std::uint16_t>(blob.residual_norms);
  w.put_array<float>(blob.window);
  w.put<std::uint64_t>(xxh64(w.bytes()));
  return std::move(w.bytes());
}

Status check_blob_matches(const BlobHeader& h, const BlobExpectation& e) {
  const auto mismatch = [](std::string_view field, auto blob_value, auto expected_value) {
    return make_error(ErrorCode::Mismatch, "blob {} is {} but the cache expects {}", field, blob_value,
                      expected_value);
  };
  if (h.kind != e.kind) return mismatch("kind", kind_name(h.kind), kind_name(e.kind));
  KVC_ASSIGN_OR_RETURN(BlobHeader want,
                       make_blob_header(e.kind, e.config, e.head_dim, e.kv_heads, h.seq_len, e.layer_index));
  if (h.seed != want.seed) return mismatch("seed", h.seed, want.seed);
  if (h.layer_index != want.layer_index) return mismatch("layer index", h.layer_index, want.layer_index);
  if (h.key_mode != want.key_mode || h.bits != want.bits) return mismatch("mode", mode_name(h), mode_name(want));
  if (h.norm_correction != want.norm_correction) return mismatch("norm correction", h.norm_correction, want.norm_correction);
  if (h.head_dim != want.head_dim) return mismatch("head_dim", h.head_dim, want.head_dim);
  if (h.kv_heads != want.kv_heads) return mismatch("kv_heads", h.kv_heads, want.kv_heads);
  if (h.exact_window != want.exact_window) return mismatch("exact window", h.exact_window, want.exact_window);
  if (h.codebook_id != want.codebook_id) return mismatch("codebook id", h.codebook_id, want.codebook_id);
  return ok_status();
}

Result<LayerBlob> decode_layer_blob(std::span<const std::uint8_t> bytes, const std::optional<BlobExpectation>& expected) {
  if (bytes.size() < kBlobHeaderBytes + kBlobChecksumBytes) {
    return make_error(ErrorCode::Truncated, "a KVCB blob has at least {} bytes, got {}",
                      kBlobHeaderBytes + kBlobChecksumBytes, bytes.size());
  }
  if (!has_magic(bytes, kMagic)) return make_error(ErrorCode::Corrupt, "not a KVCB blob (bad magic)");
  ByteReader r(bytes.subspan(4));
  LayerBlob blob;
  BlobHeader& h = blob.header;
  KVC_ASSIGN_OR_RETURN(std::uint16_t version, r.get<std::uint16_t>("version"));
  if (version != kBlobVersion) {
    return make_error(ErrorCode::Unsupported, "KVCB version {} is not supported (this build reads {})", version,
                      kBlobVersion);
  }
  KVC_ASSIGN_OR_RETURN(std::uint8_t kind, r.get<std::uint8_t>("kind"));
  KVC_ASSIGN_OR_RETURN(std::uint8_t flags, r.get<std::uint8_t>("flags"));
  KVC_ASSIGN_OR_RETURN(std::uint8_t key_mode, r.get<std::uint8_t>("key mode"));
  KVC_ASSIGN_OR_RETURN(h.bits, r.get<std::uint8_t>("bits"));
  KVC_ASSIGN_OR_RETURN(std::uint16_t reserved0, r.get<std::uint16_t>("reserved"));
  KVC_ASSIGN_OR_RETURN(h.head_dim, r.get<std::uint32_t>("head_dim"));
  KVC_ASSIGN_OR_RETURN(h.kv_heads, r.get<std::uint32_t>("kv_heads"));
  KVC_ASSIGN_OR_RETURN(h.seq_len, r.get<std::uint32_t>("seq_len"));
  KVC_ASSIGN_OR_RETURN(h.layer_index, r.get<std::uint32_t>("layer index"));
  KVC_ASSIGN_OR_RETURN(h.codebook_id, r.get<std::uint32_t>("codebook id"));
  KVC_ASSIGN_OR_RETURN(h.seed, r.get<std::uint64_t>("seed"));
  KVC_ASSIGN_OR_RETURN(h.exact_window, r.get<std::uint32_t>("exact window"));
  KVC_ASSIGN_OR_RETURN(h.window_rows, r.get<std::uint32_t>("window rows"));
  KVC_ASSIGN_OR_RETURN(h.window_first_position, r.get<std::uint32_t>("window first position"));
  KVC_ASSIGN_OR_RETURN(std::uint32_t reserved1, r.get<std::uint32_t>("reserved"));
  KVC_ASSIGN_OR_RETURN(std::uint64_t payload_bytes, r.get<std::uint64_t>("payload bytes"));
  if (reserved0 != 0 || reserved1 != 0 || (flags & ~kFlagNormCorrection) != 0) {
    return make_error(ErrorCode::Corrupt, "reserved header bits are set (flags {:#x})", flags);
  }
  h.kind = static_cast<BlobKind>(kind);
  h.key_mode = static_cast<KeyMode>(key_mode);
  h.norm_correction = (flags & kFlagNormCorrection) != 0;
  KVC_TRY(validate_header_fields(h));
  KVC_ASSIGN_OR_RETURN(BlobSizes s, blob_sizes(h));
  if (payload_bytes != s.payload_bytes) {
    return make_error(ErrorCode::Corrupt, "header says {} payload bytes but its shape implies {}", payload_bytes,
                      s.payload_bytes);
  }
  KVC_ASSIGN_OR_RETURN(std::uint64_t total, checked_sum({kBlobHeaderBytes, s.payload_bytes, kBlobChecksumBytes}));
  if (bytes.size() < total) {
    return make_error(ErrorCode::Truncated, "blob has {} bytes, its header implies {}", bytes.size(), total);
  }
  if (bytes.size() > total) {
    return make_error(ErrorCode::Corrupt, "blob has {} trailing bytes after its checksum", bytes.size() - total);
  }
  std::uint64_t stored_checksum = 0;
  std::memcpy(&stored_checksum, bytes.data() + total - kBlobChecksumBytes, sizeof(stored_checksum));
  const std::uint64_t actual_checksum = xxh64(bytes.subspan(0, total - kBlobChecksumBytes));
  if (stored_checksum != actual_checksum) {
    return make_error(ErrorCode::Corrupt, "checksum {:#018x} does not match the content ({:#018x})", stored_checksum,
                      actual_checksum);
  }
  ByteReader payload(bytes.subspan(kBlobHeaderBytes, s.payload_bytes));
  KVC_TRY(payload.get_array("codes", s.code_bytes, blob.codes));
  KVC_TRY(payload.get_array("signs", s.sign_bytes, blob.signs));
  KVC_TRY(payload.get_array("norms", s.norm_count, blob.norms));
  KVC_TRY(payload.get_array("residual norms", s.residual_count, blob.residual_norms));
  KVC_TRY(payload.get_array("window", s.window_floats, blob.window));
  KVC_TRY(validate_blob_values(blob, ErrorCode::Corrupt));
  KVC_TRY(check_codebook_id(h));
  if (expected) KVC_TRY(check_blob_matches(h, *expected));
  return blob;
}

// ----- seed system formats -----

bool is_seed_blob(std::span<const std::uint8_t> bytes) {
  return has_magic(bytes, kSeedKeyMagic) || has_magic(bytes, kSeedValueMagic);
}
bool is_layer_blob(std::span<const std::uint8_t> bytes) { return has_magic(bytes, kMagic); }

Result<std::vector<std::uint8_t>> encode_seed_blob(const LayerBlob& blob) {
  KVC_TRY(validate_blob(blob));
  const BlobHeader& h = blob.header;
  const bool keys = h.kind == BlobKind::Keys;
  if (keys ? !(h.key_mode == KeyMode::Prod && h.bits == 3) : h.bits != 2) {
    return make_error(ErrorCode::Unsupported, "the seed's {} format holds only {} (this blob is {})",
                      keys ? "TQK1" : "TQV1", keys ? "prod3" : "mse2", mode_name(h));
  }
  if (h.norm_correction) return make_error(ErrorCode::Unsupported, "the seed format has no norm correction");
  if (h.window_rows > 0) {
    return make_error(ErrorCode::Unsupported, "the seed format cannot carry the {} exact window rows",
                      h.window_rows);
  }
  ByteWriter w;
  w.put_bytes(keys ? kSeedKeyMagic : kSeedValueMagic);
  w.put<std::uint32_t>(h.kv_heads);
  w.put<std::uint32_t>(h.head_dim);
  w.put<std::uint32_t>(h.seq_len);
  w.put_array<std::uint8_t>(blob.codes);
  w.put_array<std::uint8_t>(blob.signs);
  for (std::size_t i = 0; i < blob.norms.size(); ++i) {
    const std::uint16_t half = f32_to_f16(blob.norms[i]);
    if (!std::isfinite(f16_to_f32(half))) {
      return make_error(ErrorCode::OutOfRange, "norm {} = {:g} exceeds the f16 range of the seed format", i,
                        blob.norms[i]);
    }
    w.put<std::uint16_t>(half);
  }
  w.put_array<std::uint16_t>(blob.residual_norms);
  return std::move(w.bytes());
}

Result<LayerBlob> decode_seed_blob(std::span<const std::uint8_t> bytes, std::uint64_t seed, std::uint32_t layer_index) {
  if (bytes.size() < kSeedBlobHeaderBytes) {
    return make_error(ErrorCode::Truncated, "a seed blob has at least {} bytes, got {}", kSeedBlobHeaderBytes,
                      bytes.size());
  }
  const bool keys = has_magic(bytes, kSeedKeyMagic);
  if (!keys && !has_magic(bytes, kSeedValueMagic)) {
    return make_error(ErrorCode::Corrupt, "not a TQK1 / TQV1 blob (bad magic)");
  }
  ByteReader r(bytes.subspan(4));
  KVC_ASSIGN_OR_RETURN(std::uint32_t kv_heads, r.get<std::uint32_t>("kv_heads"));
  KVC_ASSIGN_OR_RETURN(std::uint32_t head_dim, r.get<std::uint32_t>("head_dim"));
  KVC_ASSIGN_OR_RETURN(std::uint32_t seq_len, r.get<std::uint32_t>("seq_len"));
  if (head_dim % (keys ? 8 : 4) != 0) {
    return make_error(ErrorCode::Corrupt, "{} head_dim {} is not a multiple of {}", keys ? "TQK1" : "TQV1", head_dim,
                      keys ? 8 : 4);
  }
  if (kv_heads == 0) return make_error(ErrorCode::Corrupt, "seed blob has 0 kv_heads");
  QuantConfig config = QuantConfig::seed_system(seed);
  KVC_ASSIGN_OR_RETURN(BlobHeader h, make_blob_header(keys ? BlobKind::Keys : BlobKind::Values, config, head_dim,
                                                      kv_heads, seq_len, layer_index));
  KVC_ASSIGN_OR_RETURN(BlobSizes s, blob_sizes(h));
  // The seed stores f16 norms: payload = codes + signs + 2·norms + 2·residuals.
  KVC_ASSIGN_OR_RETURN(std::uint64_t expected,
                       checked_sum({kSeedBlobHeaderBytes, s.code_bytes, s.sign_bytes, 2 * s.norm_count,
                                    2 * s.residual_count}));
  if (bytes.size() != expected) {
    return make_error(bytes.size() < expected ? ErrorCode::Truncated : ErrorCode::Corrupt,
                      "{} blob with {} heads × {} tokens × head_dim {} has {} bytes, expected {}",
                      keys ? "TQK1" : "TQV1", kv_heads, seq_len, head_dim, bytes.size(), expected);
  }
  LayerBlob blob;
  blob.header = h;
  KVC_TRY(r.get_array("codes", s.code_bytes, blob.codes));
  KVC_TRY(r.get_array("signs", s.sign_bytes, blob.signs));
  std::vector<std::uint16_t> half_norms;
  KVC_TRY(r.get_array("norms", s.norm_count, half_norms));
  blob.norms.resize(half_norms.size());
  for (std::size_t i = 0; i < half_norms.size(); ++i) blob.norms[i] = f16_to_f32(half_norms[i]);
  KVC_TRY(r.get_array("residual norms", s.residual_count, blob.residual_norms));
  KVC_TRY(validate_blob_values(blob, ErrorCode::Corrupt));
  return blob;
}

std::string describe_blob(std::span<const std::uint8_t> bytes) {
  std::string out;
  if (is_layer_blob(bytes)) {
    auto blob = decode_layer_blob(bytes);
    if (bytes.size() >= kBlobHeaderBytes) {
      // Show the raw header even when verification fails, so a damaged file can be diagnosed.
      ByteReader r(bytes.subspan(4));
      const auto version = r.get<std::uint16_t>("version");
      out += fmt::format("format            KVCB (kvcompact layer blob) version {}\n", version.ok() ? *version : 0);
    }
    if (blob.ok()) {
      const BlobHeader& h = blob->header;
      out += fmt::format("kind              {}\n", kind_name(h.kind));
      out += fmt::format("mode              {}{}\n", mode_name(h), h.norm_correction ? " (norm-corrected)" : "");
      out += fmt::format("head_dim          {}\nkv_heads          {}\nseq_len           {}\n", h.head_dim, h.kv_heads,
                         h.seq_len);
      out += fmt::format("layer index       {}\nseed              {:#018x}\ncodebook id       {:#010x}\n",
                         h.layer_index, h.seed, h.codebook_id);
      out += fmt::format("exact window      {} (stored rows {} from position {})\n", h.exact_window, h.window_rows,
                         h.window_first_position);
      out += fmt::format("size              {} bytes\nverification      OK (checksum, sizes, codebook, values)\n",
                         bytes.size());
    } else {
      out += fmt::format("verification      FAILED: {}\n", blob.error().to_string());
    }
    return out;
  }
  if (is_seed_blob(bytes)) {
    const bool keys = has_magic(bytes, kSeedKeyMagic);
    out += fmt::format("format            {} (seed system, cera 0.4.0; carries no seed, mode or checksum)\n",
                       keys ? "TQK1 keys, prod3" : "TQV1 values, mse2");
    auto blob = decode_seed_blob(bytes, 0, 0);
    if (blob.ok()) {
      out += fmt::format("head_dim          {}\nkv_heads          {}\nseq_len           {}\n", blob->header.head_dim,
                         blob->header.kv_heads, blob->header.seq_len);
      out += fmt::format("size              {} bytes\nverification      OK (sizes, values; the format has no "
                         "checksum)\n",
                         bytes.size());
    } else {
      out += fmt::format("verification      FAILED: {}\n", blob.error().to_string());
    }
    return out;
  }
  return "format            unknown (no KVCB / TQK1 / TQV1 magic)\n";
}

}  // namespace kvcompact::tq
