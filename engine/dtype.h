/// @file
/// Element types. Float32 and Float64 carry gradients and run every op; BFloat16 is storage (casts,
/// copies, files; engine/ops.h says what takes it); Int64 holds indices (argmax, gather).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "evenflow/engine/bfloat16.h"
#include "evenflow/engine/error.h"

namespace evenflow {

/// The element type of a tensor: Float32 (float), Float64 (double), Int64 (int64_t) or BFloat16
/// (bfloat16).
enum class DType : uint8_t { Float32, Float64, Int64, BFloat16 };

inline constexpr DType kFloat32 = DType::Float32;    ///< Shorthand for DType::Float32.
inline constexpr DType kFloat64 = DType::Float64;    ///< Shorthand for DType::Float64.
inline constexpr DType kInt64 = DType::Int64;        ///< Shorthand for DType::Int64.
inline constexpr DType kBFloat16 = DType::BFloat16;  ///< Shorthand for DType::BFloat16.

/// The size of one element in bytes: 4 for Float32, 8 for Float64 and Int64, 2 for BFloat16.
inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32:
      return 4;
    case DType::Float64:
      return 8;
    case DType::Int64:
      return 8;
    case DType::BFloat16:
      return 2;
  }
  return 0;
}

/// The dtype's name as error messages print it: "float32", "float64", "int64" or "bfloat16".
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::Int64:
      return "int64";
    case DType::BFloat16:
      return "bfloat16";
  }
  return "?";
}

/// True for Float32 and Float64, the dtypes every floating-point op computes in.
inline bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64;
}

/// True for the dtypes a gradient can flow through: Float32, Float64, and BFloat16, whose only
/// differentiable op is the cast (to_dtype) to and from the others.
inline bool carries_gradient(DType t) {
  return is_floating(t) || t == DType::BFloat16;
}

/// The DType of C++ type T, as `dtype_of<T>::value`; defined for float, double and int64_t only
/// (any other T does not compile).
template <typename T>
struct dtype_of;
/// float is DType::Float32.
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::Float32;  ///< DType::Float32
};
/// double is DType::Float64.
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::Float64;  ///< DType::Float64
};
/// int64_t is DType::Int64.
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::Int64;  ///< DType::Int64
};
/// bfloat16 is DType::BFloat16.
template <>
struct dtype_of<bfloat16> {
  static constexpr DType value = DType::BFloat16;  ///< DType::BFloat16
};

/// One case of the dispatch macros below: DType::`name` runs the lambda with `scalar_t` = `type`.
#define EF_DISPATCH_CASE(name, type, ...) \
  case ::evenflow::DType::name: {         \
    using scalar_t = type;                \
    return __VA_ARGS__();                 \
  }

/// Runs a lambda for the C++ type of `dtype`: EF_DISPATCH_FLOAT for gradient-carrying kernels. The
/// lambda (the last argument, called with no arguments, e.g. `[&] { ... }`) sees `scalar_t` as
/// float or double; the macro evaluates to its result. Any other dtype throws ef::Error
/// "`what`: dtype int64 is not supported (float32 or float64 expected)".
#define EF_DISPATCH_FLOAT(dtype, what, ...)                                                        \
  [&] {                                                                                            \
    switch (dtype) {                                                                               \
      EF_DISPATCH_CASE(Float32, float, __VA_ARGS__)                                                \
      EF_DISPATCH_CASE(Float64, double, __VA_ARGS__)                                               \
      default:                                                                                     \
        EF_ERROR(what, ": dtype ", ::evenflow::dtype_name(dtype),                                  \
                 " is not supported (float32 or float64 expected; bfloat16 is storage: cast it)"); \
    }                                                                                              \
  }()

/// As EF_DISPATCH_FLOAT, for every dtype that computes: `scalar_t` is float, double or int64_t
/// (bfloat16 throws ef::Error "`what`: dtype bfloat16 is not supported ...", a value outside DType
/// "`what`: unknown dtype").
#define EF_DISPATCH_ALL(dtype, what, ...)                                                              \
  [&] {                                                                                                \
    switch (dtype) {                                                                                   \
      EF_DISPATCH_CASE(Float32, float, __VA_ARGS__)                                                    \
      EF_DISPATCH_CASE(Float64, double, __VA_ARGS__)                                                   \
      EF_DISPATCH_CASE(Int64, int64_t, __VA_ARGS__)                                                    \
      case ::evenflow::DType::BFloat16:                                                                \
        EF_ERROR(what, ": dtype bfloat16 is not supported (bfloat16 is storage: cast it to float32)"); \
    }                                                                                                  \
    EF_ERROR(what, ": unknown dtype");                                                                 \
  }()

/// As EF_DISPATCH_ALL with bfloat16 too: for what every dtype's storage supports (fill, copies
/// between dtypes), where `scalar_t` only converts (dtype_cast in bfloat16.h).
#define EF_DISPATCH_STORAGE(dtype, what, ...)                       \
  [&] {                                                             \
    switch (dtype) {                                                \
      EF_DISPATCH_CASE(Float32, float, __VA_ARGS__)                 \
      EF_DISPATCH_CASE(Float64, double, __VA_ARGS__)                \
      EF_DISPATCH_CASE(Int64, int64_t, __VA_ARGS__)                 \
      EF_DISPATCH_CASE(BFloat16, ::evenflow::bfloat16, __VA_ARGS__) \
    }                                                               \
    EF_ERROR(what, ": unknown dtype");                              \
  }()

}  // namespace evenflow
