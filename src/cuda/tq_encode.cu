// The TurboQuant encode kernels: f32 / bf16 / f16 rows -> packed records in the layer layout of
// tq::plan_layer_layout, byte-identical to LayerCodec::encode_key / encode_value (docs/cuda.md, "Encode";
// docs/cuda-encode.md describes the fast kernel). Host-side checks are in tq_codec.cpp.
//
// Fast kernel (head_dim 64, 128, 256; 16-byte aligned inputs): head_dim/32 lanes per row, 32 coordinates per
// lane in registers, one warp = 32·32/head_dim consecutive positions of one KV head and kind. Butterflies are
// register adds for strides inside a lane and __shfl_xor for strides across lanes; the row is normalised as the
// codec defines it (kvcompact/tq/normalise.hpp: one float product per coordinate). General kernel (every other
// head_dim): one warp per (row, KV head, key-or-value) item, the row in shared memory.
//
// Pieces: encode_common.cuh (what both kernels share), encode_general.cuh (the general kernel),
// encode_fast_parts.cuh (the fast kernel's tables, butterflies, input ring and tails); this file: the fast kernel,
// its launches and the host entry points.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstddef>
#include <utility>

#include "encode_common.cuh"
#include "encode_fast_parts.cuh"
#include "encode_general.cuh"
#include "encode_params.hpp"
#include "input_widen.cuh"
#include "pdl.cuh"
#include "kvcompact/tq/normalise.hpp"

