// Fused split-K decode attention kernels over the packed TurboQuant layer layout (flash-decoding): one block
// per (split of the sequence, KV head, sequence) scores 128- or 256-token tiles of packed keys for the KV head's whole
// GQA group with tensor cores (mma.sync m16n8k16: 16 tokens × 16 coordinates of dequantised fp16 centroids
// against the group's rotated queries as the N = 8 dimension), accumulates P·V in rotated space and writes one
// partial (output, log-sum-exp) per split; a window kernel adds the exact f32 rows and a merge kernel combines
// the partials with the sink and applies R⁻¹ once per (sequence, query head). Host side: tq_decode.cpp. Pieces:
// decode_shape.cuh (an instance's constants and shared-memory layout), decode_device_ops.cuh (MMA, slices, table
// lookups), decode_merge.cuh (the in-kernel merge, the window and merge kernels); this file: the fused kernel and
// the choice of its instance.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "bulk_copy.cuh"
#include "decode_coords.hpp"
#include "decode_device_ops.cuh"
#include "decode_merge.cuh"
#include "decode_shape.cuh"
#include "mbarrier.cuh"
#include "params.hpp"
#include "pdl.cuh"

namespace kvcompact::cuda::tq::detail {

namespace {

// (region_copy, bulk_copy.cuh: the byte shift of a region's first record inside its first chunk is the same for
// every tile, region_shift.)
__device__ inline std::uint32_t region_shift(const std::uint8_t* region) {
  return static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(region) & 15u);
}

// Blocks per multiprocessor that the register budget is sized for: as many as the shared memory of the mse
// modes admits (228 KB per SM, 1 KB reserved per block), at most 20 warps (96 registers); d = 256 needs more
// registers.
template <int D, int CB, int VB, bool WIDE>
constexpr int decode_min_blocks() {
  using S = Shape<D, CB, VB, WIDE>;
  if (D > 128 || S::mt > 2) return 1;  // four m-tiles per warp need ≈ 170 registers
  const unsigned fit = (228u * 1024u) / (S::total(false) + 1024u), cap = 20u / S::warps;
  return fit >= cap ? static_cast<int>(cap) : (fit < 1 ? 1 : static_cast<int>(fit));
}

// PACK (GQA groups of at most 4 query heads, e.g. Llama-3): the MMA's N = 8 columns carry the fp16 hi parts of
// the ≤ 4 heads in columns 0–3 and their lo parts in columns 4–7 (for S the query's, for P'·V the weights'), so
// S and P'·V take one MMA per fragment instead of two; lane c ^ 2 then holds the other half of lane c's heads
// and one shuffle adds them. Otherwise (5–8 heads per block) all 8 columns are heads and hi and lo are separate
// MMAs.
template <int D, int CB, int VB, bool PACK, bool WIDE>
__global__ void __launch_bounds__(Shape<D, CB, VB, WIDE>::threads, (decode_min_blocks<D, CB, VB, WIDE>()))
    decode_kernel(DecodeParams p) {
  // Launched with launch_after_previous: nothing in memory is touched before the grid before it has completed.
  kvcompact::cuda::detail::wait_for_previous_grid();
  using S = Shape<D, CB, VB, WIDE>;
  constexpr unsigned kTile = S::tile, kBlockSize = S::threads, kWarps = S::warps, kHalves = S::halves;
  constexpr int kMt = S::mt;
  constexpr unsigned kWarpTokens = S::warp_tokens;
  // 128-bit key-slice loads where the rows allow them, in the packed instances only: the others keep the lo
  // accumulators live and would spill (ptxas: 20–24 bytes at d = 128) with four-register loads.
  constexpr bool kKeyA16 = S::key_rows_a16 && PACK;
  // Stage layout: key codes, key norms, value codes, value norms, then (QJL only) signs and ρ, so the
  // offsets of the buffers every mode reads are compile-time constants.
  constexpr unsigned kOffKn = S::kc, kOffVc = kOffKn + S::kn, kOffVn = kOffVc + S::vc;
  constexpr unsigned kOffKs = kOffVn + S::vn, kOffKr = kOffKs + S::ks;
  const bool qjl = p.tables_has_qjl != 0;
  const unsigned stage_bytes = S::stage(qjl);
  const unsigned main_bytes = S::main_area(qjl);
  extern __shared__ __align__(16) std::uint8_t smem[];
  std::uint8_t* main_area = smem;
  std::uint32_t* lut_k = reinterpret_cast<std::uint32_t*>(smem + main_bytes);
  std::uint32_t* lut_v = reinterpret_cast<std::uint32_t*>(smem + main_bytes + S::lut_k);
  uint2* lut_s = reinterpret_cast<uint2*>(smem + main_bytes + S::lut_k + S::lut_v);
  float* qscale = reinterpret_cast<float*>(reinterpret_cast<std::uint8_t*>(lut_s) + S::lut_s);
  std::uint64_t* bars = reinterpret_cast<std::uint64_t*>(reinterpret_cast<std::uint8_t*>(qscale) + S::qscale);
  uint4* qfrag = reinterpret_cast<uint4*>(reinterpret_cast<std::uint8_t*>(bars) + S::bars);  // [which][kk][lane]

  const Tables& t = *p.tables;
  const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  // The warp's half of the block (S::halves) and its index there; tile work and stages are per half.
  const unsigned half = kHalves == 1 ? 0u : warp / S::half_warps, hwarp = kHalves == 1 ? warp : warp % S::half_warps;
  const bool half_leader = (kHalves == 1 ? tid : tid % S::half_threads) == 0;  // issues its half's copies
  const unsigned g = lane >> 2, c = lane & 3u;
  const std::uint32_t lane4 = 4u * lane;  // a lane's byte offset inside every lane-replicated table entry
  // The same for the code-byte tables of 4-bit (half2 entries) and 2-bit keys (uint2 entries).
  const std::uint32_t key_lane =
      S::quad_keys ? 8u * (lane % kQuadCopies) : (S::wide_keys ? lane4 : 4u * (lane % kKeyCopies));
  std::uint32_t vtl = 0, vth = 0;  // 2-bit values: centroid byte tables (dequant2)
  if constexpr (VB == 2) byte_tables(p.tables->value_centroids, p.tables->value_lut_scale, vtl, vth);
  const std::uint32_t seq = blockIdx.z;
  const std::uint32_t kvh = blockIdx.y / p.head_groups;
  const std::uint32_t hg = blockIdx.y % p.head_groups;
  const std::uint32_t split = blockIdx.x;
  // Lengths come from device memory. Within the plan, length ≤ max_length ≤ capacity keeps every read inside the
  // layer buffer; a length beyond it reads nothing (as an empty sequence), and the merge writes NaN outputs for
  // it (merge_if_last, merge_kernel).
  const std::uint32_t device_length = p.lengths[seq];
  const std::uint32_t length = device_length <= p.max_length ? device_length : 0u;
  const std::uint32_t wb = p.window_begins != nullptr ? p.window_begins[seq] : 0u;
  const std::uint32_t qend = exact_begin(length, wb, p.window);
  const std::uint32_t begin = split * p.chunk;
  const std::uint32_t end = min(begin + p.chunk, qend);
  const std::uint32_t qh0 = kvh * p.group + hg * kGroup;
  const std::uint32_t nh = min(kGroup, p.group - hg * kGroup);

  // The prologue's global inputs are loaded here, before anything waits on one of them, so that their latencies
  // overlap: before, the centroids, the query rows and the rotations' signs were each loaded where they were
  // needed, a chain of global-memory waits and block barriers that took about a quarter of a batch-1 call.
  // Warp w < kPrepWarps prepares the query rows of heads w, w + kPrepWarps, …; lane k holds the centroids of
  // code k.
  constexpr unsigned kPrepWarps = kWarps < kGroup ? kWarps : kGroup;
  constexpr unsigned kWarpHeads = kGroup / kPrepWarps;
  static_assert(kGroup % kPrepWarps == 0, "every preparing warp prepares the same number of query heads");
  const bool prep_warp = kPrepWarps == kWarps || warp < kPrepWarps;
  float q_in[kWarpHeads][D / 32];
#pragma unroll
  for (unsigned k = 0; k < kWarpHeads; ++k) {
    const unsigned hh = (kPrepWarps == kWarps ? warp : min(warp, kPrepWarps - 1u)) + k * kPrepWarps;
    const float* q = p.queries + (static_cast<std::uint64_t>(seq) * p.q_heads + qh0 + min(hh, nh - 1u)) * D;
#pragma unroll
    for (int i = 0; i < D / 32; ++i) q_in[k][i] = hh < nh ? q[lane + 32 * i] : 0.0f;
  }
  float main_sign[D / 32], qjl_sign[D / 32];
  detail::load_lane_signs<D>(main_sign, t.main_signs, lane);
  if (qjl) detail::load_lane_signs<D>(qjl_sign, t.qjl_signs, lane);
  const float rotation_scale = t.block_scale[0], key_lut_scale = t.key_lut_scale, qjl_scale = t.qjl_scale;
  const float key_centroid = t.key_centroids[lane & ((1u << CB) - 1u)];
  const float value_centroid = t.value_centroids[lane & ((1u << VB) - 1u)];
  const float value_lut_scale = t.value_lut_scale;

  if (begin >= end) {
    for (std::uint32_t i = tid; i < nh * D; i += kBlockSize) {
      const std::uint64_t part = (static_cast<std::uint64_t>(seq) * p.q_heads + qh0 + i / D) * (p.splits + 1) + split;
      p.part_o[part * D + i % D] = 0.0f;
      if (i % D == 0) p.part_lse[part] = -INFINITY;
    }
    if (p.merge_in_kernel != 0) {
      merge_if_last<D, kBlockSize>(split_merge(p), p.tables, reinterpret_cast<float*>(smem), seq, qh0, nh);
    }
    return;
  }

  const std::uint64_t slot0 = (static_cast<std::uint64_t>(seq) * p.kv_heads + kvh) * p.capacity;
  const std::uint8_t* g_kc = p.layer + p.key_codes + slot0 * S::kc_bpt;
  const std::uint8_t* g_ks = p.layer + p.key_signs + slot0 * S::ks_bpt;
  const std::uint8_t* g_kn = p.layer + p.key_norms + slot0 * 4;
  const std::uint8_t* g_kr = p.layer + p.key_rho + slot0 * 2;
  const std::uint8_t* g_vc = p.layer + p.value_codes + slot0 * S::vc_bpt;
  const std::uint8_t* g_vn = p.layer + p.value_norms + slot0 * 4;
  const std::uint32_t sh_kc = region_shift(g_kc), sh_ks = region_shift(g_ks), sh_kn = region_shift(g_kn);
  const std::uint32_t sh_kr = region_shift(g_kr), sh_vc = region_shift(g_vc), sh_vn = region_shift(g_vn);

  const std::uint32_t tiles = (end - begin + kTile - 1) / kTile;
  // Half h takes tiles h, h + kHalves, …; its n-th (tile / kHalves) goes to its stage n mod kStages.
  auto stage_index = [&](std::uint32_t tile) { return half * kStages + (tile / kHalves) % kStages; };
  // One thread per half issues a stage's bulk copies (key codes, signs, norms, ρ, value codes, value norms).
  auto issue = [&](std::uint32_t tile) {
    if (!half_leader || tile >= tiles) return;
    std::uint8_t* sb = main_area + stage_index(tile) * stage_bytes;
    std::uint64_t* bar = &bars[stage_index(tile)];
    const std::uint32_t p0 = begin + tile * kTile;
    const std::uint32_t n = min(kTile, end - p0);
    const RegionCopy kc = region_copy(g_kc, p0, n, S::kc_bpt), kn = region_copy(g_kn, p0, n, 4);
    const RegionCopy vc = region_copy(g_vc, p0, n, S::vc_bpt), vn = region_copy(g_vn, p0, n, 4);
    RegionCopy ks{nullptr, 0}, kr{nullptr, 0};
    if (qjl) {
      ks = region_copy(g_ks, p0, n, S::ks_bpt);
      kr = region_copy(g_kr, p0, n, 2);
    }
    mbar_arrive_expect_tx(bar, kc.bytes + ks.bytes + kn.bytes + kr.bytes + vc.bytes + vn.bytes);
    bulk_copy(sb, kc.src, kc.bytes, bar);
    if (qjl) {
      bulk_copy(sb + kOffKs, ks.src, ks.bytes, bar);
      bulk_copy(sb + kOffKr, kr.src, kr.bytes, bar);
    }
    bulk_copy(sb + kOffKn, kn.src, kn.bytes, bar);
    bulk_copy(sb + kOffVc, vc.src, vc.bytes, bar);
    bulk_copy(sb + kOffVn, vn.src, vn.bytes, bar);
  };

  // The first stages' copies are in flight while the block builds its tables and query fragments.
  if (half_leader) {
    for (unsigned st = 0; st < kStages; ++st) mbar_init(&bars[half * kStages + st], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    for (unsigned st = 0; st + 1 < kStages; ++st) issue(half + st * kHalves);
  }

  // Lookup tables from packed code groups to fp16 centroids (low half = lower coordinate) for 3- to 5-bit
  // codes (2-bit codes use register tables, dequant2): a pair of coordinates (3 bits) or one (4, 5 bits);
  // signs: 4 bits -> four ±1 (one 64-bit lookup: fewer instructions than decoding the bits with ALU operations).
  // Every table is made of entries that repeat a 16-byte pattern (fill_replicated; 128-byte entries, except for
  // 4-bit keys with fewer than 32 copies); a pattern's fp16 centroids come by shuffle from the lanes that hold
  // them (lane k holds code k's), so no staging in shared memory and no barrier precede the tables.
  {
    constexpr unsigned km = (1u << CB) - 1u, vm = (1u << VB) - 1u;
    constexpr unsigned nk = S::pair_keys ? (1u << (2 * CB)) : (1u << CB);
    constexpr unsigned nv = S::pair_values ? (1u << (2 * VB)) : (1u << VB);
    auto halves = [](std::uint32_t lo, std::uint32_t hi) { return lo | (hi << 16); };
    const std::uint32_t key_half = __half_as_ushort(__float2half_rn(key_lut_scale * key_centroid));
    const std::uint32_t value_half = __half_as_ushort(__float2half_rn(value_lut_scale * value_centroid));
    auto key = [&](unsigned code) { return __shfl_sync(0xffffffffu, key_half, code); };
    auto value = [&](unsigned code) { return __shfl_sync(0xffffffffu, value_half, code); };
    uint4* lk = reinterpret_cast<uint4*>(lut_k);
    if constexpr (S::quad_keys) {
      static_assert(8u * kQuadCopies == 128u, "2-bit key entries are 128 bytes");
      fill_replicated<kBlockSize>(lk, 256u, [&](unsigned e) {
        const std::uint32_t x = halves(key(e & 3u), key((e >> 2) & 3u)), y = halves(key((e >> 4) & 3u), key(e >> 6));
        return make_uint4(x, y, x, y);
      });
    } else if constexpr (S::byte_keys) {
      fill_replicated<kBlockSize, S::wide_keys ? 128u : 4u * kKeyCopies, S::key_stride>(lk, 256u, [&](unsigned e) {
        const std::uint32_t x = halves(key(e & 15u), key(e >> 4));
        return make_uint4(x, x, x, x);
      });
    } else if constexpr (S::lut_k != 0) {
      fill_replicated<kBlockSize>(lk, nk, [&](unsigned e) {
        const std::uint32_t x = S::pair_keys ? halves(key(e & km), key(e >> CB)) : halves(key(e), 0u);
        return make_uint4(x, x, x, x);
      });
    }
    if constexpr (S::lut_v != 0) {
      fill_replicated<kBlockSize>(reinterpret_cast<uint4*>(lut_v), nv, [&](unsigned e) {
        const std::uint32_t x = S::pair_values ? halves(value(e & vm), value(e >> VB)) : halves(value(e), 0u);
        return make_uint4(x, x, x, x);
      });
    }
  }

  if (tid < 16) {
    lut_s[tid] = make_uint2(pack_half2((tid & 1u) ? 1.0f : -1.0f, (tid & 2u) ? 1.0f : -1.0f),
                            pack_half2((tid & 4u) ? 1.0f : -1.0f, (tid & 8u) ? 1.0f : -1.0f));
  }

  // Query preparation: q_rot = R_p(q), q_jl = R_j(q_rot) for the block's heads, scaled to max |x| = 1 and
  // split into fp16 hi + lo parts laid out as the MMA's B fragments.
  {
    float* qrot = reinterpret_cast<float*>(main_area + (kStages - 1) * stage_bytes);  // behind the stages in flight
    float* qjlb = qrot + kGroup * D;
#pragma unroll
    for (unsigned k = 0; k < (prep_warp ? kWarpHeads : 0u); ++k) {
      const unsigned hh = warp + k * kPrepWarps;
      float* row = qrot + hh * D;
      float* rowj = qjlb + hh * D;
      // Coordinate lane + 32i in v[i]; a block's unused head columns stay zero (rotating zeros gives zeros).
      float v[D / 32], vj[D / 32];
#pragma unroll
      for (int i = 0; i < D / 32; ++i) v[i] = q_in[k][i];
      if (hh < nh) detail::rotate_forward_in_registers<D>(v, main_sign, rotation_scale, lane);
#pragma unroll
      for (int i = 0; i < D / 32; ++i) vj[i] = v[i];
      if (qjl && hh < nh) detail::rotate_forward_in_registers<D>(vj, qjl_sign, rotation_scale, lane);
      float mr = 0.0f, mj = 0.0f;
#pragma unroll
      for (int i = 0; i < D / 32; ++i) {
        mr = fmaxf(mr, fabsf(v[i]));
        mj = fmaxf(mj, fabsf(vj[i]));
      }
      for (int o = 16; o > 0; o >>= 1) {
        mr = fmaxf(mr, __shfl_xor_sync(0xffffffffu, mr, o));
        mj = fmaxf(mj, __shfl_xor_sync(0xffffffffu, mj, o));
      }
      mr = mr > 0.0f ? mr : 1.0f;
      mj = mj > 0.0f ? mj : 1.0f;
      // Scaled by reciprocals (one division per row; the fp16 hi + lo split keeps 2⁻²² of x / max anyway).
      const float ir = 1.0f / mr, ij = 1.0f / mj;
#pragma unroll
      for (int i = 0; i < D / 32; ++i) {
        row[lane + 32 * i] = v[i] * ir;
        rowj[lane + 32 * i] = vj[i] * ij;
      }
      if (lane == 0) {
        qscale[2 * hh] = mr / key_lut_scale;
        qscale[2 * hh + 1] = mj * qjl_scale;
      }
    }
    __syncthreads();
    for (unsigned i = tid; i < (D / 16) * 32; i += kBlockSize) {
      const unsigned kk = i / 32, l = i % 32, hg8 = l >> 2, cc = l & 3u;
      // Column hg8 of the B fragment: head hg8, or with PACK the hi (hg8 < 4) or lo part of head hg8 mod 4.
      const unsigned head = PACK ? (hg8 & 3u) : hg8;
      const bool lo_column = PACK && hg8 >= 4;
      for (unsigned which = 0; which < (qjl ? 2u : 1u); ++which) {
        // Lane (g, c) of k-step kk holds coordinates c·D/4 + 4kk .. +3 (the keys' A fragments use the same
        // order: any permutation of the reduction index works when both operands share it), so the codes a
        // lane needs from one token row over all k-steps are one contiguous slice.
        const float* row = (which == 0 ? qrot : qjlb) + head * D + cc * (D / 4);
        // The code part follows key_coord; the QJL part keeps 4kk + e (its signs come from a 16-entry table).
        const unsigned e0 = which == 0 ? key_coord<CB>(kk, 0) : 4 * kk, e1 = which == 0 ? key_coord<CB>(kk, 1) : 4 * kk + 1;
        const unsigned e2 = which == 0 ? key_coord<CB>(kk, 2) : 4 * kk + 2, e3 = which == 0 ? key_coord<CB>(kk, 3) : 4 * kk + 3;
        const float x0 = row[e0], x1 = row[e1], x8 = row[e2], x9 = row[e3];
        const __half2 h01 = __floats2half2_rn(x0, x1), h89 = __floats2half2_rn(x8, x9);
        const float2 f01 = __half22float2(h01), f89 = __half22float2(h89);
        uint4 v;
        v.x = *reinterpret_cast<const std::uint32_t*>(&h01);
        v.y = *reinterpret_cast<const std::uint32_t*>(&h89);
        v.z = pack_half2(x0 - f01.x, x1 - f01.y);
        v.w = pack_half2(x8 - f89.x, x9 - f89.y);
        if constexpr (PACK) {  // one half per column: 8-byte entries (one LDS.64 per k-step)
          reinterpret_cast<uint2*>(qfrag)[which * S::qfrag_entries + i] = lo_column ? make_uint2(v.z, v.w)
                                                                                     : make_uint2(v.x, v.y);
        } else {
          qfrag[which * S::qfrag_entries + i] = v;
        }
      }
    }
    __syncthreads();
  }


  float m_run[2] = {-INFINITY, -INFINITY};
  float vscale = 0.0f, inv = 0.0f;  // the running value scale (below) and its reciprocal
  float l_run[2] = {0.0f, 0.0f};
  float acc[D / 16][4];
#pragma unroll
  for (int jb = 0; jb < D / 16; ++jb) acc[jb][0] = acc[jb][1] = acc[jb][2] = acc[jb][3] = 0.0f;
  // Per-lane score scales of the lane's heads hb, hb + 1 (hb = 2c; with PACK 2(c mod 2)): the code part's (with
  // the softmax scale · log2 e folded in) and the QJL part's relative to it (both query scales are positive).
  const unsigned hb = PACK ? 2u * (c & 1u) : 2u * c;
  const float qsr0 = qscale[2 * hb] * p.scale_log2, qsr1 = qscale[2 * hb + 2] * p.scale_log2;
  const float qjr0 = qscale[2 * hb + 1] / qscale[2 * hb], qjr1 = qscale[2 * hb + 3] / qscale[2 * hb + 2];
  // The fp16 half of the weights P' that this lane's B columns carry (PACK: lanes c ≥ 2 the lo parts).
  const bool lo_lane = PACK && c >= 2u;
  // A k-step's query B fragment of this lane (which = 0: the code part, 1: the QJL part): hi in x, y and lo in
  // z, w; with PACK one uint2 per lane (hi or lo, by column) in x, y.
  auto query_fragment = [&](unsigned which, int kk) -> uint4 {
    if constexpr (PACK) {
      const uint2 q = reinterpret_cast<const uint2*>(qfrag)[which * S::qfrag_entries + kk * 32 + lane];
      return make_uint4(q.x, q.y, 0u, 0u);
    } else {
      return qfrag[which * S::qfrag_entries + kk * 32 + lane];
    }
  };

  // Both halves run the same number of steps (and barriers); with an odd tile count half 1's last step has
  // no tile and only keeps the count.
  for (std::uint32_t step = 0; step < (tiles + kHalves - 1) / kHalves; ++step) {
    const std::uint32_t tile = step * kHalves + half;
    if (tile < tiles) mbar_wait(&bars[stage_index(tile)], (step / kStages) & 1u);
    // Every warp of the half has finished its previous tile before that stage buffer is refilled.
    if constexpr (kHalves == 1) {
      __syncthreads();
    } else {
      half_barrier<S::half_threads>(half);
    }
    if (tile >= tiles) continue;
    issue(tile + (kStages - 1) * kHalves);
    const std::uint8_t* sb = main_area + stage_index(tile) * stage_bytes;
    const std::uint32_t p0 = begin + tile * kTile;
    const std::uint32_t valid = min(kTile, end - p0);
    if (hwarp * kWarpTokens >= valid) continue;
    // The warp's kMt m-tiles of 16 tokens share every query fragment load and every softmax reduction.
    unsigned r0[kMt], r1[kMt];
    bool v0[kMt], v1[kMt];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      r0[mt] = hwarp * kWarpTokens + 16 * mt + g;
      r1[mt] = r0[mt] + 8;
      v0[mt] = r0[mt] < valid;
      v1[mt] = r1[mt] < valid;
    }

    // Scores S[token, head] = K̃[16 × d] · Q[d × 8] per m-tile; code and QJL parts, fp16 hi and lo parts of the
    // query in separate accumulators (independent MMA chains).
    float ch[kMt][4], cl[kMt][4];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) ch[mt][i] = cl[mt][i] = 0.0f;
    }
    // Each lane reads its slice of its token rows once per tile (instead of one shared-memory load per k-step).
    Slice<S::slice_k> kq0[kMt], kq1[kMt];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      kq0[mt] = load_slice<S::slice_k, kKeyA16>(sb + sh_kc + r0[mt] * S::kc_bpt, c * S::slice_k);
      kq1[mt] = load_slice<S::slice_k, kKeyA16>(sb + sh_kc + r1[mt] * S::kc_bpt, c * S::slice_k);
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint4 qb = query_fragment(0, kk);
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        std::uint32_t a0, a1, a2, a3;
        const unsigned pos = 4 * CB * kk;
        if constexpr (S::quad_keys) {
          // Slots 0..3 of k-step kk (coordinates 4kk .. 4kk + 3) are one code byte: a0 / a2 from one entry.
          constexpr unsigned stride = 8 * kQuadCopies;
          const KeyByteSource src = key_byte_source<CB>(kk, 0);
          const uint2 x0 = lds_at<uint2>(lut_k, byte_entry<stride>(kq0[mt].w[src.word], src.byte, key_lane));
          const uint2 x1 = lds_at<uint2>(lut_k, byte_entry<stride>(kq1[mt].w[src.word], src.byte, key_lane));
          a0 = x0.x;
          a2 = x0.y;
          a1 = x1.x;
          a3 = x1.y;
        } else if constexpr (S::byte_keys) {
          // Slots 0, 1 of k-step kk are one code byte, slots 2, 3 the next.
          const KeyByteSource s01 = key_byte_source<CB>(kk, 0), s23 = key_byte_source<CB>(kk, 2);
          auto entry = [&](std::uint32_t w, unsigned b) {
            return S::wide_keys ? wide_byte_entry(w, b, key_lane) : byte_entry<S::key_stride>(w, b, key_lane);
          };
          a0 = lds_at<std::uint32_t>(lut_k, entry(kq0[mt].w[s01.word], s01.byte));
          a2 = lds_at<std::uint32_t>(lut_k, entry(kq0[mt].w[s23.word], s23.byte));
          a1 = lds_at<std::uint32_t>(lut_k, entry(kq1[mt].w[s01.word], s01.byte));
          a3 = lds_at<std::uint32_t>(lut_k, entry(kq1[mt].w[s23.word], s23.byte));
        } else if constexpr (S::pair_keys) {
          a0 = lds_at<std::uint32_t>(lut_k, field_offset<2 * CB, 7>(kq0[mt], pos, lane4));
          a2 = lds_at<std::uint32_t>(lut_k, field_offset<2 * CB, 7>(kq0[mt], pos + 2 * CB, lane4));
          a1 = lds_at<std::uint32_t>(lut_k, field_offset<2 * CB, 7>(kq1[mt], pos, lane4));
          a3 = lds_at<std::uint32_t>(lut_k, field_offset<2 * CB, 7>(kq1[mt], pos + 2 * CB, lane4));
        } else {
          auto pair = [&](const Slice<S::slice_k>& sl, unsigned q) {
            return __byte_perm(lds_at<std::uint32_t>(lut_k, field_offset<CB, 7>(sl, pos + 2 * q * CB, lane4)),
                               lds_at<std::uint32_t>(lut_k, field_offset<CB, 7>(sl, pos + (2 * q + 1) * CB, lane4)),
                               0x5410);
          };
          a0 = pair(kq0[mt], 0);
          a2 = pair(kq0[mt], 1);
          a1 = pair(kq1[mt], 0);
          a3 = pair(kq1[mt], 1);
        }
        mma16816(ch[mt], a0, a1, a2, a3, qb.x, qb.y);
        if constexpr (!PACK) mma16816(cl[mt], a0, a1, a2, a3, qb.z, qb.w);
      }
    }
    // ks = the code part in units of the query scale; the QJL part (ρ · its own query scale) is folded in.
    float ks[kMt][4];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) ks[mt][i] = ch[mt][i] + (PACK ? __shfl_xor_sync(0xffffffffu, ch[mt][i], 2) : cl[mt][i]);
    }
    if (qjl) {
      float sh[kMt][4], sl[kMt][4];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) sh[mt][i] = sl[mt][i] = 0.0f;
      }
      Slice<S::slice_s> sg0[kMt], sg1[kMt];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        sg0[mt] = load_slice<S::slice_s>(sb + kOffKs + sh_ks + r0[mt] * S::ks_bpt, c * S::slice_s);
        sg1[mt] = load_slice<S::slice_s>(sb + kOffKs + sh_ks + r1[mt] * S::ks_bpt, c * S::slice_s);
      }
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint4 qb = query_fragment(1, kk);
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          const uint2 x0 = lds_pair_split(lut_s, field_offset<4, 3>(sg0[mt], 4 * kk, 0u));
          const uint2 x1 = lds_pair_split(lut_s, field_offset<4, 3>(sg1[mt], 4 * kk, 0u));
          mma16816(sh[mt], x0.x, x1.x, x0.y, x1.y, qb.x, qb.y);
          if constexpr (!PACK) mma16816(sl[mt], x0.x, x1.x, x0.y, x1.y, qb.z, qb.w);
        }
      }
      if constexpr (PACK) {  // the other half of the lane's heads is in lane c ^ 2
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
          for (int i = 0; i < 4; ++i) sl[mt][i] = __shfl_xor_sync(0xffffffffu, sh[mt][i], 2);
        }
      }
      const __half* rho = reinterpret_cast<const __half*>(sb + kOffKr + sh_kr);
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        const float t0 = __half2float(rho[r0[mt]]), t1 = __half2float(rho[r1[mt]]);
        ks[mt][0] += t0 * qjr0 * (sh[mt][0] + sl[mt][0]);
        ks[mt][1] += t0 * qjr1 * (sh[mt][1] + sl[mt][1]);
        ks[mt][2] += t1 * qjr0 * (sh[mt][2] + sl[mt][2]);
        ks[mt][3] += t1 * qjr1 * (sh[mt][3] + sl[mt][3]);
      }
    }
    const float* kn = reinterpret_cast<const float*>(sb + kOffKn + sh_kn);
    float sc[kMt][4];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      const float n0 = kn[r0[mt]], n1 = kn[r1[mt]];
      sc[mt][0] = v0[mt] ? n0 * qsr0 * ks[mt][0] : -INFINITY;
      sc[mt][1] = v0[mt] ? n0 * qsr1 * ks[mt][1] : -INFINITY;
      sc[mt][2] = v1[mt] ? n1 * qsr0 * ks[mt][2] : -INFINITY;
      sc[mt][3] = v1[mt] ? n1 * qsr1 * ks[mt][3] : -INFINITY;
    }

    // Online softmax per head column (heads hb, hb + 1 of this lane; rows = tokens across g and m-tiles).
    float mt0 = -INFINITY, mt1 = -INFINITY;
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      mt0 = fmaxf(mt0, fmaxf(sc[mt][0], sc[mt][2]));
      mt1 = fmaxf(mt1, fmaxf(sc[mt][1], sc[mt][3]));
    }
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, o));
      mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, o));
    }
    const float mn0 = fmaxf(m_run[0], mt0), mn1 = fmaxf(m_run[1], mt1);
    // The warp's first row is valid, so the maxima are finite; the guard only keeps −∞ − (−∞) out of ex2 if a
    // score were −∞. Masked scores (−∞) and the first tile's m_run (−∞) give ex2(−∞) = 0.
    const float ms0 = mn0 == -INFINITY ? 0.0f : mn0, ms1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float al0 = exp2_fast(m_run[0] - ms0), al1 = exp2_fast(m_run[1] - ms1);
    float pe[kMt][4];
    l_run[0] *= al0;
    l_run[1] *= al1;
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      pe[mt][0] = exp2_fast(sc[mt][0] - ms0);
      pe[mt][1] = exp2_fast(sc[mt][1] - ms1);
      pe[mt][2] = exp2_fast(sc[mt][2] - ms0);
      pe[mt][3] = exp2_fast(sc[mt][3] - ms1);
      l_run[0] += pe[mt][0] + pe[mt][2];
      l_run[1] += pe[mt][1] + pe[mt][3];
    }
    m_run[0] = mn0;
    m_run[1] = mn1;

    // Value norms go into P relative to a running scale vscale (acc holds Σ P'·V with P' = p·n_v / vscale),
    // so P' stays in [0, 1] in fp16: vscale follows the tile maximum when it grows or drops 4×, and acc is
    // rescaled together with the softmax rescale (rare once the maxima settle).
    const float* vn = reinterpret_cast<const float*>(sb + kOffVn + sh_vn);
    float nv0[kMt], nv1[kMt];
    float nvmax = 0.0f;
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      nv0[mt] = v0[mt] ? vn[r0[mt]] : 0.0f;
      nv1[mt] = v1[mt] ? vn[r1[mt]] : 0.0f;
      nvmax = fmaxf(nvmax, fmaxf(nv0[mt], nv1[mt]));
    }
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) nvmax = fmaxf(nvmax, __shfl_xor_sync(0xffffffffu, nvmax, o));
    const float new_scale = (nvmax > vscale || nvmax * 4.0f < vscale) && nvmax > 0.0f ? nvmax : vscale;
    float ratio = 1.0f;
    if (new_scale != vscale) {  // warp-uniform (nvmax is reduced over the warp's tokens); rare once it settles
      const float inv_new = rcp_fast(new_scale);
      ratio = vscale > 0.0f ? vscale * inv_new : 1.0f;
      vscale = new_scale;
      inv = inv_new;
    }
    const float f0 = al0 * ratio, f1 = al1 * ratio;
    if (!__all_sync(0xffffffffu, f0 == 1.0f && f1 == 1.0f)) {
#pragma unroll
      for (int jb = 0; jb < D / 16; ++jb) {
        acc[jb][0] *= f0;
        acc[jb][1] *= f1;
        acc[jb][2] *= f0;
        acc[jb][3] *= f1;
      }
    }

    // O[coord, head] += Vᵀ[16 coords × 16 tokens] · P'[16 tokens × 8 heads] per m-tile, in rotated space.
    // Row g of the A fragment of output block jb is coordinate g·D/8 + 2jb and row g + 8 is g·D/8 + 2jb + 1, so
    // one pair lookup per token gives both rows, two byte permutes put two tokens side by side, and the codes a
    // lane needs from one token row over all jb are one contiguous slice (read once per m-tile).
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      // P' = hi + lo in fp16 (two MMAs against the same V fragment, or with PACK the lo parts in columns 4–7 of
      // the one MMA): P' keeps ≈ 22 bits.
      const float x0 = pe[mt][0] * nv0[mt] * inv, x1 = pe[mt][1] * nv0[mt] * inv;
      const float x2 = pe[mt][2] * nv1[mt] * inv, x3 = pe[mt][3] * nv1[mt] * inv;
      const __half2 h01 = __floats2half2_rn(x0, x1), h23 = __floats2half2_rn(x2, x3);
      const float2 g01 = __half22float2(h01), g23 = __half22float2(h23);
      const std::uint32_t hi01 = *reinterpret_cast<const std::uint32_t*>(&h01);
      const std::uint32_t hi23 = *reinterpret_cast<const std::uint32_t*>(&h23);
      const std::uint32_t lo01 = pack_half2(x0 - g01.x, x1 - g01.y), lo23 = pack_half2(x2 - g23.x, x3 - g23.y);
      const std::uint32_t b0 = transpose8x8(lo_lane ? lo01 : hi01), b1 = transpose8x8(lo_lane ? lo23 : hi23);
      const std::uint32_t c0 = PACK ? 0u : transpose8x8(lo01), c1 = PACK ? 0u : transpose8x8(lo23);
      const std::uint8_t* vcb = sb + kOffVc + sh_vc + (hwarp * kWarpTokens + 16 * mt) * S::vc_bpt;
      const Slice<S::slice_v> va = load_slice<S::slice_v>(vcb + (2 * c) * S::vc_bpt, g * S::slice_v);
      const Slice<S::slice_v> vb = load_slice<S::slice_v>(vcb + (2 * c + 1) * S::vc_bpt, g * S::slice_v);
      const Slice<S::slice_v> vc8 = load_slice<S::slice_v>(vcb + (2 * c + 8) * S::vc_bpt, g * S::slice_v);
      const Slice<S::slice_v> vd = load_slice<S::slice_v>(vcb + (2 * c + 9) * S::vc_bpt, g * S::slice_v);
