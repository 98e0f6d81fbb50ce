// The model's own low-precision rounding of cached rows, simulated in place: FP8 e4m3 in blocks of 64
// with power-of-two (ue8m0) scales over a main row's dims [0, 448), and for indexer rows a Walsh-Hadamard
// rotation (scale 1/sqrt(n)) followed by FP4 e2m1 in blocks of 32 with power-of-two scales. The block
// scale rules (amax floor, fl32 multiply by 1/max, round the scale UP to a power of two) are the
// reference kernel's, so a simulated row is bit-for-bit the row the model would have produced.
#pragma once

#include <cstddef>
#include <span>

namespace kvcompact::dsv4 {

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr float kFp4E2M1Max = 6.0f;
inline constexpr std::size_t kFp8SimBlock = 64;  // window / compressed rows
inline constexpr std::size_t kFp4SimBlock = 32;  // indexer rows and indexer queries
// Floors applied to a block's absolute maximum before choosing its scale (reference act_quant: 1e-4;
// fp4_act_quant with ue8m0 scales: 6 * 2^-126).
inline constexpr float kFp8AmaxFloor = 1e-4f;
inline constexpr float kFp4AmaxFloor = 6.0f * 0x1p-126f;

// Power-of-two block scale: 2^ceil(log2(r)) with r = float32(max(amax, floor) * float32(1 / max_code)),
// computed from r's bits as the reference does (exponent, plus one if any mantissa bit is set).
float pow2_ceil_scale(float amax, float amax_floor, float max_code);

// ---- float64 oracle ---------------------------------------------------------------------------------
// Nearest finite value of the format, ties to the even code; |v| beyond the format's max saturates.
double round_to_e4m3_f64(double v);
double round_to_e2m1_f64(double v);
// Block simulation in place; x.size() must be a multiple of the block. The scale decision uses the
// float32 rule above on float32(amax); the division, clamp and rounding are done in double.
void fp8_block_sim_f64(std::span<double> x, std::size_t block = kFp8SimBlock);
void fp4_block_sim_f64(std::span<double> x, std::size_t block = kFp4SimBlock);
// Normalised Walsh-Hadamard transform (Sylvester order, H_n = [[H, H], [H, -H]]), scaled by
// 1/sqrt(n); n a power of two. Straight from the definition: y_i = n^-1/2 sum_j (-1)^popcount(i & j) x_j.
void hadamard_f64(std::span<double> x);

// ---- float32 fast path ------------------------------------------------------------------------------
void fp8_block_sim(float* x, std::size_t n, std::size_t block = kFp8SimBlock);
void fp4_block_sim(float* x, std::size_t n, std::size_t block = kFp4SimBlock);
// In-place butterflies (log2 n stages), then one multiply by float32(1/sqrt(n)).
void hadamard(float* x, std::size_t n);

// Whole-row steps as the model applies them:
//   main row (width 512): FP8 on dims [0, 448), the 64 RoPE dims untouched;
//   indexer row / query head (width 128): Hadamard on all dims, then FP4 on all dims.
void simulate_main_row(float* row512);
void simulate_main_row_f64(std::span<double> row512);
void simulate_indexer_row(float* row128);
void simulate_indexer_row_f64(std::span<double> row128);

}  // namespace kvcompact::dsv4
