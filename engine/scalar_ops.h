// Scalar math, written once. Each elementwise op is one functor usable from host code (the CPU
// backend's loops) and device code (the CUDA backend's kernels). The X-macro lists generate the
// op enums and every backend's switch; a missing case fails to compile (see the static_asserts).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "evenflow/engine/bfloat16.h"  // also defines EF_HD (host and device code)

namespace evenflow::scalar {

EF_HD inline float exp_(float x) {
  return ::expf(x);
}
EF_HD inline double exp_(double x) {
  return ::exp(x);
}
EF_HD inline float log_(float x) {
  return ::logf(x);
}
EF_HD inline double log_(double x) {
  return ::log(x);
}
EF_HD inline float expm1_(float x) {
  return ::expm1f(x);
}
EF_HD inline double expm1_(double x) {
  return ::expm1(x);
}
EF_HD inline float log1p_(float x) {
  return ::log1pf(x);
}
EF_HD inline double log1p_(double x) {
  return ::log1p(x);
}
EF_HD inline float sqrt_(float x) {
  return ::sqrtf(x);
}
EF_HD inline double sqrt_(double x) {
  return ::sqrt(x);
}
EF_HD inline float tanh_(float x) {
  return ::tanhf(x);
}
EF_HD inline double tanh_(double x) {
  return ::tanh(x);
}
EF_HD inline float erf_(float x) {
  return ::erff(x);
}
EF_HD inline double erf_(double x) {
  return ::erf(x);
}
EF_HD inline float abs_(float x) {
  return ::fabsf(x);
}
EF_HD inline double abs_(double x) {
  return ::fabs(x);
}
EF_HD inline float pow_(float x, float y) {
  return ::powf(x, y);
}
EF_HD inline double pow_(double x, double y) {
  return ::pow(x, y);
}
// log(1 + e^t) as max(t, 0) + log1p(e^-|t|): finite where e^t overflows (softplus below a large
// threshold).
template <typename T>
EF_HD inline T log1p_exp_(T t) {
  return (t > T(0) ? t : T(0)) + log1p_(exp_(-abs_(t)));
}
// a·b rounded on its own, never fused into the add that follows: nvcc contracts a·b + c into one
// FMA by default, which rounds once where the CPU's kernels (built with -ffp-contract=off) round
// twice.
template <typename T>
EF_HD inline T product_rounded(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) return __fmul_rn(a, b);
  if constexpr (std::is_same_v<T, double>) return __dmul_rn(a, b);
#endif
  return a * b;
}
// Whether x is NaN; always false for integer types.
template <typename T>
EF_HD inline bool isnan_(T x) {
  if constexpr (std::is_floating_point_v<T>)
    return x != x;
  else
    return false;
}

// Note [NaN propagation]
// As in PyTorch, a NaN input gives a NaN output: relu, leaky_relu, elu, softplus and clamp of NaN
// are NaN, maximum and minimum are NaN when either operand is, and so are max pooling over a
// window holding a NaN and max/argmax along a dim holding one (the backends' own kernels). Every
// comparison with NaN is false, so the branch a functor below takes for NaN must compute from x:
// Relu is PyTorch's threshold, x <= 0 ? 0 : x (x > 0 ? x : 0 would turn NaN into 0), and
// Maximum/Minimum test x for NaN (a NaN y reaches the output through the false comparison). The
// backward rules for NaN are in Note [NaN in backward masks] (ops/elementwise.cpp).

