// Deepseek4Cache: the DeepSeek-V4 hybrid cache on the CPU backend. It owns, per layer, the attention
// rows (window ring + compressed rows), the indexer rows and the four compressor state buffers laid
// out exactly as the CachePlan says, and runs the two-phase step protocol (plan, device work, commit).
//
// How the math uses it, per decode token at position p (see docs/deepseek-v4.md, "Step protocol"):
//   KVC_ASSIGN_OR_RETURN(StepPlan step, cache.plan_next_step());   // side-effect free
//   for each layer L:                                               // the work ("device work")
//     encode c_t into cache.window_rows(L).row(step.window_write_slot);
//     write the compressor state row step.layers[L].state_write_row of cache.kv_state(L) / score_state(L);
//     if step.layers[L].compressed_write_slot: pool and encode into cache.compressed_rows(L).row(slot)
//       (and the indexer row into cache.indexer_rows(L).row(*indexer_write_slot) for m = 4);
//     attend over window rows [0, step.window_valid_after) and compressed rows
//       [0, step.layers[L].compressed_valid_after);
//   if the work failed: cache.poison("why");  else KVC_TRY(cache.commit_step(step.position));
// Rows are read and written through encode_/decode_attention_row and encode_/decode_indexer_row
// (storage.hpp) with the view's storage type; window slot of absolute position q is q % window_capacity.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/core/error.hpp"
#include "kvcompact/dsv4/plan.hpp"

namespace kvcompact::dsv4 {

namespace detail {
struct CacheAccess;  // snapshot / migration / anchor-image internals (src/dsv4/cache_access.hpp)
}

// A block of encoded rows: `rows` rows of `row_stride` bytes each, stored as `storage`.
template <typename Byte, typename StorageType>
struct RowBlock {
  std::span<Byte> bytes;
  std::uint64_t rows = 0;
  std::uint64_t row_stride = 0;
  StorageType storage{};
  std::span<Byte> row(std::uint64_t i) const {
    KVC_ASSERT(i < rows, "row index out of range");
    return bytes.subspan(i * row_stride, row_stride);
  }
};
using AttentionRows = RowBlock<std::uint8_t, RowStorage>;
using ConstAttentionRows = RowBlock<const std::uint8_t, RowStorage>;
using IndexerRows = RowBlock<std::uint8_t, IndexerStorage>;
using ConstIndexerRows = RowBlock<const std::uint8_t, IndexerStorage>;

// A compressor state buffer, F32 row-major [rows, cols] (the seed's [1, rows, cols]).
template <typename Float>
struct StateBlock {
  std::span<Float> data;
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  std::span<Float> row(std::uint64_t i) const {
    KVC_ASSERT(i < rows, "state row out of range");
    return data.subspan(i * cols, cols);
  }
};
using StateBuffer = StateBlock<float>;
using ConstStateBuffer = StateBlock<const float>;

// The second count over real allocations: each layer's allocated bytes must equal the plan's
// resident bytes and their sum the plan's total, else Accounting (named layer and both numbers).
Status check_accounting(const CachePlan& plan, std::span<const std::uint64_t> allocated_per_layer);

class Deepseek4Cache {
 public:
  // Allocates every buffer of the plan (zeroed rows, kv states 0, score states -inf) and counts the
  // real allocations against the plan: Accounting when they differ (e.g. a hand-edited plan), the plan's
  // own errors for a bad model / context, CapacityExceeded when the host cannot allocate it.
  // One thread drives a cache at a time; a moved-from cache may only be destroyed or assigned to.
  static Result<Deepseek4Cache> create(const CachePlan& plan);
  static Result<Deepseek4Cache> create(const ModelConfig& model, std::uint64_t context, StorageConfig storage = {});

  Deepseek4Cache(Deepseek4Cache&&) noexcept;
  Deepseek4Cache& operator=(Deepseek4Cache&&) noexcept;
  Deepseek4Cache(const Deepseek4Cache&) = delete;
  Deepseek4Cache& operator=(const Deepseek4Cache&) = delete;
  ~Deepseek4Cache();

