// Row encoders / decoders for the DeepSeek-V4 cache storage types (layouts in storage.hpp). The scalar
// codes are done by table lookup over every finite code so rounding is plainly nearest-even and
// saturating; the block scale is the finest power of two that holds the block maximum.
#include "kvcompact/dsv4/storage.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "kvcompact/core/assert.hpp"

namespace kvcompact::dsv4 {

namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kE2m1Max = 6.0f;

// Magnitudes of the 127 finite non-negative e4m3 codes (0x00..0x7E; 0x7F is NaN in e4m3fn), ascending.
std::array<double, 127> make_e4m3_table() {
  std::array<double, 127> t{};
  for (int code = 0; code < 127; ++code) {
    int exp = code >> 3;
    int mant = code & 7;
    t[static_cast<std::size_t>(code)] = exp == 0 ? std::ldexp(mant, -9) : std::ldexp(8 + mant, exp - 7 - 3);
  }
  return t;
}
const std::array<double, 127> kE4m3 = make_e4m3_table();
constexpr std::array<double, 8> kE2m1 = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// Nearest code in an ascending magnitude table, ties to the even code (the one with mantissa bit 0).
template <std::size_t N>
std::uint8_t nearest_code(const std::array<double, N>& table, double magnitude) {
  if (magnitude >= table[N - 1]) return static_cast<std::uint8_t>(N - 1);  // saturate
  auto it = std::lower_bound(table.begin(), table.end(), magnitude);
  std::size_t hi = static_cast<std::size_t>(it - table.begin());
  if (table[hi] == magnitude || hi == 0) return static_cast<std::uint8_t>(hi);
  std::size_t lo = hi - 1;
  double dlo = magnitude - table[lo];
  double dhi = table[hi] - magnitude;
  if (dlo < dhi) return static_cast<std::uint8_t>(lo);
  if (dhi < dlo) return static_cast<std::uint8_t>(hi);
  return static_cast<std::uint8_t>((lo % 2 == 0) ? lo : hi);
}

std::uint8_t encode_e4m3_scaled(double x) {
  std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  return static_cast<std::uint8_t>(sign | nearest_code(kE4m3, std::fabs(x)));
}
double decode_e4m3(std::uint8_t code) {
  double m = kE4m3[std::min<std::size_t>(code & 0x7F, 126)];
  if ((code & 0x7F) == 0x7F) m = std::nan("");
  return (code & 0x80) ? -m : m;
}
std::uint8_t encode_e2m1_scaled(double x) {
  std::uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  return static_cast<std::uint8_t>(sign | nearest_code(kE2m1, std::fabs(x)));
}
double decode_e2m1(std::uint8_t nibble) {
  double m = kE2m1[nibble & 7];
  return (nibble & 8) ? -m : m;
}

// Exponent e (as ue8m0 byte e + 127) of the smallest 2^e with amax / 2^e <= max_code, clamped to the
// ue8m0 range [-127, 127]. A zero block gets the smallest scale.
std::uint8_t block_scale_byte(double amax, double max_code) {
  if (!(amax > 0)) return 0;
  double q = amax / max_code;
  int x = 0;
  double f = std::frexp(q, &x);  // q = f * 2^x, f in [0.5, 1)
  int e = (f == 0.5) ? x - 1 : x;
  e = std::clamp(e, -127, 127);
  return static_cast<std::uint8_t>(e + 127);
}
double scale_of(std::uint8_t byte) {
  if (byte == 255) return std::nan("");
  return std::ldexp(1.0, static_cast<int>(byte) - 127);
}

std::uint16_t f32_to_bf16_bits(float x) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float bf16_bits_to_f32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

void put_bf16(std::uint8_t* p, float x) {
  std::uint16_t b = f32_to_bf16_bits(x);
  p[0] = static_cast<std::uint8_t>(b & 0xFF);
  p[1] = static_cast<std::uint8_t>(b >> 8);
}
float get_bf16(const std::uint8_t* p) {
  return bf16_bits_to_f32(static_cast<std::uint16_t>(p[0] | (static_cast<std::uint16_t>(p[1]) << 8)));
}

Status check_sizes(std::size_t floats, std::size_t want_floats, std::size_t bytes, std::size_t want_bytes,
                   const char* what) {
  if (floats != want_floats || bytes != want_bytes) {
    return make_error(ErrorCode::InvalidArgument, "{} row needs {} floats and {} bytes, got {} floats and {} bytes",
                      what, want_floats, want_bytes, floats, bytes);
  }
  return ok_status();
}

Status check_finite(std::span<const float> row) {
  for (std::size_t i = 0; i < row.size(); ++i) {
    if (!std::isfinite(row[i])) {
      return make_error(ErrorCode::NonFinite, "row value {} at dim {} is not finite", row[i], i);
    }
  }
  return ok_status();
}

double block_amax(std::span<const float> block) {
  double amax = 0;
  for (float v : block) {
    if (std::isfinite(v)) amax = std::max(amax, static_cast<double>(std::fabs(v)));
  }
  return amax;
}

}  // namespace

