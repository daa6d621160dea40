// Elementary functions the CPU kernels' loops can vectorize: glibc's scalar calls (tanhf) stop the
// compiler from vectorizing a loop, and each call costs as much as a vector of our own.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "evenflow/engine/cpu/isa.h"

namespace evenflow::cpu_backend {
// Per instruction set, as every engine/cpu declaration (isa.h): a portable build compiles this
// three times, and one symbol for all three would let the linker hand AVX-512 code to the baseline
// kernels.
inline namespace EF_CPU_ISA {

// Note [Vectorized tanh]
// tanh of a float32, without calls or branches, so that an elementwise loop over it vectorizes:
// many times faster than glibc's tanhf, which showed in the wgan_gp step's profile (the generator's
// output layer; docs/benchmarks.md, "tanh vectorized"). Error against the exact value, over every
// float32 in [-12, 12]: at most 1.37 ulp (glibc's tanhf: 2.19).
// - |x| < 0.625: x + x^3 P(x^2), P of degree 4 fitted to (tanh(x) - x) / x^3 for least relative
//   error (4.4e-9 at worst, below float32's half ulp).
// - Otherwise 1 - 2 / (e^(2|x|) + 1) with the sign of x: e^(2|x|) = 2^n e^r, r = 2|x| - n ln 2 in
//   [-ln2/2, ln2/2] (Cody and Waite: ln 2 in two parts, so r is exact to float32), e^r by its
//   Taylor polynomial of degree 7 (error 5e-9 relative). |x| is capped at 10, past the 9.01 from
//   where tanh rounds to 1, so that 2^n stays a normal float.
// NaN gives NaN, ±inf ±1, ±0 itself.
inline float tanh_vectorizable(float x) {
  const float a = x < 0.0f ? -x : x;
  const float s = x * x;
  const float small =
      x + x * s *
              (-0.3333328068256378f +
               s * (0.13331441581249237f +
                    s * (-0.05373970419168472f + s * (0.02063906006515026f + s * -0.005704959388822317f))));
  const float t = 2.0f * (a < 10.0f ? a : 10.0f);
  const float n = __builtin_rintf(t * 1.44269504f);                                          // t / ln 2, rounded
  const float r = __builtin_fmaf(-n, 1.42860677e-06f, __builtin_fmaf(-n, 0.693145752f, t));  // t - n ln 2
  const float e_r =
      1.0f + r * (1.0f + r * (0.5f + r * (1.66666672e-01f +
                                          r * (4.16666679e-02f +
                                               r * (8.33333377e-03f + r * (1.38888892e-03f + r * 1.98412701e-04f))))));
  const float e = e_r * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);  // e_r * 2^n
  const float large = 1.0f - 2.0f / (e + 1.0f);
  const float y = a < 0.625f ? small : (x < 0.0f ? -large : large);
  return x != x || a == 0.0f ? x : y;  // NaN; and -0, which the polynomial turns into +0
}

// a·b + c (float or double): one FMA where this copy of the kernels has it (rounded once), else a
// product and a sum.
template <typename T>
inline T mul_add(T a, T b, T c) {
#if defined(__FMA__)
  if constexpr (std::is_same_v<T, float>)
    return __builtin_fmaf(a, b, c);
  else
    return __builtin_fma(a, b, c);
#else
  return a * b + c;
#endif
}

// c0 + x·(c1 + x·(... + x·cn)): Horner's rule on mul_add, from the highest coefficient. Arguments, not
// an array: an array of coefficients kept the elementwise loops that call it from vectorizing.
template <typename T, typename... C>
inline T polynomial(T x, T c0, C... rest) {
  if constexpr (sizeof...(rest) == 0)
    return c0;
  else
    return mul_add(x, polynomial(x, static_cast<T>(rest)...), c0);
}

// Note [Vectorized log and cos]
// Box-Muller's log(u) and cos(2πu) for normal draws (Note [Vectorized draws] in cpu_elementwise.cpp),
// in float64 without calls or branches, so that the draw's loop vectorizes: glibc's log and cos,
// scalar calls, were most of a normal draw's time (docs/benchmarks.md, "The program's host work").
// - log(x), x > 0 normal: x = m·2^e with m in [√½, √2), log m = 2 atanh(s), s = (m - 1) / (m + 1)
//   (|s| ≤ 0.172), by its series to s^23 (the next term is below 2^-60 of the sum); e·ln 2 with
//   ln 2 in two parts. Against glibc's log over a million draws' u in (0, 1] and every power of two
//   down to 2^-53: within 2.0 ulp (test_engine's "the normal draws' log and cos").
// - cos(2πu): u reduced exactly (u is a multiple of 2^-53) to r = u - rint(u) in [-½, ½] and to f =
//   r - q/4 in [-⅛, ⅛] with q = rint(4r), then cos or ∓sin of 2πf (|2πf| ≤ π/4) by their Taylor
//   series (to x^16 and x^17: the next terms are below 2^-58) by the quadrant q. Against glibc's
//   cos(2π·u) over the same u: within 2.875·2^-52 absolute, most of it glibc's own rounding of its
//   argument 2π·u.
// x = 2^e·m, m in [√½, √2), for x positive and normal: e, and s = (m - 1) / (m + 1), whose atanh is
// half of log m.
struct LogReduced {
  double e, s;
};
inline LogReduced log_reduce(double x) {
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  const bool above_sqrt2 = (bits & 0x000FFFFFFFFFFFFFull) > 0x6A09E667F3BCDull;  // mantissa of √2
  // m in [√½, √2): the mantissa with exponent 0, or -1 where it is past √2.
  const double m = std::bit_cast<double>((bits & 0x000FFFFFFFFFFFFFull) |
                                         (above_sqrt2 ? 0x3FE0000000000000ull : 0x3FF0000000000000ull));
  // The biased exponent as a float64, from the bits of 2^52 + it (AVX2 has no integer conversion).
  const double e =
      std::bit_cast<double>(0x4330000000000000ull | (bits >> 52)) - 0x1p52 - 1023.0 + (above_sqrt2 ? 1.0 : 0.0);
  return {e, (m - 1.0) / (m + 1.0)};
}

inline double log_vectorizable(double x) {
  const auto [e, s] = log_reduce(x);
  const double s2 = s * s;
  const double series =
      0.3333333333333333 +
      s2 * (0.2 +
            s2 * (0.14285714285714285 +
                  s2 * (0.1111111111111111 +
                        s2 * (0.09090909090909091 +
                              s2 * (0.07692307692307693 +
                                    s2 * (0.06666666666666667 +
                                          s2 * (0.058823529411764705 +
                                                s2 * (0.05263157894736842 +
                                                      s2 * (0.047619047619047616 + s2 * 0.043478260869565216)))))))));
  return e * 0.6931471803691238 + (e * 1.9082149292705877e-10 + (2.0 * s + 2.0 * s * s2 * series));
}

inline double cos_two_pi_vectorizable(double u) {
  const double r = u - __builtin_rint(u);
  const double q = __builtin_rint(4.0 * r);
  const double x = (r - 0.25 * q) * 6.283185307179586, x2 = x * x;
  const double c =
      1.0 +
      x2 * (-0.5 + x2 * (4.1666666666666664e-02 +
                         x2 * (-1.3888888888888889e-03 +
                               x2 * (2.4801587301587302e-05 +
                                     x2 * (-2.7557319223985893e-07 +
                                           x2 * (2.0876756987868100e-09 +
                                                 x2 * (-1.1470745597729725e-11 + x2 * 4.7794773323873853e-14)))))));
  const double s =
      x + x * x2 *
              (-1.6666666666666666e-01 +
               x2 * (8.3333333333333332e-03 +
                     x2 * (-1.9841269841269841e-04 +
                           x2 * (2.7557319223985893e-06 +
                                 x2 * (-2.5052108385441720e-08 +
                                       x2 * (1.6059043836821613e-10 +
                                             x2 * (-7.6471637318198164e-13 + x2 * 2.8114572543455206e-15)))))));
  const int64_t quadrant = static_cast<int64_t>(q) & 3;  // cos(x + q·π/2)
  return quadrant == 0 ? c : quadrant == 1 ? -s : quadrant == 2 ? -c : s;
}

// Note [Vectorized float32 exp, log, sigmoid, softplus and elu]
// float32's exp, log, sigmoid, softplus, elu and erf on the CPU, without calls or branches, so that an
// elementwise loop over them vectorizes: glibc's expf and logf are scalar calls, and sigmoid ran at
// 17x PyTorch's time (docs/benchmarks.md, "Elementwise exponentials vectorized"). Each is within 1
// ulp of the exact value (test_engine's "float32 exp, log, sigmoid, softplus, elu and erf"); PyTorch
// 2.15's own, measured the same way: exp 0.56 ulp, sigmoid 2.2, softplus 1.5, elu 1.0.
// - exp and sigmoid, where the CPU has FMA (every copy but the baseline): in float32, on twice the
//   lanes of float64 and with no conversions (docs/benchmarks.md, "float32 exp and sigmoid in
//   float32"). e^x = (hi + lo)·2^n by exp_parts: n = rint(x / ln 2); r_hi = x - n·L_hi, exact (one
//   FMA; L_hi is ln 2 rounded to float32: where n ≠ 0, x and n·L_hi are multiples of 2^-25 whose
//   difference is under ½, so it has 24 bits at most); r = r_hi - n·L_lo (ln 2 = L_hi + L_lo);
//   e^r = 1 + r + r²P(r), P of degree 5 fitted for least absolute error over |r| ≤ ln2/2 (2^-29.7
//   with float32 coefficients), where 1 + r_hi is split exactly into s + c (Fast2Sum), so that the
//   leading terms are not rounded before the small ones join them; then hi + lo renormalized (hi =
//   e^r rounded). exp rounds hi·2^n once (a subnormal result twice: 2^n in two factors). sigmoid:
//   1/(1 + e) and e/(1 + e) for e = e^-|x|, both scaled by 2^-n to one quotient (one division, one
//   select of the numerator) with an FMA correction against the pairs, so it rounds once but for
//   the correction's own rounding (a subnormal result twice). Over every float32: within 0.7240 ulp
//   for normal results, 0.7650 for subnormal ones, against 0.50 in float64 (below); e's numerator
//   taken as 1 + r_hi and its tail, unrounded, ran at 1.05x the speed of the rounded pair's 0.6708
//   ulp (docs/benchmarks.md, "sigmoid in fewer instructions").
// - softplus with beta 1 (PyTorch's default), where the copy has FMA: in float32 at 1.5x the float64
//   path's speed (1.7x with AVX2). max(x, 0) + log(1 + t), t = e^-|x| by exp_parts, scaled in two
//   factors; log(1 + t) = k·ln 2 + log1p(f) + lo with f = t (k = 0) or (1 + t)/2 - 1 (k = 1, past
//   t = √2 - 1), so that f stays in [√½ - 1, √2 - 1] and is exact; log1p(f) = f - f²/2 + f³P(f),
//   P of degree 8; k·ln 2 + f - f²/2 as an exact pair (f² by FMA, Fast2Sum), and x added by TwoSum,
//   so the result rounds once. Over every float32: within 0.6708 ulp where the result is at least
//   2^-100, 0.7717 below (e^-|x|'s low part rounds to the subnormal grid there).
// - softmax's e^(x - max(x)), where the copy has FMA (exp_of_nonpositive): the same reduction, e^r by
//   one Horner polynomial rounded at each step: within 0.88 ulp over every float32 ≤ 0, at 1.5x
//   exp_vectorizable's speed; softmax's outputs round twice more (1/s, the product).
// - Otherwise, and for log, softplus and elu: in float64 from the float32 operand, rounded once, so
//   within a hair of half an ulp. e^x (exp_of_float): x = n ln 2 + r with n = rint(x / ln 2), |r| ≤
//   ln2/2 (float64's own rounding of n ln 2 is 2^-45 relative at worst, n ≤ 150), e^r = 1 +
//   exp_minus_one_reduced(r), 2^n from its bits. x is held to [-708, 709], where 2^n is a normal
//   float64: far past float32's range (e^-104 rounds to 0, e^89 to inf), as softplus with a small
//   beta needs (e^(a·x) / a). The baseline copy keeps this path for exp and sigmoid: without FMA,
//   each fmaf is a call, and the float32 path ran at a fifth of this one's speed.
// - log: log_of_float, log_vectorizable's reduction (Note [Vectorized log and cos]) of the widened
//   value with a series cut to float32's need; float32's subnormals are normal float64s.
// - softplus with other betas: (max(a·x, 0) + log1p(e^-|a·x|))·(1/a), equal to log1p(e^(a·x)) / a, whose
//   exponential would overflow for a·x past 709 below a large threshold; log1p(y) for y in (0, 1]
//   by log1p_of_unit's series in y / (2 + y), so that a tiny y keeps its digits.
// - The float64 polynomials run on mul_add: FMAs where the copy has them.
// - elu: a·(e^x - 1), e^x - 1 by expm1_of_float, so that a tiny x keeps its digits.
// - erf (erf_vectorizable): where the copy has FMA, in float32, in three pieces (a polynomial in x²
//   below 0.7, one around 0.975, 1 - e^-x²·R(x) from 1.25): within 0.7951 ulp over every float32
//   (PyTorch's: 0.73), at 1.9x the float64 one's speed (2.2x with AVX2); otherwise in float64, a
//   polynomial below 1, 1 - e^-x²·R(x) above: within 0.5014 ulp.
// NaN gives NaN; infinities and zeros what the functions give them.

// e^r - 1 for |r| ≤ ln2/2 by its Taylor polynomial, r·(1 + r/2 + ... + r^8/9!) (the next term is
// below 2^-35 of the sum).
inline double exp_minus_one_reduced(double r) {
  return r * polynomial(r, 1.0, 0.5, 1.6666666666666666e-01, 4.1666666666666664e-02, 8.3333333333333332e-03,
                        1.3888888888888889e-03, 1.9841269841269841e-04, 2.4801587301587302e-05, 2.7557319223985893e-06);
}

inline double exp_of_float(double x) {
  const double held = x < -708.0 ? -708.0 : (x > 709.0 ? 709.0 : x);
  // n = rint(x / ln 2) as the shifter's low bits: AVX2 has no float64-integer conversions, and one
  // keeps the loop scalar there. Exact: |x / ln 2| < 2^51.
  const double shifted = mul_add(held, 1.4426950408889634, 0x1.8p52);
  const double n = shifted - 0x1.8p52;
  const double r = mul_add(-n, 0.6931471805599453, held);
  const double e_r = 1.0 + exp_minus_one_reduced(r);
  return e_r * std::bit_cast<double>((std::bit_cast<uint64_t>(shifted) + 1023) << 52);  // e^r·2^n
}

// log(1 + y) for y in [0, 1], as 2 atanh(s) with s = y / (2 + y) in [0, ⅓]: 2s(1 + s²/3 + ... +
// s^18/19), the next term below 2^-35 of the sum (float32 results need about 2^-30).
inline double log1p_of_unit(double y) {
  const double s = y / (2.0 + y), s2 = s * s;
  const double p = polynomial(s2, 1.0 / 3.0, 1.0 / 5.0, 1.0 / 7.0, 1.0 / 9.0, 1.0 / 11.0, 1.0 / 13.0, 1.0 / 15.0,
                              1.0 / 17.0, 1.0 / 19.0);
  return mul_add(2.0 * s * s2, p, 2.0 * s);
}

#if defined(__FMA__)
// The float32 2^(e - 127), for a biased exponent e in [1, 254].
inline float from_biased_exponent(int32_t e) {
  return std::bit_cast<float>(e << 23);
}

// 2^n as a float32, for n in [-126, 127].
inline float power_of_two(int32_t n) {
  return from_biased_exponent(n + 127);
}

// v·2^n for n in [-252, 254], in two normal factors (one alone would not reach 2^-150 or 2^128):
// rounded once where the result is normal.
inline float times_power_of_two(float v, int32_t n) {
  const int32_t half = n >> 1;
  return v * power_of_two(half) * power_of_two(n - half);
}

// x = n·ln 2 + r_hi - n·L_lo, n = rint(x / ln 2) (ln 2 = L_hi + L_lo, L_hi rounded to float32), for x
// in [-104, 89]: r_hi = x - n·L_hi is exact (the Note's argument).
struct ExpReduction {
  float n, r_hi;
  int32_t n_int;
};
inline ExpReduction exp_reduce(float x) {
  // n as the shifter's low bits (its bits are those of 2^23·1.5 + n).
  const float shifted = __builtin_fmaf(x, 1.44269504f, 0x1.8p23f);
  const float n = shifted - 0x1.8p23f;
  return {n, __builtin_fmaf(-n, 0.693147182f, x), std::bit_cast<int32_t>(shifted) - 0x4B400000};
}
constexpr float kLn2Low = -1.90465430e-09f;  // L_lo

// P(r), e^r = 1 + r + r²·P(r) for |r| ≤ ln2/2: degree 5, fitted for least absolute error of the sum
// (2^-29.7 with float32 coefficients).
inline float exp_series_tail(float r) {
  return polynomial(r, 0.5f, 1.666666716e-01f, 4.166626930e-02f, 8.333263919e-03f, 1.394610386e-03f, 1.991842728e-04f);
}

// e^x = (s + tail)·2^n for x in [-104, 89], before rounding: s = 1 + r_hi (the float nearest it),
// |tail| < 0.07.
struct ExpSum {
  float s, tail;
  int32_t n;
};
inline ExpSum exp_sum(float x) {
  const auto [n, r_hi, n_int] = exp_reduce(x);
  const float n_lo = n * kLn2Low;  // r = r_hi - n·L_lo
  const float r = r_hi - n_lo;
  const float s = 1.0f + r_hi, c = (1.0f - s) + r_hi;  // s + c = 1 + r_hi exactly
  return {s, c + __builtin_fmaf(r * r, exp_series_tail(r), -n_lo), n_int};
}

// e^x = (hi + lo)·2^n for x in [-104, 89], hi = e^(x - n ln 2) rounded, in [√½, √2], lo what
// rounding it left.
struct ExpParts {
  float hi, lo;
  int32_t n;
};
inline ExpParts exp_parts(float x) {
  const auto [s, tail, n] = exp_sum(x);
  const float hi = s + tail;
  return {hi, (s - hi) + tail, n};
}

inline float exp_vectorizable(float x) {
  const ExpParts e = exp_parts(x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x));
  const float y = times_power_of_two(e.hi, e.n);
  return x != x ? x : y;
}

