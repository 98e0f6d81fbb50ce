// DeviceCache: a GPU-resident TurboQuant KV cache with the CPU TurboQuantCache's semantics (contiguous
// appends, capacity, exact window ring, truncate / reset, per-layer snapshots with the same bytes), fused
// decode attention and chunked-prefill attention (kvcompact/cuda/tq_prefill.hpp). Host-side bookkeeping; data
// moves only through the kernels of kvcompact/cuda/tq.hpp.
// No CUDA header is included; device pointers are plain pointers, streams are void*.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/core/error.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/cuda/tq_prefill.hpp"
#include "kvcompact/tq/attention.hpp"
#include "kvcompact/tq/cache.hpp"

namespace kvcompact::cuda::tq {

// One sequence's rows for DeviceCache::append_batch: append's arguments.
struct AppendRequest {
  std::uint32_t seq = 0;
  std::uint32_t position = 0;
  std::uint32_t rows = 0;
  DType dtype = DType::BF16;
  const void* keys = nullptr;    // DEVICE [rows, kv_heads, head_dim]
  const void* values = nullptr;  // DEVICE [rows, kv_heads, head_dim]
};

// One sequence's rows for DeviceCache::append_at_length: appended at the sequence's length on the device.
struct LengthAppend {
  std::uint32_t seq = 0;
  std::uint32_t rows = 0;
  DType dtype = DType::BF16;
  const void* keys = nullptr;    // DEVICE [rows, kv_heads, head_dim]
  const void* values = nullptr;  // DEVICE [rows, kv_heads, head_dim]
};

class DeviceCache {
 public:
  // Same shape and config rules as tq::TurboQuantCache::create; every layer buffer is allocated (checked) and
  // zeroed: layer_buffer_bytes(layout) each (planned bytes + kLayerBufferSlack).
  static Result<DeviceCache> create(const kvcompact::tq::CacheShape& shape, const kvcompact::tq::QuantConfig& config);

  DeviceCache(DeviceCache&&) noexcept;
  DeviceCache& operator=(DeviceCache&&) noexcept;
  ~DeviceCache();

  const kvcompact::tq::QuantConfig& config() const { return config_; }
  std::uint32_t num_layers() const { return static_cast<std::uint32_t>(layers_.size()); }
  std::uint32_t head_dim() const { return head_dim_; }
  std::uint32_t sequences() const { return sequences_; }
  std::uint32_t capacity() const { return capacity_; }
  std::uint32_t kv_heads(std::uint32_t layer) const;
  std::uint32_t length(std::uint32_t layer, std::uint32_t seq) const;
  const LayerLayout* layout(std::uint32_t layer) const;  // null for non-attention layers
  // Device bytes of all layer buffers (planned bytes + documented slack per layer).
  std::uint64_t device_bytes() const;

  // Appends `rows` tokens at `position` of (layer, seq); keys / values are DEVICE arrays [rows, kv_heads,
  // head_dim] of F32, F16 or BF16. Same checks and errors as the CPU cache (OutOfRange for a non-contiguous
  // position, CapacityExceeded, NonFinite / OutOfRange for bad input). It waits for the encode and the commit
  // kernel after it: the encode writes the records past the visible length, and the commit writes the exact-window
  // ring rows and advances the length only when the encode reported no bad input (two-phase: device work, then
  // commit), so a rejected append changes nothing, as on the CPU.
  Status append(std::uint32_t layer, std::uint32_t seq, std::uint32_t position, std::uint32_t rows, DType dtype,
                const void* keys, const void* values, void* stream = nullptr);

  // Appends to several sequences of one layer with one wait instead of one per sequence (a decode step's new
  // token of every sequence). First every request gets append's host checks, in order; the first failure is
  // returned and nothing is launched or stored. A sequence may appear once per call (InvalidArgument). Then
  // the requests are encoded on `stream` (encode_append_batch: one launch per input dtype and 32 requests), the
  // stream is synchronised once, and every request whose input the kernel accepted is committed; if the kernel
  // rejected some (NonFinite, or OutOfRange for a norm beyond float32), those are not stored and the first of
  // them (in request order) is the error returned — what calling append for each request would store and
  // report. A launch failure (a CUDA error) is returned: after a failed encode launch nothing of the batch is
  // committed; after a failed commit launch (one per 32 requests) the requests of the launches before it are
  // committed as their verdicts say — as append would have — and the later ones are not (length() tells which).
  // An empty span is a no-op.
  Status append_batch(std::uint32_t layer, std::span<const AppendRequest> requests, void* stream = nullptr);

