// Chunked-prefill attention on warpgroup MMAs (wgmma, sm_90a) for head_dim 128, warp-specialised: the same
// contract and the same numbers as prefill_kernel (tq_prefill.cu) — fp16 hi + lo queries, fp16 α·centroid tiles,
// P' = p · n_v / R · 2^15 as fp16 hi (+ lo with HiLo), fp32 accumulation.
//   - a producer warpgroup copies each 64-token tile's packed bytes (bulk copies, two tiles ahead) and dequantises
//     keys and values (and for QJL keys the sign tile, ±ρ per token) into a ring of SW128 fp16
//     stages, with the tile's per-token factors; an mbarrier per stage says "full", another "empty";
//   - consumer warpgroups (three for MSE keys, two for QJL keys: their query and sign tiles need the shared
//     memory of the third), each owning 64 query rows, wait for a full stage, run S = Q_hi·Kᵀ + Q_lo·Kᵀ
//     (+ Q_jl,hi·Signsᵀ + Q_jl,lo·Signsᵀ into the same accumulator: the QJL queries are scaled like the code
//     part's times α·√(π/2d), the sign tiles hold ±ρ; the QJL lo part stays in registers, as the shared memory
//     holds no third query matrix),
//     the softmax on the accumulators and O += P'·V (P' from registers), then release the stage. No block barrier
//     in the loop: the consumer warpgroups drift apart, so one's softmax overlaps another's MMAs and the
//     producer's dequantisation.
//   - `setmaxnreg` moves registers from the producer (56) to the consumers: 152 each of three (512 threads get
//     128 at launch; the consumers would spill at 128; 24 of the 152 hold six of Q_lo's eight k-steps as A
//     fragments, so that those lo MMAs read only the key tile from shared memory), 208 each of two with QJL keys
//     (384 threads get 168, producer 80; the QJL lo fragments take 32). (Two consumers for MSE keys measured 17 %
//     slower at 32K, one producer then feeding only 128 rows.)
//   - with a key split (PrefillParams::key_splits > 1) the blocks of one query tile each take a part of its key
//     tiles; the last to finish merges their partials (merge_key_splits) before the epilogue.
//   - folded keys (FOLD): prefill_fold.cu has written each key tile as fp16 α·k̂ (QJL keys: with the QJL part
//     inside) plus an e4m3 tile of the cross terms' keys, so the MSE block runs them (two stages for QJL keys),
//     its producer bulk-copying both tiles instead of dequantising keys, its consumers computing S as one FP8
//     product of the cross terms (QJL: Q_hi·K_lo + Q_lo·K_hi; MSE: Q_lo·K_hi) plus Q_hi·K_hi, with the e4m3
//     query operand where the fp16 Q_lo was.
// docs/cuda-prefill.md describes both kernels; prefill_device.cuh holds their shared pieces, prefill_wgmma_shape.cuh
// this kernel's block shape and shared-memory layout, prefill_wgmma_parts.cuh its producer's and consumers' pieces.
#include <cuda_fp16.h>

#include <cstdint>

#include "bulk_copy.cuh"
#include "mbarrier.cuh"
#include "prefill_device.cuh"
#include "prefill_params.hpp"
#include "prefill_wgmma_parts.cuh"
#include "prefill_wgmma_shape.cuh"
#include "wgmma.cuh"