namespace kvcompact::cuda::tq::detail {

namespace ktq = kvcompact::tq;

namespace {

// kBatched: the launch encodes several requests (batch.count > 1). The single-request instance reads its request
// at a fixed parameter offset and never looks one up: the lookups (indexed constant loads in every step) cost it
// 1–7 %, 4 % on average, in a same-run A/B (docs/cuda-encode.md, "Batched launches").
template <unsigned D, unsigned DT, bool NC, bool QJL, bool kBatched>
__global__ void __launch_bounds__(kEncodeFastWarps * 32, 2)
    encode_fast_kernel(EncodeParams p, const __grid_constant__ EncodeSegments<kBatched ? kEncodeBatchMax : 1> batch) {
  kvcompact::cuda::detail::wait_for_previous_grid();  // (launch_after_previous)
  using F = Fast<D>;
  __shared__ FastTables tab;
  __shared__ __align__(16) std::uint8_t stage_codes[kEncodeFastWarps][kStageBytes];
  __shared__ __align__(16) std::uint8_t stage_signs[kEncodeFastWarps][128];
  // [i][thread]: main-rotation sign pairs of chunk i (MainSigns; bf16 / f16 only)
  __shared__ uint4 pair_masks[DT == 0 ? 1 : 4][DT == 0 ? 1 : kEncodeFastWarps * 32];
  const Tables& gt = *p.tables;
  for (unsigned i = threadIdx.x; i < 32; i += blockDim.x) {
    const double ck = gt.key_centroids_f64[i], cv = gt.value_centroids_f64[i];
    tab.c2[0][i] = __dmul_rn(ck, ck);
    tab.c2[1][i] = __dmul_rn(cv, cv);
    tab.centroids[0][i][0] = gt.key_centroids[i];
    tab.centroids[1][i][0] = gt.value_centroids[i];
    tab.centroids[0][i][1] = tab.centroids[1][i][1] = 0.0f;
    tab.thresholds[0][i] = gt.key_quantiser.thresholds[i];
    tab.thresholds[1][i] = gt.value_quantiser.thresholds[i];
  }
  // Code words: a kind that reads its code entries (norm correction; QJL keys) gets their shared address as
  // the base, the others 0 (their fields then need no correction).
  // (Scalars, not an array indexed by kind: that would live in local memory.)
  const std::uint32_t key_word_base = NC || QJL ? static_cast<std::uint32_t>(__cvta_generic_to_shared(tab.c2[0])) : 0u;
  const std::uint32_t value_word_base = NC ? static_cast<std::uint32_t>(__cvta_generic_to_shared(tab.c2[1])) : 0u;
  for (unsigned i = threadIdx.x; i < 2 * kMaxCellEntries; i += blockDim.x) {
    const unsigned kind = i / kMaxCellEntries;
    CellEntry e = (kind ? gt.value_quantiser : gt.key_quantiser).cells[i % kMaxCellEntries];
    e.below = (kind ? value_word_base : key_word_base) + 8u * e.below;
    tab.cells[kind][i % kMaxCellEntries] = e;
  }
  if (threadIdx.x < 2) {
    const EncodeQuantiser& q = threadIdx.x ? gt.value_quantiser : gt.key_quantiser;
    tab.cell_a[threadIdx.x] = q.cell_a;
    tab.cell_c[threadIdx.x] = q.cell_c;
    tab.cell_scale[threadIdx.x] = q.cell_scale;
    tab.cells_biased[threadIdx.x] =
        static_cast<std::uint32_t>(__cvta_generic_to_shared(tab.cells[threadIdx.x])) - 8u * 0x4B000000u;
  }
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  const unsigned t = lane % F::G;   // lane within the row
  const unsigned rr = lane / F::G;  // row within the warp step
  // QJL sign mask: bit m = the coordinate held in register m has sign −1. Main signs: MainSigns.
  std::uint32_t qjl_mask = 0, main_mask = 0;
#pragma unroll
  for (unsigned i = 0; i < 4; ++i) {
    unsigned w[4];
#pragma unroll
    for (unsigned q = 0; q < 4; ++q) {
      const unsigned e = 8 * (F::G * i + t) + 2 * q;
      w[q] = (gt.main_signs[e] < 0.0f ? 0x8000u : 0u) | (gt.main_signs[e + 1] < 0.0f ? 0x80000000u : 0u);
    }
    if constexpr (DT != 0) pair_masks[i][threadIdx.x] = make_uint4(w[0], w[1], w[2], w[3]);
#pragma unroll
    for (unsigned k = 0; k < 8; ++k) {
      qjl_mask |= (gt.qjl_signs[8 * (F::G * i + t) + k] < 0.0f ? 1u : 0u) << (8 * i + k);
      main_mask |= (gt.main_signs[8 * (F::G * i + t) + k] < 0.0f ? 1u : 0u) << (8 * i + k);
    }
  }
  const float scale = gt.block_scale[0];
  const float sign_threshold = gt.qjl_sign_threshold;
  const std::uint32_t key_bits = gt.key_code_bits, value_bits = gt.value_bits;
  // The batched instance's requests' first positions and rows, read once per block: from the parameter, or at
  // the device lengths (DeviceLengths), where a request ending beyond the limit keeps 0 rows and so writes
  // nothing (block 0 reports it); with a position check (PositionCheck), a request whose position is not the
  // device length keeps 0 rows (kStatusStalePosition). The single-request instance reads its parameter.
  __shared__ std::uint32_t request_position[kBatched ? kEncodeBatchMax : 1], request_rows[kBatched ? kEncodeBatchMax : 1];
  if constexpr (kBatched) {
    if (threadIdx.x < batch.count) {
      const EncodeSegment& r = batch.segment[threadIdx.x];
      std::uint32_t position = r.position, rows = r.rows;
      if (p.device_lengths != nullptr) {
        const LengthVerdict v = length_verdict(p, p.device_lengths[r.seq], position, rows);
        position = v.first;
        if (v.refusal != 0) {
          rows = 0;
          if (blockIdx.x == 0 && r.status != nullptr) atomicOr(r.status, v.refusal);
        }
      }
      request_position[threadIdx.x] = position;
      request_rows[threadIdx.x] = rows;
    }
  }
  auto position_of = [&](std::uint32_t r) { return kBatched ? request_position[r] : batch.segment[0].position; };
  auto rows_of = [&](std::uint32_t r) { return kBatched ? request_rows[r] : batch.segment[0].rows; };
  __syncthreads();

  const std::uint32_t H = p.kv_heads;
  const std::uint32_t total = batch.total_steps;  // launcher guarantees < 2^31
  const std::uint32_t stride = gridDim.x * kEncodeFastWarps;
  std::uint32_t g = blockIdx.x * kEncodeFastWarps + warp;

  // Step g lies in request r (first_step[r] ≤ g < end); its local step pb · 2H + rem -> (position block pb,
  // kind, head): neighbouring warps read neighbouring heads of the same rows. A warp's steps advance by
  // `stride`, so it keeps (r, pb, rem) of its current step and of the step it prefetches and advances them
  // without a division while it stays in one request.
  struct Cursor {
    std::uint32_t g, pb, rem, r, end;
  };
  const std::uint32_t two_h = 2u * H, stride_pb = stride / two_h, stride_rem = stride % two_h;
  auto locate = [&](Cursor& c, std::uint32_t from) {
    if constexpr (!kBatched) {
      c.r = 0;
      c.end = total;
      c.pb = c.g / two_h;
      c.rem = c.g % two_h;
      return;
    }
    std::uint32_t r = from;
    while (r + 1 < batch.count && c.g >= batch.segment[r + 1].first_step) ++r;
    c.r = r;
    c.end = r + 1 < batch.count ? batch.segment[r + 1].first_step : total;
    const std::uint32_t local = c.g - batch.segment[r].first_step;
    c.pb = local / two_h;
    c.rem = local % two_h;
  };
  auto cursor_at = [&](std::uint32_t gg) {
    Cursor c{gg, 0, 0, 0, 0};
    locate(c, 0);
    return c;
  };
  auto advance = [&](Cursor& c) {
    c.g += stride;
    if (c.g < c.end) {
      c.pb += stride_pb;
      c.rem += stride_rem;
      if (c.rem >= two_h) {
        c.rem -= two_h;
        ++c.pb;
      }
    } else if (kBatched && c.g < total) {
      locate(c, c.r);  // the next request (past the last one the cursor is out of range and never read)
    }
  };

  extern __shared__ uint4 ring_all[];
  uint4* const ring = ring_all + warp * kRingStages * RawOf<DT>::kVecs * 32u;
  auto issue = [&](const Cursor& c, unsigned stage) {
    const bool in_range = c.g < total;
    const std::uint32_t kind = c.rem >= H ? 1u : 0u;
    const std::uint32_t head = c.rem - kind * H;
    const std::uint32_t row = c.pb * F::R + rr;
    const EncodeSegment& req = batch.segment[kBatched ? c.r : 0u];
    fast_issue<D, DT>(ring + stage * RawOf<DT>::kVecs * 32u, kind ? req.values : req.keys,
                      static_cast<std::uint64_t>(row) * H + head, t, lane, in_range && row < rows_of(c.r));
  };
  Cursor now = cursor_at(g);
  issue(now, 0);
  issue(cursor_at(g + stride), 1);
  Cursor ahead = cursor_at(g + 2 * stride);
  unsigned stage = 0;
  for (; now.g < total; advance(now), advance(ahead), stage = stage == kRingStages - 1 ? 0 : stage + 1) {
    // Opaque to the compiler: stops it hoisting 32 per-register sign words out of the loop (and spilling them).
    // (main_mask likewise, for f32 only: the 16-bit instances read their signs from pair_masks.)
    asm volatile("" : "+r"(qjl_mask));
    if constexpr (DT == 0) asm volatile("" : "+r"(main_mask));
    const EncodeSegment& req = batch.segment[kBatched ? now.r : 0u];
    const std::uint32_t pb = now.pb;
    const std::uint32_t kind = now.rem >= H ? 1u : 0u;
    const std::uint32_t head = now.rem - kind * H;
    const std::uint32_t row = pb * F::R + rr;
    const std::uint32_t rows = rows_of(now.r), first_position = position_of(now.r);
    const bool valid = row < rows;
    // (A batched request refused at the device length has 0 rows in every step of it.)
    const std::uint32_t rows_here = !kBatched || pb * F::R < rows ? min(F::R, rows - pb * F::R) : 0u;

    // Two steps ahead into the stage freed by the previous step; then this step's copies (issued two groups
    // ago) are complete. Each lane reads back only what it copied itself, so no barrier is needed.
    issue(ahead, stage == 0 ? kRingStages - 1 : stage - 1);
    asm volatile("cp.async.wait_group 2;\n" ::: "memory");
    const uint4* cur = ring + stage * RawOf<DT>::kVecs * 32u;
    uint4 raw[RawOf<DT>::kVecs];
#pragma unroll
    for (unsigned v = 0; v < RawOf<DT>::kVecs; ++v) raw[v] = cur[v * 32 + lane];
    MainSigns signs;
    signs.bits = main_mask;
    if constexpr (DT != 0) {
#pragma unroll
      for (unsigned i = 0; i < 4; ++i) signs.pairs[i] = pair_masks[i][threadIdx.x];
    }

    const std::uint32_t position = first_position + row;
    const std::uint64_t slot0 =
        (static_cast<std::uint64_t>(req.seq) * H + head) * p.capacity + first_position + pb * F::R;

    // Exact window: the f32 row to ring slot position mod W (only the last W rows of the append).
    if (p.window > 0 && valid && row + p.window >= rows) {
      const std::uint64_t wrow = (static_cast<std::uint64_t>(req.seq) * H + head) * p.window + position % p.window;
      float4* dst = reinterpret_cast<float4*>(p.layer + (kind ? p.window_values_offset : p.window_keys_offset)) +
                    wrow * (D / 4);
#pragma unroll
      for (unsigned i = 0; i < 4; ++i) {
        const unsigned c = F::G * i + t;
        float v[8];
#pragma unroll
        for (unsigned k = 0; k < 8; ++k) v[k] = window_value<DT>(raw, 8 * i + k);
        dst[2 * c] = make_float4(v[0], v[1], v[2], v[3]);
        dst[2 * c + 1] = make_float4(v[4], v[5], v[6], v[7]);
      }
    }

    // x·signs (exact) and the lane's part of Σx² in float64 (squares of floats are exact in float64).
    float y[32];
    // Two chains (even and odd registers), added at the end: half the dependent float64 latency per step.
    double sums[2] = {0.0, 0.0};
#pragma unroll
    for (unsigned m = 0; m < 32; ++m) {
      const float x = signed_value<DT>(raw, signs, m);
      y[m] = x;
      sums[m & 1] = __fma_rn(static_cast<double>(x), static_cast<double>(x), sums[m & 1]);
    }
    double sum = __dadd_rn(sums[0], sums[1]);
#pragma unroll
    for (unsigned u = 1; u < F::G; u <<= 1) sum = __dadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, u));
    // Non-finite input makes Σx² inf or NaN; finite floats cannot overflow it (1024 · 3.4e38² < 1.8e308).
    const bool finite = sum <= 1.79769313486231570815e308;
    const double norm = __dsqrt_rn(sum);
    const bool overflow = finite && norm > static_cast<double>(kFloatMax);
    const bool good = finite && !overflow && norm != 0.0;
    if (valid && t == 0 && req.status != nullptr && (!finite || overflow)) {
      atomicOr(req.status, !finite ? kStatusNonFinite : kStatusNormOverflow);
    }

