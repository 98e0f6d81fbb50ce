// Chunked-prefill attention on the GPU over the packed TurboQuant layer layout: many causal query rows per
// sequence (a prompt chunk), GQA, sinks and the exact window, with the semantics of tq::attention_cpu for
// AttentionRequest rows > 1. Tensor cores on dequantised tiles; docs/cuda-prefill.md describes the kernel,
// its precision and memory. Plan / run split like DecodePlan; no CUDA header is included here.
#pragma once

#include <cstdint>

#include "kvcompact/core/error.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/tq/config.hpp"
#include "kvcompact/tq/layout.hpp"

namespace kvcompact::cuda::tq {

// How P (the softmax weights times the value norms) enters the P·V tensor-core product. Fast rounds it to fp16
// once (one MMA, ≈ 2⁻¹² relative per weight); HiLo splits it into fp16 hi + lo parts (two MMAs, ≈ 2⁻²²
// relative). Queries are always split hi + lo. Both stay within 1e-3 of the float64 oracle; Fast is the
// default: its arithmetic error is two to three orders of magnitude below what the codec itself does to the
// attention output, and it takes ≈ 14 % less time. HiLo is for comparisons against an oracle: 2× more precise
// with 4- and 5-bit keys, 4–160× with 2- and 3-bit and QJL keys (docs/cuda-prefill.md, "Precision").
enum class PrefillPrecision : std::uint8_t { HiLo = 0, Fast = 1 };
inline constexpr PrefillPrecision kDefaultPrefillPrecision = PrefillPrecision::Fast;

// Which kernel runs. Warpgroup: warpgroup MMAs (sm_90a wgmma), head_dim 128 only (every mode).
// Portable: mma.sync, every supported head_dim and mode. Auto: Warpgroup where it exists, Portable otherwise.
// Both compute the same quantities with the same fp16 splits (docs/cuda-prefill.md).
enum class PrefillKernel : std::uint8_t { Auto = 0, Portable = 1, Warpgroup = 2 };

// Fixed per batch shape: layout, mode, q_heads and upper bounds on the rows of one batch entry, on the
// sequence lengths and on the entries of one launch. It picks the kernel instance, raises its shared-memory
// limit, splits the keys where a launch would leave multiprocessors idle, and sizes the workspace.
struct PrefillPlan {
  LayerLayout layout{};
  kvcompact::tq::QuantConfig config{};
  PrefillPrecision precision = kDefaultPrefillPrecision;
  PrefillKernel kernel = PrefillKernel::Portable;  // the one that runs (never Auto in a plan)
  std::uint32_t q_heads = 0;
  std::uint32_t max_rows = 0;    // query rows of one batch entry
  std::uint32_t max_length = 0;  // ≤ layout.capacity
  std::uint32_t block_rows = 0;        // query rows (tokens × heads) per block
  std::uint32_t heads_per_block = 0;   // query heads of one KV head per block
  std::uint32_t tokens_per_block = 0;  // query tokens per block
  std::uint32_t head_groups = 0;       // blocks along a GQA group wider than block_rows
  std::uint32_t tiles = 0;             // blocks along the query tokens of one entry
  std::uint32_t max_batch = 0;         // entries of one launch
  // Blocks per query tile, each over a contiguous part of its keys, merged by the last to finish (warpgroup
  // kernel; 1 = no split): chosen so that the blocks fill the multiprocessors' waves (docs/cuda-prefill.md).
  std::uint32_t key_splits = 1;
  int blocks_per_sm = 0;               // occupancy of the kernel instance
  // QJL keys folded into fp16 key tiles by a pass before the kernel (the warpgroup kernel in Fast precision:
  // docs/cuda-prefill.md, "Folded QJL keys"); the tiles live in the workspace, 32 KiB per 64 tokens of
  // max_length, KV head and batch entry.
  bool folded_keys = false;
  // The splits' partials and counters, then the folded key tiles; 0 without either (prefill_attention accepts a
  // null workspace then).
  std::uint64_t workspace_bytes = 0;
};

// The most blocks a plan splits each query tile's keys over (bounds the workspace: one partial per split).
inline constexpr std::uint32_t kMaxPrefillKeySplits = 8;

// multiprocessors: of the device that will run it (device_properties().multiprocessors): the key split fills
// its waves. Call it with that device current: it sets the kernels' shared-memory attributes there, so a plan
// is for that device only. max_batch: the most entries a launch with this plan may have (PrefillArgs::batch).
// Errors: InvalidArgument (q_heads not a positive multiple of kv_heads, max_rows 0, max_batch 0 or above 65535,
// multiprocessors below 1), OutOfRange (max_length
// beyond the capacity, max_rows beyond max_length, a grid dimension too large), Unsupported (head_dim other
// than 64 / 128 / 256, key code bits outside 1..5 or value bits outside 2..4; kernel Warpgroup for another
// head_dim).
Result<PrefillPlan> plan_prefill(const LayerLayout& layout, const kvcompact::tq::QuantConfig& config,
                                 std::uint32_t q_heads, std::uint32_t max_rows, std::uint32_t max_length,
                                 int multiprocessors, PrefillPrecision precision = kDefaultPrefillPrecision,
                                 PrefillKernel kernel = PrefillKernel::Auto, std::uint32_t max_batch = 1);

// `plan` with its keys split `key_splits` ways (1 = no split) and the workspace sized for that: for a caller who
// measured a better count for its shape than plan_prefill's model (the benchmark's `--sweep-splits`). Results
// differ from another split count's only by float rounding (the splits are merged in split order).
// Errors: InvalidArgument (a plan not from plan_prefill, key_splits 0 or above kMaxPrefillKeySplits),
// Unsupported (key_splits > 1 for the portable kernel), OutOfRange (more splits than 64-token key tiles in
// max_length, or a grid too large).
Result<PrefillPlan> with_key_splits(const PrefillPlan& plan, std::uint32_t key_splits);

// One launch for a ragged batch: entry i holds rows[i] query rows of cache sequence seqs[i] (or i when seqs is
// null) at positions first_positions[i] + r, r ∈ [0, rows[i]); row r sees key positions [0, first_positions[i]
// + r] (causal). Entry i's queries / outputs are rows [Σ_{j<i} rows[j], …) of the [total_rows, q_heads,
// head_dim] f32 arrays. Preconditions on the device values (the host cannot check them; the kernels do, and
// a broken one is loud, not silent): seqs[i] < layout.sequences — else every computed row of the entry is NaN
// and nothing of the cache is read (kPrefillBadSequence); rows[i] ≤ plan.max_rows — rows past it are not
// computed, their outputs are left as they were (kPrefillRowsBeyondPlan); first_positions[i] + rows[i] ≤
// lengths[seq] ≤ capacity — a row at a position not below min(lengths[seq], capacity) is NaN
// (kPrefillPositionBeyondLength: its keys are not all stored). The flags go into `status` when it is given.
// sinks finite or −inf. Reads are clamped to the layout in every case, so a wrong device value never reads or
// writes outside the layer buffer; outputs are written only inside the rows of each entry. (A length beyond the
// plan's max_length is covered — the key tiles follow the device length — except with folded keys
// (PrefillPlan::folded_keys), whose tiles the plan sizes for max_length: a block whose rows need keys past
// ⌈max_length / 64⌉ · 64 reads none and its rows are NaN (kPrefillKeysBeyondPlan).)
inline constexpr std::uint32_t kPrefillBadSequence = 1u;
inline constexpr std::uint32_t kPrefillRowsBeyondPlan = 2u;
inline constexpr std::uint32_t kPrefillPositionBeyondLength = 4u;
inline constexpr std::uint32_t kPrefillKeysBeyondPlan = 8u;
struct PrefillArgs {
  std::uint32_t batch = 0;                       // entries (host value); ≤ plan.max_batch
  const std::uint32_t* seqs = nullptr;           // device [batch] or null
  const std::uint32_t* first_positions = nullptr;  // device [batch]
  const std::uint32_t* rows = nullptr;           // device [batch]
  const std::uint32_t* lengths = nullptr;        // device [layout.sequences]: tokens stored per sequence
  const std::uint32_t* window_begins = nullptr;  // device [layout.sequences]; may be null without an exact window
  const float* queries = nullptr;                // device [total_rows, q_heads, head_dim]
  const float* sinks = nullptr;                  // device [q_heads] sink logits, or null
  float scale = 0.0f;                            // softmax scale; 0 = 1/√head_dim
  float* output = nullptr;                       // device [total_rows, q_heads, head_dim]
  std::uint32_t* status = nullptr;               // device word or null: the kPrefill* flags are OR-ed in
};

// Checks every host-visible argument (Mismatch for a codec of another head_dim / mode, InvalidArgument for null
// pointers, a missing workspace, a misaligned layer or a non-finite scale, OutOfRange for a batch beyond the
// plan's max_batch) and launches one kernel on `stream` (after zeroing the split counters in the workspace when
// the plan splits the keys). Allocates and synchronises nothing, so it can be captured in a CUDA graph.
Status prefill_attention(const PrefillPlan& plan, const DeviceCodec& codec, const void* layer_data,
                         const PrefillArgs& args, void* workspace, void* stream = nullptr);

// True when prefill_attention has a kernel for this head_dim and mode.
bool prefill_supported(std::uint32_t head_dim, const kvcompact::tq::QuantConfig& config);

}  // namespace kvcompact::cuda::tq
