// DType names and the bulk row conversions the caches use to accept f32 / f16 / bf16 / fp8 rows.
// Element loads go through memcpy so callers may hand in byte buffers with any alignment.
#include "kvcompact/core/dtypes.hpp"

#include <cstring>
#include <utility>

namespace kvcompact {

namespace {

constexpr std::array<std::pair<DType, std::string_view>, 5> kNames = {{
    {DType::F32, "f32"},
    {DType::F16, "f16"},
    {DType::BF16, "bf16"},
    {DType::F8E4M3, "fp8_e4m3"},
    {DType::F4E2M1, "fp4_e2m1"},
}};

template <typename Code, float (*DECODE)(Code)>
void decode_row(const void* src, float* dst, std::size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  for (std::size_t i = 0; i < n; ++i) {
    Code c;
    std::memcpy(&c, bytes + i * sizeof(Code), sizeof(Code));
    dst[i] = DECODE(c);
  }
}

template <typename Code, Code (*ENCODE)(float)>
void encode_row(const float* src, void* dst, std::size_t n) {
  auto* bytes = static_cast<unsigned char*>(dst);
  for (std::size_t i = 0; i < n; ++i) {
    const Code c = ENCODE(src[i]);
    std::memcpy(bytes + i * sizeof(Code), &c, sizeof(Code));
  }
}

Status check_pointers(const void* a, const void* b, std::size_t n, std::string_view what) {
  if (n != 0 && (a == nullptr || b == nullptr)) {
    return make_error(ErrorCode::InvalidArgument, "{}: null buffer for {} elements", what, n);
  }
  return ok_status();
}

}  // namespace

std::string_view dtype_name(DType type) {
  for (const auto& [t, name] : kNames) {
    if (t == type) return name;
  }
  return "unknown";
}

Result<DType> parse_dtype(std::string_view name) {
  for (const auto& [t, n] : kNames) {
    if (n == name) return t;
  }
  return make_error(ErrorCode::InvalidArgument,
                    "unknown dtype '{}' (expected one of f32, f16, bf16, fp8_e4m3, fp4_e2m1)", name);
}

Status convert_to_f32(DType src_type, const void* src, float* dst, std::size_t n) {
  KVC_TRY(check_pointers(src, dst, n, "convert_to_f32"));
  if (n == 0) return ok_status();
  switch (src_type) {
    case DType::F32:
      std::memcpy(dst, src, n * sizeof(float));
      return ok_status();
    case DType::F16:
      decode_row<std::uint16_t, f16_to_f32>(src, dst, n);
      return ok_status();
    case DType::BF16:
      decode_row<std::uint16_t, bf16_to_f32>(src, dst, n);
      return ok_status();
    case DType::F8E4M3:
      decode_row<std::uint8_t, fp8_e4m3_to_f32>(src, dst, n);
      return ok_status();
    case DType::F4E2M1:
      break;
  }
  return make_error(ErrorCode::Unsupported, "convert_to_f32 does not take {} input (dtype value {})",
                    dtype_name(src_type), static_cast<unsigned>(src_type));
}

Status convert_from_f32(DType dst_type, const float* src, void* dst, std::size_t n) {
  KVC_TRY(check_pointers(src, dst, n, "convert_from_f32"));
  if (n == 0) return ok_status();
  switch (dst_type) {
    case DType::F32:
      std::memcpy(dst, src, n * sizeof(float));
      return ok_status();
    case DType::F16:
      encode_row<std::uint16_t, f32_to_f16>(src, dst, n);
      return ok_status();
    case DType::BF16:
      encode_row<std::uint16_t, f32_to_bf16>(src, dst, n);
      return ok_status();
    case DType::F8E4M3:
      encode_row<std::uint8_t, f32_to_fp8_e4m3>(src, dst, n);
      return ok_status();
    case DType::F4E2M1:
      break;
  }
  return make_error(ErrorCode::Unsupported, "convert_from_f32 does not produce {} output (dtype value {})",
                    dtype_name(dst_type), static_cast<unsigned>(dst_type));
}

}  // namespace kvcompact