// e^x for x ≤ 0, -inf and NaN included, in fewer steps than exp_vectorizable's, 0.88 ulp (the Note):
// softmax's rows (docs/benchmarks.md, "Softmax's exponential in fewer steps"). Not for x > 0 (no
// clamp above: +inf gives NaN).
inline float exp_of_nonpositive(float x) {
  const auto [n, r_hi, n_int] = exp_reduce(x < -104.0f ? -104.0f : x);  // a NaN stays NaN
  const float r = __builtin_fmaf(-n, kLn2Low, r_hi);
  return times_power_of_two(__builtin_fmaf(r, __builtin_fmaf(r, exp_series_tail(r), 1.0f), 1.0f), n_int);
}

// -|x| held at -104, past which e^-|x| rounds to 0 in float32, for sigmoid's and softplus's e^-|x|
// (2^n with n in [-150, 0]): the sign bit set, and a max (a NaN gives -104; the callers return x).
inline float minus_abs_held(float x) {
  const float minus_abs = std::bit_cast<float>(std::bit_cast<uint32_t>(x) | 0x80000000u);
  return minus_abs > -104.0f ? minus_abs : -104.0f;
}

// c ? a : b as bits. GCC 12 sinks a plain select through the arithmetic that follows and computes
// that arithmetic for both a and b (sigmoid's quotient correction twice: 1.04x the time).
inline float select_float(bool c, float a, float b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & mask) | (std::bit_cast<uint32_t>(b) & ~mask));
}

