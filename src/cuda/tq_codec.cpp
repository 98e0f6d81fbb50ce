// DeviceCodec (one layer's tables on the device) and encode_append, the checked host side of the encode
// kernels (tq_encode.cu): packed records byte-identical to LayerCodec::encode_key / encode_value up to the
// float64 summation order of three norms (docs/cuda.md, "Encode"; docs/cuda-encode.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <limits>
#include <utility>

#include "check.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/tq/codebook.hpp"
#include "kvcompact/tq/rotation.hpp"
#include "encode_params.hpp"
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

Status encode_append(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                     const EncodeRequest& request, void* stream) {
  if (codec.head_dim() != layout.head_dim) {
    return make_error(ErrorCode::Mismatch, "codec head_dim {} != layout head_dim {}", codec.head_dim(),
                      layout.head_dim);
  }
  if (request.seq >= layout.sequences) {
    return make_error(ErrorCode::OutOfRange, "sequence {} out of range (layout has {})", request.seq,
                      layout.sequences);
  }
  if (request.position > layout.capacity || request.rows > layout.capacity - request.position) {
    return make_error(ErrorCode::CapacityExceeded, "append of {} rows at position {} exceeds capacity {}",
                      request.rows, request.position, layout.capacity);
  }
  if (request.rows == 0) return ok_status();
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
  KVC_CUDA_TRY(detail::launch_encode(p, static_cast<cudaStream_t>(stream)));
  return ok_status();
}

}  // namespace kvcompact::cuda::tq
