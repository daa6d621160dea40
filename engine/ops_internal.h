// Helpers shared by the op implementations (engine/ops/*.cpp, one file per op family); not part of
// the public API. The ones not defined here are defined in ops/elementwise.cpp.
#pragma once

#include <string>
#include <vector>

#include "evenflow/engine/context_internal.h"
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
// An uninitialized tensor in `format` (ChannelsLast: 4-D shapes), of t's dtype and device or of `options`'.
Tensor empty_in_format(const Shape& shape, MemoryFormat format, const TensorOptions& options);
inline Tensor empty_in_format(const Tensor& t, const Shape& shape, MemoryFormat format) {
  return empty_in_format(shape, format, options_of(t));
}
// The layout of an op's result of `shape` (Note [Channels-last] in ops.h): that of the first of
// `operands` with that shape that is channels-last or contiguous (not an expanded or strided view),
// else contiguous.
MemoryFormat format_for(const Shape& shape, std::initializer_list<const Tensor*> operands);

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

// Note [bfloat16 compute]: the operand a product or convolution runs on, `t` itself or, for
// bfloat16 compute, t rounded to bfloat16 (held in float32: the float32 kernels then multiply
// exactly what bfloat16 ones would). A constant: the node records the unrounded inputs, and its
// backward rounds what it multiplies in turn.
inline Tensor operand_for(const char* op, const Tensor& t, DType compute) {
  if (compute != kBFloat16) return t;
  EF_CHECK(t.dtype() == kFloat32, op, ": bfloat16 compute takes float32 operands, got ", dtype_name(t.dtype()));
  Tensor rounded = detail::empty_in_format(t, t.shape(), detail::format_for(t.shape(), {&t}));
  if (t.numel() > 0) backend_of(t).unary(UnaryOp::RoundBfloat16, rounded.view(), t.view(), 0.0, 0.0);
  return rounded;
}

using Grads = std::vector<Tensor>;

// Bumps t's version counter (Note [Saved tensor versions] in autograd.cpp): what an in-place op does
// after writing t, and an op that has a kernel write t beside its output (batch norm's running
// statistics).
void mark_written(const Tensor& t);

// xs[0] + xs[1] + ... in one kernel (Backend::add_n; the bits of the adds), differentiable: each input's
// gradient is the output's. Contiguous tensors of one shape, floating dtype and device, at least two
// (Note [Gradients summed in one kernel] in autograd.cpp).
Tensor add_n(const std::vector<Tensor>& xs);

// a·x^b, and 0 where x is 0; its derivative is scaled_pow_or_zero(x, a·b, b - 1), so it stays 0 at
// x = 0 to any order: the derivatives of a norm's root (Note [Norm at zero] in ops/reduce.cpp).
Tensor scaled_pow_or_zero(const Tensor& x, double scale, double exponent);
// s^(1/p), sqrt(s) for p = 2, whose derivatives are 0 at s = 0 (Note [Norm at zero]).
Tensor norm_root(const Tensor& s, double p);

}  // namespace evenflow::detail