    // u = RN32(x · RN32(1/‖x‖)), the codec's normalisation (normalise.hpp); rows of extreme norm divide in
    // float64 instead, out of line.
    if (good && ktq::normalises_by_product(norm)) {
      const float r = ktq::unit_reciprocal(norm);
#pragma unroll
      for (unsigned m = 0; m < 32; ++m) y[m] = ktq::unit_coordinate(y[m], r);
    } else {
      // Out of line, zeros included: inlined, the zeroing of y was hoisted into every step.
      const Row32 rare = rare_unit_row<DT>(cur, &pair_masks[0][threadIdx.x], main_mask, lane, norm, good);
#pragma unroll
      for (unsigned m = 0; m < 32; ++m) y[m] = rare.v[m];
    }

    fast_butterflies<D>(y, t);  // (the ·1/√b: only QJL keys need it, in fast_tail)

    TailArgs a;
    a.p = &p;
    a.thr = tab.thresholds[kind];
    a.tab = &tab;
    a.c2 = tab.c2[kind];
    a.centroids = tab.centroids[kind];
    a.code_word_base = kind ? value_word_base : key_word_base;
    a.stage_codes = stage_codes[warp];
    a.stage_signs = stage_signs[warp];
    a.status = req.status;
    a.slot0 = slot0;
    a.norm = norm;
    a.scale = scale;
    a.sign_threshold = sign_threshold;
    a.qjl_mask = qjl_mask;
    a.lane = lane;
    a.t = t;
    a.rr = rr;
    a.rows_here = rows_here;
    a.kind = kind;
    a.good = good;
    a.valid = valid;
    fast_tail_dispatch<D, NC, QJL>(y, a, kind ? value_bits : key_bits, kind == 0);
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Every instance needs more dynamic shared memory than a kernel gets without opting in (48 KB less its static
// shared memory; the 16-bit inputs' ring alone is 48 KB). prepare_encode opts the codec's instances in once per
// codec: the attribute belongs to the function in the current context, so it is set where the codec's tables are
// allocated, not on every append.

// Devices whose resident-block count each kernel instance remembers; a higher ordinal asks the runtime per call.
constexpr int kRememberedDevices = 64;

// How many blocks of this instance run at once on the current device (SMs × blocks per SM): the persistent
// grid's size. Asked of the runtime once per instance and device, not per append: the occupancy query costs
// microseconds of host time, and a benchmark's event-timed append (or a user's decode step) would wait for it
// with the GPU idle. The answer depends only on the kernel and the device, so caching it changes no launch.
template <unsigned D, unsigned DT, bool NC, bool QJL, bool kBatched>
cudaError_t fast_resident_blocks(std::uint32_t& resident) {
  static std::atomic<std::uint32_t> remembered[kRememberedDevices];  // 0: not asked yet on that device
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool remembers = device >= 0 && device < kRememberedDevices;
  if (remembers) {
    resident = remembered[device].load(std::memory_order_acquire);
    if (resident != 0) return cudaSuccess;
  }
  int sms = 0, per_sm = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, encode_fast_kernel<D, DT, NC, QJL, kBatched>,
                                                        kEncodeFastWarps * 32, fast_ring_bytes<DT>());
  }
  if (err != cudaSuccess) return err;
  resident = static_cast<std::uint32_t>(sms > 0 ? sms : 1) * static_cast<std::uint32_t>(per_sm > 0 ? per_sm : 1);
  if (remembers) remembered[device].store(resident, std::memory_order_release);  // racing stores write one value
  return cudaSuccess;
}

template <unsigned D, unsigned DT, bool NC, bool QJL, bool kBatched, unsigned N>
cudaError_t launch_fast_instance(const EncodeParams& p, const EncodeSegments<N>& batch, cudaStream_t stream) {
  std::uint32_t resident = 0;
  const cudaError_t err = fast_resident_blocks<D, DT, NC, QJL, kBatched>(resident);
  if (err != cudaSuccess) return err;
  const std::uint32_t wanted = (batch.total_steps + kEncodeFastWarps - 1) / kEncodeFastWarps;
  const std::uint32_t blocks = wanted < resident ? wanted : resident;
  // Its launch overlaps the tail of the kernel before it on the stream (the previous layer's decode in a step).
  const cudaError_t launched = kvcompact::cuda::detail::launch_after_previous(
      encode_fast_kernel<D, DT, NC, QJL, kBatched>, dim3(blocks), dim3(kEncodeFastWarps * 32), fast_ring_bytes<DT>(),
      stream, p, batch);
  return launched != cudaSuccess ? launched : cudaGetLastError();
}

// The dispatch from the parameters' head_dim, dtype and family to an instance; N = 1: the single-request one.
template <unsigned D, unsigned DT, unsigned N>
cudaError_t launch_fast_family(const EncodeParams& p, const EncodeSegments<N>& batch, cudaStream_t stream) {
  constexpr bool kBatched = N > 1;
  if (p.has_qjl != 0) {
    return p.norm_correction != 0 ? launch_fast_instance<D, DT, true, true, kBatched>(p, batch, stream)
                                  : launch_fast_instance<D, DT, false, true, kBatched>(p, batch, stream);
  }
  return p.norm_correction != 0 ? launch_fast_instance<D, DT, true, false, kBatched>(p, batch, stream)
                                : launch_fast_instance<D, DT, false, false, kBatched>(p, batch, stream);
}

template <unsigned D, unsigned N>
cudaError_t launch_fast_dtype(const EncodeParams& p, const EncodeSegments<N>& batch, cudaStream_t stream) {
  if (p.dtype == 0) return launch_fast_family<D, 0>(p, batch, stream);
  if (p.dtype == 1) return launch_fast_family<D, 1>(p, batch, stream);
  return launch_fast_family<D, 2>(p, batch, stream);
}

template <unsigned N>
cudaError_t launch_fast_segments(const EncodeParams& p, const EncodeSegments<N>& batch, cudaStream_t stream) {
  if (p.head_dim == 64) return launch_fast_dtype<64>(p, batch, stream);
  if (p.head_dim == 128) return launch_fast_dtype<128>(p, batch, stream);
  return launch_fast_dtype<256>(p, batch, stream);
}

// Copies the requests into the launch's parameter and numbers their steps; false when they total 2^31 or more.
template <unsigned N>
bool number_steps(const EncodeParams& p, const EncodeSegment* segments, std::uint32_t count, EncodeSegments<N>& batch) {
  batch.count = count;
  std::uint64_t steps = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    batch.segment[i] = segments[i];
    batch.segment[i].first_step = static_cast<std::uint32_t>(steps);
    steps += fast_encode_steps(segments[i].rows, p.head_dim, p.kv_heads);
    if (steps >= (1ull << 31)) return false;
  }
  batch.total_steps = static_cast<std::uint32_t>(steps);
  return true;
}

