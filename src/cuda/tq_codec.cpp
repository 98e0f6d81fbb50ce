// DeviceCodec (one layer's tables on the device) and encode_append, the checked host side of the encode
// kernels (tq_encode.cu): packed records byte-identical to LayerCodec::encode_key / encode_value up to the
// float64 summation order of three norms (docs/cuda.md, "Encode"; docs/cuda-encode.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <limits>
#include <utility>
#include <vector>

#include "check.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/tq/codebook.hpp"
#include "kvcompact/tq/rotation.hpp"
#include "encode_params.hpp"
#include "encode_records.hpp"
#include "encode_setup.hpp"
#include "lut_scale.hpp"

namespace kvcompact::cuda::tq {

using detail::EncodeParams;
using detail::kEncodeWarps;
using detail::Tables;

Result<DeviceCodec> DeviceCodec::create(const LayerCodec& codec) {
  const std::uint32_t d = codec.head_dim();
  if (d > detail::kMaxHeadDim) {
    return make_error(ErrorCode::Unsupported, "head_dim {} exceeds the CUDA backend's limit {}", d,
                      detail::kMaxHeadDim);
  }
  Tables t;
  std::memset(&t, 0, sizeof(t));
  t.head_dim = d;
  const auto blocks = codec.main_rotation().blocks();
  if (blocks.size() > detail::kMaxBlocks) {
    return make_error(ErrorCode::Unsupported, "head_dim {} has {} rotation blocks; at most {} supported", d,
                      blocks.size(), detail::kMaxBlocks);
  }
  t.block_count = static_cast<std::uint32_t>(blocks.size());
  std::uint32_t offset = 0;
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    t.block_size[k] = blocks[k];
    t.block_offset[k] = offset;
    t.block_scale[k] = 1.0f / std::sqrt(static_cast<float>(blocks[k]));
    offset += blocks[k];
  }
  const auto& cfg = codec.config();
  t.key_code_bits = cfg.key_code_bits();
  t.value_bits = cfg.value_bits;
  t.has_qjl = cfg.has_qjl() ? 1u : 0u;
  t.norm_correction = cfg.norm_correction ? 1u : 0u;
  t.qjl_scale = codec.qjl_scale();
  t.key_lut_scale = detail::fp16_table_scale(codec.key_codebook());
  t.value_lut_scale = detail::fp16_table_scale(codec.value_codebook());
  const auto& kc = codec.key_codebook();
  for (std::uint32_t i = 0; i < kc.levels(); ++i) {
    t.key_centroids[i] = kc.centroids_f32()[i];
    t.key_centroids_f64[i] = kc.centroids()[i];
  }
  for (std::uint32_t i = 0; i + 1 < kc.levels(); ++i) t.key_boundaries[i] = kc.boundaries_f32()[i];
  const auto& vc = codec.value_codebook();
  for (std::uint32_t i = 0; i < vc.levels(); ++i) {
    t.value_centroids[i] = vc.centroids_f32()[i];
    t.value_centroids_f64[i] = vc.centroids()[i];
  }
  for (std::uint32_t i = 0; i + 1 < vc.levels(); ++i) t.value_boundaries[i] = vc.boundaries_f32()[i];
  if (d == 64 || d == 128 || d == 256) {  // the fast encode kernel's head_dims: one rotation block
    const float scale = t.block_scale[0];
    if (!detail::build_encode_quantiser(kc.boundaries_f32().data(), kc.levels() - 1, cfg.has_qjl() ? 1.0f : scale,
                                        t.key_quantiser) ||
        !detail::build_encode_quantiser(vc.boundaries_f32().data(), vc.levels() - 1, scale, t.value_quantiser)) {
      // (tests/cuda/encode_quantiser_test.cpp builds every codebook of these head_dims)
      return make_error(ErrorCode::Internal, "no encode quantiser table for head_dim {} ({} / {} bits)", d,
                        kc.bits(), vc.bits());
    }
    t.qjl_sign_threshold = detail::scaled_threshold(0.0f, scale);
  }
  for (std::uint32_t j = 0; j < d; ++j) {
    t.main_signs[j] = codec.main_rotation().signs()[j];
    t.qjl_signs[j] = codec.qjl_rotation().signs()[j];
  }
  DeviceCodec out;
  KVC_ASSIGN_OR_RETURN(out.buffer_, DeviceBuffer::allocate(sizeof(Tables)));
  KVC_TRY(out.buffer_.upload(&t, sizeof(Tables)));
  KVC_CUDA_TRY(detail::prepare_encode(d, cfg.has_qjl(), cfg.norm_correction));
  out.head_dim_ = d;
  out.config_ = cfg;
  return Result<DeviceCodec>(std::move(out));
}

