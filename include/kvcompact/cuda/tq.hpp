// The CUDA backend of the TurboQuant cache: device copies of a layer's codec tables, the encode kernel
// (f32 / bf16 / f16 rows -> the packed layer layout of tq::plan_layer_layout) and fused split-K decode
// attention with a plan / run split. docs/cuda.md describes the kernels; no CUDA header is included here.
#pragma once

#include <cstdint>
#include <span>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/core/error.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/layout.hpp"

namespace kvcompact::cuda::tq {

using kvcompact::tq::LayerCodec;
using kvcompact::tq::LayerLayout;

// Documented scratch of a device layer buffer: the decode kernel copies 16-byte chunks that cover each
// region's first and last token, so a layer buffer must extend this many bytes past layout.total_bytes.
inline constexpr std::uint64_t kLayerBufferSlack = 256;
inline std::uint64_t layer_buffer_bytes(const LayerLayout& layout) { return layout.total_bytes + kLayerBufferSlack; }

// Bits of the encode status word (EncodeRequest::status): set by the kernel, never cleared by it.
inline constexpr std::uint32_t kEncodeNonFinite = 1u;      // a NaN / inf input coordinate (its record is zeroed)
inline constexpr std::uint32_t kEncodeNormOverflow = 2u;   // a norm beyond float32 (its record is zeroed)
inline constexpr std::uint32_t kEncodeBeyondLimit = 4u;    // appending at the device length: the rows would end
                                                           // beyond DeviceLengths::limit (nothing was written)
inline constexpr std::uint32_t kEncodeStalePosition = 8u;  // a checked position (PositionCheck) was not the device
                                                           // length when the kernel ran (nothing was written)

// One layer's rotation signs and scales (main and QJL streams), codebooks and flags, on the current device
// (create also sets the encode kernels' attributes there; use the codec on that device).
class DeviceCodec {
 public:
  static Result<DeviceCodec> create(const LayerCodec& codec);
  const void* tables() const { return buffer_.data(); }
  std::uint32_t head_dim() const { return head_dim_; }
  const kvcompact::tq::QuantConfig& config() const { return config_; }