  // A decode step's appends without a wait per layer. append_deferred checks and launches like append_batch
  // but returns without waiting: a commit kernel queued after the encodes on `stream` writes each accepted
  // request's ring rows and advances its sequence's device length (a rejected one changes nothing), so
  // decode / prefill queued after it on the same stream see the new tokens. length() reports the lengths as if
  // every pending append were accepted. finish_appends waits once for the whole step, brings the host copies in
  // line with what the device committed and returns the first rejected append's error (in call and request
  // order; NonFinite or OutOfRange, append's messages; InvalidArgument naming sync_lengths for a request whose
  // position was not the device's length when its encode ran — replays of a captured append_at_length since the
  // last sync_lengths, which the host cannot see without a wait: nothing is stored for it, and the host calls
  // refuse until sync_lengths). Rules while appends are pending: every call of the step
  // uses one stream, a (layer, sequence) takes one append per step, and append, append_batch, truncate*,
  // reset, snapshot, restore and attention return InvalidArgument until finish_appends (reset_all waits and
  // drops the pending appends' verdicts: it empties every sequence anyway). A launch failure (a CUDA error)
  // waits, settles the earlier pending appends (quoting the first rejection among them in its message) and is
  // returned; of the failing call, only the requests of the commit launches before a failed one (one per 32
  // requests) are committed, as their verdicts say (length() tells which).
  Status append_deferred(std::uint32_t layer, std::span<const AppendRequest> requests, void* stream = nullptr);
  Status finish_appends();
  bool appends_pending() const { return !pending_.empty(); }

  // A decode step that a CUDA graph can replay: append_at_length appends each request's rows at the sequence's
  // length as the device holds it when the kernels run (no position and no host wait), and a commit kernel on
  // `stream` advances that length, so a step captured once — append_at_length and decode per layer — appends
  // and attends at the right place on every replay. The host checks what it can (layer, sequences once each,
  // rows ≤ max_length ≤ capacity, dtype, pointers; typed errors as append's, nothing launched on failure); the
  // device refuses an append whose rows would end beyond `max_length` (nothing stored) and, like append,
  // one with NaN / inf input or a norm beyond float32 (nothing stored). From the first call on, the lengths live
  // on the device: length() reports those of the last
  // sync, and append, append_batch, append_deferred, truncate*, reset, snapshot, restore and attention return
  // InvalidArgument until sync_lengths; decode and prefill need a plan whose max_length is at least every
  // max_length passed for their layer since then. sync_lengths waits for `stream` (the stream the steps ran
  // on), copies the lengths and window starts back and returns the first refused append since the last sync, in
  // (layer, sequence) order (CapacityExceeded for the limit, NonFinite / OutOfRange for the input, at the
  // position of that sequence's first refusal). Replays of a captured step are invisible to the host, so it
  // always copies: call it after replays, before anything that reads the host's lengths. A call that forgets
  // it is refused, not run on stale lengths: once append_at_length has been used, append, append_batch,
  // truncate*, reset, snapshot, restore and attention read the device's count of its commits (a 4-byte copy
  // and a wait on their stream, the default stream for those without one) and return InvalidArgument when
  // commits ran since the last sync_lengths or reset_all; decode answers NaN for a sequence whose device length
  // is beyond its plan (DecodeArgs). append_deferred has no wait in which to read the counter: its encode
  // checks each position against the device length and stores nothing where they differ (finish_appends then
  // returns InvalidArgument naming sync_lengths). Not while deferred
  // appends are pending (InvalidArgument). A launch failure (a CUDA error) is returned; the requests of that
  // call count as refused for their input — except, after a failed commit launch, the requests of the launches
  // before it (one per 32 requests), which the device commits as their verdicts say (sync_lengths shows them).
  Status append_at_length(std::uint32_t layer, std::span<const LengthAppend> requests, std::uint32_t max_length,
                          void* stream = nullptr);
  Status sync_lengths(void* stream = nullptr);
  bool lengths_on_device() const { return lengths_on_device_; }

  Status truncate(std::uint32_t seq, std::uint32_t position);
  Status truncate_layer(std::uint32_t layer, std::uint32_t seq, std::uint32_t position);
  Status reset(std::uint32_t seq);
  void reset_all();

