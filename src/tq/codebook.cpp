// Lloyd–Max solver for the unit-vector coordinate density. Every cell moment is exact up to one special
// function: the mass comes from the regularised incomplete beta function (continued fraction, evaluated
// on the side that keeps relative accuracy in the tails), and the first and second moments have closed
// forms. Lloyd's map is iterated with a Newton step on its fixed point (the Jacobian is tridiagonal), so a
// codebook converges to |T(c) − c| < 1e-13 in a handful of iterations instead of thousands.
#include "kvcompact/tq/codebook.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numbers>
#include <utility>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/core/checksum.hpp"

namespace kvcompact::tq {
namespace {

Status validate_codebook_args(std::uint32_t head_dim, std::uint32_t bits) {
  if (head_dim < 16 || head_dim > 1024 || head_dim % 16 != 0) {
    return make_error(ErrorCode::InvalidArgument,
                      "head_dim {} has no TurboQuant codebook: it must be a multiple of 16 in [16, 1024]", head_dim);
  }
  if (bits < kMinCodebookBits || bits > kMaxCodebookBits) {
    return make_error(ErrorCode::InvalidArgument, "codebook bits {} out of range: must be in [{}, {}]", bits,
                      kMinCodebookBits, kMaxCodebookBits);
  }
  return ok_status();
}

// Continued fraction of the regularised incomplete beta function (DLMF 8.17.22), modified Lentz:
// I_z(a, b) = z^a (1−z)^b / (a·B(a, b)) · 1/(1 + d1/(1 + d2/(1 + ...))). Converges fast for
// z < (a+1)/(a+b+2); callers only use it there.
// log z and log(1 − z) come from the caller, computed from x² with log1p: a·log z with a ≈ 500 would
// otherwise turn one rounding of z into a 5e-14 relative error of the result.
double incomplete_beta_cf(double z, double log_z, double log_one_minus_z, double a, double b, double log_beta_ab) {
  if (z <= 0.0) return 0.0;
  const double log_front = a * log_z + b * log_one_minus_z - std::log(a) - log_beta_ab;
  constexpr double kTiny = 1e-300;
  constexpr double kEps = 3e-16;  // |δ − 1| within about one ulp
  // g = 1 + d1/(1 + d2/(1 + ...)) by modified Lentz (b0 = 1, every partial denominator 1); I = front/g.
  double g = 1.0;
  double c = 1.0;
  double d = 0.0;
  for (int j = 1; j <= 10000; ++j) {
    const int m = j / 2;
    const double numerator = (j % 2 == 1)
                                 ? -(a + m) * (a + b + m) * z / ((a + 2.0 * m) * (a + 2.0 * m + 1.0))
                                 : m * (b - m) * z / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
    d = 1.0 + numerator * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1.0 + numerator / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double delta = c * d;
    g *= delta;
    if (std::fabs(delta - 1.0) < kEps) return std::exp(log_front) / g;
  }
  KVC_ASSERT(false, "incomplete beta continued fraction did not converge");
  return 0.0;
}

// Everything the solver needs about one dimension's density.
struct Density {
  double d = 0.0;
  double half_d_minus_1 = 0.0;  // A = (d−1)/2
  double m = 0.0;               // exponent (d−3)/2
  double log_norm = 0.0;        // log of Γ(d/2) / (√π·Γ((d−1)/2))
  double log_beta = 0.0;        // log B(½, A) = log(√π·Γ(A)/Γ(A + ½)), the incomplete beta's normaliser

  explicit Density(std::uint32_t head_dim) {
    d = static_cast<double>(head_dim);
    half_d_minus_1 = (d - 1.0) / 2.0;
    m = (d - 3.0) / 2.0;
    // ρ = Γ(A + ½)/Γ(A) by the recurrence ρ(a + 1) = ρ(a)·(a + ½)/a from ρ(1) = √π/2 or ρ(3/2) = 2/√π:
    // at most 511 correctly rounded factors, ~1e-15 relative, where lgamma(A + ½) − lgamma(A) cancels
    // two numbers near 2700 and keeps only ~3e-13.
    const double sqrt_pi = std::sqrt(std::numbers::pi);
    double a = head_dim % 2 == 1 ? 1.0 : 1.5;
    double ratio = head_dim % 2 == 1 ? 0.5 * sqrt_pi : 2.0 / sqrt_pi;
    for (; a < half_d_minus_1; a += 1.0) ratio *= (a + 0.5) / a;
    log_norm = std::log(ratio / sqrt_pi);
    log_beta = std::log(sqrt_pi / ratio);
  }