  const CachePlan& plan() const;
  std::uint64_t position() const;  // tokens committed so far
  std::uint32_t num_layers() const;
  bool poisoned() const;
  const std::string& poison_reason() const;
  std::uint64_t allocated_bytes() const;  // the second count, summed over the real buffers
  std::uint64_t id() const;               // unique per live cache in this process

  // Valid counts at the current position (what a reader may touch).
  std::uint64_t window_valid() const;           // min(position, window_capacity)
  std::uint64_t window_start_position() const;  // position - window_valid
  std::uint64_t window_slot(std::uint64_t absolute_position) const;  // absolute_position % window_capacity
  std::uint64_t compressed_valid(std::uint32_t layer) const;  // position / m (0 for m = 0)
  std::uint64_t indexer_valid(std::uint32_t layer) const;     // position / 4 for m = 4, else 0

  // Raw buffers of a layer (layer < num_layers(), else abort). Views of buffers a layer does not have
  // are empty (rows 0). window_rows and compressed_rows are zero-copy views into attention_rows.
  AttentionRows attention_rows(std::uint32_t layer);
  AttentionRows window_rows(std::uint32_t layer);
  AttentionRows compressed_rows(std::uint32_t layer);
  IndexerRows indexer_rows(std::uint32_t layer);
  StateBuffer kv_state(std::uint32_t layer);             // [coff*m, coff*512]
  StateBuffer score_state(std::uint32_t layer);          // [coff*m, coff*512]
  StateBuffer indexer_kv_state(std::uint32_t layer);     // [8, 256] for m = 4
  StateBuffer indexer_score_state(std::uint32_t layer);  // [8, 256] for m = 4
  ConstAttentionRows attention_rows(std::uint32_t layer) const;
  ConstAttentionRows window_rows(std::uint32_t layer) const;
  ConstAttentionRows compressed_rows(std::uint32_t layer) const;
  ConstIndexerRows indexer_rows(std::uint32_t layer) const;
  ConstStateBuffer kv_state(std::uint32_t layer) const;
  ConstStateBuffer score_state(std::uint32_t layer) const;
  ConstStateBuffer indexer_kv_state(std::uint32_t layer) const;
  ConstStateBuffer indexer_score_state(std::uint32_t layer) const;

  // ---- Step protocol ----
  // Side-effect free. Poisoned; ContextExhausted when position >= context.
  Result<StepPlan> plan_next_step() const;
  // Checks poison (Poisoned), then order (StepOutOfOrder{expected = position(), actual = position}),
  // then exhaustion (ContextExhausted), then advances by one. A failed commit poisons the cache: the
  // step's work already touched its buffers.
  Status commit_step(std::uint64_t position);
  // Side-effect free planning of a prefill span from any start: Poisoned, EmptyPrefill, ContextBound.
  Result<PrefillPlan> plan_prefill(std::uint64_t start, std::uint64_t count) const;
  // Poisoned, EmptyPrefill, StepOutOfOrder (start != position()), ContextBound; then position = start
  // + count. A failed commit poisons the cache.
  Status commit_prefill(std::uint64_t start, std::uint64_t count);
  // Marks the cache unusable after failed work; only reset() or a restore / hydrate clears it.
  void poison(std::string reason);
  // Refills the states (kv 0, score -inf), sets position 0 and clears poison. Rows are left as they
  // are: readers are bounded by the valid counts. Snapshots with a position > 0 no longer restore.
  void reset();

  struct Impl;  // opaque: host buffers and bookkeeping (src/dsv4/cache_access.hpp)

 private:
  explicit Deepseek4Cache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend struct detail::CacheAccess;
};

// Commit several caches decoding in lock-step at the same `position`: every cache is checked first
// (Poisoned, StepOutOfOrder, ContextExhausted — the message names the cohort index); only when all pass
// do all advance. If any fails none advances, and every member is poisoned (the cohort's work ran on
// all of them). A null or repeated cache is InvalidArgument and changes nothing.
Status commit_cohort(std::span<Deepseek4Cache* const> caches, std::uint64_t position);

}  // namespace kvcompact::dsv4
