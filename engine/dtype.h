/// @file
/// Element types. Float32 and Float64 carry gradients; Int64 holds indices (argmax, gather).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "evenflow/engine/error.h"

namespace evenflow {

/// The element type of a tensor: Float32 (float), Float64 (double) or Int64 (int64_t).
enum class DType : uint8_t { Float32, Float64, Int64 };

inline constexpr DType kFloat32 = DType::Float32;  ///< Shorthand for DType::Float32.
inline constexpr DType kFloat64 = DType::Float64;  ///< Shorthand for DType::Float64.
inline constexpr DType kInt64 = DType::Int64;      ///< Shorthand for DType::Int64.

/// The size of one element in bytes: 4 for Float32, 8 for Float64 and Int64.
inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32:
      return 4;
    case DType::Float64:
      return 8;
    case DType::Int64:
      return 8;
  }
  return 0;
}

/// The dtype's name as error messages print it: "float32", "float64" or "int64".
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::Int64:
      return "int64";
  }
  return "?";
}

/// True for Float32 and Float64, the dtypes that can carry gradients.
inline bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64;
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

/// Runs a lambda for the C++ type of `dtype`: EF_DISPATCH_FLOAT for gradient-carrying kernels. The
/// lambda (the last argument, called with no arguments, e.g. `[&] { ... }`) sees `scalar_t` as
/// float or double; the macro evaluates to its result. Any other dtype throws ef::Error
/// "`what`: dtype int64 is not supported (float32 or float64 expected)".
#define EF_DISPATCH_FLOAT(dtype, what, ...)                                                                           \
  [&] {                                                                                                               \
    switch (dtype) {                                                                                                  \
      case ::evenflow::DType::Float32: {                                                                              \
        using scalar_t = float;                                                                                       \
        return __VA_ARGS__();                                                                                         \
      }                                                                                                               \
      case ::evenflow::DType::Float64: {                                                                              \
        using scalar_t = double;                                                                                      \
        return __VA_ARGS__();                                                                                         \
      }                                                                                                               \
      default:                                                                                                        \
        EF_ERROR(what, ": dtype ", ::evenflow::dtype_name(dtype), " is not supported (float32 or float64 expected)"); \
    }                                                                                                                 \
  }()

/// As EF_DISPATCH_FLOAT, for every dtype: `scalar_t` is float, double or int64_t (a value outside
/// DType throws ef::Error "`what`: unknown dtype").
#define EF_DISPATCH_ALL(dtype, what, ...) \
  [&] {                                   \
    switch (dtype) {                      \
      case ::evenflow::DType::Float32: {  \
        using scalar_t = float;           \
        return __VA_ARGS__();             \
      }                                   \
      case ::evenflow::DType::Float64: {  \
        using scalar_t = double;          \
        return __VA_ARGS__();             \
      }                                   \
      case ::evenflow::DType::Int64: {    \
        using scalar_t = int64_t;         \
        return __VA_ARGS__();             \
      }                                   \
    }                                     \
    EF_ERROR(what, ": unknown dtype");    \
  }()

}  // namespace evenflow