  // Exponents use log1p(−x²): m·log((1 − x)(1 + x)) would amplify the product's rounding by m ≈ 500.
  double pdf(double x) const {
    const double ax = std::fabs(x);
    if (ax > 1.0) return 0.0;
    if (ax == 1.0) return m == 0.0 ? std::exp(log_norm) : (m < 0.0 ? INFINITY : 0.0);
    return std::exp(log_norm + m * std::log1p(-ax * ax));
  }

  // f(x)·(1 − x²): the antiderivative of x·f(x) is −f(x)(1 − x²)/(d − 1).
  double pdf_times_one_minus_x2(double x) const {
    const double ax = std::fabs(x);
    if (ax >= 1.0) return 0.0;
    return std::exp(log_norm + (m + 1.0) * std::log1p(-ax * ax));
  }

  // ∫_x^1 f for x ∈ [0, 1] = ½·I_{1−x²}(A, ½) = ½·(1 − I_{x²}(½, A)); each side where its fraction converges.
  double upper_tail(double x) const {
    if (x <= 0.0) return 0.5;
    if (x >= 1.0) return 0.0;
    const double s = x * x;
    const double z = (1.0 - x) * (1.0 + x);
    const double log_s = 2.0 * std::log(x);
    const double log_z = std::log1p(-s);
    const double a = half_d_minus_1;
    if (z < (a + 1.0) / (a + 2.5)) return 0.5 * incomplete_beta_cf(z, log_z, log_s, a, 0.5, log_beta);
    return 0.5 * (1.0 - incomplete_beta_cf(s, log_s, log_z, 0.5, a, log_beta));
  }

  // ∫_lo^hi f, with relative accuracy for cells in either tail.
  double mass(double lo, double hi) const {
    if (lo >= 0.0) return upper_tail(lo) - upper_tail(hi);
    if (hi <= 0.0) return upper_tail(-hi) - upper_tail(-lo);
    return 1.0 - upper_tail(-lo) - upper_tail(hi);
  }

  // ∫_lo^hi x f = (F(lo) − F(hi)) / (d − 1) with F = f·(1 − x²).
  double first_moment(double lo, double hi) const {
    return (pdf_times_one_minus_x2(lo) - pdf_times_one_minus_x2(hi)) / (d - 1.0);
  }