 private:
  DeviceBuffer buffer_;
  std::uint32_t head_dim_ = 0;
  kvcompact::tq::QuantConfig config_{};
};

// Appends `rows` tokens at `position` of sequence `seq`: keys / values are device arrays
// [rows, kv_heads, head_dim] of `dtype` (F32, BF16, F16). Every token is quantised; with an exact window
// the f32 row also goes to ring slot position mod W, whatever the status (a caller that must keep the ring of a
// rejected append writes it after reading the status, as DeviceCache does). The bytes equal
// LayerCodec::encode_key / encode_value (up to float64 summation order in the norms, see docs/cuda.md).
struct EncodeRequest {
  std::uint32_t seq = 0;
  std::uint32_t position = 0;
  std::uint32_t rows = 0;
  DType dtype = DType::F32;
  const void* keys = nullptr;
  const void* values = nullptr;
  std::uint32_t* status = nullptr;  // optional device word; kEncode* bits are OR-ed into it
};
Status encode_append(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                     const EncodeRequest& request, void* stream = nullptr);
// Several appends to one layer, each sequence at most once (InvalidArgument otherwise): every request is checked
// as encode_append checks it, in order, and the first failure returns before anything is launched. The
// requests then share launches: those the fast kernel takes (head_dim 64 / 128 / 256, 16-byte aligned rows)
// one launch per input dtype and up to 32 requests, the others one general launch each. Each request's
// verdict goes to its own status word. The records equal those of encode_append called per request.
Status encode_append_batch(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                           std::span<const EncodeRequest> requests, void* stream = nullptr);

// Appends at the device-resident lengths (DeviceCache::append_at_length, whose steps a CUDA graph can replay):
// each request's rows go to position lengths[seq], read by the kernel when it runs; request.position is ignored.
// A request whose rows would end beyond `limit` (≤ the layout's capacity) writes nothing and sets
// kEncodeBeyondLimit in its status word. The encode does not advance `lengths` (DeviceCache's commit kernel
// does). The host checks are encode_append_batch's, with `rows ≤ limit` in place of the capacity check of the
// position; fast-kernel requests share launches as there (with one request too, the batched kernel runs).
struct DeviceLengths {
  const std::uint32_t* lengths = nullptr;  // device [layout.sequences]
  std::uint32_t limit = 0;
};
Status encode_append_batch(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                           std::span<const EncodeRequest> requests, const DeviceLengths& at_device_lengths,
                           void* stream = nullptr);

// Appends at the host positions, each checked on the device (DeviceCache::append_deferred, which does not wait
// for the host to learn the device lengths): a request whose position is not lengths[seq] when the kernel runs
// writes nothing and sets kEncodeStalePosition in its status word — the device length moved without the host
// knowing (replays of a captured append_at_length). The host checks, launches and records are
// encode_append_batch's (with one request too, the batched kernel runs).
struct PositionCheck {
  const std::uint32_t* lengths = nullptr;  // device [layout.sequences]
};
Status encode_append_batch(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                           std::span<const EncodeRequest> requests, const PositionCheck& check,
                           void* stream = nullptr);

// Decode attention plan: fixed per batch shape (sequences of the layout, q_heads, an upper bound on the
// length). It chooses the split over the sequence and sizes the workspace; decode_attention then does
// no allocation and can be captured in a CUDA graph.
struct DecodePlan {
  LayerLayout layout{};
  kvcompact::tq::QuantConfig config{};
  std::uint32_t q_heads = 0;
  std::uint32_t max_length = 0;
  std::uint32_t chunk = 0;   // tokens per split (a multiple of 64)
  std::uint32_t splits = 0;  // quantised splits per (sequence, KV head); one more partial holds the exact window
  bool wide = false;         // the fused kernel's wide variant (4-bit keys, d = 128, mse modes, plans of one wave;
                             // docs/tq-decode-history.md, rounds 10 and 11)
  std::uint64_t workspace_bytes = 0;
};
// multiprocessors: of the device that will run it (device_properties().multiprocessors). Call it with that
// device current: it sets the kernels' shared-memory attributes there, so a plan is for that device only.
Result<DecodePlan> plan_decode(const LayerLayout& layout, const kvcompact::tq::QuantConfig& config,
                               std::uint32_t q_heads, std::uint32_t max_length, int multiprocessors);

// One query row per sequence: the query of position lengths[seq] − 1, which sees positions
// [0, lengths[seq]) (the newest token included). Sequences with length 0 get a zero output.
// The lengths are device values, so the host cannot check them against the plan: the kernels do. A sequence
// whose length exceeds plan.max_length (the plan's splits would leave its later tokens out) gets NaN in every
// output element instead of a shorter attention, nothing of it is read, and `status`, when given, has
// kDecodeLengthBeyondPlan OR-ed into it.
inline constexpr std::uint32_t kDecodeLengthBeyondPlan = 1u;
struct DecodeArgs {
  const float* queries = nullptr;             // device [sequences, q_heads, head_dim]
  const std::uint32_t* lengths = nullptr;     // device [sequences], each ≤ plan.max_length (≤ capacity)
  const std::uint32_t* window_begins = nullptr;  // device [sequences]; may be null without an exact window
  const float* sinks = nullptr;               // device [q_heads] sink logits, or null
  float scale = 0.0f;                         // softmax scale; 0 = 1/√head_dim
  float* output = nullptr;                    // device [sequences, q_heads, head_dim]
  std::uint32_t* status = nullptr;            // device word or null: kDecodeLengthBeyondPlan is OR-ed in (never
                                              // cleared by the kernels)
};
Status decode_attention(const DecodePlan& plan, const DeviceCodec& codec, const void* layer_data,
                        const DecodeArgs& args, void* workspace, void* stream = nullptr);

// True when decode_attention has a kernel for this head_dim and mode (docs/cuda.md lists them).
bool decode_supported(std::uint32_t head_dim, const kvcompact::tq::QuantConfig& config);

}  // namespace kvcompact::cuda::tq
