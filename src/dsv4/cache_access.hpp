// Private to kvcompact_dsv4: the cache's storage and bookkeeping, shared by cache.cpp, snapshot.cpp and
// anchor_image.cpp so snapshots, migration and images can move rows and state without public setters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache_bookkeeping.hpp"
#include "kvcompact/dsv4/cache.hpp"

namespace kvcompact::dsv4 {

struct LayerBuffers {
  std::vector<std::uint8_t> attention;  // [window_rows + compressed_rows] x attention_row_bytes
  std::vector<std::uint8_t> indexer;    // [indexer_rows] x indexer_row_bytes (m = 4)
  std::vector<float> kv_state;          // [state_rows, state_cols]
  std::vector<float> score_state;
  std::vector<float> indexer_kv_state;  // [8, 256] (m = 4)
  std::vector<float> indexer_score_state;
};

// The bookkeeping (plan, id, position, poison, rewind floors) and the protocol on it are shared with the
// CUDA cache (cache_bookkeeping.hpp); the CPU cache adds its host buffers.
struct Deepseek4Cache::Impl : CacheBookkeeping {
  std::vector<LayerBuffers> layers;

  void fill_states();  // kv 0, score -inf
};

namespace detail {
struct CacheAccess {
  static Deepseek4Cache::Impl& impl(Deepseek4Cache& c) { return *c.impl_; }
  static const Deepseek4Cache::Impl& impl(const Deepseek4Cache& c) { return *c.impl_; }
};
}  // namespace detail

}  // namespace kvcompact::dsv4