#pragma unroll
      for (int jb = 0; jb < D / 16; ++jb) {
        auto lookup = [&](const Slice<S::slice_v>& sl) -> std::uint32_t {
          const unsigned pos = 2 * VB * jb;
          if constexpr (VB == 2) {
            const ValuePairSource<D> src = value_pair_source<D>(jb);
            return dequant2(nibble_codes(sl.w[src.word], src.j, src.upper), src.second, vtl, vth);
          } else if constexpr (S::pair_values) {
            return lds_at<std::uint32_t>(lut_v, field_offset<2 * VB, 7>(sl, pos, lane4));
          } else {
            return __byte_perm(lds_at<std::uint32_t>(lut_v, field_offset<VB, 7>(sl, pos, lane4)),
                               lds_at<std::uint32_t>(lut_v, field_offset<VB, 7>(sl, pos + VB, lane4)), 0x5410);
          }
        };
        const std::uint32_t la = lookup(va);
        const std::uint32_t lb = lookup(vb);
        const std::uint32_t lc = lookup(vc8);
        const std::uint32_t ld = lookup(vd);
        const std::uint32_t a0 = __byte_perm(la, lb, 0x5410), a1 = __byte_perm(la, lb, 0x7632);
        const std::uint32_t a2 = __byte_perm(lc, ld, 0x5410), a3 = __byte_perm(lc, ld, 0x7632);
        mma16816(acc[jb], a0, a1, a2, a3, b0, b1);
        if constexpr (!PACK) mma16816(acc[jb], a0, a1, a2, a3, c0, c1);
      }
    }
  }
  // Every issued copy was waited for (a half issues only tiles < tiles of its own, which its loop consumes).
  __syncthreads();

  // Merge the warps' partial softmax states in shared memory (the stage buffers are free now).
  float* mo = reinterpret_cast<float*>(main_area);                // [warps][8][S::merge_row]
  float* mm = mo + kWarps * kGroup * S::merge_row;                // [warps][8]
  float* ml = mm + kWarps * kGroup;                               // [warps][8]
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    l_run[0] += __shfl_xor_sync(0xffffffffu, l_run[0], o);
    l_run[1] += __shfl_xor_sync(0xffffffffu, l_run[1], o);
  }
  // With PACK, lanes c ^ 2 hold the lo columns of the same heads: add them; lanes c < 2 write the heads.
  if constexpr (PACK) {
#pragma unroll
    for (int jb = 0; jb < D / 16; ++jb) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[jb][i] += __shfl_xor_sync(0xffffffffu, acc[jb][i], 2);
    }
  }
  const bool writer = !PACK || c < 2u;
  if (g == 0 && writer) {
    mm[warp * kGroup + 2 * c] = m_run[0];
    mm[warp * kGroup + 2 * c + 1] = m_run[1];
    ml[warp * kGroup + 2 * c] = l_run[0];
    ml[warp * kGroup + 2 * c + 1] = l_run[1];
  }
  float* mw = mo + warp * kGroup * S::merge_row;
  auto merge_at = [](unsigned row, unsigned j) { return row * S::merge_row + j + j / (D / 8); };
  vscale /= value_lut_scale;
  if (writer) {
#pragma unroll
    for (int jb = 0; jb < D / 16; ++jb) {
      // The value A fragment's row order (P·V above): rows g and g + 8 of block jb.
      const unsigned j0 = g * (D / 8) + value_first<D, VB>(jb), j1 = j0 + value_second_offset<VB>();
      mw[merge_at(2 * c, j0)] = acc[jb][0] * vscale;
      mw[merge_at(2 * c + 1, j0)] = acc[jb][1] * vscale;
      mw[merge_at(2 * c, j1)] = acc[jb][2] * vscale;
      mw[merge_at(2 * c + 1, j1)] = acc[jb][3] * vscale;
    }
  }
  __syncthreads();
  for (std::uint32_t i = tid; i < nh * D; i += kBlockSize) {
    const std::uint32_t h = i / D, j = i % D;
    float m = -INFINITY;
    for (unsigned w = 0; w < kWarps; ++w) m = fmaxf(m, mm[w * kGroup + h]);
    const std::uint64_t part = (static_cast<std::uint64_t>(seq) * p.q_heads + qh0 + h) * (p.splits + 1) + split;
    float o = 0.0f, l = 0.0f;
    if (m != -INFINITY) {
      for (unsigned w = 0; w < kWarps; ++w) {
        const float f = exp2f(mm[w * kGroup + h] - m);
        l += ml[w * kGroup + h] * f;
        o += mo[merge_at(w * kGroup + h, j)] * f;
      }
    }
    p.part_o[part * D + j] = l > 0.0f ? o / l : 0.0f;
    if (j == 0) p.part_lse[part] = l > 0.0f ? m + log2f(l) : -INFINITY;
  }
  if (p.merge_in_kernel != 0) merge_if_last<D, kBlockSize>(split_merge(p), p.tables, mo, seq, qh0, nh);
}


