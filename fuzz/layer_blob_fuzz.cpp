// libFuzzer target: every TurboQuant blob decoder (KVCB, TQK1 / TQV1, inspect's describe) on arbitrary
// bytes must return a value or a typed error, never crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvcompact/tq/blob.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::uint8_t> bytes(data, size);
  auto blob = kvcompact::tq::decode_layer_blob(bytes);
  if (blob.ok()) {
    // Whatever decodes must re-encode to the same bytes.
    auto again = kvcompact::tq::encode_layer_blob(*blob);
    if (!again.ok() || *again != std::vector<std::uint8_t>(bytes.begin(), bytes.end())) __builtin_trap();
  }
  (void)kvcompact::tq::decode_seed_blob(bytes, 1, 0);
  (void)kvcompact::tq::describe_blob(bytes);
  return 0;
}