// sigmoid from e^-|x| = E·2^n, E = s + tail, n ≤ 0, with both sides of the quotient scaled by P =
// 2^-n' (n' = max(n, -125), so that 1 / (P + E) stays a normal float): P / (P + E) for x ≥ 0, E / (P + E)·2^(n
// - n') for x < 0. Past n = -125 the 2^(n - n') takes the rest of 2^n, and P + E rounds to P (a
// relative 2^-125 that no result keeps).
inline float sigmoid_vectorizable(float x) {
  const auto [s, tail, n] = exp_sum(minus_abs_held(x));
  // P = 2^-n', n' = max(n, -125), and below 2^(n - n'), from their biased exponents: 127 - n held at
  // 252, and n + 252 held at 127 (1) where x < 0, else 127 (GCC makes one multiply of that product
  // and the NaN's select). Written as power_of_two(-max(n, -125)), it ran at 0.94x the speed.
  const int32_t p_exponent = 127 - n;
  const float p = from_biased_exponent(p_exponent < 252 ? p_exponent : 252);
  // P + s + tail as the pair d + d_lo, to 2^-48: d = P + hi (hi = s + tail rounded) and d_lo = ((P -
  // d) + s) + tail, where P - d is exact (Fast2Sum: P ≥ 1 has the larger exponent; hi < 2 where n =
  // 0) and so is adding s (multiples of 2^-24 whose sum is under 1, or s alone where d = P), so that
  // only the last sum rounds (each checked for every float32 -|x|, as the FMA below for x ≥ 0).
  const float d = p + (s + tail), d_lo = ((p - d) + s) + tail;
  const bool negative = x < 0.0f;
  const float num = select_float(negative, s, p), num_lo = select_float(negative, tail, 0.0f);
  // (num + num_lo) / (d + d_lo) as q0 + rem / d, rem = num - q0·d (an FMA) with the pairs' low parts
  // joined. Where x ≥ 0, q0 is within an ulp of P / d and the FMA exact, so the quotient rounds once;
  // where x < 0, E's numerator is s + tail unrounded (forming its rounded pair cost 1.05x the time),
  // so q0 = s / d can be 7% off and rem, up to 7% of the result, rounds at 2^-24 of itself: 0.7240
  // ulp at worst (x = -5.198) against 0.6708 with the rounded pair.
  const float inv = 1.0f / d;
  const float q0 = num * inv;
  const float rem = __builtin_fmaf(-q0, d, num) + __builtin_fmaf(-q0, d_lo, num_lo);
  const float q = __builtin_fmaf(rem, inv, q0);
  const int32_t rest_exponent = negative ? n + 252 : 127;
  return x != x ? x : q * from_biased_exponent(rest_exponent < 127 ? rest_exponent : 127);
}