using KernelFn = void (*)(DecodeParams);

// A fused-kernel instance and its launch shape.
struct KernelPick {
  KernelFn fn = nullptr;
  std::uint32_t smem = 0, threads = 0;
  std::uint32_t tile = 0;  // the split granularity in tokens: a stage's tokens times the block's halves
};

// The opt-in limit of a block's shared memory on sm_90 (227 KB).
constexpr std::uint32_t kMaxBlockSmem = 227u * 1024u;

template <int D, int CB, int VB, bool WIDE>
KernelPick pick_instance(bool qjl, bool pack) {
  using S = Shape<D, CB, VB, WIDE>;
  static_assert(!WIDE || S::total(false) <= kMaxBlockSmem, "the wide variant's mse modes fit a block");
  return KernelPick{pack ? decode_kernel<D, CB, VB, true, WIDE> : decode_kernel<D, CB, VB, false, WIDE>,
                    S::total(qjl), S::threads, S::tile * S::halves};
}

// `wide`: the wide variant where there is one (Shape::wide_keys), else the narrow kernel.
template <int D>
KernelPick pick_by_bits(std::uint32_t cb, std::uint32_t vb, bool qjl, bool pack, bool wide) {
#define KVC_DECODE_CASE(CBV, VBV)                                                       \
  if (cb == CBV && vb == VBV) {                                                         \
    if constexpr (has_wide_variant(D, CBV)) {                                           \
      if (wide) return pick_instance<D, CBV, VBV, true>(qjl, pack);                     \
    }                                                                                   \
    return pick_instance<D, CBV, VBV, false>(qjl, pack);                                \
  }
  KVC_DECODE_CASE(1, 2) KVC_DECODE_CASE(1, 3) KVC_DECODE_CASE(1, 4)
  KVC_DECODE_CASE(2, 2) KVC_DECODE_CASE(2, 3) KVC_DECODE_CASE(2, 4)
  KVC_DECODE_CASE(3, 2) KVC_DECODE_CASE(3, 3) KVC_DECODE_CASE(3, 4)
  KVC_DECODE_CASE(4, 2) KVC_DECODE_CASE(4, 3) KVC_DECODE_CASE(4, 4)
  KVC_DECODE_CASE(5, 2) KVC_DECODE_CASE(5, 3) KVC_DECODE_CASE(5, 4)
#undef KVC_DECODE_CASE
  return KernelPick{};
}

