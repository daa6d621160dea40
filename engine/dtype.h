/// @file
/// Element types. Float32 and Float64 carry gradients; Int64 holds indices (argmax, gather).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "evenflow/engine/error.h"

namespace evenflow {

enum class DType : uint8_t { Float32, Float64, Int64 };

inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kInt64 = DType::Int64;

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

inline bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64;
}

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::Float64;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::Int64;
};

// Calls f with a value of the C++ type for t: EF_DISPATCH_FLOAT for gradient-carrying kernels.
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