// P(f), log1p(f) = f - f²/2 + f³·P(f) for f in [√½ - 1, √2 - 1]: degree 8, fitted for least error
// relative to log(1 + t) = k·ln 2 + log1p(f) (2^-29.8 with float32 coefficients).
inline float log1p_cubic_tail(float f) {
  return polynomial(f, 3.333331943e-01f, -2.500007153e-01f, 2.000189275e-01f, -1.666532606e-01f, 1.422017664e-01f,
                    -1.244193390e-01f, 1.192156598e-01f, -1.151552722e-01f, 6.503254175e-02f);
}

// softplus with beta 1 and threshold b, in float32 (the Note): x where x > b, else max(x, 0) + log(1 +
// t), t = e^-|x|.
inline float softplus_beta_one_vectorizable(float x, float b) {
  const ExpParts e = exp_parts(minus_abs_held(x));
  const float t = times_power_of_two(e.hi, e.n), t_lo = times_power_of_two(e.lo, e.n);
  // log(1 + t) = k·ln 2 + log1p(f) + lo, f in [√½ - 1, √2 - 1]: below √2 - 1, k = 0, f = t and lo =
  // t_lo / (1 + t); above, 1 + t = u + u_lo exactly (Fast2Sum), k = 1, f = u/2 - 1 (exact) and lo =
  // u_lo / u.
  const float u = 1.0f + t, u_lo = ((1.0f - u) + t) + t_lo;
  const bool above = u > 1.41421354f;
  const float k = above ? 1.0f : 0.0f;
  const float f = above ? 0.5f * u - 1.0f : t;
  const float lo = (above ? u_lo : t_lo) / u;
  // k·ln 2 + f - f²/2 as the exact pair l + l_err: k·L_hi + f is exact (multiples of 2^-24 below 1),
  // f² = ff + ff_lo (FMA), and Fast2Sum; the rest is small beside l.
  const float ff = f * f, ff_lo = __builtin_fmaf(f, f, -ff);
  const float lead = __builtin_fmaf(k, 0.693147182f, f), minus_half_ff = -0.5f * ff;
  const float l = lead + minus_half_ff, l_err = (lead - l) + minus_half_ff;
  const float l_lo =
      l_err + __builtin_fmaf(ff * f, log1p_cubic_tail(f), __builtin_fmaf(-0.5f, ff_lo, __builtin_fmaf(k, kLn2Low, lo)));
  // max(x, 0) + l exactly (TwoSum), so that the result rounds once.
  const float x_plus = x > 0.0f ? x : 0.0f;
  const float s = x_plus + l, s_l = s - x_plus, s_err = (x_plus - (s - s_l)) + (l - s_l);
  const float y = s + (s_err + l_lo);
  return x > b || !(x < __builtin_inff()) ? x : y;  // NaN and +inf give themselves
}
#else
inline float exp_vectorizable(float x) {
  const double e = exp_of_float(x != x ? 0.0 : static_cast<double>(x));
  return x != x ? x : static_cast<float>(e);
}