std::string_view row_storage_name(RowStorage s) { return s == RowStorage::Bf16 ? "bf16" : "fp8"; }

std::string_view indexer_storage_name(IndexerStorage s) {
  switch (s) {
    case IndexerStorage::Bf16: return "bf16";
    case IndexerStorage::Fp8: return "fp8";
    case IndexerStorage::Mxfp4: return "mxfp4";
  }
  return "?";
}

Result<RowStorage> parse_row_storage(std::string_view name) {
  if (name == "bf16") return RowStorage::Bf16;
  if (name == "fp8") return RowStorage::Fp8;
  return make_error(ErrorCode::InvalidArgument, "unknown attention row storage '{}' (bf16 or fp8)", name);
}

Result<IndexerStorage> parse_indexer_storage(std::string_view name) {
  if (name == "bf16") return IndexerStorage::Bf16;
  if (name == "fp8") return IndexerStorage::Fp8;
  if (name == "mxfp4") return IndexerStorage::Mxfp4;
  return make_error(ErrorCode::InvalidArgument, "unknown indexer row storage '{}' (bf16, fp8 or mxfp4)", name);
}

Status encode_attention_row(std::span<const float> row, RowStorage storage, std::span<std::uint8_t> out) {
  KVC_TRY(check_sizes(row.size(), kHeadDim, out.size(), attention_row_bytes(storage), "attention"));
  KVC_TRY(check_finite(row));
  if (storage == RowStorage::Bf16) {
    for (std::size_t i = 0; i < kHeadDim; ++i) put_bf16(&out[2 * i], row[i]);
    return ok_status();
  }
  for (std::size_t b = 0; b < kFp8Blocks; ++b) {
    auto block = row.subspan(b * kFp8BlockDims, kFp8BlockDims);
    std::uint8_t sbyte = block_scale_byte(block_amax(block), kE4m3Max);
    double scale = scale_of(sbyte);
    for (std::size_t i = 0; i < kFp8BlockDims; ++i) {
      out[kFp8NopeOffset + b * kFp8BlockDims + i] = encode_e4m3_scaled(static_cast<double>(block[i]) / scale);
    }
    out[kFp8ScaleOffset + b] = sbyte;
  }
  for (std::size_t k = 0; k < kRopeDims; ++k) put_bf16(&out[kFp8RopeOffset + 2 * k], row[kNopeDims + k]);
  out[kFp8PadOffset] = 0;
  return ok_status();
}

Status decode_attention_row(std::span<const std::uint8_t> bytes, RowStorage storage, std::span<float> row) {
  KVC_TRY(check_sizes(row.size(), kHeadDim, bytes.size(), attention_row_bytes(storage), "attention"));
  if (storage == RowStorage::Bf16) {
    for (std::size_t i = 0; i < kHeadDim; ++i) row[i] = get_bf16(&bytes[2 * i]);
    return ok_status();
  }
  for (std::size_t b = 0; b < kFp8Blocks; ++b) {
    double scale = scale_of(bytes[kFp8ScaleOffset + b]);
    for (std::size_t i = 0; i < kFp8BlockDims; ++i) {
      std::size_t d = b * kFp8BlockDims + i;
      row[d] = static_cast<float>(decode_e4m3(bytes[kFp8NopeOffset + d]) * scale);
    }
  }
  for (std::size_t k = 0; k < kRopeDims; ++k) row[kNopeDims + k] = get_bf16(&bytes[kFp8RopeOffset + 2 * k]);
  return ok_status();
}

