// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11). Element i of a draw with
// (seed, offset) depends only on (seed, offset + i), so the CPU and CUDA backends produce the same
// numbers for the same generator state, and a draw can be split across threads freely. The same to
// the last bit for uniform and Bernoulli draws; normal draws go through log and cos, which CUDA's
// library, glibc (sample() on the host) and the CPU backend's vectorized ones (Note [Vectorized log
// and cos] in cpu/vector_math.h) compute differently in the last bits (a few times 1e-16).
#pragma once

#include <cstdint>

#include "evenflow/engine/scalar_ops.h"

namespace evenflow::random {

struct Philox4 {
  uint32_t v[4];
};

EF_HD inline Philox4 philox(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in (0, 1]: never 0, so log(u) in Box-Muller is finite.
EF_HD inline double uniform01(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);  // 53 random bits
  return (static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) + 1.0) * (1.0 / 9007199254740992.0);
}

// a + b·c rounded twice, as the CPU computes it (sample() runs on the host only in cpu_elementwise.cpp,
// which is built with -ffp-contract=off: GCC's C++ default would contract too); nvcc would otherwise
// fuse it into one FMA and round once, and uniform draws would differ between the backends in the
// last bit.
EF_HD inline double add_product(double a, double b, double c) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, __dmul_rn(b, c));
#else
  return a + b * c;
#endif
}

// Each kind from its Philox draw r (its uniform u = uniform01(r.v[0], r.v[1]), and u2 =
// uniform01(r.v[2], r.v[3])): uniform in [a, b), normal(mean a, std b) by Box-Muller from log(u) and
// cos(2π·u2) (whose implementations differ between callers: sample()'s, the CPU backend's own),
// bernoulli(p = a).
EF_HD inline double uniform_from(double a, double b, const Philox4& r) {
  return add_product(a, b - a, 1.0 - uniform01(r.v[0], r.v[1]));
}
EF_HD inline double normal_from(double a, double b, double log_u, double cos_two_pi_u2) {
  return add_product(a, b * ::sqrt(-2.0 * log_u), cos_two_pi_u2);
}
EF_HD inline double bernoulli_from(double a, const Philox4& r) {
  return (1.0 - uniform01(r.v[0], r.v[1])) < a ? 1.0 : 0.0;
}

// Sample i of a draw. kind: 0 uniform in [a, b), 1 normal(mean a, std b), 2 bernoulli(p = a).
EF_HD inline double sample(int kind, double a, double b, uint64_t seed, uint64_t index) {
  const Philox4 r = philox(seed, index);
  if (kind == 0) return uniform_from(a, b, r);
  if (kind == 1)
    return normal_from(a, b, ::log(uniform01(r.v[0], r.v[1])), ::cos(6.283185307179586 * uniform01(r.v[2], r.v[3])));
  return bernoulli_from(a, r);
}

}  // namespace evenflow::random
