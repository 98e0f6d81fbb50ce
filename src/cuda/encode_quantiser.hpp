// Internal: the quantiser tables of the fast encode kernel (docs/cuda-encode.md, "Quantiser"). The CPU codec
// quantises v = y · (1/√b) by a binary search over the f32 boundaries b_j (code = #{j : b_j ≤ v}). The kernel
// instead
//   - compares the y it already holds with thresholds t_j = the smallest float y with RN(y · s) ≥ b_j (for
//     value kinds and MSE keys, s = 1/√b: the rotation's last multiplication is skipped; QJL keys keep it,
//     s = 1, t_j = b_j). RN(y · s) is non-decreasing in y, so #{t_j ≤ y} = #{b_j ≤ RN(y · s)} exactly;
//   - for 3 bits and more, finds the code with one lookup: u = sat(fma(y, a, c)), cell = ⌊u · 2^cell_bits⌋,
//     code = below[cell] + (y ≥ threshold[cell]). The cell map is non-decreasing in y and the builder
//     checks that no two thresholds share a cell, so a cell's code is fixed except across its one threshold
//     (threshold = NaN, never ≥, in cells without one). Every operation is an IEEE operation the host repeats,
//     so the builder's check covers every float y, NaN and ±∞ included (code in [0, n]).
// Plain data (also read by device code); the builders and host mirrors are host-only (encode_quantiser.cpp).
#pragma once

#include <cstdint>

namespace kvcompact::cuda::tq::detail {

inline constexpr std::uint32_t kMaxCellBits = 7;  // 5-bit codebooks need 6 (encode_quantiser_test)
inline constexpr std::uint32_t kMaxCellEntries = (1u << kMaxCellBits) + 1;  // cells 0 … 2^bits (u = 1)

struct CellEntry {
  float threshold;      // the cell's threshold, or NaN when the cell holds none
  std::uint32_t below;  // number of thresholds in lower cells
};

struct EncodeQuantiser {
  float thresholds[32];  // t_j ascending (2^bits − 1 of them); the search and the register compares use them
  float cell_a, cell_c;  // u = sat(fma(y, cell_a, cell_c))
  float cell_scale;      // 2^cell_bits
  std::uint32_t cell_bits;
  CellEntry cells[kMaxCellEntries];
};

// Fills `out` for `count` ascending boundaries (count ≤ 31) and the kernel's multiplier `scale` (> 0; 1.0f
// when the kernel quantises v itself). Returns false when the thresholds are not strictly increasing or no
// table of at most 2^kMaxCellBits cells gives every threshold its own cell (DeviceCodec::create then fails; it
// never does for the codebooks of head_dim 64 / 128 / 256, which encode_quantiser_test builds).
bool build_encode_quantiser(const float* boundaries, std::uint32_t count, float scale, EncodeQuantiser& out);

// The smallest float y with RN(y · scale) ≥ b (scale > 0, b finite): y ≥ it ⟺ RN(y · scale) ≥ b. The QJL sign
// bits use it with b = 0 (the sign of RN(y · scale), −0 counting as ≥ 0, without the multiplication).
float scaled_threshold(float b, float scale);

// Host mirrors of the kernel's two quantisers (the same float operations), for tests.
std::uint32_t quantise_by_cells(const EncodeQuantiser& q, float y);
std::uint32_t quantise_by_thresholds(const EncodeQuantiser& q, std::uint32_t count, float y);

}  // namespace kvcompact::cuda::tq::detail