  // ∫_lo^hi x² f = (M0 + lo·F(lo) − hi·F(hi)) / d (integration by parts).
  double second_moment(double lo, double hi, double m0) const {
    return (m0 + lo * pdf_times_one_minus_x2(lo) - hi * pdf_times_one_minus_x2(hi)) / d;
  }
};

// Gaussian Lloyd–Max centroids (unit variance, positive half, Max 1960) as the starting point; 32 levels
// start from the Panter–Dite compander (quantiles of N(0, 3)). Scaled by 1/√d.
std::vector<double> initial_guess(std::uint32_t head_dim, std::uint32_t bits) {
  static constexpr double kB1[] = {0.7979};
  static constexpr double kB2[] = {0.4528, 1.5104};
  static constexpr double kB3[] = {0.2451, 0.7560, 1.3440, 2.1520};
  static constexpr double kB4[] = {0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326};
  const std::uint32_t n = 1u << bits;
  const std::uint32_t half = n / 2;
  std::vector<double> positive(half);
  switch (bits) {
    case 1: std::copy(std::begin(kB1), std::end(kB1), positive.begin()); break;
    case 2: std::copy(std::begin(kB2), std::end(kB2), positive.begin()); break;
    case 3: std::copy(std::begin(kB3), std::end(kB3), positive.begin()); break;
    case 4: std::copy(std::begin(kB4), std::end(kB4), positive.begin()); break;
    default:
      for (std::uint32_t i = 0; i < half; ++i) {
        // Φ⁻¹(p) by bisection on erfc: the guess only needs a few digits.
        const double p = (half + i + 0.5) / n;
        double lo = 0.0, hi = 10.0;
        for (int it = 0; it < 60; ++it) {
          const double mid = 0.5 * (lo + hi);
          (0.5 * std::erfc(-mid / std::numbers::sqrt2) < p ? lo : hi) = mid;
        }
        positive[i] = std::sqrt(3.0) * 0.5 * (lo + hi);
      }
  }
  const double sigma = 1.0 / std::sqrt(static_cast<double>(head_dim));
  std::vector<double> c(n);
  for (std::uint32_t i = 0; i < half; ++i) {
    c[half + i] = positive[i] * sigma;
    c[half - 1 - i] = -positive[i] * sigma;
  }
  return c;
}

void symmetrize(std::vector<double>& c) {
  const std::size_t n = c.size();
  for (std::size_t i = 0; i < n / 2; ++i) {
    const double v = 0.5 * (c[n - 1 - i] - c[i]);
    c[n - 1 - i] = v;
    c[i] = -v;
  }
}

bool valid_centroids(const std::vector<double>& c) {
  if (!(c.front() > -1.0) || !(c.back() < 1.0)) return false;
  for (std::size_t i = 1; i < c.size(); ++i) {
    if (!(c[i] > c[i - 1])) return false;
  }
  return true;
}

// One evaluation of Lloyd's map T(c) (cell conditional means for midpoint boundaries), plus the
// tridiagonal Jacobian of T when requested.
struct LloydEval {
  std::vector<double> t;
  std::vector<double> sub, diag, super;  // ∂T_k/∂c_{k−1}, ∂T_k/∂c_k, ∂T_k/∂c_{k+1}
};

void lloyd_map(const Density& density, const std::vector<double>& c, LloydEval& out) {
  const std::size_t n = c.size();
  out.t.assign(n, 0.0);
  out.sub.assign(n, 0.0);
  out.diag.assign(n, 0.0);
  out.super.assign(n, 0.0);
  for (std::size_t k = 0; k < n; ++k) {
    const double lo = k == 0 ? -1.0 : 0.5 * (c[k - 1] + c[k]);
    const double hi = k + 1 == n ? 1.0 : 0.5 * (c[k] + c[k + 1]);
    const double m0 = density.mass(lo, hi);
    KVC_ASSERT(m0 > 0.0, "Lloyd–Max cell lost all its mass");
    const double g = density.first_moment(lo, hi) / m0;
    out.t[k] = g;
    // ∂g/∂lo = f(lo)(g − lo)/M0, ∂g/∂hi = f(hi)(hi − g)/M0, and each boundary moves by half of each
    // neighbouring centroid's move.
    const double d_lo = k == 0 ? 0.0 : density.pdf(lo) * (g - lo) / m0;
    const double d_hi = k + 1 == n ? 0.0 : density.pdf(hi) * (hi - g) / m0;
    out.sub[k] = 0.5 * d_lo;
    out.diag[k] = 0.5 * (d_lo + d_hi);
    out.super[k] = 0.5 * d_hi;
  }
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double r = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) r = std::max(r, std::fabs(a[i] - b[i]));
  return r;
}

// Newton step for T(c) − c = 0: solve (J_T − I)·δ = c − T(c) with the Thomas algorithm.
std::vector<double> newton_step(const std::vector<double>& c, const LloydEval& e) {
  const std::size_t n = c.size();
  std::vector<double> cp(n), dp(n);
  for (std::size_t k = 0; k < n; ++k) {
    const double a = e.sub[k];
    const double b = e.diag[k] - 1.0;
    const double cc = e.super[k];
    const double rhs = c[k] - e.t[k];
    const double denom = k == 0 ? b : b - a * cp[k - 1];
    cp[k] = cc / denom;
    dp[k] = k == 0 ? rhs / denom : (rhs - a * dp[k - 1]) / denom;
  }
  std::vector<double> next(n);
  double delta = dp[n - 1];
  next[n - 1] = c[n - 1] + delta;
  for (std::size_t k = n - 1; k-- > 0;) {
    delta = dp[k] - cp[k] * delta;
    next[k] = c[k] + delta;
  }
  return next;
}

std::uint32_t codebook_id(std::span<const float> centroids, std::uint32_t head_dim, std::uint32_t bits) {
  std::vector<std::uint8_t> bytes;
  auto put_u32 = [&bytes](std::uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  };
  for (const float c : centroids) put_u32(std::bit_cast<std::uint32_t>(c));
  put_u32(head_dim);
  put_u32(bits);
  return static_cast<std::uint32_t>(xxh64(bytes) & 0xFFFFFFFFu);
}

}  // namespace

double coordinate_density(std::uint32_t head_dim, double x) {
  KVC_ASSERT(head_dim >= 3, "coordinate_density needs head_dim >= 3");
  return Density(head_dim).pdf(x);
}

double coordinate_cdf(std::uint32_t head_dim, double x) {
  KVC_ASSERT(head_dim >= 3, "coordinate_cdf needs head_dim >= 3");
  const Density density(head_dim);
  if (std::isnan(x)) return x;
  if (x >= 0.0) return 1.0 - density.upper_tail(std::min(x, 1.0));
  return density.upper_tail(std::min(-x, 1.0));
}

