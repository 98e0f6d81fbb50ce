// Little-endian byte writer and bounds-checked reader for blobs and images. The reader never reads past
// its span: every read checks the remaining length and returns a Truncated error naming the field.
#pragma once

#include <cstdint>
#include <algorithm>
#include <bit>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvcompact/core/error.hpp"

namespace kvcompact {

class ByteWriter {
 public:
  template <typename T>
    requires std::is_arithmetic_v<T>
  void put(T value) {
    static_assert(std::endian::native == std::endian::little, "kvcompact formats assume a little-endian host");
    const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_bytes(std::span<const std::uint8_t> data) { bytes_.insert(bytes_.end(), data.begin(), data.end()); }
  template <typename T>
    requires std::is_arithmetic_v<T>
  void put_array(std::span<const T> data) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(data.data());
    bytes_.insert(bytes_.end(), p, p + data.size_bytes());
  }
  void pad_to(std::size_t size) { bytes_.resize(std::max(bytes_.size(), size), 0); }
  std::size_t size() const { return bytes_.size(); }
  std::vector<std::uint8_t>& bytes() { return bytes_; }
  void reserve(std::size_t n) { bytes_.reserve(n); }

 private:
  std::vector<std::uint8_t> bytes_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}

  template <typename T>
    requires std::is_arithmetic_v<T>
  Result<T> get(std::string_view field) {
    if (remaining() < sizeof(T)) return truncated(field, sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  // Copies `count` elements; the caller has already bounded `count` with checked arithmetic.
  template <typename T>
    requires std::is_arithmetic_v<T>
  Status get_array(std::string_view field, std::uint64_t count, std::vector<T>& out) {
    if (count > remaining() / sizeof(T)) return truncated(field, count * sizeof(T));
    out.resize(count);
    if (count) std::memcpy(out.data(), bytes_.data() + offset_, count * sizeof(T));
    offset_ += count * sizeof(T);
    return ok_status();
  }
  Status skip(std::string_view field, std::uint64_t n) {
    if (n > remaining()) return truncated(field, n);
    offset_ += n;
    return ok_status();
  }
  std::uint64_t remaining() const { return bytes_.size() - offset_; }
  std::uint64_t offset() const { return offset_; }

 private:
  Error truncated(std::string_view field, std::uint64_t need) const {
    return make_error(ErrorCode::Truncated, "{} needs {} bytes at offset {} but only {} remain", field, need,
                      offset_, remaining());
  }
  std::span<const std::uint8_t> bytes_;
  std::uint64_t offset_ = 0;
};

}  // namespace kvcompact