Status encode_indexer_row(std::span<const float> row, IndexerStorage storage, std::span<std::uint8_t> out) {
  KVC_TRY(check_sizes(row.size(), kIndexerHeadDim, out.size(), indexer_row_bytes(storage), "indexer"));
  KVC_TRY(check_finite(row));
  switch (storage) {
    case IndexerStorage::Bf16:
      for (std::size_t i = 0; i < kIndexerHeadDim; ++i) put_bf16(&out[2 * i], row[i]);
      return ok_status();
    case IndexerStorage::Fp8: {
      std::uint8_t sbyte = block_scale_byte(block_amax(row), kE4m3Max);
      double scale = scale_of(sbyte);
      for (std::size_t i = 0; i < kIndexerHeadDim; ++i) {
        out[i] = encode_e4m3_scaled(static_cast<double>(row[i]) / scale);
      }
      float fscale = static_cast<float>(scale);  // a power of two in [2^-127, 2^127]: exact as f32
      std::uint32_t bits = std::bit_cast<std::uint32_t>(fscale);
      for (int k = 0; k < 4; ++k) out[kIndexerFp8ScaleOffset + k] = static_cast<std::uint8_t>(bits >> (8 * k));
      return ok_status();
    }
    case IndexerStorage::Mxfp4: {
      std::fill(out.begin(), out.begin() + kMxfp4ScaleOffset, std::uint8_t{0});
      for (std::size_t b = 0; b < kFp4Blocks; ++b) {
        auto block = row.subspan(b * kFp4BlockDims, kFp4BlockDims);
        std::uint8_t sbyte = block_scale_byte(block_amax(block), kE2m1Max);
        double scale = scale_of(sbyte);
        for (std::size_t i = 0; i < kFp4BlockDims; ++i) {
          std::size_t d = b * kFp4BlockDims + i;
          std::uint8_t nibble = encode_e2m1_scaled(static_cast<double>(block[i]) / scale);
          out[d / 2] = static_cast<std::uint8_t>(out[d / 2] | (d % 2 == 0 ? nibble : nibble << 4));
        }
        out[kMxfp4ScaleOffset + b] = sbyte;
      }
      return ok_status();
    }
  }
  return make_error(ErrorCode::InvalidArgument, "unknown indexer storage {}", static_cast<int>(storage));
}

Status decode_indexer_row(std::span<const std::uint8_t> bytes, IndexerStorage storage, std::span<float> row) {
  KVC_TRY(check_sizes(row.size(), kIndexerHeadDim, bytes.size(), indexer_row_bytes(storage), "indexer"));
  switch (storage) {
    case IndexerStorage::Bf16:
      for (std::size_t i = 0; i < kIndexerHeadDim; ++i) row[i] = get_bf16(&bytes[2 * i]);
      return ok_status();
    case IndexerStorage::Fp8: {
      std::uint32_t bits = 0;
      for (int k = 0; k < 4; ++k) bits |= static_cast<std::uint32_t>(bytes[kIndexerFp8ScaleOffset + k]) << (8 * k);
      double scale = std::bit_cast<float>(bits);
      for (std::size_t i = 0; i < kIndexerHeadDim; ++i) row[i] = static_cast<float>(decode_e4m3(bytes[i]) * scale);
      return ok_status();
    }
    case IndexerStorage::Mxfp4:
      for (std::size_t d = 0; d < kIndexerHeadDim; ++d) {
        double scale = scale_of(bytes[kMxfp4ScaleOffset + d / kFp4BlockDims]);
        std::uint8_t byte = bytes[d / 2];
        std::uint8_t nibble = (d % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
        row[d] = static_cast<float>(decode_e2m1(nibble) * scale);
      }
      return ok_status();
  }
  return make_error(ErrorCode::InvalidArgument, "unknown indexer storage {}", static_cast<int>(storage));
}

void simulate_fp8_attention_row(std::span<float> row512) {
  KVC_ASSERT(row512.size() == kHeadDim, "simulate_fp8_attention_row needs 512 dims");
  for (std::size_t b = 0; b < kFp8Blocks; ++b) {
    auto block = row512.subspan(b * kFp8BlockDims, kFp8BlockDims);
    double scale = scale_of(block_scale_byte(block_amax(block), kE4m3Max));
    for (float& v : block) {
      if (std::isfinite(v)) v = static_cast<float>(decode_e4m3(encode_e4m3_scaled(v / scale)) * scale);
    }
  }
}

void simulate_fp4_indexer_row(std::span<float> row128) {
  KVC_ASSERT(row128.size() == kIndexerHeadDim, "simulate_fp4_indexer_row needs 128 dims");
  for (std::size_t b = 0; b < kFp4Blocks; ++b) {
    auto block = row128.subspan(b * kFp4BlockDims, kFp4BlockDims);
    double scale = scale_of(block_scale_byte(block_amax(block), kE2m1Max));
    for (float& v : block) {
      if (std::isfinite(v)) v = static_cast<float>(decode_e2m1(encode_e2m1_scaled(v / scale)) * scale);
    }
  }
}

}  // namespace kvcompact::dsv4