Result<Codebook> Codebook::solve(std::uint32_t head_dim, std::uint32_t bits) {
  KVC_TRY(validate_codebook_args(head_dim, bits));
  const Density density(head_dim);
  std::vector<double> c = initial_guess(head_dim, bits);

  // Converged when a plain Lloyd step would move every centroid by less than this.
  constexpr double kTolerance = 1e-13;
  constexpr std::uint32_t kMaxIterations = 5000;
  LloydEval eval;
  LloydEval trial;
  lloyd_map(density, c, eval);
  double residual = max_abs_diff(eval.t, c);
  std::uint32_t iterations = 0;
  // After reaching the tolerance, keep taking Newton steps while they still shrink the residual (at most
  // kPolishSteps): the distance to the fixed point is the residual times 1/(1 − ρ), ρ the Lloyd map's
  // contraction rate, which is close to 1 for many levels.
  constexpr std::uint32_t kPolishSteps = 4;
  std::uint32_t polish = 0;
  while ((residual >= kTolerance || polish < kPolishSteps) && iterations < kMaxIterations) {
    ++iterations;
    if (residual < kTolerance) ++polish;
    // Try Newton; keep it only if it lands on valid centroids with a smaller residual, else take the
    // plain Lloyd step (which never increases the distortion).
    std::vector<double> next = newton_step(c, eval);
    symmetrize(next);
    bool accepted = false;
    if (valid_centroids(next)) {
      lloyd_map(density, next, trial);
      const double trial_residual = max_abs_diff(trial.t, next);
      if (trial_residual < residual) {
        c = std::move(next);
        std::swap(eval, trial);
        residual = trial_residual;
        accepted = true;
      }
    }
    if (!accepted && residual < kTolerance) break;  // polishing has reached the rounding floor
    if (!accepted) {
      c = eval.t;
      symmetrize(c);
      lloyd_map(density, c, eval);
      residual = max_abs_diff(eval.t, c);
    }
  }
  if (residual >= kTolerance) {
    return make_error(ErrorCode::Internal,
                      "Lloyd–Max solver for head_dim {} bits {} stopped after {} iterations at residual {}", head_dim,
                      bits, iterations, residual);
  }
  // Finish with the Lloyd update itself, so every centroid is its cell's conditional mean.
  c = eval.t;
  symmetrize(c);

  Codebook book;
  book.head_dim_ = head_dim;
  book.bits_ = bits;
  book.iterations_ = iterations;
  book.residual_ = residual;
  book.centroids_ = c;
  const std::size_t n = c.size();
  book.boundaries_.resize(n - 1);
  for (std::size_t k = 0; k + 1 < n; ++k) book.boundaries_[k] = 0.5 * (c[k] + c[k + 1]);
  if (n % 2 == 0) book.boundaries_[n / 2 - 1] = 0.0;  // exact by symmetry
  book.centroids_f32_.assign(c.begin(), c.end());
  book.boundaries_f32_.assign(book.boundaries_.begin(), book.boundaries_.end());

  double per_coordinate = 0.0;
  book.cell_masses_.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    const double lo = k == 0 ? -1.0 : book.boundaries_[k - 1];
    const double hi = k + 1 == n ? 1.0 : book.boundaries_[k];
    const double m0 = density.mass(lo, hi);
    book.cell_masses_[k] = m0;
    const double m1 = density.first_moment(lo, hi);
    const double m2 = density.second_moment(lo, hi, m0);
    per_coordinate += m2 - 2.0 * c[k] * m1 + c[k] * c[k] * m0;
  }
  book.distortion_ = density.d * per_coordinate;
  book.id_ = codebook_id(book.centroids_f32_, head_dim, bits);
  return book;
}

Result<const Codebook*> lloyd_max_codebook(std::uint32_t head_dim, std::uint32_t bits) {
  KVC_TRY(validate_codebook_args(head_dim, bits));
  struct Registry {
    std::mutex mutex;
    std::map<std::pair<std::uint32_t, std::uint32_t>, std::unique_ptr<const Codebook>> books;
  };
  // Never destroyed, so pointers stay valid through static destruction too.
  static Registry* const registry = new Registry;
  std::lock_guard<std::mutex> lock(registry->mutex);
  auto& slot = registry->books[{head_dim, bits}];
  if (!slot) {
    KVC_ASSIGN_OR_RETURN(Codebook book, Codebook::solve(head_dim, bits));
    slot = std::make_unique<const Codebook>(std::move(book));
  }
  return slot.get();
}

}  // namespace kvcompact::tq
