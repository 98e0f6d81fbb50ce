// Private to the DeepSeek-V4 caches: the backend-independent bookkeeping of a cache (plan, id, position,
// poison, rewind floors) and the step protocol on it, shared by the CPU Deepseek4Cache and the CUDA
// DeviceDeepseek4Cache so that both give the same plans, the same errors and the same poisoning.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcompact/core/error.hpp"
#include "kvcompact/dsv4/plan.hpp"

namespace kvcompact::dsv4 {

struct Snapshot;
struct AnchorImageView;

struct CacheBookkeeping {
  CachePlan plan;
  std::uint64_t id = 0;
  std::uint64_t position = 0;
  bool poisoned = false;
  std::string poison_reason;
  // Each rewind (reset, restore, hydrate) appends the position it rewound to. A snapshot taken when
  // this held k entries restores only if every later entry is >= its position: otherwise compressed /
  // indexer rows it relies on may have been rewritten.
  std::vector<std::uint64_t> rewind_floors;

  // Unique per live cache in this process, whatever its backend.
  static std::uint64_t next_id();

  std::uint32_t num_layers() const { return static_cast<std::uint32_t>(plan.layers.size()); }
  std::uint64_t window_valid() const;
  std::uint64_t window_start_position() const { return position - window_valid(); }
  std::uint64_t window_slot(std::uint64_t absolute_position) const { return absolute_position % plan.window_capacity; }
  std::uint64_t compressed_valid(std::uint32_t layer) const;
  std::uint64_t indexer_valid(std::uint32_t layer) const;

  Error poisoned_error() const;
  // The checks commit_step makes (Poisoned, StepOutOfOrder, ContextExhausted), without mutating anything.
  Status check_commit(std::uint64_t step_position) const;

  Result<StepPlan> plan_next_step() const;
  Status commit_step(std::uint64_t step_position);  // poisons on failure
  Result<PrefillPlan> plan_prefill(std::uint64_t start, std::uint64_t count) const;
  Status commit_prefill(std::uint64_t start, std::uint64_t count);  // poisons on failure
  void poison(std::string reason);
  // Poisons after a write that failed part-way and may have rewritten compressed / indexer rows from position 0
  // on (a GPU hydrate whose uploads failed): also appends the rewind floor 0, so that no snapshot taken before
  // can restore over those rows and clear the poison.
  void poison_rows_rewritten(std::string reason);
  // Position `to`, poison cleared, `floor` appended to the rewind floors (reset: 0, 0; restore: p, p;
  // hydrate: p, 0).
  void rewind(std::uint64_t to, std::uint64_t floor);

  // Every check restore_snapshot makes before it touches a buffer, in the CPU cache's order and with its
  // messages: Mismatch for another plan, another cache, foreign bookkeeping, a rewind below the snapshot
  // or buffers of the wrong size; ContextBound for a position beyond the context (an edited snapshot).
  Status check_snapshot_restore(const Snapshot& snapshot) const;
  // Every check hydrate_from_anchor_image makes on a decoded image before it touches a buffer: Mismatch
  // (model, storage, layer count, a layer's ratio), ContextBound (position beyond the context).
  Status check_image_target(const AnchorImageView& view) const;
};

// Lock-step commit of several caches' bookkeeping at `position` (see dsv4::commit_cohort): null or
// repeated members are InvalidArgument and change nothing; any failed check poisons every member and
// advances none; otherwise all advance by one.
Status commit_cohort_bookkeeping(std::span<CacheBookkeeping* const> members, std::uint64_t position);

}  // namespace kvcompact::dsv4