template <unsigned D, unsigned DT>
cudaError_t prepare_fast_dtype(bool has_qjl, bool norm_correction) {
  const auto set_one = [](auto kernel) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(fast_ring_bytes<DT>()));
  };
  const auto set = [&](auto single, auto batched) {  // both instances of a family
    const cudaError_t err = set_one(single);
    return err != cudaSuccess ? err : set_one(batched);
  };
  if (has_qjl) {
    return norm_correction ? set(encode_fast_kernel<D, DT, true, true, false>, encode_fast_kernel<D, DT, true, true, true>)
                           : set(encode_fast_kernel<D, DT, false, true, false>, encode_fast_kernel<D, DT, false, true, true>);
  }
  return norm_correction ? set(encode_fast_kernel<D, DT, true, false, false>, encode_fast_kernel<D, DT, true, false, true>)
                         : set(encode_fast_kernel<D, DT, false, false, false>, encode_fast_kernel<D, DT, false, false, true>);
}

template <unsigned D>
cudaError_t prepare_fast(bool has_qjl, bool norm_correction) {
  cudaError_t err = prepare_fast_dtype<D, 0>(has_qjl, norm_correction);
  if (err == cudaSuccess) err = prepare_fast_dtype<D, 1>(has_qjl, norm_correction);
  if (err == cudaSuccess) err = prepare_fast_dtype<D, 2>(has_qjl, norm_correction);
  return err;
}

