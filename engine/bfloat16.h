/// @file
/// bfloat16: the upper half of a float32 -- its sign, its 8 exponent bits (float32's range) and 7 of
/// its 23 mantissa bits (about 3 significant digits). The storage type of DType::BFloat16, usable in
/// host and device code; arithmetic happens in float32 (engine/ops.h says which ops take bfloat16).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#ifndef EF_HD
#ifdef __CUDACC__
#define EF_HD __host__ __device__
#else
#define EF_HD
#endif
#endif

namespace evenflow {

/// One bfloat16 value, as its 16 bits. Conversions are explicit: from float32 rounding to nearest,
/// ties to even (NaN stays NaN, infinities stay infinite, overflow rounds to infinity); to float32
/// exactly.
struct bfloat16 {
  uint16_t bits = 0;  ///< sign, exponent, the 7 upper mantissa bits of a float32

  bfloat16() = default;
  /// `f` rounded to the nearest bfloat16 (ties to even).
  EF_HD explicit bfloat16(float f) : bits(round(f)) {}
  /// The value, exactly, as a float32.
  EF_HD explicit operator float() const { return float_of(static_cast<uint32_t>(bits) << 16); }

 private:
  EF_HD static float float_of(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
  }
  EF_HD static uint32_t bits_of(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
#endif
  }
  EF_HD static uint16_t round(float f) {
    uint32_t u = bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN, kept quiet
    u += 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even (a carry into the exponent is right)
    return static_cast<uint16_t>(u >> 16);
  }
};

/// `v` as an Out, for any two of float, double, int64_t and bfloat16 (the storage types of the
/// dtypes): to and from bfloat16 through float32, otherwise static_cast. What the backends' copies
/// between dtypes and their fills compute, on the host and on the device.
template <typename Out, typename In>
EF_HD Out dtype_cast(In v) {
  if constexpr (std::is_same_v<In, bfloat16>) {
    return static_cast<Out>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<Out, bfloat16>) {
    return bfloat16(static_cast<float>(v));
  } else {
    return static_cast<Out>(v);
  }
}

}  // namespace evenflow
