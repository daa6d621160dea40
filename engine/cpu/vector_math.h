// Elementary functions the CPU kernels' loops can vectorize: glibc's scalar calls (tanhf) stop the
// compiler from vectorizing a loop, and each call costs as much as a vector of our own.
#pragma once

#include <bit>
#include <cstdint>

#include "evenflow/engine/cpu/isa.h"

namespace evenflow::cpu_backend {
// Per instruction set, as every engine/cpu declaration (isa.h): a portable build compiles this
// three times, and one symbol for all three would let the linker hand AVX-512 code to the baseline
// kernels.
inline namespace EF_CPU_ISA {

// Note [Vectorized tanh]
// tanh of a float32, without calls or branches, so that an elementwise loop over it vectorizes:
// 0.66 ns an element against glibc's tanhf's 8.3 (one Sapphire Rapids core, 2^20 elements in
// [-4, 4]); it was 3% of the wgan_gp step's CPU time (the generator's output layer). Error against
// the exact value, over every float32 in [-12, 12]: at most 1.37 ulp (glibc's tanhf: 2.19).
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

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
