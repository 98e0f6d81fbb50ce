// Checksums for blobs and images: XXH64 (xxHash), stable across platforms and endianness of the host
// because it hashes bytes. Used to detect corruption, never for security.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvcompact {

std::uint64_t xxh64(std::span<const std::uint8_t> bytes, std::uint64_t seed = 0);

// Incremental form for data that is written in pieces.
class Xxh64Stream {
 public:
  explicit Xxh64Stream(std::uint64_t seed = 0);
  Xxh64Stream(const Xxh64Stream&) = delete;
  Xxh64Stream& operator=(const Xxh64Stream&) = delete;
  ~Xxh64Stream();
  void update(std::span<const std::uint8_t> bytes);
  std::uint64_t digest() const;

 private:
  void* state_;
};

}  // namespace kvcompact