KernelPick pick_kernel(std::uint32_t d, std::uint32_t cb, std::uint32_t vb, bool qjl, bool pack, bool wide) {
  switch (d) {
    case 64: return pick_by_bits<64>(cb, vb, qjl, pack, wide);
    case 128: return pick_by_bits<128>(cb, vb, qjl, pack, wide);
    case 256: return pick_by_bits<256>(cb, vb, qjl, pack, wide);
    default: return KernelPick{};
  }
}


}  // namespace

std::uint32_t decode_smem_bytes(std::uint32_t head_dim, std::uint32_t key_code_bits, std::uint32_t value_bits,
                                bool qjl) {
  return pick_kernel(head_dim, key_code_bits, value_bits, qjl, false, false).smem;
}

// Only mse modes: the wide variant was measured and tested on the H200 without QJL keys only (with them and
// 4-bit values its shared memory would not fit a block anyway).
bool decode_has_wide(std::uint32_t head_dim, std::uint32_t key_code_bits, bool qjl) {
  return has_wide_variant(static_cast<int>(head_dim), static_cast<int>(key_code_bits)) && !qjl;
}

std::uint32_t decode_tile_tokens(std::uint32_t head_dim, std::uint32_t key_code_bits, std::uint32_t value_bits,
                                 bool wide) {
  return pick_kernel(head_dim, key_code_bits, value_bits, false, false, wide).tile;
}