// Unary ops: y = f(x; a, b). `a` and `b` are the op's scalar parameters (unused by most).
// Masks (GtScalar, LeScalar, InRange) return 1 or 0 in the input's type (0 for NaN); they carry no
// gradient.
#define EF_UNARY_OPS(X)                                                                \
  X(Neg, -x)                                                                           \
  X(Exp, exp_(x))                                                                      \
  X(Log, log_(x))                                                                      \
  X(Sqrt, sqrt_(x))                                                                    \
  X(Rsqrt, T(1) / sqrt_(x))                                                            \
  X(Reciprocal, T(1) / x)                                                              \
  X(Abs, abs_(x))                                                                      \
  X(Sign, T((x > T(0)) - (x < T(0))))                                                  \
  X(Square, x* x)                                                                      \
  X(Relu, x <= T(0) ? T(0) : x)                                                        \
  X(LeakyRelu, x > T(0) ? x : T(a) * x)                                                \
  X(Elu, x > T(0) ? x : T(a) * expm1_(x))                                              \
  X(Sigmoid, x >= T(0) ? T(1) / (T(1) + exp_(-x)) : exp_(x) / (T(1) + exp_(x)))        \
  X(Tanh, tanh_(x))                                                                    \
  X(Erf, erf_(x))                                                                      \
  /* softplus with beta=a, threshold=b (PyTorch's): linear where beta*x > threshold */ \
  X(Softplus, T(a) * x > T(b) ? x : log1p_exp_(T(a) * x) / T(a))                       \
  X(Clamp, x < T(a) ? T(a) : (x > T(b) ? T(b) : x))                                    \
  X(PowScalar, pow_(x, T(a)))                                                          \
  X(AddScalar, x + T(a))                                                               \
  X(MulScalar, x* T(a))                                                                \
  X(GtScalar, T(x > T(a)))                                                             \
  X(LeScalar, T(x <= T(a)))                                                            \
  X(InRange, T(x >= T(a) && x <= T(b)))                                                \
  /* x rounded to bfloat16, kept in T: Note [bfloat16 compute]'s operands */           \
  X(RoundBfloat16, T(static_cast<float>(::evenflow::bfloat16(static_cast<float>(x))))) \
  /* a·x^b, and 0 at x = 0: the derivatives of a norm's root (Note [Norm at zero]) */ \
  X(ScaledPowOrZero, x == T(0) ? T(0) : T(a) * pow_(x, T(b)))

// Binary ops: out = f(x, y; a), `a` the op's scalar parameter (unused by most). The *Grad ops
// apply an activation's derivative at y to the incoming gradient x in one pass (no mask tensor):
// ReluGrad is PyTorch's threshold_backward, y <= 0 ? 0 : x; LeakyReluGrad multiplies x by 1 where
// y > 0 and by the slope a elsewhere (NaN too), as a mask of those values would. AddScaled is
// add_(y, alpha) in one pass, with the bits of MulScalar then Add on both backends.
#define EF_BINARY_OPS(X)                    \
  X(Add, x + y)                             \
  X(Sub, x - y)                             \
  X(Mul, x* y)                              \
  X(Div, x / y)                             \
  X(Maximum, x > y || isnan_(x) ? x : y)    \
  X(Minimum, x < y || isnan_(x) ? x : y)    \
  X(Gt, T(x > y))                           \
  X(Lt, T(x < y))                           \
  X(Ge, T(x >= y))                          \
  X(Le, T(x <= y))                          \
  X(Eq, T(x == y))                          \
  X(Ne, T(x != y))                          \
  X(ReluGrad, y <= T(0) ? T(0) : x)         \
  X(LeakyReluGrad, y > T(0) ? x : T(a) * x) \
  X(AddScaled, x + product_rounded(T(a), y))

#define EF_DECLARE_UNARY_FUNCTOR(name, expr)            \
  struct name {                                         \
    template <typename T>                               \
    EF_HD T operator()(T x, double a, double b) const { \
      (void)a;                                          \
      (void)b;                                          \
      return expr;                                      \
    }                                                   \
  };
#define EF_DECLARE_BINARY_FUNCTOR(name, expr) \
  struct name {                               \
    double a = 0; /* the op's scalar */       \
    template <typename T>                     \
    EF_HD T operator()(T x, T y) const {      \
      return expr;                            \
    }                                         \
  };

namespace unary {
EF_UNARY_OPS(EF_DECLARE_UNARY_FUNCTOR)
}
namespace binary {
EF_BINARY_OPS(EF_DECLARE_BINARY_FUNCTOR)
}

#undef EF_DECLARE_UNARY_FUNCTOR
#undef EF_DECLARE_BINARY_FUNCTOR

// A counter's increment, add_(x, s) of an int64 tensor (UnaryOp::AddScalar on int64, as batch
// norm's num_batches_tracked): wraps on overflow, as PyTorch's integer add, where a signed add
// would be undefined behaviour. The float ops reach the functors above; this is the one integer op.
struct AddInteger {
  uint64_t s;
  EF_HD explicit AddInteger(double a) : s(static_cast<uint64_t>(static_cast<int64_t>(a))) {}
  EF_HD int64_t operator()(int64_t v) const { return static_cast<int64_t>(static_cast<uint64_t>(v) + s); }
};

