// The small DeepSeek-V4 model and anchor images the anchor-image fuzzer works on: anchor_image_fuzz.cpp
// mutates and hydrates them, make_seeds.cpp writes a few into its seed corpus.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcompact/dsv4/anchor_image.hpp"

namespace kvcompact::fuzzing {

inline constexpr std::uint64_t kFuzzContext = 300;

inline dsv4::ModelConfig fuzz_model() {
  dsv4::ModelConfig model;
  model.name = "fuzz";
  model.num_hidden_layers = 2;
  model.compress_ratios = {0, 4};  // no m = 128 layer: its 512 KiB state would drown the interesting bytes
  model.max_position_embeddings = 4096;
  return model;
}

// An image of a fuzz_model cache after `steps` decode steps with patterned window rows and indexer rows
// (empty when a step fails, which a fuzz run would notice as a missing base image).
inline std::vector<std::uint8_t> fuzz_anchor_image(dsv4::StorageConfig storage, std::uint32_t steps) {
  auto cache = dsv4::Deepseek4Cache::create(fuzz_model(), kFuzzContext, storage);
  if (!cache.ok()) return {};
  std::vector<std::uint32_t> tokens;
  for (std::uint32_t t = 0; t < steps; ++t) {
    auto step = cache->plan_next_step();
    if (!step.ok()) return {};
    for (std::uint32_t l = 0; l < cache->num_layers(); ++l) {
      auto row = cache->window_rows(l).row(step->window_write_slot);
      for (std::size_t i = 0; i < row.size(); ++i) row[i] = static_cast<std::uint8_t>(t * 31 + i);
      if (auto slot = step->layers[l].indexer_write_slot) cache->indexer_rows(l).row(*slot)[0] = 0x42;
    }
    if (!cache->commit_step(t).ok()) return {};
    tokens.push_back(1000 + t);
  }
  auto image = dsv4::encode_anchor_image(*cache, tokens);
  return image.ok() ? std::move(*image) : std::vector<std::uint8_t>{};
}

}  // namespace kvcompact::fuzzing