std::uint64_t fast_steps(const EncodeParams& p) { return fast_encode_steps(p.rows, p.head_dim, p.kv_heads); }

}  // namespace

std::uint64_t fast_encode_steps(std::uint32_t rows, std::uint32_t head_dim, std::uint32_t kv_heads) {
  const std::uint64_t rows_per_step = 1024u / head_dim;
  return (rows + rows_per_step - 1) / rows_per_step * 2u * kv_heads;
}

EncodePath encode_path(const EncodeParams& p) {
  const bool dim = p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256;
  const bool aligned = ((reinterpret_cast<std::uintptr_t>(p.keys) | reinterpret_cast<std::uintptr_t>(p.values) |
                         reinterpret_cast<std::uintptr_t>(p.layer)) & 15u) == 0;
  const bool bits = p.key_code_bits >= 1 && p.key_code_bits <= 5 && p.value_bits >= 1 && p.value_bits <= 5;
  return dim && aligned && bits && p.dtype <= 2 && fast_steps(p) < (1ull << 31) ? EncodePath::Fast : EncodePath::General;
}

cudaError_t prepare_encode(std::uint32_t head_dim, bool has_qjl, bool norm_correction) {
  if (head_dim == 64) return prepare_fast<64>(has_qjl, norm_correction);
  if (head_dim == 128) return prepare_fast<128>(has_qjl, norm_correction);
  if (head_dim == 256) return prepare_fast<256>(has_qjl, norm_correction);
  return cudaSuccess;  // the general kernel sizes its shared memory per launch
}