inline float sigmoid_vectorizable(float x) {
  const double e = exp_of_float(x != x ? 0.0 : -static_cast<double>(x < 0.0f ? -x : x));  // e^-|x|, in (0, 1]
  const double s = (x < 0.0f ? e : 1.0) / (1.0 + e);
  return x != x ? x : static_cast<float>(s);
}
#endif

// log of a positive normal float64 to float32's need: log_reduce, and the series to s^12/13 (the
// next term is below 2^-34 of the sum), on FMAs where the copy has them.
inline double log_of_float(double x) {
  const auto [e, s] = log_reduce(x);
  const double s2 = s * s;
  const double p = polynomial(s2, 1.0 / 3.0, 1.0 / 5.0, 1.0 / 7.0, 1.0 / 9.0, 1.0 / 11.0, 1.0 / 13.0);
  return mul_add(e, 0.6931471803691238, mul_add(e, 1.9082149292705877e-10, mul_add(2.0 * s * s2, p, 2.0 * s)));
}

inline float log_vectorizable(float x) {
  const bool finite_positive = x > 0.0f && x < __builtin_inff();
  const double l = log_of_float(finite_positive ? static_cast<double>(x) : 1.0);
  // log 0 = -inf, log inf = inf, log of a negative number NaN, NaN itself.
  return finite_positive ? static_cast<float>(l)
                         : (x == 0.0f ? -__builtin_inff() : (x > 0.0f || x != x ? x : __builtin_nanf("")));
}

