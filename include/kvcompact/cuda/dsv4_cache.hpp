// DeviceDeepseek4Cache: the DeepSeek-V4 hybrid cache with its rows and compressor states in GPU memory,
// laid out exactly as the CPU Deepseek4Cache (same plan, offsets, strides, bytes), with the same step
// protocol and errors (the bookkeeping is shared code), snapshots and anchor images that are
// interchangeable with the CPU cache's, and the per-layer kernels that fill it: the window write (the
// model's FP8 rounding, then the storage encoding) and the compressors (state update, softmax pooling,
// RMSNorm, RoPE / YaRN, rounding, encoding into the compressed / indexer rows), batched over sequences.
// No CUDA header: device memory is raw pointers, streams are void* (null = the default stream).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvcompact/core/error.hpp"
#include "kvcompact/dsv4/plan.hpp"
#include "kvcompact/dsv4/snapshot.hpp"
#include "kvcompact/dsv4/storage.hpp"

namespace kvcompact::cuda::dsv4 {

namespace kd = kvcompact::dsv4;

// One layer's device buffers (the CPU cache's views, as raw device pointers). Buffers a layer does not
// have are null with 0 rows. window / compressed point into the attention buffer (window at offset 0,
// compressed at window_rows * attention_row_bytes). Row r of a block starts at base + r * row stride.
struct DeviceLayerView {
  std::uint32_t layer = 0;
  std::uint32_t ratio = 0;  // m: 0, 4 or 128
  std::uint32_t coff = 0;   // 2 for m = 4, 1 for m = 128, 0 for m = 0
  kd::RowStorage attention_storage = kd::RowStorage::Bf16;
  kd::IndexerStorage indexer_storage = kd::IndexerStorage::Bf16;

  std::uint8_t* attention = nullptr;  // [attention_rows, attention_row_bytes]
  std::uint64_t attention_rows = 0;
  std::uint64_t attention_row_bytes = 0;
  std::uint8_t* window = nullptr;  // [window_rows, attention_row_bytes]: slot of position q is q % window_rows
  std::uint64_t window_rows = 0;
  std::uint8_t* compressed = nullptr;  // [compressed_rows, attention_row_bytes]: row g = group g
  std::uint64_t compressed_rows = 0;

  std::uint8_t* indexer = nullptr;  // [indexer_rows, indexer_row_bytes] (m = 4)
  std::uint64_t indexer_rows = 0;
  std::uint64_t indexer_row_bytes = 0;

  float* kv_state = nullptr;  // F32 [state_rows, state_cols] (m != 0)
  float* score_state = nullptr;
  std::uint64_t state_rows = 0;
  std::uint64_t state_cols = 0;
  float* indexer_kv_state = nullptr;  // F32 [indexer_state_rows, indexer_state_cols] (m = 4)
  float* indexer_score_state = nullptr;
  std::uint64_t indexer_state_rows = 0;
  std::uint64_t indexer_state_cols = 0;
};

class DeviceDeepseek4Cache {
 public:
  // Allocates every buffer of the plan on the current device (rows zeroed, kv states 0, score states -inf) and
  // counts the real allocations against the plan with the CPU's check_accounting: Accounting when they differ (a
  // hand-edited plan), the plan's own errors for a bad model / context, CapacityExceeded when the device
  // cannot allocate it. Besides the plan's buffers the cache holds one 4-byte status word for its kernels.
  static Result<DeviceDeepseek4Cache> create(const kd::CachePlan& plan);
  static Result<DeviceDeepseek4Cache> create(const kd::ModelConfig& model, std::uint64_t context,
                                             kd::StorageConfig storage = {});

  DeviceDeepseek4Cache(DeviceDeepseek4Cache&&) noexcept;
  DeviceDeepseek4Cache& operator=(DeviceDeepseek4Cache&&) noexcept;
  DeviceDeepseek4Cache(const DeviceDeepseek4Cache&) = delete;
  DeviceDeepseek4Cache& operator=(const DeviceDeepseek4Cache&) = delete;
  ~DeviceDeepseek4Cache();

