// Shared helpers for the DeepSeek-V4 cache tests: a tiny model, a seeded RNG whose seed goes into every
// failure message, and a "writer" that plays the math's part (writes tagged rows and state where a step
// or prefill plan says) together with a dense oracle of what every valid row must then contain.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvcompact/dsv4/cache.hpp"
#include "kvcompact/dsv4/config.hpp"
#include "kvcompact/dsv4/plan.hpp"
#include "test_seed.hpp"

namespace kvcompact::dsv4::testing {

// 5 layers covering every kind, a bound small enough to test ContextBound cheaply.
inline ModelConfig tiny_model(std::uint64_t max_positions = 4096) {
  ModelConfig m;
  m.name = "tiny";
  m.num_hidden_layers = 5;
  m.compress_ratios = {0, 4, 128, 4, 128};
  m.max_position_embeddings = max_positions;
  m.rope_scaling = YarnScaling{};
  return m;
}

using kvcompact::testing_support::fresh_seed;

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Content of a row as a pure function of (salt, layer, kind, index): the oracle recomputes it.
inline void fill_row(std::span<std::uint8_t> row, std::uint64_t salt, std::uint32_t layer, int kind,
                     std::uint64_t index) {
  std::uint64_t h = mix(salt ^ (std::uint64_t{layer} << 48) ^ (std::uint64_t(kind) << 40) ^ index);
  for (std::size_t i = 0; i < row.size(); ++i) {
    if (i % 8 == 0) h = mix(h);
    row[i] = static_cast<std::uint8_t>(h >> (8 * (i % 8)));
  }
}
inline float state_value(std::uint64_t salt, std::uint32_t layer, std::uint64_t position, std::uint64_t col) {
  return static_cast<float>(mix(salt ^ (std::uint64_t{layer} << 48) ^ (position << 12) ^ col) % 1000003) / 7.0f;
}

enum RowKind { kWindowRow = 0, kCompressedRow = 1, kIndexerRow = 2 };

// Plays the math for one decode step: window row, compressor state row, and any completed group.
inline void write_step(Deepseek4Cache& cache, const StepPlan& step, std::uint64_t salt) {
  for (std::uint32_t l = 0; l < cache.num_layers(); ++l) {
    fill_row(cache.window_rows(l).row(step.window_write_slot), salt, l, kWindowRow, step.position);
    const LayerStepPlan& ls = step.layers[l];
    if (ls.ratio != 0) {
      auto row = cache.kv_state(l).row(ls.state_write_row);
      for (std::size_t c = 0; c < row.size(); c += 97) row[c] = state_value(salt, l, step.position, c);
    }
    if (ls.compressed_write_slot) {
      fill_row(cache.compressed_rows(l).row(*ls.compressed_write_slot), salt, l, kCompressedRow,
               *ls.compressed_write_slot);
    }
    if (ls.indexer_write_slot) {
      fill_row(cache.indexer_rows(l).row(*ls.indexer_write_slot), salt, l, kIndexerRow, *ls.indexer_write_slot);
    }
  }
}

// Plays the math for a prefill span.
inline void write_prefill(Deepseek4Cache& cache, const PrefillPlan& p, std::uint64_t salt) {
  const std::uint64_t cap = cache.plan().window_capacity;
  for (std::uint32_t l = 0; l < cache.num_layers(); ++l) {
    for (std::uint64_t q = p.start; q < p.end; ++q) {
      fill_row(cache.window_rows(l).row(q % cap), salt, l, kWindowRow, q);
    }
    const LayerPrefillPlan& lp = p.layers[l];
    for (std::uint64_t g = lp.compressed_write_start; g < lp.compressed_write_start + lp.compressed_count; ++g) {
      fill_row(cache.compressed_rows(l).row(g), salt, l, kCompressedRow, g);
    }
    for (std::uint64_t g = lp.indexer_write_start; g < lp.indexer_write_start + lp.indexer_count; ++g) {
      fill_row(cache.indexer_rows(l).row(g), salt, l, kIndexerRow, g);
    }
  }
}

// Dense oracle: every row readable at the cache's position holds what the writer put there.
inline ::testing::AssertionResult rows_match_oracle(const Deepseek4Cache& cache, std::uint64_t salt) {
  const std::uint64_t n = cache.position();
  const std::uint64_t cap = cache.plan().window_capacity;
  for (std::uint32_t l = 0; l < cache.num_layers(); ++l) {
    const LayerPlan& lp = cache.plan().layers[l];
    std::vector<std::uint8_t> want(lp.attention_row_bytes);
    for (std::uint64_t q = n - std::min(n, cap); q < n; ++q) {
      fill_row(want, salt, l, kWindowRow, q);
      auto got = cache.window_rows(l).row(q % cap);
      if (std::memcmp(got.data(), want.data(), want.size()) != 0) {
        return ::testing::AssertionFailure() << "layer " << l << " window row of position " << q << " differs at n=" << n;
      }
    }
    if (lp.ratio != 0) {
      if (cache.compressed_valid(l) != n / lp.ratio) return ::testing::AssertionFailure() << "compressed_valid";
      for (std::uint64_t g = 0; g < n / lp.ratio; ++g) {
        fill_row(want, salt, l, kCompressedRow, g);
        auto got = cache.compressed_rows(l).row(g);
        if (std::memcmp(got.data(), want.data(), want.size()) != 0) {
          return ::testing::AssertionFailure() << "layer " << l << " compressed row " << g << " differs at n=" << n;
        }
      }
    }
    if (lp.ratio == 4) {
      std::vector<std::uint8_t> want_idx(lp.indexer_row_bytes);
      for (std::uint64_t g = 0; g < n / 4; ++g) {
        fill_row(want_idx, salt, l, kIndexerRow, g);
        auto got = cache.indexer_rows(l).row(g);
        if (std::memcmp(got.data(), want_idx.data(), want_idx.size()) != 0) {
          return ::testing::AssertionFailure() << "layer " << l << " indexer row " << g << " differs at n=" << n;
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kvcompact::dsv4::testing