// softplus with beta a and threshold b (PyTorch's): x where a·x > b, else log1p(e^(a·x)) / a.
inline float softplus_vectorizable(float x, float a, float b) {
  const float ax = a * x;  // in float32, as the threshold test has always been
  const double t = ax != ax ? 0.0 : static_cast<double>(ax);
  const double y = exp_of_float(t < 0.0 ? t : -t);  // e^-|a·x|, in (0, 1]
  const double softplus = ((t > 0.0 ? t : 0.0) + log1p_of_unit(y)) * (1.0 / static_cast<double>(a));
  return ax > b ? x : (ax != ax ? ax : static_cast<float>(softplus));
}

#if !defined(__FMA__)
// Without FMA the float32 path's pairs would be calls: beta 1 takes the float64 path as well.
inline float softplus_beta_one_vectorizable(float x, float b) {
  return softplus_vectorizable(x, 1.0f, b);
}
#endif

// e^x - 1 for x of float32's range: near 0 (|x| < 1/4, within ln2/2) by exp_minus_one_reduced (e^x
// - 1 would lose x's digits to the 1), else from e^x.
inline double expm1_of_float(double x) {
  return x > -0.25 && x < 0.25 ? exp_minus_one_reduced(x) : exp_of_float(x) - 1.0;
}