namespace kvcompact::cuda::tq::detail {

namespace {

using namespace prefill;

// FOLD (the MSE block shape, QJL = false): the keys were folded into an fp16 and an e4m3 tile by the fold pass
// (prefill_fold.cu); the producer bulk-copies both into the stage (counted on the stage's full barrier) in
// place of the key dequantisation, and the consumers' S adds the FP8 product of the cross terms.
template <bool SPLITP, bool QJL, int FOLD = kFoldNone>
__global__ void __launch_bounds__(Ws<QJL, FOLD>::kThreads, 1) prefill_wgmma_kernel(PrefillParams p) {
  static_assert(!(QJL && FOLD != kFoldNone), "folded keys run on the MSE block");
  constexpr bool FOLDED = FOLD != kFoldNone;
  using W = Ws<QJL, FOLD>;
  constexpr unsigned kConsumers = W::kConsumers, kStages = W::kStages, kThreads = W::kThreads, kRows = W::kRows;
  constexpr unsigned kWarps = W::kWarps, kConsumerWarps = W::kConsumerWarps, kConsumerThreads = W::kConsumerThreads;
  constexpr unsigned kQBlock = W::kQBlock;
  constexpr bool kMoveRegisters = W::kMoveRegisters;
  static_assert(kConsumers * 64 == kRows, "64 rows per consumer warpgroup");
  extern __shared__ std::uint8_t smem_raw[];
  Smem<QJL, FOLD>& sm = *reinterpret_cast<Smem<QJL, FOLD>*>(
      smem_raw + ((1024u - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u));
  const Tables& t = *p.tables;
  const unsigned tid = threadIdx.x, lane = tid % 32, warp = tid / 32, x = tid / 128;
  const unsigned g = lane / 4, tig = lane % 4;
  const bool producer = tid >= kConsumerThreads;
  const unsigned pt = tid - kConsumerThreads;  // the producer's thread index (producer threads only)
  BlockRange blk;
  if (!blk.init(p, kBN)) return;
  // This block's key tiles: split `split` of the query tile's blk.ntiles (all of them without a key split);
  // i counts from the first, tile tbeg + i holds tokens from (tbeg + i) · kBN.
  const std::uint32_t splits = p.key_splits, split = blockIdx.x % splits;
  const std::uint32_t tbeg = static_cast<std::uint32_t>(std::uint64_t{blk.ntiles} * split / splits);
  const std::uint32_t ntiles = static_cast<std::uint32_t>(std::uint64_t{blk.ntiles} * (split + 1) / splits) - tbeg;
  const std::uint32_t kend = blk.kend;
  const std::uint64_t slot0 = blk.slot0 + std::uint64_t{tbeg} * kBN;
  auto tile_tokens = [&](std::uint32_t i) { return min(kBN, kend - (tbeg + i) * kBN); };

  // The producer's first thread starts the first two tiles' copies while everybody prepares the queries (the
  // other threads see the staging barriers' initialisation after the block barrier below).
  if (producer && pt == 0) {
    mbar_init(&sm.staged[0], 1);
    mbar_init(&sm.staged[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    if (ntiles > 0) copy_tile<QJL, FOLDED>(p, sm.packed[0], slot0, tile_tokens(0), &sm.staged[0]);
    if (ntiles > 1) copy_tile<QJL, FOLDED>(p, sm.packed[1], slot0 + kBN, tile_tokens(1), &sm.staged[1]);
  }
  for (unsigned r = tid; r < kRows; r += kThreads) sm.row_limit[r] = blk.row_limit(r, p);
  fill_pair_table<kThreads>(sm.pair_k, p.key_code_bits, t.key_lut_scale, t.key_centroids);
  fill_pair_table<kThreads>(sm.pair_v, p.value_bits, t.value_lut_scale, t.value_centroids);
  if (QJL && tid < 16) {
    const std::uint32_t m0 = (tid & 1u ? 0u : 0x8000u) | (tid & 2u ? 0u : 0x80000000u);
    const std::uint32_t m1 = (tid & 4u ? 0u : 0x8000u) | (tid & 8u ? 0u : 0x80000000u);
    sm.sign_mask[tid] = make_uint2(m0, m1);
  }
  if (tid < kStages) {
    mbar_init(&sm.full[tid], kProducerThreads);
    mbar_init(&sm.empty[tid], kConsumerThreads);
  }
  if (tid == 0) sm.r_final = 0.0f;
  // A negative softmax scale is folded into the queries (fp16 negation is exact), so that every row factor is
  // positive and a row's largest score is its factor times its largest S · n_k.
  const std::uint32_t neg = p.scale_log2 < 0.0f ? 0x80008000u : 0u;
  // QJL keys: the QJL part at the code part's scale times α·√(π/2d), its hi part in shared memory, its lo part
  // row-major in the sign-tile area (free until the producer's first tile), from where each consumer thread takes
  // its fragments into registers.
  prepare_queries<D, QJL, kWarps, kRows, QJL>(
      p, t, blk, sm.rowfac_c, sm.rowfac_s,
      [&](int part, unsigned r, unsigned j, std::uint32_t h, std::uint32_t l) {
        const unsigned off = sw128_offset(r, j, kRows);
        if constexpr (QJL) {
          if (part == 1) {
            *reinterpret_cast<std::uint32_t*>(sm.jl.q + off) = h ^ neg;
            reinterpret_cast<std::uint32_t*>(sm.jl.sg[0])[r * (D / 2) + j / 2] = l ^ neg;
            return;
          }
        }
        *reinterpret_cast<std::uint32_t*>(sm.qhi + off) = h ^ neg;
        if constexpr (FOLDED) {
          // The FP8 operand: QJL keys Q_hi and Q_lo of columns j, j + 1 (scaled) at byte columns j, j + 1 and
          // 128 + j, + 1, i.e. the fp16 layout's columns j / 2 and 64 + j / 2; MSE keys Q_lo at byte columns j, + 1.
          const float2 qh = __half22float2(*reinterpret_cast<const __half2*>(&h));
          const float2 ql = __half22float2(*reinterpret_cast<const __half2*>(&l));
          const float sg = neg != 0u ? -1.0f : 1.0f;
          const std::uint16_t lo8 = e4m3x2_of(sg * ql.x * kFoldQloScale, sg * ql.y * kFoldQloScale);
          if constexpr (FOLD == kFoldQjl) {
            *reinterpret_cast<std::uint16_t*>(sm.qlo + sw128_offset(r, j / 2, kRows)) =
                e4m3x2_of(sg * qh.x * kFoldQhiScale, sg * qh.y * kFoldQhiScale);
            *reinterpret_cast<std::uint16_t*>(sm.qlo + sw128_offset(r, 64 + j / 2, kRows)) = lo8;
          } else {
            *reinterpret_cast<std::uint16_t*>(sm.qlo + sw128_offset(r, j / 2, kRows)) = lo8;
          }
        } else {
          *reinterpret_cast<std::uint32_t*>(sm.qlo + off) = l ^ neg;
        }
      });
  fence_shared_for_async();
  __syncthreads();  // queries, tables, row limits and the mbarriers are ready

  if (producer) {
    if constexpr (kMoveRegisters) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(W::kProducerRegs));
    if constexpr (QJL) named_barrier(kQjlLoBarrier, kThreads);  // the consumers hold their QJL lo fragments
    // ---- producer: tile i → stage i % kStages. Key factors by its first warp, value factors (R, the running
    // maximum of the value norms, in its registers) by its second.
    const unsigned pw = pt / 32;
    float r_run = 0.0f;
    for (std::uint32_t i = 0; i < ntiles; ++i) {
      const unsigned stage = i % kStages, buf = i & 1u;
      mbar_spin_wait(&sm.staged[buf], (i >> 1) & 1u);  // tile i's bytes are in packed[buf]
      if (i >= kStages) mbar_spin_wait(&sm.empty[stage], (i / kStages - 1) & 1u);  // its consumers are done
      const Stage<D, QJL, kBN> s(sm.packed[buf]);
      const std::uint64_t first = slot0 + i * kBN;
      const std::uint32_t cnt = tile_tokens(i);
      if constexpr (FOLDED) {
        // The folded tile lands in the stage while the value tile is dequantised; the full barrier counts its
        // bytes besides the producer's arrivals. (The consumers released the stage: its last reads are done.)
        if (pt == 0) {
          constexpr std::uint32_t kBytes = folded_tile_bytes(FOLD == kFoldQjl);
          mbar_expect_tx(&sm.full[stage], kBytes);
          const std::uint64_t fold_tile =
              (static_cast<std::uint64_t>(blk.entry) * p.kv_heads + blk.kvh) * p.fold_tiles + tbeg + i;
          const std::uint8_t* src = p.folded_keys + fold_tile * kBytes;
          bulk_copy(sm.k[stage], src, kFoldedHalfTileBytes, &sm.full[stage]);
          bulk_copy(sm.fold.k8[stage], src + kFoldedHalfTileBytes, W::kK8Bytes, &sm.full[stage]);
        }
      } else {
        dequant_tile<1, 5>(pt, sm.k[stage], staged_row0(s.kc, p.layer + p.key_codes, first, p.kc_bytes),
                           p.key_code_bits, sm.pair_k);
      }
      dequant_tile<2, 4>(pt, sm.v[stage], staged_row0(s.vc, p.layer + p.value_codes, first, p.vc_bytes),
                         p.value_bits, sm.pair_v);
      if constexpr (QJL) {
        sign_tile(pt, sm.jl.sg[stage], staged_row0(s.ks, p.layer + p.key_signs, first, p.ks_bytes),
                  reinterpret_cast<const unsigned short*>(staged_row0(s.kr, p.layer + p.key_rho, first, 2u)),
                  p.ks_bytes, cnt, sm.sign_mask);
      }
      if (pw == 0) {
        const float* kn = reinterpret_cast<const float*>(staged_row0(s.kn, p.layer + p.key_norms, first, 4u));
        sm.kscale[stage][lane] = lane < cnt ? kn[lane] : 0.0f;
        sm.kscale[stage][lane + 32] = lane + 32 < cnt ? kn[lane + 32] : 0.0f;
      } else if (pw == 1) {
        const float* vn = reinterpret_cast<const float*>(staged_row0(s.vn, p.layer + p.value_norms, first, 4u));
        const float n0 = lane < cnt ? vn[lane] : 0.0f, n1 = lane + 32 < cnt ? vn[lane + 32] : 0.0f;
        float tmax = fmaxf(n0, n1);
        for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
        const float r_new = fmaxf(r_run, tmax);
        sm.vfac[stage][lane] = r_new > 0.0f ? n0 / r_new * kPScale : 0.0f;
        sm.vfac[stage][lane + 32] = r_new > 0.0f ? n1 / r_new * kPScale : 0.0f;
        if (lane == 0) {
          sm.ratio[stage] = r_run > 0.0f ? r_run / r_new : 1.0f;
          sm.r_final = r_new;
        }
        r_run = r_new;
      }
      fence_shared_for_async();
      mbar_arrive(&sm.full[stage]);  // (release: the stage's fp16 tiles and factors, and r_final)
      named_barrier(kProducerBarrier, kProducerThreads);  // everybody is done reading packed[buf]
      if (pt == 0 && i + 2 < ntiles) {
        copy_tile<QJL, FOLDED>(p, sm.packed[buf], first + 2 * kBN, tile_tokens(i + 2), &sm.staged[buf]);
      }
    }
    return;
  }

  if constexpr (kMoveRegisters) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(W::kConsumerRegs));
  // ---- consumers. This thread's rows (the accumulators' rows 16 w + g and + 8 of its warpgroup) are block
  // rows ra and rb.
  const unsigned ra = warp * 16u + g, rb = ra + 8u;
  const std::uint32_t lim_a = sm.row_limit[ra], lim_b = sm.row_limit[rb];
  // Row factors (log2 units per unit of S · n_k); positive (the sign is in the queries) and not below the
  // smallest normal float, so that a masked −∞ times the factor stays −∞.
  const float fc_a = fmaxf(fabsf(sm.rowfac_c[ra]), 1.17549435e-38f), fc_b = fmaxf(fabsf(sm.rowfac_c[rb]), 1.17549435e-38f);
  const GmmaDesc desc_qhi = sw128_descriptor(sm.qhi + 64 * x * 128, 16, 1024);
  const GmmaDesc desc_qlo = sw128_descriptor(sm.qlo + 64 * x * 128, 16, 1024);
  const GmmaDesc desc_k = sw128_descriptor(sm.k[0], 16, 1024);    // k[i] is at(i * kTileBytes)
  const GmmaDesc desc_v = sw128_descriptor(sm.v[0], 8192, 1024);  // MN-major; v[i] is at(i * kTileBytes)
  // QJL: the QJL queries and the sign tiles (sg[i] is at(i * kTileBytes)); unused otherwise.
  const GmmaDesc desc_qj = sw128_descriptor((QJL ? sm_qjl(sm) : sm.qhi) + 64 * x * 128, 16, 1024);
  const GmmaDesc desc_sg = sw128_descriptor(QJL ? sm_sign_tiles(sm) : sm.k[0], 16, 1024);
  // QJL: this thread's A fragments of the QJL lo part (rows ra, rb; k-step ks = dims 16 ks ...), for the RS MMAs.
  std::uint32_t qjl_lo[QJL ? D / 16 : 1][4];
  if constexpr (QJL) {
    const std::uint32_t* lo = reinterpret_cast<const std::uint32_t*>(sm_sign_tiles(sm));
#pragma unroll
    for (unsigned ks = 0; ks < D / 16; ++ks) {
      const unsigned c = 8 * ks + tig;  // the word of dims 16 ks + 2 tig, + 1
      qjl_lo[ks][0] = lo[ra * (D / 2) + c];
      qjl_lo[ks][1] = lo[rb * (D / 2) + c];
      qjl_lo[ks][2] = lo[ra * (D / 2) + c + 4];
      qjl_lo[ks][3] = lo[rb * (D / 2) + c + 4];
    }
    named_barrier(kQjlLoBarrier, kThreads);  // the producer may now write sign tiles over them
  }
  // MSE keys: this thread's A fragments of Q_lo's first W::kQloRegSteps k-steps (rows ra, rb; k-step ks = dims
  // 16 ks ...), for the RS MMAs.
  constexpr int kQloRegSteps = W::kQloRegSteps;
  std::uint32_t qlo_frag[kQloRegSteps > 0 ? kQloRegSteps : 1][4];
  if constexpr (kQloRegSteps > 0) {
#pragma unroll
    for (int ks = 0; ks < kQloRegSteps; ++ks) {
      const unsigned c = 16u * ks + 2u * tig;
      qlo_frag[ks][0] = *reinterpret_cast<const std::uint32_t*>(sm.qlo + sw128_offset(ra, c, kRows));
      qlo_frag[ks][1] = *reinterpret_cast<const std::uint32_t*>(sm.qlo + sw128_offset(rb, c, kRows));
      qlo_frag[ks][2] = *reinterpret_cast<const std::uint32_t*>(sm.qlo + sw128_offset(ra, c + 8, kRows));
      qlo_frag[ks][3] = *reinterpret_cast<const std::uint32_t*>(sm.qlo + sw128_offset(rb, c + 8, kRows));
    }
  }
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  float o[2][32];  // dims 64 nb + 8 i + 2 tig (+1), the m64n64 accumulator layout
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[nb][i] = 0.0f;
  }

  for (std::uint32_t it = 0; it < ntiles; ++it) {
    const unsigned stage = it % kStages;
    const std::uint32_t t0 = (tbeg + it) * kBN;
    mbar_spin_wait(&sm.full[stage], (it / kStages) & 1u);  // (acquire: the producer's fp16 tiles and factors)

    // ---- S = Q_hi Kᵀ + Q_lo Kᵀ (64 rows x 64 tokens per warpgroup), k-step s = dims 16 s ...
    float s[32];
    // Folded keys: first the cross terms as one FP8 product (QJL keys Q_hi·K_lo + Q_lo·K_hi, K = 256 codes: eight
    // k-steps of 32, the same byte offsets as the fp16 ones; MSE keys Q_lo·K_hi, four) on their own (FP8 MMAs
    // accumulate with fewer bits, so the large terms must not pass through them), scaled back exactly, then the
    // fp16 product Q_hi·K_hi added to them. (A second accumulator for the cross terms would leave the consumers
    // too few registers: ptxas serialises the wgmma, C7512.)
    if constexpr (FOLDED) {
      const GmmaDesc desc_q8 = sw128_descriptor(sm.qlo + 64 * x * 128, 16, 1024);
      const GmmaDesc desc_k8 = sw128_descriptor(sm.fold.k8[0], 16, 1024);
      wgmma_fence();
#pragma unroll
      for (unsigned ks = 0; ks < (FOLD == kFoldQjl ? 8u : 4u); ++ks) {
        const unsigned qcol = (ks / 4) * kQBlock + (ks % 4) * 32, kcol = (ks / 4) * kTileBlock + (ks % 4) * 32;
        wgmma_m64n64k32_e4m3_ss(s, desc_q8.at(qcol), desc_k8.at(stage * W::kK8Bytes + kcol), ks > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (unsigned i = 0; i < 32; ++i) s[i] *= 1.0f / kFoldCrossScale;
    }
    wgmma_fence();
    // Q_lo's MMA of k-step ks (from registers for its first kQloRegSteps steps).
    [[maybe_unused]] auto lo_step = [&](unsigned ks) {
      const unsigned qcol = (ks / 4) * kQBlock + (ks % 4) * 32, kcol = (ks / 4) * kTileBlock + (ks % 4) * 32;
      const int rs = static_cast<int>(ks);  // (the loops are unrolled: one of the two MMAs is compiled per step)
      if (rs < kQloRegSteps) {
        wgmma_m64n64k16_rs<0>(s, qlo_frag[rs < kQloRegSteps ? rs : 0], desc_k.at(stage * kTileBytes + kcol), true);
      } else {
        wgmma_m64n64k16_ss<0>(s, desc_qlo.at(qcol), desc_k.at(stage * kTileBytes + kcol), true);
      }
    };
    // QJL keys issue each k-step's hi and lo MMAs together, MSE keys all hi MMAs first: measured 1.1–1.6 % faster
    // (QJL) and 0.5–1.2 % slower (MSE) the other way round (docs/cuda-prefill-history.md).
#pragma unroll
    for (unsigned ks = 0; ks < D / 16; ++ks) {
      const unsigned qcol = (ks / 4) * kQBlock + (ks % 4) * 32, kcol = (ks / 4) * kTileBlock + (ks % 4) * 32;
      wgmma_m64n64k16_ss<0>(s, desc_qhi.at(qcol), desc_k.at(stage * kTileBytes + kcol), FOLDED || ks > 0);
      if constexpr (QJL) lo_step(ks);
    }
    if constexpr (!QJL && !FOLDED) {
#pragma unroll
      for (unsigned ks = 0; ks < D / 16; ++ks) lo_step(ks);
    }
    if constexpr (QJL) {
#pragma unroll
      for (unsigned ks = 0; ks < D / 16; ++ks) {
        const unsigned qcol = (ks / 4) * kQBlock + (ks % 4) * 32, kcol = (ks / 4) * kTileBlock + (ks % 4) * 32;
        wgmma_m64n64k16_ss<0>(s, desc_qj.at(qcol), desc_sg.at(stage * kTileBytes + kcol), true);
      }
#pragma unroll
      for (unsigned ks = 0; ks < D / 16; ++ks) {
        const unsigned kcol = (ks / 4) * kTileBlock + (ks % 4) * 32;
        wgmma_m64n64k16_rs<0>(s, qjl_lo[ks], desc_sg.at(stage * kTileBytes + kcol), true);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    // (Reading the key norms between the commit and the wait, to hide the latency the profile shows at the
    // first multiply, measured 10 % slower on the H200: docs/cuda-prefill-history.md.)
    float2 kn[8];
#pragma unroll
    for (unsigned i = 0; i < 8; ++i) kn[i] = *reinterpret_cast<const float2*>(&sm.kscale[stage][8 * i + 2 * tig]);

    // ---- masked online softmax (log2 units); columns 8 i + 2 tig (+1) are tile tokens. t = S · n_k here and
    // the row's score is fc · t: the row factor enters through the maximum and the exponent's FFMA.
#pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
      s[4 * i] *= kn[i].x;
      s[4 * i + 1] *= kn[i].y;
      s[4 * i + 2] *= kn[i].x;
      s[4 * i + 3] *= kn[i].y;
    }
    // Only tiles that reach past a row's last visible key need the mask (the causal diagonal, the chunk's end).
    if (t0 + kBN > min(lim_a, lim_b)) {
#pragma unroll
      for (unsigned i = 0; i < 8; ++i) {
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
          const unsigned tt = 8 * i + 2 * tig + (e & 1u);
          if (t0 + tt >= (e >= 2 ? lim_b : lim_a)) s[4 * i + e] = -INFINITY;
        }
      }
    }
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
      mx_a = fmaxf(mx_a, fmaxf(s[4 * i], s[4 * i + 1]));
      mx_b = fmaxf(mx_b, fmaxf(s[4 * i + 2], s[4 * i + 3]));
    }
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o2));
    }
    const float mn_a = fmaxf(m_a, fc_a * mx_a), mn_b = fmaxf(m_b, fc_b * mx_b);
    const float use_a = mn_a == -INFINITY ? 0.0f : mn_a, use_b = mn_b == -INFINITY ? 0.0f : mn_b;
    const float al_a = exp2f(m_a - use_a), al_b = exp2f(m_b - use_b);
    m_a = mn_a;
    m_b = mn_b;
    const float ratio = sm.ratio[stage];
    const float ro_a = al_a * ratio, ro_b = al_b * ratio;
    // Once the running maxima settle (most tiles of a long sequence) no row of the warp needs a rescale.
    if (__any_sync(0xffffffffu, ro_a != 1.0f || ro_b != 1.0f)) scale_accumulator_rows(o, ro_a, ro_b);
    // P' = p · n_v / R · 2^15 in place of S; l sums the unscaled p.
    const float off_a = -use_a, off_b = -use_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
      const float2 vf = *reinterpret_cast<const float2*>(&sm.vfac[stage][8 * i + 2 * tig]);
      const float p0 = fast_exp2(fmaf(s[4 * i], fc_a, off_a)), p1 = fast_exp2(fmaf(s[4 * i + 1], fc_a, off_a));
      const float p2 = fast_exp2(fmaf(s[4 * i + 2], fc_b, off_b)), p3 = fast_exp2(fmaf(s[4 * i + 3], fc_b, off_b));
      sum_a += p0 + p1;
      sum_b += p2 + p3;
      s[4 * i] = p0 * vf.x;
      s[4 * i + 1] = p1 * vf.y;
      s[4 * i + 2] = p2 * vf.x;
      s[4 * i + 3] = p3 * vf.y;
    }
    l_a = l_a * al_a + sum_a;
    l_b = l_b * al_b + sum_b;
    std::uint32_t ph[4][4], pl[4][4];
#pragma unroll
    for (unsigned ks = 0; ks < kBN / 16; ++ks) p_fragment<SPLITP>(s, ks, ph[ks], pl[ks]);