namespace {

static_assert(detail::kStatusNonFinite == kEncodeNonFinite, "the kernels' status bit and the public one");
static_assert(detail::kStatusNormOverflow == kEncodeNormOverflow, "the kernels' status bit and the public one");
static_assert(detail::kStatusBeyondLimit == kEncodeBeyondLimit, "the kernels' status bit and the public one");
static_assert(detail::kStatusStalePosition == kEncodeStalePosition, "the kernels' status bit and the public one");

// encode_append's checks of one request (the codec's head_dim is checked once per batch); the kernels' dtype
// code (EncodeParams::dtype) on success. Requests of 0 rows pass once their range is checked. At the device
// lengths (`at`), the position is unknown on the host: the rows must fit under the limit.
Result<std::uint32_t> check_request(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                                    const EncodeRequest& request, const DeviceLengths* at = nullptr) {
  if (request.seq >= layout.sequences) {
    return make_error(ErrorCode::OutOfRange, "sequence {} out of range (layout has {})", request.seq,
                      layout.sequences);
  }
  if (at != nullptr) {
    if (request.rows > at->limit) {
      return make_error(ErrorCode::CapacityExceeded, "append of {} rows exceeds the length limit {}", request.rows,
                        at->limit);
    }
  } else if (request.position > layout.capacity || request.rows > layout.capacity - request.position) {
    return make_error(ErrorCode::CapacityExceeded, "append of {} rows at position {} exceeds capacity {}",
                      request.rows, request.position, layout.capacity);
  }
  if (request.rows == 0) return 0u;
  if (layer_data == nullptr || request.keys == nullptr || request.values == nullptr) {
    return make_error(ErrorCode::InvalidArgument, "encode_append needs layer data, keys and values");
  }
  std::uint32_t dtype = 0;
  switch (request.dtype) {
    case DType::F32: dtype = 0; break;
    case DType::F16: dtype = 1; break;
    case DType::BF16: dtype = 2; break;
    default:
      return make_error(ErrorCode::Unsupported, "encode input dtype {} (f32, f16 and bf16 are supported)",
                        dtype_name(request.dtype));
  }
  const EncodeParams p = detail::make_encode_params(layout, codec, layer_data, request, dtype);
  const std::uint64_t items = static_cast<std::uint64_t>(request.rows) * layout.kv_heads * 2u;
  if (detail::encode_path(p) == detail::EncodePath::General && (items + kEncodeWarps - 1) / kEncodeWarps > 0x7fffffffu) {
    return make_error(ErrorCode::Overflow, "encode of {} items needs too many blocks", items);
  }
  return dtype;
}

// The fast kernel's requests of one input dtype, launched kEncodeBatchMax at a time.
struct PendingFastLaunch {
  EncodeParams layer{};  // the layer's fields and the dtype (any request's parameters of this dtype)
  detail::EncodeSegment segments[detail::kEncodeBatchMax]{};
  std::uint32_t count = 0;

  Status flush(cudaStream_t stream) {
    if (count == 0) return ok_status();
    const cudaError_t err = detail::launch_encode_batch(layer, segments, count, stream);
    count = 0;
    KVC_CUDA_TRY(err);
    return ok_status();
  }
};

Status check_codec(const LayerLayout& layout, const DeviceCodec& codec) {
  if (codec.head_dim() != layout.head_dim) {
    return make_error(ErrorCode::Mismatch, "codec head_dim {} != layout head_dim {}", codec.head_dim(),
                      layout.head_dim);
  }
  return ok_status();
}

}  // namespace

