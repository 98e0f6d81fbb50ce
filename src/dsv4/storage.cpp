// Row encoders / decoders for the DeepSeek-V4 cache storage types (layouts in storage.hpp). Scalar codes
// come from core/dtypes.hpp; the block scale is the finest power of two that holds the block maximum,
// which is what makes re-encoding a row the model already rounded lossless.
#include "kvcompact/dsv4/storage.hpp"

#include "kvcompact/dsv4/fp_sim.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/core/dtypes.hpp"

namespace kvcompact::dsv4 {

namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kE2m1Max = 6.0f;

// Scalar codes come from core/dtypes.hpp (round to nearest even, saturating); the block scale is
// applied with ldexp, exact for a power of two.
std::uint8_t encode_e4m3_scaled(float x, int scale_exp) { return f32_to_fp8_e4m3(std::ldexp(x, -scale_exp)); }
float decode_e4m3_scaled(std::uint8_t code, int scale_exp) { return std::ldexp(fp8_e4m3_to_f32(code), scale_exp); }
std::uint8_t encode_e2m1_scaled(float x, int scale_exp) { return f32_to_fp4_e2m1(std::ldexp(x, -scale_exp)); }
float decode_e2m1_scaled(std::uint8_t nibble, int scale_exp) {
  return std::ldexp(fp4_e2m1_to_f32(nibble), scale_exp);
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
// ue8m0 byte -> exponent. 255 (NaN in ue8m0) is never written; a damaged byte 255 decodes as 2^128,
// i.e. inf for non-zero codes, which stays well defined.
int scale_exp(std::uint8_t byte) { return static_cast<int>(byte) - 127; }

void put_bf16(std::uint8_t* p, float x) {
  std::uint16_t b = f32_to_bf16(x);
  p[0] = static_cast<std::uint8_t>(b & 0xFF);
  p[1] = static_cast<std::uint8_t>(b >> 8);
}
float get_bf16(const std::uint8_t* p) {
  return bf16_to_f32(static_cast<std::uint16_t>(p[0] | (static_cast<std::uint16_t>(p[1]) << 8)));
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
    const int e = scale_exp(sbyte);
    for (std::size_t i = 0; i < kFp8BlockDims; ++i) {
      out[kFp8NopeOffset + b * kFp8BlockDims + i] = encode_e4m3_scaled(block[i], e);
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
    const int e = scale_exp(bytes[kFp8ScaleOffset + b]);
    for (std::size_t i = 0; i < kFp8BlockDims; ++i) {
      std::size_t d = b * kFp8BlockDims + i;
      row[d] = decode_e4m3_scaled(bytes[kFp8NopeOffset + d], e);
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
      const int e = scale_exp(sbyte);
      for (std::size_t i = 0; i < kIndexerHeadDim; ++i) out[i] = encode_e4m3_scaled(row[i], e);
      float fscale = std::ldexp(1.0f, e);  // a power of two in [2^-127, 2^127]: exact as f32
      std::uint32_t bits = std::bit_cast<std::uint32_t>(fscale);
      for (int k = 0; k < 4; ++k) out[kIndexerFp8ScaleOffset + k] = static_cast<std::uint8_t>(bits >> (8 * k));
      return ok_status();
    }
    case IndexerStorage::Mxfp4: {
      std::fill(out.begin(), out.begin() + kMxfp4ScaleOffset, std::uint8_t{0});
      for (std::size_t b = 0; b < kFp4Blocks; ++b) {
        auto block = row.subspan(b * kFp4BlockDims, kFp4BlockDims);
        std::uint8_t sbyte = block_scale_byte(block_amax(block), kE2m1Max);
        const int e = scale_exp(sbyte);
        for (std::size_t i = 0; i < kFp4BlockDims; ++i) {
          std::size_t d = b * kFp4BlockDims + i;
          std::uint8_t nibble = encode_e2m1_scaled(block[i], e);
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
      const float scale = std::bit_cast<float>(bits);
      for (std::size_t i = 0; i < kIndexerHeadDim; ++i) row[i] = fp8_e4m3_to_f32(bytes[i]) * scale;
      return ok_status();
    }
    case IndexerStorage::Mxfp4:
      for (std::size_t d = 0; d < kIndexerHeadDim; ++d) {
        const int e = scale_exp(bytes[kMxfp4ScaleOffset + d / kFp4BlockDims]);
        std::uint8_t byte = bytes[d / 2];
        std::uint8_t nibble = (d % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
        row[d] = decode_e2m1_scaled(nibble, e);
      }
      return ok_status();
  }
  return make_error(ErrorCode::InvalidArgument, "unknown indexer storage {}", static_cast<int>(storage));
}

// The model's rounding lives in fp_sim (amax floors, float32 reciprocal scales); storage only delegates.
void simulate_fp8_attention_row(std::span<float> row512) {
  KVC_ASSERT(row512.size() == kHeadDim, "simulate_fp8_attention_row needs 512 dims");
  fp8_block_sim(row512.data(), kFp8Blocks * kFp8BlockDims, kFp8BlockDims);
}

void simulate_fp4_indexer_row(std::span<float> row128) {
  KVC_ASSERT(row128.size() == kIndexerHeadDim, "simulate_fp4_indexer_row needs 128 dims");
  fp4_block_sim(row128.data(), kFp4Blocks * kFp4BlockDims, kFp4BlockDims);
}

}  // namespace kvcompact::dsv4