    // ---- O += P'·V: V MN-major (rows = tokens), k-step = tokens 16 ks ..., all 128 dims per MMA (the two
    // 64-dim blocks of the tile are desc_v's leading byte offset apart)
    wgmma_fence();
#pragma unroll
    for (unsigned ks = 0; ks < kBN / 16; ++ks) {
      const GmmaDesc vd = desc_v.at(stage * kTileBytes + ks * 16 * 128);
      wgmma_m64n128k16_rs<1>(o, ph[ks], vd, true);
      if constexpr (SPLITP) wgmma_m64n128k16_rs<1>(o, pl[ks], vd, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    mbar_arrive(&sm.empty[stage]);  // this thread's MMAs are done with the stage
  }

  // ---- epilogue: rows to shared memory (over the queries), then R⁻¹, exact window, sink, output
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, o2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, o2);
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);  // every consumer's MMAs are done with the queries
  float* obuf = reinterpret_cast<float*>(sm.qhi);
  {
    // r_final: written by the producer before its last arrive on a full barrier, which every consumer waited for.
    const float fr = sm.r_final / (kPScale * t.value_lut_scale);  // undo R, 2^15 and the value centroids' α
#pragma unroll
    for (unsigned nb = 0; nb < 2; ++nb) {
#pragma unroll
      for (unsigned i = 0; i < 8; ++i) {
        const unsigned col = 64 * nb + 8 * i + 2 * tig;
        *reinterpret_cast<float2*>(obuf + ra * D + col) = make_float2(o[nb][4 * i] * fr, o[nb][4 * i + 1] * fr);
        *reinterpret_cast<float2*>(obuf + rb * D + col) = make_float2(o[nb][4 * i + 2] * fr, o[nb][4 * i + 3] * fr);
      }
    }
    if (tig == 0) {
      sm.row_m[ra] = m_a;
      sm.row_l[ra] = l_a;
      sm.row_m[rb] = m_b;
      sm.row_l[rb] = l_b;
    }
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);
  if (splits > 1 && !merge_key_splits<W>(p, split, obuf, sm.row_m, sm.row_l, sm.merge_flag)) return;
  finish_rows<D, kConsumerWarps, kRows>(p, t, blk, obuf, sm.row_m, sm.row_l);
}

