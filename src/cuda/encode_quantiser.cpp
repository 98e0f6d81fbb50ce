// Builds the fast encode kernel's quantiser tables (encode_quantiser.hpp; docs/cuda-encode.md, "Quantiser").
#include "encode_quantiser.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace kvcompact::cuda::tq::detail {

// RN(y · scale) is non-decreasing in y, so step from an estimate.
float scaled_threshold(float b, float scale) {
  const auto reaches = [&](float y) { return y * scale >= b; };  // one f32 multiplication, round to nearest
  float y = static_cast<float>(static_cast<double>(b) / static_cast<double>(scale));
  while (!reaches(y)) y = std::nextafter(y, std::numeric_limits<float>::infinity());
  for (;;) {
    const float lower = std::nextafter(y, -std::numeric_limits<float>::infinity());
    if (!reaches(lower)) return y;
    y = lower;
  }
}

namespace {

// The kernel's cell of y: fma.rn.sat (NaN → +0), then fma.rm(u, 2^bits, 2^23), whose result is ⌊u · 2^bits⌋ + 2^23
// exactly (u · 2^bits is exact and the float spacing in [2^23, 2^24) is 1).
std::uint32_t cell_of(float y, float a, float c, float cell_scale) {
  float u = std::fmaf(y, a, c);
  if (!(u > 0.0f)) u = 0.0f;
  if (u > 1.0f) u = 1.0f;
  return static_cast<std::uint32_t>(std::floor(static_cast<double>(u) * static_cast<double>(cell_scale)));
}

}  // namespace

bool build_encode_quantiser(const float* boundaries, std::uint32_t count, float scale, EncodeQuantiser& out) {
  std::memset(&out, 0, sizeof(out));
  if (count == 0 || count > 31 || !(scale > 0.0f) || !std::isfinite(scale)) return false;
  for (std::uint32_t j = 0; j < count; ++j) {
    if (!std::isfinite(boundaries[j])) return false;
    out.thresholds[j] = scale == 1.0f ? boundaries[j] : scaled_threshold(boundaries[j], scale);
    if (j > 0 && !(out.thresholds[j] > out.thresholds[j - 1])) return false;
  }
  // Cells over [t_0, t_last] widened by one mean gap on each side (any a, c would be exact; these spread the
  // thresholds over the cells); the smallest table that separates every threshold.
  const double lo = out.thresholds[0], hi = out.thresholds[count - 1];
  const double gap = count > 1 ? (hi - lo) / (count - 1) : std::fabs(lo) + 1.0;
  const double from = lo - gap, to = hi + gap;
  for (std::uint32_t bits = 3; bits <= kMaxCellBits; ++bits) {
    const float a = static_cast<float>(1.0 / (to - from));
    const float c = static_cast<float>(-from * static_cast<double>(a));
    const float cell_scale = static_cast<float>(1u << bits);
    bool separated = true;
    for (std::uint32_t j = 1; j < count && separated; ++j) {
      separated = cell_of(out.thresholds[j], a, c, cell_scale) > cell_of(out.thresholds[j - 1], a, c, cell_scale);
    }
    if (!separated) continue;
    out.cell_a = a;
    out.cell_c = c;
    out.cell_scale = cell_scale;
    out.cell_bits = bits;
    const std::uint32_t cells = (1u << bits) + 1u;
    std::uint32_t next = 0;  // the first threshold not in a lower cell
    for (std::uint32_t k = 0; k < cells; ++k) {
      out.cells[k].below = next;
      out.cells[k].threshold = std::numeric_limits<float>::quiet_NaN();
      if (next < count && cell_of(out.thresholds[next], a, c, cell_scale) == k) {
        out.cells[k].threshold = out.thresholds[next];
        ++next;
      }
    }
    return next == count;
  }
  return false;
}

std::uint32_t quantise_by_cells(const EncodeQuantiser& q, float y) {
  const CellEntry& e = q.cells[cell_of(y, q.cell_a, q.cell_c, q.cell_scale)];
  return e.below + (y >= e.threshold ? 1u : 0u);
}

std::uint32_t quantise_by_thresholds(const EncodeQuantiser& q, std::uint32_t count, float y) {
  std::uint32_t code = 0;
  for (std::uint32_t j = 0; j < count; ++j) code += y >= q.thresholds[j] ? 1u : 0u;
  return code;
}

}  // namespace kvcompact::cuda::tq::detail