// One element of the fused Adam step (AdamArgs, engine/backend.h), written once for both backends.
// The scalars are rounded to T once per call (adam_scalars); m and v are the moments, v_max the
// amsgrad maximum or nullptr.
template <typename T>
struct AdamScalars {
  T decay, weight_decay, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, inv_bias_correction2_sqrt, step;
  bool decoupled, l2;  // tested, so that no 0·inf turns an infinite parameter into NaN
};

template <typename T, typename Args>
EF_HD inline AdamScalars<T> adam_scalars(const Args& a) {
  return {T(a.decay),     T(a.weight_decay), T(a.beta1),         T(a.beta2),
          T(1 - a.beta1), T(1 - a.beta2),    T(a.eps),           T(a.inv_bias_correction2_sqrt),
          T(a.step),      a.decay != 1,      a.weight_decay != 0};
}

template <typename T>
EF_HD inline void adam_element(const AdamScalars<T>& s, T& p, T grad, T& m, T& v, T* v_max) {
  const T tiny = std::numeric_limits<T>::min();  // the smallest normal number
  T pi = p;
  if (s.decoupled) pi = pi * s.decay;
  T g = grad;
  if (s.l2) g = g + pi * s.weight_decay;
  T mi = m * s.beta1 + g * s.one_minus_beta1;
  T vi = v * s.beta2 + (g * g) * s.one_minus_beta2;
  // Note [Adam moments flush to zero]
  mi = abs_(mi) < tiny ? T(0) : mi;
  vi = vi < tiny ? T(0) : vi;
  T second = vi;
  if (v_max) {
    second = (*v_max != *v_max || *v_max > vi) ? *v_max : vi;  // maximum() propagates NaN
    *v_max = second;
  }
  p = pi + (mi / (sqrt_(second) * s.inv_bias_correction2_sqrt + s.eps)) * s.step;
  m = mi;
  v = vi;
}

}  // namespace evenflow::scalar

namespace evenflow {

#define EF_ENUM_ENTRY(name, expr) name,
enum class UnaryOp : uint8_t { EF_UNARY_OPS(EF_ENUM_ENTRY) Count };
enum class BinaryOp : uint8_t { EF_BINARY_OPS(EF_ENUM_ENTRY) Count };
#undef EF_ENUM_ENTRY

#define EF_COUNT_ENTRY(name, expr) +1
static_assert(static_cast<int>(UnaryOp::Count) == 0 EF_UNARY_OPS(EF_COUNT_ENTRY));
static_assert(static_cast<int>(BinaryOp::Count) == 0 EF_BINARY_OPS(EF_COUNT_ENTRY));
#undef EF_COUNT_ENTRY

// Calls f(functor) with the functor type of `op`; used by both backends' elementwise loops.
#define EF_UNARY_CASE(name, expr) \
  case ::evenflow::UnaryOp::name: \
    return f(::evenflow::scalar::unary::name{});
template <typename F>
EF_HD inline auto visit_unary(UnaryOp op, F&& f) {
  switch (op) {
    EF_UNARY_OPS(EF_UNARY_CASE)
    default:
      return f(::evenflow::scalar::unary::Neg{});
  }
}
#undef EF_UNARY_CASE
#define EF_BINARY_CASE(name, expr) \
  case ::evenflow::BinaryOp::name: \
    return f(::evenflow::scalar::binary::name{a});
template <typename F>
EF_HD inline auto visit_binary(BinaryOp op, double a, F&& f) {
  switch (op) {
    EF_BINARY_OPS(EF_BINARY_CASE)
    default:
      return f(::evenflow::scalar::binary::Add{a});
  }
}
#undef EF_BINARY_CASE

// Mean: the sum rounded to the dtype, then times 1 / count rounded (MulScalar's bits: mean() was
// sum and mul_scalar until 2026-12-01, two kernels). Floating dtypes, a count of at least 1.
enum class ReduceOp : uint8_t { Sum, Max, Min, ArgMax, ArgMin, Mean };
enum class RandomKind : uint8_t { Uniform, Normal, Bernoulli };

}  // namespace evenflow