// The kernel instance and its launch shape, with the registers its setmaxnreg moves hand out (0 without a move).
struct WsKernel {
  void (*fn)(PrefillParams);
  unsigned threads, smem, moved_registers;
};
template <bool SPLITP, bool QJL, int FOLD>
WsKernel ws_instance() {
  using W = Ws<QJL, FOLD>;
  return {prefill_wgmma_kernel<SPLITP, QJL, FOLD>, W::kThreads, smem_bytes<QJL, FOLD>(),
          W::kMoveRegisters ? 128u * (W::kConsumers * W::kConsumerRegs + W::kProducerRegs) : 0u};
}
// The instances plan_prefill can ask for (prefill_attention refuses edited plans that would need others): Fast
// precision folds the keys (the MSE block; split_p false), HiLo reads codes (and signs: qjl_block, the
// two-consumer instance). Anything else has no instance: fn is null.
WsKernel ws_kernel(bool qjl_block, bool split_p, int fold) {
  if (fold != kFoldNone) {
    if (split_p || qjl_block) return {};
    return fold == kFoldQjl ? ws_instance<false, false, kFoldQjl>() : ws_instance<false, false, kFoldMse>();
  }
  if (!split_p) return {};
  return qjl_block ? ws_instance<true, true, kFoldNone>() : ws_instance<true, false, kFoldNone>();
}

}  // namespace