// One request: no allocation and no batch bookkeeping on the way to the launch (a step's host time before the
// launch is GPU idle time; docs/cuda-encode.md, "Batched launches").
Status encode_append(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                     const EncodeRequest& request, void* stream) {
  KVC_TRY(check_codec(layout, codec));
  KVC_ASSIGN_OR_RETURN(const std::uint32_t dtype, check_request(layout, codec, layer_data, request));
  if (request.rows == 0) return ok_status();
  const EncodeParams p = detail::make_encode_params(layout, codec, layer_data, request, dtype);
  KVC_CUDA_TRY(detail::launch_encode(p, static_cast<cudaStream_t>(stream)));
  return ok_status();
}

namespace {

// encode_append_batch, at the host positions (at = null; checked against the device lengths when `check` is
// set) or at the device lengths; without the exact-window ring writes when `ring_rows` is false
// (encode_records_batch).
Status append_batch(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                    std::span<const EncodeRequest> requests, const DeviceLengths* at, const PositionCheck* check,
                    bool ring_rows, void* stream) {
  KVC_TRY(check_codec(layout, codec));
  if (check != nullptr && check->lengths == nullptr) {
    return make_error(ErrorCode::InvalidArgument, "encode_append_batch with a position check needs the lengths");
  }
  if (at != nullptr) {
    if (at->lengths == nullptr) {
      return make_error(ErrorCode::InvalidArgument, "encode_append_batch at the device lengths needs their array");
    }
    if (at->limit > layout.capacity) {
      return make_error(ErrorCode::CapacityExceeded, "length limit {} exceeds capacity {}", at->limit,
                        layout.capacity);
    }
  }
  std::vector<std::uint32_t> dtypes(requests.size());
  std::vector<bool> seen(requests.size() > 1 ? layout.sequences : 0, false);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    KVC_ASSIGN_OR_RETURN(dtypes[i], check_request(layout, codec, layer_data, requests[i], at));
    if (requests.size() > 1) {
      // One launch may run two requests at once: a sequence twice could write the same ring slots.
      if (seen[requests[i].seq]) {
        return make_error(ErrorCode::InvalidArgument, "encode_append_batch: sequence {} appears more than once",
                          requests[i].seq);
      }
      seen[requests[i].seq] = true;
    }
  }
  const auto s = static_cast<cudaStream_t>(stream);
  PendingFastLaunch fast[3];  // by dtype code
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const EncodeRequest& r = requests[i];
    if (r.rows == 0) continue;
    EncodeParams p = detail::make_encode_params(layout, codec, layer_data, r, dtypes[i]);
    if (!ring_rows) p.window = 0;  // (the kernels write ring slots only for a window)
    if (at != nullptr) {
      p.device_lengths = at->lengths;
      p.length_limit = at->limit;
    } else if (check != nullptr) {
      p.device_lengths = check->lengths;
      p.check_positions = 1;
    }
    if (detail::encode_path(p) == detail::EncodePath::General) {
      KVC_CUDA_TRY(detail::launch_encode(p, s));
      continue;
    }
    PendingFastLaunch& pending = fast[dtypes[i]];
    if (pending.count == 0) pending.layer = p;
    pending.segments[pending.count++] = {r.keys, r.values, r.status, r.seq, r.position, r.rows, 0};
    if (pending.count == detail::kEncodeBatchMax) KVC_TRY(pending.flush(s));
  }
  for (PendingFastLaunch& pending : fast) KVC_TRY(pending.flush(s));
  return ok_status();
}

}  // namespace

Status encode_append_batch(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                           std::span<const EncodeRequest> requests, void* stream) {
  return append_batch(layout, codec, layer_data, requests, nullptr, nullptr, true, stream);
}

Status encode_append_batch(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                           std::span<const EncodeRequest> requests, const DeviceLengths& at_device_lengths,
                           void* stream) {
  return append_batch(layout, codec, layer_data, requests, &at_device_lengths, nullptr, true, stream);
}

Status encode_append_batch(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                           std::span<const EncodeRequest> requests, const PositionCheck& check, void* stream) {
  return append_batch(layout, codec, layer_data, requests, nullptr, &check, true, stream);
}

Status detail::encode_records_batch(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                                    std::span<const EncodeRequest> requests, const DeviceLengths* at,
                                    const PositionCheck* check, void* stream) {
  if (at != nullptr && check != nullptr) {
    return make_error(ErrorCode::InvalidArgument, "encode_records_batch: device lengths or a position check, not both");
  }
  return append_batch(layout, codec, layer_data, requests, at, check, false, stream);
}

}  // namespace kvcompact::cuda::tq