// elu with alpha a: x where x > 0, else a·(e^x - 1).
// Written with x <= 0 (false for NaN) rather than x > 0 || x != x: clang 14-16 compile the latter's
// select of 0 or x to vminss, which gives +0 for -0 (elu(-0) is -0, as expm1(-0)).
inline float elu_vectorizable(float x, float a) {
  const double e_minus_1 = expm1_of_float(x <= 0.0f ? static_cast<double>(x) : 0.0);
  return x <= 0.0f ? static_cast<float>(static_cast<double>(a) * e_minus_1) : x;
}

#if defined(__FMA__)
// erf in float32, in three pieces, each polynomial fitted for least absolute error in erf; the one
// for a = |x| computed everywhere and chosen (a branch would keep the loop scalar):
// - below 0.7: a·c0 + a·(c0_lo + a²·P(a²)), 2/√π = c0 + c0_lo, P of degree 4 (2^-30.4 relative); a
//   scaled by 2^64 meanwhile, so that a tiny a's a·c0_lo keeps its digits;
// - from 0.7 to 1.25: erf(m) + v·Q(v), v = a - m exact (m = 0.975), erf(m) = E + E_lo, Q of degree
//   7 (2^-33.6);
// - from 1.25: 1 - e^-a²·R(a), R of degree 7 in a - 2.585 fitted to erfc(a)·e^a² (2^-28.7 in erfc),
//   e^-a² by exp_of_nonpositive, a held at 3.92, from where erf rounds to 1;
// then the sign of x. Over every float32: within 0.7951 ulp for normal results, 0.75 for subnormal
// ones. One piece alone for a below 1 reached 1.26 ulp near a = 1.
inline float erf_vectorizable(float x) {
  const float a = std::fabs(x), a2 = a * a;
  const float scaled = a * 0x1p64f;
  const float p =
      polynomial(a2, -3.761263192e-01f, 1.128358245e-01f, -2.684652060e-02f, 5.142488517e-03f, -6.982286577e-04f);
  const float small = __builtin_fmaf(scaled, 1.128379226f, scaled * __builtin_fmaf(a2, p, -5.86353834e-08f)) * 0x1p-64f;
  const float v = a - 0.975f;
  const float q = polynomial(v, 4.361178279e-01f, -4.252149165e-01f, 1.310166568e-01f, 7.786796987e-02f,
                             -6.965284050e-02f, 1.862082398e-03f, 1.569804363e-02f, -4.079315346e-03f);
  const float middle = 8.320615292e-01f + __builtin_fmaf(v, q, 1.025030105e-08f);
  const float held = a < 3.92f ? a : 3.92f;
  const float r = polynomial(held - 2.585f, 2.046613544e-01f, -7.026854903e-02f, 2.306743897e-02f, -7.082536817e-03f,
                             2.137971343e-03f, -1.013941481e-03f, -2.524534357e-04f, -2.287993266e-04f);
  const float large = 1.0f - exp_of_nonpositive(-(held * held)) * r;
  const float y = a < 0.7f ? small : (a < 1.25f ? middle : large);
  return x != x ? x : std::copysign(y, x);
}
#else
// erf in float64 (the Note): x·P(x²) below 1 (P of degree 7 fitted for least relative error:
// 2^-34.8); from 1, 1 - e^-x²·R(x), R of degree 10 in x - 2.46 fitted to erfc(x)·e^x² for least
// error in erfc (2^-33.5), x held at 3.92, from where erf rounds to 1; the sign of x.
inline float erf_vectorizable(float x) {
  const double a = std::fabs(static_cast<double>(x)), a2 = a * a;
  const double p =
      polynomial(a2, 1.1283791670580456, -0.3761263843473629, 0.11283781975029857, -0.026865400086296665,
                 0.00522094554098643, -0.0008482830263779172, 0.00011256957378531655, -9.641541364626233e-06);
  const double held = a < 3.92 ? a : 3.92, u = held - 2.46;
  const double r =
      polynomial(u, 0.21382064248363125, -0.07638169196780814, 0.025922887629804405, -0.008402708417812512,
                 0.002627140185721288, -0.000794186764694433, 0.00020000985253781618, -8.222667230579081e-05,
                 2.6617119907897474e-05, 1.0827363727678586e-05, 7.033009522946585e-06);
  const double y = a < 1.0 ? a * p : 1.0 - exp_of_float(-held * held) * r;
  return x != x ? x : std::copysign(static_cast<float>(y), x);
}
#endif

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