cudaError_t prepare_decode(std::uint32_t head_dim, std::uint32_t key_code_bits, std::uint32_t value_bits, bool qjl) {
  for (const bool wide : {false, true}) {
    if (wide && !decode_has_wide(head_dim, key_code_bits, qjl)) continue;
    for (const bool pack : {false, true}) {
      const KernelPick k = pick_kernel(head_dim, key_code_bits, value_bits, qjl, pack, wide);
      if (k.fn == nullptr) return cudaErrorInvalidValue;
      const cudaError_t err =
          cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(k.smem));
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

int decode_blocks_per_sm(std::uint32_t head_dim, std::uint32_t key_code_bits, std::uint32_t value_bits, bool qjl,
                         std::uint32_t group, bool wide) {
  const KernelPick k = pick_kernel(head_dim, key_code_bits, value_bits, qjl, group <= kDecodePackedGroup, wide);
  int blocks = 0;
  if (k.fn == nullptr ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k.fn, static_cast<int>(k.threads), k.smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return blocks;
}

cudaError_t launch_decode(const DecodeParams& p, cudaStream_t stream) {
  const KernelPick k = pick_kernel(p.head_dim, p.tables_key_code_bits, p.tables_value_bits, p.tables_has_qjl != 0,
                                   p.group <= kDecodePackedGroup, p.wide != 0);
  if (k.fn == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(p.splits, p.kv_heads * p.head_groups, p.seqs);
  // Its launch overlaps the tail of the kernel before it on the stream (an append's commit in a decode step).
  cudaError_t err = kvcompact::cuda::detail::launch_after_previous(k.fn, grid, dim3(k.threads), k.smem, stream, p);
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (p.merge_in_kernel != 0) return cudaSuccess;
  if (p.window > 0) {
    const std::size_t wsmem = sizeof(float) * (p.head_dim + p.window);
    window_kernel<<<dim3(p.q_heads, p.seqs), kThreads, wsmem, stream>>>(p);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const std::uint64_t items = std::uint64_t{p.seqs} * p.q_heads;
  const std::size_t msmem = sizeof(float) * (4 * p.head_dim + p.splits + 1);
  merge_kernel<<<static_cast<unsigned>(items), kThreads, msmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::tq::detail
