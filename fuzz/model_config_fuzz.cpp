// libFuzzer target: the text parsers of user-supplied configuration — a DeepSeek-V4 config.json
// (parse_config_json) and a TurboQuant mode string (QuantConfig::parse) — on arbitrary text must return a value
// or a typed error, never crash or read out of bounds; a config that parses must plan a cache (sizes only, no
// allocation) at a few contexts without crashing. Seeds: tests/golden/dsv4/*.config.json and mode strings
// (.ci/run copies them).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvcompact/dsv4/config.hpp"
#include "kvcompact/dsv4/plan.hpp"
#include "kvcompact/tq/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = kvcompact::dsv4::parse_config_json(text, "fuzz.config.json");
  if (config.ok()) {
    (void)config->fingerprint();
    for (const std::uint64_t context : {std::uint64_t{1}, std::uint64_t{4096}, config->max_position_embeddings}) {
      (void)kvcompact::dsv4::plan_cache(*config, context, kvcompact::dsv4::StorageConfig{});
    }
  }
  (void)kvcompact::tq::QuantConfig::parse(text, 1);
  return 0;
}
