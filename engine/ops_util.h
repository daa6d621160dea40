// Helpers shared by the op implementations (ops.cpp, ops_nn.cpp); not part of the public API.
#pragma once

#include <string>
#include <vector>

#include "evenflow/engine/context.h"
#include "evenflow/engine/ops.h"

namespace evenflow::detail {

inline Backend& backend_of(const Tensor& t) {
  return t.storage()->context->backend();
}
inline TensorOptions options_of(const Tensor& t) {
  return {.dtype = t.dtype(), .device = t.device()};
}
inline Tensor empty_like_shape(const Tensor& t, const Shape& shape) {
  return empty(shape, options_of(t));
}

void check_defined(const char* op, const Tensor& t, const char* what = "input");
void check_float(const char* op, const Tensor& t, const char* what = "input");
// Same dtype and same device (no implicit conversions or copies).
void check_compatible(const char* op, const Tensor& a, const Tensor& b, const char* what_a = "first input",
                      const char* what_b = "second input");
void check_index(const char* op, const Tensor& index, const Tensor& x);
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// A view of t broadcast to `shape` (stride 0 on broadcast dims).
View broadcast_view(const Tensor& t, const Shape& shape);
std::vector<int64_t> normalize_dims(const Shape& dims, int64_t ndim, const char* op);

using Grads = std::vector<Tensor>;

}  // namespace evenflow::detail
