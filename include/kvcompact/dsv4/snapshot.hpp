// Snapshots of a live Deepseek4Cache (for rollback, e.g. speculative decoding across a pooling boundary)
// and migration into a larger context. A snapshot copies the visible window rows, all state buffers,
// the plan and the position — not the append-only compressed / indexer rows — so it restores only into
// the cache it was taken from, and only while those rows are still the ones it saw.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcompact/core/error.hpp"
#include "kvcompact/dsv4/cache.hpp"
#include "kvcompact/dsv4/plan.hpp"

namespace kvcompact::dsv4 {

struct LayerSnapshot {
  std::vector<std::uint8_t> window;  // the visible window rows, oldest position first, encoded
  std::vector<float> kv_state;
  std::vector<float> score_state;
  std::vector<float> indexer_kv_state;
  std::vector<float> indexer_score_state;
};

struct Snapshot {
  CachePlan plan;
  std::uint64_t cache_id = 0;      // the cache it came from
  std::uint64_t rewinds_seen = 0;  // that cache's rewind count when it was taken
  std::uint64_t position = 0;
  std::vector<LayerSnapshot> layers;
};

// Poisoned when the cache is poisoned.
Result<Snapshot> take_snapshot(const Deepseek4Cache& cache);

// Restores rows, states and position, and clears poison. Mismatch when the snapshot is of another plan,
// of another cache, or when the cache has since rewound below the snapshot's position (reset, or a
// restore to an earlier point, after which its compressed rows may have been rewritten); ContextBound for a
// position beyond the context. A Snapshot's fields are public for inspection, not for editing: restore trusts
// the position and rewind count it carries (within those bounds), so an edited one restores a cache whose
// compressed rows do not match its position.
Status restore_snapshot(Deepseek4Cache& cache, const Snapshot& snapshot);

// A new cache of the same model and storage with `context` (>= the source's position, and within the
// model's bound), holding the source's valid window rows (re-slotted for the new ring), compressed and
// indexer rows, states and position. Poisoned if the source is.
Result<Deepseek4Cache> migrate(const Deepseek4Cache& source, std::uint64_t context);
// The same into an existing cache (its previous contents are replaced). Mismatch when the model or
// storage differ; ContextBound when the destination's context is below the source's position.
Status migrate_into(const Deepseek4Cache& source, Deepseek4Cache& destination);

}  // namespace kvcompact::dsv4
