// Internal to the warpgroup prefill kernel (tq_prefill_wgmma.cu): the block's shape (consumers, stages, registers
// moved by setmaxnreg) and its shared-memory layout for MSE keys, QJL keys and folded QJL keys, with the checks that
// each fits one block per multiprocessor. Included by tq_prefill_wgmma.cu only.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "prefill_device.cuh"
#include "prefill_params.hpp"

namespace kvcompact::cuda::tq::detail {

namespace {

using namespace prefill;

constexpr int D = 128;
// Consumer warpgroups per block (each owns 64 query rows), registers per thread of the producer and of the
// consumers after the setmaxnreg moves (three consumers only), the k-steps of Q_lo held in the consumers'
// registers (MSE keys), and stages of the fp16 tile ring; overridable at compile time for tuning. Measured at 32K
// (docs/cuda-prefill.md): six k-steps at 56 / 152 registers 1.4 % (hilo) / 2.5 % (fast) faster than none at
// 80 / 144; four at 80 / 144 1.2 % slower (hilo) / 3.1 % faster (fast); all eight at 32 / 160 2.4 % / 0.9 %
// slower (the 32-register producer alone costs 7 % / 2 %); before Q_lo moved to registers, 80 / 144 was 3 %
// faster than 56 / 152.
#ifndef KVC_PREFILL_WS_CONSUMERS
#define KVC_PREFILL_WS_CONSUMERS 3
#endif
#ifndef KVC_PREFILL_WS_PRODUCER_REGS
#define KVC_PREFILL_WS_PRODUCER_REGS 56
#endif
#ifndef KVC_PREFILL_WS_CONSUMER_REGS
#define KVC_PREFILL_WS_CONSUMER_REGS 152
#endif
#ifndef KVC_PREFILL_WS_QLO_REG_STEPS
#define KVC_PREFILL_WS_QLO_REG_STEPS 6
#endif
#ifndef KVC_PREFILL_WS_STAGES
#define KVC_PREFILL_WS_STAGES 3
#endif
constexpr unsigned kMseProducerRegs = KVC_PREFILL_WS_PRODUCER_REGS, kMseConsumerRegs = KVC_PREFILL_WS_CONSUMER_REGS;
constexpr unsigned kProducerThreads = 128;
constexpr unsigned kBN = 64;                  // key / value tokens per tile
constexpr unsigned kTileBytes = kBN * D * 2;  // SW128: two column blocks of 64 rows x 128 bytes
constexpr unsigned kTileBlock = kBN * 128;    // bytes of one 64-column block of a tile
// Named barriers (0 is __syncthreads): the producer warpgroup's own, the consumers' for the epilogue, and (QJL) the
// whole block's after the consumers took their QJL lo fragments out of the sign-tile area.
constexpr unsigned kProducerBarrier = 1, kConsumerBarrier = 2, kQjlLoBarrier = 3;

// The block's shape: MSE keys take KVC_PREFILL_WS_CONSUMERS (3) consumers and KVC_PREFILL_WS_STAGES (3) stages;
// QJL keys two of each, for their QJL query matrix and sign tiles; folded keys (FOLD, prefill_params.hpp) three
// consumers, with an FP8 tile beside each stage's key tile: two stages for QJL keys (16 KiB FP8 tiles), three for
// MSE keys (8 KiB FP8 tiles and a query FP8 operand of half the fp16 Q_lo matrix's size).
template <bool QJL, int FOLD = kFoldNone>
struct Ws {
  static constexpr unsigned kConsumers = QJL ? 2u : KVC_PREFILL_WS_CONSUMERS;
  static constexpr unsigned kStages = QJL || FOLD == kFoldQjl ? 2u : KVC_PREFILL_WS_STAGES;
  // setmaxnreg: three consumers need it (512 threads: 128 registers each at launch); two (QJL) take it for the 32
  // registers of their QJL lo fragments: 80 for the producer, 208 for the consumers. A move can only hand out
  // the registers the block got at launch (kLaunchRegs per thread, what ptxas allots under the launch bound):
  // asking for more blocks the consumers forever.
  static constexpr bool kMoveRegisters = kConsumers == 3 || QJL;
  static constexpr unsigned kProducerRegs = QJL ? 80u : kMseProducerRegs;
  static constexpr unsigned kConsumerRegs = QJL ? 208u : kMseConsumerRegs;
  // MSE keys: Q_lo's first kQloRegSteps k-steps (of 8) are A fragments in the consumers' registers (RS MMAs), the
  // rest are read from shared memory like Q_hi (the wgmma operand reads are ≈ 58 % of the shared-memory
  // wavefronts, the busiest unit: docs/cuda-prefill.md). QJL keys keep their registers for the QJL lo part;
  // folded keys run no fp16 Q_lo product (their cross terms are one FP8 product from shared memory).
  static constexpr int kQloRegSteps = QJL || FOLD != kFoldNone ? 0 : KVC_PREFILL_WS_QLO_REG_STEPS;
  static constexpr unsigned kConsumerThreads = 128 * kConsumers;
  static constexpr unsigned kThreads = kConsumerThreads + kProducerThreads;  // the producer is the last warpgroup
  static constexpr unsigned kLaunchRegs = (65536 / kThreads) & ~7u;
  static constexpr unsigned kWarps = kThreads / 32;
  static constexpr unsigned kConsumerWarps = kConsumerThreads / 32;
  static constexpr unsigned kRows = 64 * kConsumers;  // query rows per block
  static constexpr unsigned kQBytes = kRows * D * 2;  // SW128: two column blocks of kRows rows x 128 bytes
  static constexpr unsigned kQBlock = kRows * 128;    // bytes of one 64-column block of the queries
  // The Q_lo area: fp16 Q_lo, or the FP8 operand of folded keys (QJL: [Q_hi | Q_lo], as large; MSE: Q_lo, half).
  static constexpr unsigned kQloBytes = FOLD == kFoldMse ? kQBlock : kQBytes;
  // Bytes of a stage's FP8 tile (folded keys; 0 otherwise).
  static constexpr unsigned kK8Bytes = FOLD == kFoldNone ? 0u : folded_fp8_tile_bytes(FOLD == kFoldQjl);
  static constexpr unsigned kPartialFloats = kRows * D + 2 * kRows;  // one split's partial: outputs, maxima, sums
  static_assert(!kMoveRegisters || (128 * (kConsumers * kConsumerRegs + kProducerRegs) <= kThreads * kLaunchRegs &&
                                    kProducerRegs % 8 == 0 &&
                                    kConsumerRegs % 8 == 0 && kProducerRegs >= 24 && kConsumerRegs <= 256),
                "setmaxnreg: multiples of 8 in [24, 256] whose total fits the multiprocessor's 64K registers");
  static_assert(kConsumers >= 1 && kConsumers <= 3 && kStages >= 2 && kQloRegSteps >= 0 && kQloRegSteps <= 8,
                "block shape");
};

// QJL keys only: the QJL queries' hi part (fp16, scaled like the code part's times α·√(π/2d)) and the sign tiles,
// ±ρ per token.
template <bool QJL>
struct QjlArea {};
template <>
struct QjlArea<true> {
  alignas(1024) std::uint8_t q[Ws<true>::kQBytes];
  std::uint8_t sg[Ws<true>::kStages][kTileBytes];
};

// Folded keys only: each stage's FP8 tile (the cross terms' keys, prefill_params.hpp).
template <int FOLD>
struct FoldArea {
  alignas(1024) std::uint8_t k8[Ws<false, FOLD>::kStages][Ws<false, FOLD>::kK8Bytes];
};
template <>
struct FoldArea<kFoldNone> {};

// (Folded keys: qlo holds the queries' FP8 operand instead — QJL keys [Q_hi · kFoldQhiScale | Q_lo ·
// kFoldQloScale], 256 e4m3 codes per row in the fp16 layout of 128 columns; MSE keys Q_lo · kFoldQloScale, 128
// codes per row in that of 64 columns.)
template <bool QJL, int FOLD = kFoldNone>
struct Smem {
  using W = Ws<QJL, FOLD>;
  using Staged = StageLayout<D, QJL, kBN>;
  std::uint8_t qhi[W::kQBytes];    // 1024-byte aligned (the struct is placed so); with qlo (and, for folded MSE
  std::uint8_t qlo[W::kQloBytes];  //   keys, the key tiles), the epilogue rows after the main loop (kRows x 128 floats)
  std::uint8_t k[W::kStages][kTileBytes];
  std::uint8_t v[W::kStages][kTileBytes];
  QjlArea<QJL> jl;
  FoldArea<FOLD> fold;
  alignas(16) std::uint8_t packed[2][Staged::bytes];  // the producer's staging buffers (bulk copies)
  float kscale[W::kStages][kBN];  // key norms of a stage's tokens (0 past the tile's end)
  float vfac[W::kStages][kBN];    // n_v / R · 2^15 (0 past the tile's end)
  float ratio[W::kStages];        // R before / R after the stage's tile (the accumulator's rescale)
  float r_final;                  // R after the last tile
  std::uint64_t full[W::kStages], empty[W::kStages];  // mbarriers
  std::uint64_t staged[2];                              // the staging buffers' bulk copies (bytes landed)
  float rowfac_c[W::kRows], rowfac_s[W::kRows], row_m[W::kRows], row_l[W::kRows];
  std::uint32_t row_limit[W::kRows];
  std::uint32_t merge_flag;  // the key split's block that merges (the last one to finish)
  // Pair tables: entry (code of the higher coordinate) · 2^bits + (code of the lower one) → half2 of α·centroid,
  // for every code width (≤ 1024 entries at 5 bits), so a code group of 8 coordinates takes 4 lookups.
  std::uint32_t pair_k[1024], pair_v[256];
  // QJL: sign-nibble masks, entry n → the fp16 sign bits (0x8000 where bit b of n is clear: σ = −1) of 4 halves.
  uint2 sign_mask[16];
};
// The QJL area's buffers (QJL keys only).
template <bool QJL, int FOLD>
__device__ __forceinline__ std::uint8_t* sm_qjl(Smem<QJL, FOLD>& sm) {
  if constexpr (QJL) {
    return sm.jl.q;
  } else {
    return nullptr;
  }
}
template <bool QJL, int FOLD>
__device__ __forceinline__ std::uint8_t* sm_sign_tiles(Smem<QJL, FOLD>& sm) {
  if constexpr (QJL) {
    return sm.jl.sg[0];
  } else {
    return nullptr;
  }
}
template <bool QJL, int FOLD = kFoldNone>
constexpr unsigned smem_bytes() {
  return sizeof(Smem<QJL, FOLD>) + 1024;  // + alignment slack
}
static_assert(smem_bytes<false>() <= 227 * 1024 && smem_bytes<true>() <= 227 * 1024 &&
                  smem_bytes<false, kFoldQjl>() <= 227 * 1024 && smem_bytes<false, kFoldMse>() <= 227 * 1024,
              "one block per multiprocessor");
static_assert(Ws<false>::kK8Bytes == 0 && Ws<true>::kK8Bytes == 0, "FP8 key tiles for folded keys only");
using FoldedMseSmem = Smem<false, kFoldMse>;
static_assert(Ws<false, kFoldMse>::kQBytes + Ws<false, kFoldMse>::kQloBytes +
                      Ws<false, kFoldMse>::kStages * kTileBytes >= Ws<false>::kRows * D * 4 &&
                  offsetof(FoldedMseSmem, k) == Ws<false>::kQBytes + Ws<false, kFoldMse>::kQloBytes,
              "folded MSE keys: the epilogue rows fit in the query area and the key tiles after it");
static_assert(2 * Ws<false>::kQBytes >= Ws<false>::kRows * D * 4 && 2 * Ws<true>::kQBytes >= Ws<true>::kRows * D * 4,
              "the epilogue rows fit in the query area");
static_assert(StageLayout<D, false, kBN>::bytes % 16 == 0 && StageLayout<D, true, kBN>::bytes % 16 == 0,
              "staging buffers stay 16-byte aligned");
// A region's bulk copy (region_span: up to 15 bytes before the first record, rounded up to 16 past the last) fits
// its staging region at the widest records: 5-bit key codes, 4-bit value codes.
constexpr bool staging_holds(unsigned region_bytes, unsigned bpt) { return round16(15u + kBN * bpt) <= region_bytes; }
using StagingRegions = StageLayout<D, true, kBN>;
static_assert(staging_holds(StagingRegions::kc, D * 5 / 8) && staging_holds(StagingRegions::ks, D / 8) &&
                  staging_holds(StagingRegions::kn, 4) && staging_holds(StagingRegions::kr, 2) &&
                  staging_holds(StagingRegions::vc, D / 2) && staging_holds(StagingRegions::vn, 4),
              "a tile's bulk copies fit the staging regions");

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