cudaError_t launch_encode(const EncodeParams& p, cudaStream_t stream, bool force_general) {
  if (p.rows == 0 || p.kv_heads == 0) return cudaSuccess;  // nothing to encode (and no empty grid to launch)
  if (!force_general && encode_path(p) == EncodePath::Fast) {
    const EncodeSegment one{p.keys, p.values, p.status, p.seq, p.position, p.rows, 0};
    return launch_encode_batch(p, &one, 1, stream);
  }
  const std::uint64_t items = static_cast<std::uint64_t>(p.rows) * p.kv_heads * 2u;
  const std::uint64_t blocks = (items + kEncodeWarps - 1) / kEncodeWarps;
  if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;
  const std::size_t smem = sizeof(float) * 2u * kEncodeWarps * p.head_dim;
  if (smem > 48u * 1024u) {
    const cudaError_t err =
        cudaFuncSetAttribute(encode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const cudaError_t launched = kvcompact::cuda::detail::launch_after_previous(
      encode_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kEncodeWarps * 32), smem, stream, p);
  return launched != cudaSuccess ? launched : cudaGetLastError();
}

cudaError_t launch_encode_batch(const EncodeParams& p, const EncodeSegment* segments, std::uint32_t count,
                                cudaStream_t stream) {
  if (count == 0 || count > kEncodeBatchMax) return cudaErrorInvalidValue;
  if (count == 1 && p.device_lengths == nullptr) {  // (only the batched instance reads the device lengths)
    EncodeSegments<1> one;
    if (!number_steps(p, segments, 1, one)) return cudaErrorInvalidValue;
    return one.total_steps == 0 ? cudaSuccess : launch_fast_segments(p, one, stream);
  }
  EncodeBatch batch{};
  if (!number_steps(p, segments, count, batch)) return cudaErrorInvalidValue;
  return batch.total_steps == 0 ? cudaSuccess : launch_fast_segments(p, batch, stream);  // 0: only empty requests
}

}  // namespace kvcompact::cuda::tq::detail