  const kd::CachePlan& plan() const;
  std::uint64_t position() const;
  std::uint32_t num_layers() const;
  bool poisoned() const;
  const std::string& poison_reason() const;
  std::uint64_t allocated_bytes() const;  // the plan's buffers as allocated (== plan().total_bytes)
  std::uint64_t id() const;               // unique per live cache of either backend in this process

  std::uint64_t window_valid() const;
  std::uint64_t window_start_position() const;
  std::uint64_t window_slot(std::uint64_t absolute_position) const;
  std::uint64_t compressed_valid(std::uint32_t layer) const;
  std::uint64_t indexer_valid(std::uint32_t layer) const;

  // Device pointers of a layer's buffers (layer < num_layers(), else abort). The pointers stay valid for
  // the cache's lifetime (also across moves of the cache object).
  DeviceLayerView layer_view(std::uint32_t layer) const;
  // The device word the kernels OR their input flags into (KernelOptions::check_finite).
  std::uint32_t* status_word() const;

  // ---- Step protocol: the CPU cache's, on the same shared bookkeeping (same plans, errors, poisoning) ----
  Result<kd::StepPlan> plan_next_step() const;
  Status commit_step(std::uint64_t position);
  Result<kd::PrefillPlan> plan_prefill(std::uint64_t start, std::uint64_t count) const;
  Status commit_prefill(std::uint64_t start, std::uint64_t count);
  void poison(std::string reason);
  // States refilled (kv 0, score -inf) on the device, position 0, poison cleared; rows are left as they are.
  // Poisons the cache if the device refill fails.
  Status reset();

  // ---- Host copies (tests, tools): the whole buffer of a layer, synchronously; InvalidArgument for a layer out
  // of range. Like snapshot, restore, hydrate and reset they copy through the legacy default stream, which is
  // not ordered after kernels on a cudaStreamNonBlocking stream: synchronise such a stream first. ----
  Result<std::vector<std::uint8_t>> download_attention(std::uint32_t layer) const;
  Result<std::vector<std::uint8_t>> download_indexer(std::uint32_t layer) const;
  // which: 0 kv, 1 score, 2 indexer kv, 3 indexer score.
  Result<std::vector<float>> download_state(std::uint32_t layer, int which) const;

  struct Impl;

