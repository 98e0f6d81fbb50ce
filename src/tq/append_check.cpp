// The append argument checks every TurboQuant cache shares (append_check.hpp): one place for the messages,
// error codes and expected / actual fields.
#include "kvcompact/tq/append_check.hpp"

namespace kvcompact::tq {

Status validate_append(std::uint32_t layer, std::uint32_t seq, std::uint32_t length, std::uint32_t capacity,
                       std::uint32_t position, std::uint32_t rows, DType dtype, const void* keys,
                       const void* values) {
  if (position != length) {
    Error e = make_error(ErrorCode::OutOfRange,
                         "append to layer {} sequence {} at position {}, but its length is {} (appends must be "
                         "contiguous; truncate first to rewrite)",
                         layer, seq, position, length);
    e.expected = length;
    e.actual = position;
    return e;
  }
  if (static_cast<std::uint64_t>(position) + rows > capacity) {
    Error e = make_error(ErrorCode::CapacityExceeded,
                         "append of {} rows at position {} of layer {} sequence {} exceeds the capacity {}", rows,
                         position, layer, seq, capacity);
    e.expected = capacity;
    e.actual = static_cast<std::int64_t>(position) + rows;
    return e;
  }
  if (rows == 0) return ok_status();
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) {
    return make_error(ErrorCode::Unsupported, "append takes f32, f16 or bf16 rows, not {}", dtype_name(dtype));
  }
  if (keys == nullptr || values == nullptr) {
    return make_error(ErrorCode::InvalidArgument, "append of {} rows with null keys or values", rows);
  }
  return ok_status();
}

}  // namespace kvcompact::tq