  // Byte-identical to tq::TurboQuantCache::snapshot of a CPU cache that received the same operations.
  Result<kvcompact::tq::LayerSnapshot> snapshot(std::uint32_t layer, std::uint32_t seq) const;
  Status restore(std::uint32_t layer, std::uint32_t seq, const kvcompact::tq::LayerSnapshot& snapshot);

  // Decode attention for every sequence of `layer` (one query row each, at position length − 1). Plan once
  // per (layer, q_heads, max_length); decode allocates nothing. queries / sinks / output are device arrays.
  // A plan made for another layer's layout is Mismatch (as for prefill).
  // `status`: an optional device word into which the kernels OR kDecodeLengthBeyondPlan when a sequence's
  // device length is beyond the plan (its output rows are NaN; DecodeArgs::status).
  Result<DecodePlan> plan_decode(std::uint32_t layer, std::uint32_t q_heads, std::uint32_t max_length) const;
  Status decode(std::uint32_t layer, const DecodePlan& plan, const float* queries, const float* sinks, float scale,
                float* output, void* workspace, void* stream = nullptr, std::uint32_t* status = nullptr) const;

  // Batched causal attention for `layer` with tq::TurboQuantCache::attention's semantics and checks (query row
  // i of a request sits at first_position + i and sees [0, first_position + i]; GQA, sinks, scale 0 = 1/√d, the
  // exact window). Differences: requests' queries / output are DEVICE arrays [rows, q_heads, head_dim];
  // options.sinks is a DEVICE array [q_heads] or null (its values cannot be checked on the host);
  // options.threads and chunk_tokens are ignored. It plans per call, uploads the requests' positions (after
  // synchronising `stream`, so the small argument buffer is never overwritten while a kernel of an earlier call
  // on `stream` reads it) and launches one prefill kernel per request on `stream`; it does not wait for them.
  // Where the plan splits the keys or folds QJL keys, the cache keeps the workspace (grown when a call needs
  // more; planned for the requests' largest first_position + rows, so it follows the prompt, not the capacity).
  // The argument buffer and that workspace belong to the cache, not to a stream: a call first waits for the
  // previous call's kernels, on whichever stream they ran, so calls on different streams may follow each other.
  // Not graph-capturable: use plan_prefill / prefill for that.
  Status attention(std::uint32_t layer, std::span<const kvcompact::tq::AttentionRequest> requests,
                   const kvcompact::tq::AttentionOptions& options, void* stream = nullptr,
                   PrefillPrecision precision = kDefaultPrefillPrecision);

  // The plan / run form of chunked prefill over `layer`: plan once per (q_heads, max_rows, max_batch entries
  // per launch, max_length: the longest sequence the plan serves, 0 = the capacity); prefill fills args.lengths /
  // args.window_begins with the cache's device mirrors (whatever the caller set) and checks that every sequence's
  // length is ≤ the plan's max_length (OutOfRange). The caller passes a workspace of plan.workspace_bytes
  // (non-zero where the plan splits the keys or folds them: in Fast precision 384 / 512 bytes per token of
  // max_length, KV head and batch entry for MSE / QJL keys, so a bound below the capacity keeps it small).
  // Device-side preconditions: see PrefillArgs.
  Result<PrefillPlan> plan_prefill(std::uint32_t layer, std::uint32_t q_heads, std::uint32_t max_rows,
                                   PrefillPrecision precision = kDefaultPrefillPrecision,
                                   std::uint32_t max_batch = 1, std::uint32_t max_length = 0) const;
  Status prefill(std::uint32_t layer, const PrefillPlan& plan, PrefillArgs args, void* workspace = nullptr,
                 void* stream = nullptr) const;

