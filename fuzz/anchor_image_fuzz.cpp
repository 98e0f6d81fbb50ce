// libFuzzer target: decodes arbitrary bytes as a DeepSeek-V4 anchor image (and describes it, as
// `kvcompact inspect` does); it must never crash or read out of bounds, only return typed errors.
// Inputs with an odd first byte (and no image magic, so seed images stay images) are instead edit
// scripts applied to a valid built-in image (byte flips, truncation, appends, optionally resealing the
// checksum) that is then hydrated into a cache of the same model, so mutations reach the checks behind
// the magic, the counts and the checksum.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvcompact/core/checksum.hpp"
#include "fuzz_images.hpp"
#include "kvcompact/dsv4/anchor_image.hpp"

namespace {

using namespace kvcompact;
using namespace kvcompact::dsv4;

using fuzzing::fuzz_model;
constexpr std::uint64_t kContext = fuzzing::kFuzzContext;

const std::vector<std::uint8_t>& base_image() {
  static const std::vector<std::uint8_t> image =
      fuzzing::fuzz_anchor_image({RowStorage::Fp8, IndexerStorage::Mxfp4}, 9);
  return image;
}

void reseal(std::vector<std::uint8_t>& bytes) {
  if (bytes.size() < 8) return;
  std::uint64_t sum = xxh64(std::span<const std::uint8_t>(bytes.data(), bytes.size() - 8));
  for (int i = 0; i < 8; ++i) bytes[bytes.size() - 8 + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(sum >> (8 * i));
}

void exercise(std::span<const std::uint8_t> bytes) {
  (void)looks_like_anchor_image(bytes);
  auto text = describe_anchor_image(bytes);
  (void)text;
  auto view = decode_anchor_image(bytes);
  if (!view.ok()) return;
  // Touch every span the decoder handed out: they must lie inside `bytes`.
  std::uint64_t sum = 0;
  for (std::uint32_t t : view->ledger()) sum += t;
  for (const AnchorImageLayer& l : view->layers) {
    for (auto s : {l.window_rows, l.compressed_rows, l.indexer_rows, l.kv_state, l.score_state, l.indexer_kv_state,
                   l.indexer_score_state}) {
      if (!s.empty()) sum += s.front() + s.back();
    }
  }
  (void)sum;
}

void hydrate(std::span<const std::uint8_t> bytes, std::uint64_t context) {
  auto cache = Deepseek4Cache::create(fuzz_model(), context, {RowStorage::Fp8, IndexerStorage::Mxfp4});
  if (!cache.ok()) return;
  std::vector<std::uint32_t> tokens;
  if (hydrate_from_anchor_image(*cache, bytes, &tokens).ok()) {
    (void)cache->plan_next_step();
    (void)encode_anchor_image(*cache, tokens);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const bool looks_like_image = looks_like_anchor_image(std::span<const std::uint8_t>(data, size));
  if (size > 0 && (data[0] & 1) != 0 && !looks_like_image) {
    std::vector<std::uint8_t> bytes = base_image();
    const std::size_t header_region = 8192;  // headers, ledger and the first layers' rows
    for (std::size_t at = 1; at + 4 <= size; at += 4) {
      const std::uint32_t offset = static_cast<std::uint32_t>(data[at + 1]) | (static_cast<std::uint32_t>(data[at + 2]) << 8);
      const std::uint8_t value = data[at + 3];
      if (bytes.empty()) break;
      switch (data[at] % 4) {
        case 0: bytes[offset % std::min(bytes.size(), header_region)] ^= value; break;
        case 1: bytes[(static_cast<std::size_t>(offset) * 131u) % bytes.size()] ^= value; break;
        case 2: bytes.resize(offset % bytes.size()); break;
        case 3: bytes.push_back(value); break;
      }
    }
    if ((data[0] & 2) != 0) reseal(bytes);
    exercise(bytes);
    hydrate(bytes, (data[0] & 4) != 0 ? 9 : kContext);
    return 0;
  }
  std::vector<std::uint8_t> bytes(data, data + size);  // exact-size copy so ASan sees every overread
  exercise(bytes);
  reseal(bytes);
  exercise(bytes);
  return 0;
}