bool prefill_wgmma_supported(std::uint32_t head_dim, bool) { return head_dim == D; }
std::uint32_t prefill_wgmma_block_rows(bool qjl_block) { return qjl_block ? Ws<true>::kRows : Ws<false>::kRows; }
std::uint32_t prefill_wgmma_partial_floats(bool qjl_block) {
  return qjl_block ? Ws<true>::kPartialFloats : Ws<false>::kPartialFloats;
}

cudaError_t prepare_prefill_wgmma(bool qjl_block, bool split_p, int fold) {
  const WsKernel k = ws_kernel(qjl_block, split_p, fold);
  if (k.fn == nullptr) return cudaErrorInvalidValue;
  // The setmaxnreg moves can only redistribute the registers the block gets at launch; were the compiled count
  // lower than Ws::kLaunchRegs assumes, the consumers' increase would wait forever. Refuse that instead.
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, k.fn);
  if (err != cudaSuccess) return err;
  if (static_cast<unsigned>(attr.numRegs) * k.threads < k.moved_registers) return cudaErrorInvalidConfiguration;
  return cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(k.smem));
}

int prefill_wgmma_blocks_per_sm(bool qjl_block, bool split_p, int fold) {
  const WsKernel k = ws_kernel(qjl_block, split_p, fold);
  int blocks = 0;
  if (k.fn == nullptr) return 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k.fn, static_cast<int>(k.threads), k.smem) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return blocks;
}

cudaError_t launch_prefill_wgmma(const PrefillParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.tiles == 0) return cudaSuccess;
  const int fold = p.folded_keys == nullptr ? kFoldNone : (p.qjl != 0 ? kFoldQjl : kFoldMse);
  const WsKernel k = ws_kernel(p.qjl != 0 && fold == kFoldNone, p.split_p != 0, fold);
  if (k.fn == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(p.tiles * p.key_splits, p.kv_heads * p.head_groups, p.batch);
  k.fn<<<grid, k.threads, k.smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::tq::detail
