// XXH64 through the system xxHash library.
#include "kvcompact/core/checksum.hpp"

#include <xxhash.h>

#include "kvcompact/core/assert.hpp"

namespace kvcompact {

std::uint64_t xxh64(std::span<const std::uint8_t> bytes, std::uint64_t seed) {
  return XXH64(bytes.data(), bytes.size(), seed);
}

Xxh64Stream::Xxh64Stream(std::uint64_t seed) : state_(XXH64_createState()) {
  KVC_ASSERT(state_ != nullptr, "XXH64_createState failed");
  XXH64_reset(static_cast<XXH64_state_t*>(state_), seed);
}

Xxh64Stream::~Xxh64Stream() { XXH64_freeState(static_cast<XXH64_state_t*>(state_)); }

void Xxh64Stream::update(std::span<const std::uint8_t> bytes) {
  XXH64_update(static_cast<XXH64_state_t*>(state_), bytes.data(), bytes.size());
}

std::uint64_t Xxh64Stream::digest() const { return XXH64_digest(static_cast<const XXH64_state_t*>(state_)); }

}  // namespace kvcompact