 private:
  struct Layer;
  DeviceCache() = default;
  Status check_layer_seq(std::uint32_t layer, std::uint32_t seq, bool need_attention) const;
  // Mismatch unless `planned` is layer `layer`'s layout (decode / prefill plans; `what` names the plan).
  Status check_plan_layout(std::uint32_t layer, const LayerLayout& planned, const char* what) const;
  Status check_append_requests(std::uint32_t layer, std::span<const AppendRequest> requests, const char* caller) const;
  Status check_no_pending_appends(const char* operation) const;
  // check_no_pending_appends, and the host's lengths are current: no append_at_length since sync_lengths and,
  // once append_at_length has been used, no commit of one on the device since (a replayed graph): that reads
  // the device's commit counter on `stream` (a 4-byte copy and a wait).
  Status check_host_lengths(const char* operation, void* stream = nullptr) const;
  // decode / prefill: a plan of `max_length` covers every sequence of the layer (host lengths, and the limit of
  // the appends at the device lengths since the last sync).
  Status check_plan_covers(std::uint32_t layer, std::uint32_t max_length) const;
  // prefill after its checks (and attention, whose plan covers its requests' keys): fills the length mirrors and
  // launches.
  Status prefill_unchecked(const Layer& l, const PrefillPlan& plan, PrefillArgs args, void* workspace,
                           void* stream) const;
  // truncate_layer / reset after check_host_lengths (so that truncate and reset_all read the device's commit
  // counter once, not once per layer or sequence).
  Status truncate_checked(std::uint32_t layer, std::uint32_t seq, std::uint32_t position);
  Status reset_checked(std::uint32_t seq);
  void drop_pending_appends();  // waits for the pending step's stream and forgets its appends
  // Waits for the device, zeroes the status words, forgets the limits and takes the commit counter as seen
  // (reset_all).
  void drop_device_lengths();
  static Error rejected_append(std::uint32_t layer, std::uint32_t seq, std::uint32_t position, std::uint32_t flags);
  // The layer's host lengths and window starts to its device mirror, done on return (create, truncate, reset,
  // restore and the failure paths of the appends), so that kernels on every stream see them and no copy is left
  // in flight. The appends that succeed leave the mirror to the device's commit kernel instead.
  Status sync_positions(std::uint32_t layer);
  // After a failed commit launch of append_batch / append_deferred (a CUDA error): the launches before it ran —
  // their accepted requests' ring rows written, device lengths advanced — and the later ones never will, so the
  // device's lengths of the layer are the truth: waits for `stream` and takes them as the host's (every exact
  // window stays valid). If that fails too (a broken device), the windows of the `launched` requests' sequences
  // start at their host lengths instead, since their commits may have written ring slots of rows still in them.
  void adopt_device_lengths(std::uint32_t layer, std::span<const std::uint32_t> launched, void* stream);

  // One append of the pending step (append_deferred), in call and request order.
  struct PendingAppend {
    std::uint32_t layer, seq, position, old_length;
  };

  kvcompact::tq::QuantConfig config_{};
  std::uint32_t head_dim_ = 0;
  std::uint32_t sequences_ = 0;
  std::uint32_t capacity_ = 0;
  int multiprocessors_ = 1;
  std::vector<std::unique_ptr<Layer>> layers_;
  // [layers][2][sequences]: each layer's device lengths, then window starts (Layer::device_positions), in one
  // buffer so that sync_lengths brings them all back in one copy.
  DeviceBuffer positions_;
  // sync_lengths' landing place for positions_ and the refusal words ([2 · layers · sequences] words each), then
  // the commit counter (step_status_).
  PinnedBuffer sync_staging_;
  DeviceBuffer status_;        // [2][requests]: an append_batch's encode status words, then its verdicts (grown)
  DeviceBuffer request_args_;  // attention(): [3][requests] seq, first_position, rows
  DeviceBuffer prefill_workspace_;  // attention(): the key splits' partials and counters
  DeviceEvent attention_done_;       // attention(): recorded after its kernels, on whichever stream they ran
  // The appends without a host wait: [4][layers × sequences] words (word layer · sequences + seq of each part):
  // encode status (zero between steps), append_deferred's verdicts, and append_at_length's refusals since the
  // last sync (flags OR-ed, position of the first); then one word, the count of append_at_length's commit
  // launches (never reset). Allocated and zeroed by create, so a captured step needs no allocation.
  DeviceBuffer step_status_;
  bool lengths_on_device_ = false;
  bool at_length_used_ = false;       // append_at_length was called once: graphs of it may replay at any time
  std::uint32_t synced_commits_ = 0;  // the commit counter as the last sync_lengths (or reset_all) saw it
  std::vector<std::uint32_t> length_limits_;  // [layers]: the largest max_length of append_at_length since sync
  std::vector<PendingAppend> pending_;
  std::vector<bool> pending_slots_;  // [layers × sequences]: has an append in the pending step
  void* pending_stream_ = nullptr;
};

}  // namespace kvcompact::cuda::tq