 private:
  explicit DeviceDeepseek4Cache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend struct CacheAccessDevice;
};

// Lock-step commit of several GPU caches, as dsv4::commit_cohort.
Status commit_cohort(std::span<DeviceDeepseek4Cache* const> caches, std::uint64_t position);

// ---- Snapshots and anchor images (the CPU formats; interchangeable) --------------------------------------
// The same dsv4::Snapshot contents as the CPU's take_snapshot of a cache that saw the same work (window rows
// oldest first, the four states, position); cache_id is this cache's. Poisoned when poisoned.
Result<kd::Snapshot> take_snapshot(const DeviceDeepseek4Cache& cache);
// The CPU restore's checks, in its order and with its errors, all made before any device memory is touched
// (a snapshot restores only into the cache it was taken from, of either backend's, as on the CPU); then
// the uploads. A failed upload poisons the cache.
Status restore_snapshot(DeviceDeepseek4Cache& cache, const kd::Snapshot& snapshot);
// Byte-identical to dsv4::encode_anchor_image of a CPU cache with the same plan, position and contents.
Result<std::vector<std::uint8_t>> encode_anchor_image(const DeviceDeepseek4Cache& cache,
                                                      std::span<const std::uint32_t> tokens);
// Accepts images of either backend: dsv4::decode_anchor_image validates the bytes fully and the CPU
// hydrate's target checks run before any upload. A failed upload poisons the cache.
Status hydrate_from_anchor_image(DeviceDeepseek4Cache& cache, std::span<const std::uint8_t> bytes,
                                 std::vector<std::uint32_t>* tokens = nullptr);

// ---- Kernels: window write and compressors, batched over sequences --------------------------------------

// One sequence's tokens for one layer: `count` consecutive tokens starting at cache->position() (the
// tokens the caller is about to commit). All arrays are DEVICE float32, token-major.
struct LayerSpan {
  DeviceDeepseek4Cache* cache = nullptr;
  std::uint64_t count = 0;
  const float* kv = nullptr;                // [count, 512] c_t (RoPE at t already applied on [448, 512))
  const float* compressor_kv = nullptr;     // [count, coff*512] a_t           (m != 0)
  const float* compressor_score = nullptr;  // [count, coff*512] z_t (no ape)  (m != 0)
  const float* indexer_kv = nullptr;        // [count, 256]                    (m == 4)
  const float* indexer_score = nullptr;     // [count, 256]                    (m == 4)
  // Optional output of write_window: [count, attention_row_bytes] device bytes receiving every token's encoded
  // row in order (the prefill chunk's own rows, which the ring may no longer hold when count > capacity:
  // dsv4_kernels.hpp TokenRows::chunk_rows). Rows at 2-byte aligned addresses.
  std::uint8_t* chunk_rows = nullptr;
};

// The layer's learned compressor constants, DEVICE float32, shared by every sequence of a batch.
struct CompressorWeights {
  const float* ape = nullptr;           // [m, coff*512]  (m != 0)
  const float* norm = nullptr;          // [512]          (m != 0)
  const float* indexer_ape = nullptr;   // [4, 256]       (m == 4)
  const float* indexer_norm = nullptr;  // [128]          (m == 4)
  float norm_eps = 1e-6f;
};

struct KernelOptions {
  // true: the kernels flag NaN / inf inputs in each cache's status word; the launcher waits for them, reads and
  // clears the words, and reports a flag as NonFinite (poisoning every cache of the batch: they were written).
  // false: no checks, nothing waited for: the launch is only enqueued on `stream` (CUDA-graph friendly).
  bool check_finite = true;
  // run_compressors: a batch in which some span has more than one token (prefill) emits all of its rows in
  // parallel (a block per emitted row, pooling straight from the inputs and the state the chunk began with,
  // then one pass that leaves the state the token-by-token walk would leave: the same bits). true forces the
  // token-by-token walk (one block per sequence), the decode path, for every batch (tests compare the two).
  bool sequential_compressor = false;
};

// Checks shared by both launchers, before anything is launched: a null / repeated cache, layer out of range,
// caches of different models or storage -> InvalidArgument / Mismatch; a poisoned cache -> Poisoned;
// count 0 -> EmptyPrefill; position + count beyond the context -> ContextBound; a missing input ->
// InvalidArgument.

// Window rows of layer `layer` for each span: the model's FP8 rounding (e4m3 in blocks of 64 with power-of-
// two scales over dims [0, 448), bf16 tail untouched), encoded with the cache's attention storage into ring
// slot q % window_capacity for the last min(count, capacity) positions q of the span (and every token's row
// into LayerSpan::chunk_rows when given).
Status write_window(std::span<const LayerSpan> spans, std::uint32_t layer, const KernelOptions& options = {},
                    void* stream = nullptr);

// The layer's compressors for each span (m != 0; nothing to do for m = 0): per token the state row update,
// and at each group end the softmax pooling, RMSNorm, RoPE / YaRN at g*m on the tail, the model's rounding
// and the encoding into compressed row g (and for m = 4 the indexer compressor into indexer row g). Decode:
// one block per (sequence, branch) walks the span's tokens in order; prefill: see KernelOptions. Float32 math
// in the CPU's order (explicit roundings, no FMA contraction).
Status run_compressors(std::span<const LayerSpan> spans, std::uint32_t layer, const CompressorWeights& weights,
                       const KernelOptions& options = {}, void* stream = nullptr);

}  // namespace kvcompact::cuda::dsv4
