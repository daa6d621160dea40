// Elementwise ops (arithmetic, activations, where, maximum/minimum, comparisons) and the in-place
// ops: argument checks, a backend kernel, and a node whose backward is written in these same ops.
// Also the argument checks and broadcasting helpers that ops_internal.h declares for every op family.
#include "evenflow/engine/ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "evenflow/engine/ops_internal.h"

namespace evenflow {

using detail::backend_of;
using detail::Grads;

namespace detail {

void check_defined(const char* op, const Tensor& t, const char* what) {
  EF_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

void check_float(const char* op, const Tensor& t, const char* what) {
  check_defined(op, t, what);
  EF_CHECK(is_floating(t.dtype()), op, ": ", what, " must be float32 or float64, got ", dtype_name(t.dtype()));
}

void check_compatible(const char* op, const Tensor& a, const Tensor& b, const char* what_a, const char* what_b) {
  check_defined(op, a, what_a);
  check_defined(op, b, what_b);
  EF_CHECK(a.device() == b.device(), op, ": ", what_a, " is on ", a.device().str(), " but ", what_b, " is on ",
           b.device().str(), " (no implicit copies across devices; use .to(device))");
  EF_CHECK(a.dtype() == b.dtype(), op, ": ", what_a, " is ", dtype_name(a.dtype()), " but ", what_b, " is ",
           dtype_name(b.dtype()), " (no implicit conversions; use .to(dtype))");
}

void check_index(const char* op, const Tensor& index, const Tensor& x) {
  check_defined(op, index, "index");
  EF_CHECK(index.dtype() == kInt64, op, ": index must be int64, got ", dtype_name(index.dtype()));
  EF_CHECK(index.device() == x.device(), op, ": index is on ", index.device().str(), " but input is on ",
           x.device().str());
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    EF_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

View broadcast_view(const Tensor& t, const Shape& shape) {
  View v = t.view();
  const int nd = static_cast<int>(shape.size());
  const int offset = nd - v.ndim;
  View out;
  out.data = v.data;
  out.dtype = v.dtype;
  out.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    out.shape[d] = shape[static_cast<size_t>(d)];
    const int src = d - offset;
    out.strides[d] = (src < 0 || v.shape[src] == 1) ? 0 : v.strides[src];
  }
  return out;
}

std::vector<int64_t> normalize_dims(const Shape& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  for (int64_t d : dims) {
    const int64_t nd = normalize_dim(d, ndim, op);
    EF_CHECK(std::find(out.begin(), out.end(), nd) == out.end(), op, ": dim ", d, " appears twice");
    out.push_back(nd);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Tensor empty_in_format(const Shape& shape, MemoryFormat format, const TensorOptions& options) {
  if (format == MemoryFormat::Contiguous) return empty(shape, options);
  EF_ASSERT(shape.size() == 4, "empty_in_format: channels-last needs a 4-D shape");
  const Tensor nhwc = empty({shape[0], shape[2], shape[3], shape[1]}, options);
  return make_view(nhwc, shape, channels_last_strides(shape), 0);
}

MemoryFormat format_for(const Shape& shape, std::initializer_list<const Tensor*> operands) {
  for (const Tensor* t : operands) {
    if (t->shape() != shape) continue;
    if (t->is_channels_last()) return MemoryFormat::ChannelsLast;
    if (t->is_contiguous()) return MemoryFormat::Contiguous;
    // else an expanded or strided view: it has no layout to keep
  }
  return MemoryFormat::Contiguous;
}

}  // namespace detail

namespace {

// --- Elementwise helpers -------------------------------------------------------------------------

Tensor unary_kernel(const Tensor& x, UnaryOp op, double a = 0, double b = 0) {
  Tensor y = detail::empty_in_format(x, x.shape(), detail::format_for(x.shape(), {&x}));
  if (y.numel() > 0) backend_of(x).unary(op, y.view(), x.view(), a, b);
  return y;
}

// d/dx of a unary op, given x, the incoming gradient and the op's scalars.
using UnaryGrad = Tensor (*)(const Tensor& x, const Tensor& g, double a, double b);

Tensor unary_op(const char* name, UnaryOp op, const Tensor& x, UnaryGrad grad_fn, double a = 0, double b = 0) {
  detail::check_float(name, x);
  Tensor y = unary_kernel(x, op, a, b);
  record(name, {y}, {x}, {x}, [x, grad_fn, a, b](const Grads& g) { return Grads{grad_fn(x, g[0], a, b)}; });
  return y;
}

// `s`: the op's scalar (LeakyReluGrad's slope).
Tensor binary_kernel(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, double s = 0) {
  detail::check_compatible(name, a, b);
  const Shape shape = detail::broadcast_shapes(name, a.shape(), b.shape());
  Tensor y = detail::empty_in_format(a, shape, detail::format_for(shape, {&a, &b}));
  if (y.numel() > 0)
    backend_of(a).binary(op, y.view(), detail::broadcast_view(a, shape), detail::broadcast_view(b, shape), s);
  return y;
}

// A mask (1 where the relation holds, else 0); never carries gradient.
Tensor mask_of(const Tensor& x, UnaryOp op, double a = 0, double b = 0) {
  NoGradGuard no_grad;
  return unary_kernel(x.detach(), op, a, b);
}

// Note [NaN in backward masks]
// PyTorch's backward formulas select where they mask (threshold_backward: x <= 0 ? 0 : g), they
// do not multiply by a 0/1 mask. So a NaN input gets what the false comparison selects (relu, elu:
// all of g; clamp: 0; maximum/minimum: all of g on both sides), and a masked-out position gets 0
// even when its incoming gradient is NaN or infinite. Ours follow: masks are computed with
// comparisons that are false for NaN, and applied with where(mask, g, 0) or as factors that are
// finite everywhere (never 0 times an exp that overflows).
Tensor zero_where(const Tensor& mask, const Tensor& t) {  // 0 where the mask is 1, else t
  return where(mask, zeros({}, detail::options_of(t)), t);
}
Tensor keep_where(const Tensor& mask, const Tensor& t) {  // t where the mask is 1, else 0
  return where(mask, t, zeros({}, detail::options_of(t)));
}

void check_inplace(const char* op, const Tensor& x) {
  detail::check_defined(op, x);
  EF_CHECK(!(grad_enabled() && x.requires_grad()), op, ": ", x.str(),
           " requires grad and cannot be modified in place while grad mode is on (wrap the update in NoGradGuard)");
}

}  // namespace

// --- Elementwise -----------------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = binary_kernel("add", BinaryOp::Add, a, b);
  record("add", {y}, {a, b}, {}, [sa = a.shape(), sb = b.shape()](const Grads& g) {
    return Grads{sum_to(g[0], sa), sum_to(g[0], sb)};
  });
  return y;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor y = binary_kernel("sub", BinaryOp::Sub, a, b);
  record("sub", {y}, {a, b}, {}, [sa = a.shape(), sb = b.shape()](const Grads& g) {
    return Grads{sum_to(g[0], sa), sum_to(neg(g[0]), sb)};
  });
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = binary_kernel("mul", BinaryOp::Mul, a, b);
  record("mul", {y}, {a, b}, {a, b}, [a, b](const Grads& g) {
    return Grads{a.requires_grad() ? sum_to(g[0] * b, a.shape()) : Tensor(),
                 b.requires_grad() ? sum_to(g[0] * a, b.shape()) : Tensor()};
  });
  return y;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor y = binary_kernel("div", BinaryOp::Div, a, b);
  record("div", {y}, {a, b}, {a, b}, [a, b](const Grads& g) {
    return Grads{a.requires_grad() ? sum_to(g[0] / b, a.shape()) : Tensor(),
                 b.requires_grad() ? sum_to(neg(g[0] * a / square(b)), b.shape()) : Tensor()};
  });
  return y;
}

Tensor neg(const Tensor& x) {
  return unary_op("neg", UnaryOp::Neg, x, [](const Tensor&, const Tensor& g, double, double) { return neg(g); });
}
Tensor add_scalar(const Tensor& x, double s) {
  return unary_op(
      "add_scalar", UnaryOp::AddScalar, x, [](const Tensor&, const Tensor& g, double, double) { return g; }, s);
}
Tensor mul_scalar(const Tensor& x, double s) {
  return unary_op(
      "mul_scalar", UnaryOp::MulScalar, x,
      [](const Tensor&, const Tensor& g, double k, double) { return mul_scalar(g, k); }, s);
}
Tensor pow(const Tensor& x, double p) {
  return unary_op(
      "pow", UnaryOp::PowScalar, x,
      [](const Tensor& in, const Tensor& g, double e, double) { return g * mul_scalar(pow(in, e - 1), e); }, p);
}
namespace detail {
Tensor add_n(const std::vector<Tensor>& xs) {
  EF_ASSERT(xs.size() >= 2, "add_n: fewer than two tensors");
  Tensor y = detail::empty_in_format(xs[0], xs[0].shape(), MemoryFormat::Contiguous);
  std::vector<View> views;
  for (const Tensor& x : xs) views.push_back(x.view());
  if (y.numel() > 0) backend_of(xs[0]).add_n(y.view(), views);
  record("add_n", {y}, xs, {}, [n = xs.size()](const Grads& g) { return Grads(n, g[0]); });
  return y;
}
Tensor scaled_pow_or_zero(const Tensor& x, double scale, double exponent) {
  return unary_op(
      "scaled_pow_or_zero", UnaryOp::ScaledPowOrZero, x,
      [](const Tensor& in, const Tensor& g, double a, double b) { return g * scaled_pow_or_zero(in, a * b, b - 1.0); },
      scale, exponent);
}
Tensor norm_root(const Tensor& s, double p) {
  detail::check_float("norm", s);
  Tensor y = p == 2.0 ? unary_kernel(s, UnaryOp::Sqrt) : unary_kernel(s, UnaryOp::PowScalar, 1.0 / p);
  record("norm_root", {y}, {s}, {s},
         [s, p](const Grads& g) { return Grads{g[0] * scaled_pow_or_zero(s, 1.0 / p, 1.0 / p - 1.0)}; });
  return y;
}
}  // namespace detail
Tensor sqrt(const Tensor& x) {
  return unary_op("sqrt", UnaryOp::Sqrt, x,
                  [](const Tensor& in, const Tensor& g, double, double) { return g * mul_scalar(rsqrt(in), 0.5); });
}
Tensor rsqrt(const Tensor& x) {
  return unary_op("rsqrt", UnaryOp::Rsqrt, x, [](const Tensor& in, const Tensor& g, double, double) {
    return g * mul_scalar(pow(in, -1.5), -0.5);
  });
}
Tensor reciprocal(const Tensor& x) {
  return unary_op("reciprocal", UnaryOp::Reciprocal, x,
                  [](const Tensor& in, const Tensor& g, double, double) { return neg(g * square(reciprocal(in))); });
}
Tensor exp(const Tensor& x) {
  return unary_op("exp", UnaryOp::Exp, x,
                  [](const Tensor& in, const Tensor& g, double, double) { return g * exp(in); });
}
Tensor log(const Tensor& x) {
  return unary_op("log", UnaryOp::Log, x, [](const Tensor& in, const Tensor& g, double, double) { return g / in; });
}
Tensor abs(const Tensor& x) {
  return unary_op("abs", UnaryOp::Abs, x,
                  [](const Tensor& in, const Tensor& g, double, double) { return g * sign(in); });
}
Tensor square(const Tensor& x) {
  return unary_op("square", UnaryOp::Square, x,
                  [](const Tensor& in, const Tensor& g, double, double) { return g * mul_scalar(in, 2.0); });
}
Tensor clamp(const Tensor& x, double lo, double hi) {
  EF_CHECK(lo <= hi, "clamp: lower bound ", lo, " is greater than upper bound ", hi);
  return unary_op(
      "clamp", UnaryOp::Clamp, x,
      [](const Tensor& in, const Tensor& g, double l, double h) {
        return keep_where(mask_of(in, UnaryOp::InRange, l, h), g);
      },
      lo, hi);
}
// A piecewise-linear activation's derivative at x applied to g in one pass (`op`, one of the
// binary *Grad ops; `s` its scalar), without a mask tensor: relu's is PyTorch's
// threshold_backward(g, x, 0), x <= 0 ? 0 : g, so a NaN input passes g; leaky_relu's is g where
// x > 0, else s·g (NaN too). Linear in g (so its own derivative in g is itself); piecewise constant
// in x, whose derivative is 0.
static Tensor activation_backward(const char* name, BinaryOp op, const Tensor& g, const Tensor& x, double s) {
  Tensor y = binary_kernel(name, op, g, x, s);
  record(name, {y}, {g}, {x},
         [name, op, x, s](const Grads& gg) { return Grads{activation_backward(name, op, gg[0], x, s)}; });
  return y;
}

Tensor relu(const Tensor& x) {
  return unary_op("relu", UnaryOp::Relu, x, [](const Tensor& in, const Tensor& g, double, double) {
    return activation_backward("relu_backward", BinaryOp::ReluGrad, g, in, 0.0);
  });
}
Tensor leaky_relu(const Tensor& x, double slope) {
  return unary_op(
      "leaky_relu", UnaryOp::LeakyRelu, x,
      [](const Tensor& in, const Tensor& g, double s, double) {
        return activation_backward("leaky_relu_backward", BinaryOp::LeakyReluGrad, g, in, s);
      },
      slope);
}
Tensor elu(const Tensor& x, double alpha) {
  return unary_op(
      "elu", UnaryOp::Elu, x,
      [](const Tensor& in, const Tensor& g, double a, double) {
        // α·exp(x) where x <= 0, else 1; exp sees 0 elsewhere, so a large x cannot make it inf
        // (inf·0 would be NaN) and a NaN x gets all of g.
        const Tensor neg = mask_of(in, UnaryOp::LeScalar);
        const Tensor in_neg = keep_where(neg, in);
        return g * (neg * (mul_scalar(exp(in_neg), a) - 1.0) + 1.0);
      },
      alpha);
}
Tensor sigmoid(const Tensor& x) {
  return unary_op("sigmoid", UnaryOp::Sigmoid, x, [](const Tensor& in, const Tensor& g, double, double) {
    const Tensor s = sigmoid(in);
    return g * s * (1.0 - s);
  });
}
Tensor tanh(const Tensor& x) {
  return unary_op("tanh", UnaryOp::Tanh, x,
                  [](const Tensor& in, const Tensor& g, double, double) { return g * (1.0 - square(tanh(in))); });
}
Tensor erf(const Tensor& x) {
  return unary_op("erf", UnaryOp::Erf, x, [](const Tensor& in, const Tensor& g, double, double) {
    return g * mul_scalar(exp(neg(square(in))), 2.0 / std::sqrt(std::numbers::pi));
  });
}

Tensor softplus(const Tensor& x, double beta, double threshold) {
  EF_CHECK(beta > 0, "softplus: beta must be positive, got ", beta);
  return unary_op(
      "softplus", UnaryOp::Softplus, x,
      [](const Tensor& in, const Tensor& g, double b, double t) {
        // Linear region (beta·x > threshold): slope 1; elsewhere sigmoid(beta·x).
        const Tensor linear = mask_of(in, UnaryOp::GtScalar, t / b);
        return g * (linear + (1.0 - linear) * sigmoid(mul_scalar(in, b)));
      },
      beta, threshold);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  detail::check_compatible("where", a, b);
  detail::check_compatible("where", cond, a, "condition", "first input");
  const Shape shape =
      detail::broadcast_shapes("where", cond.shape(), detail::broadcast_shapes("where", a.shape(), b.shape()));
  Tensor y = detail::empty_in_format(a, shape, detail::format_for(shape, {&a, &b}));
  if (y.numel() > 0)
    backend_of(a).where(y.view(), detail::broadcast_view(cond, shape), detail::broadcast_view(a, shape),
                        detail::broadcast_view(b, shape));
  const Tensor c = cond.detach();
  record("where", {y}, {a, b}, {cond}, [c, sa = a.shape(), sb = b.shape()](const Grads& g) {
    const Tensor zero = zeros_like(g[0]);
    return Grads{sum_to(where(c, g[0], zero), sa), sum_to(where(c, zero, g[0]), sb)};
  });
  return y;
}

// As PyTorch: the operand that loses (`loses(a, b)`: a < b for maximum) gets 0, ties split g
// evenly, and otherwise g goes whole to each side, so both get g where either is NaN.
static Tensor extremum(const char* name, BinaryOp op, BinaryOp loses, const Tensor& a, const Tensor& b) {
  Tensor y = binary_kernel(name, op, a, b);
  record(name, {y}, {a, b}, {a, b}, [a, b, loses](const Grads& g) {
    Tensor lose_a, lose_b, share;
    {
      NoGradGuard no_grad;
      const Tensor ad = a.detach(), bd = b.detach();
      lose_a = binary_kernel("mask", loses, ad, bd);
      lose_b = binary_kernel("mask", loses, bd, ad);
      share = 1.0 - mul_scalar(binary_kernel("mask", BinaryOp::Eq, ad, bd), 0.5);
    }
    const Tensor gs = g[0] * share;
    return Grads{sum_to(zero_where(lose_a, gs), a.shape()), sum_to(zero_where(lose_b, gs), b.shape())};
  });
  return y;
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return extremum("maximum", BinaryOp::Maximum, BinaryOp::Lt, a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return extremum("minimum", BinaryOp::Minimum, BinaryOp::Gt, a, b);
}

Tensor sign(const Tensor& x) {
  return mask_of(x, UnaryOp::Sign);
}

static Tensor compare(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  return binary_kernel(name, op, a.detach(), b.detach());
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return compare("gt", BinaryOp::Gt, a, b);
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return compare("lt", BinaryOp::Lt, a, b);
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return compare("ge", BinaryOp::Ge, a, b);
}
Tensor le(const Tensor& a, const Tensor& b) {
  return compare("le", BinaryOp::Le, a, b);
}
Tensor eq(const Tensor& a, const Tensor& b) {
  return compare("eq", BinaryOp::Eq, a, b);
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return compare("ne", BinaryOp::Ne, a, b);
}

// --- In place ------------------------------------------------------------------------------------------

void detail::mark_written(const Tensor& x) {
  x.storage()->version.fetch_add(1);
}

void fill_(const Tensor& x, double v) {
  check_inplace("fill_", x);
  if (x.numel() > 0) backend_of(x).fill(x.view(), v);
  detail::mark_written(x);
}

void copy_(const Tensor& dst, const Tensor& src) {
  check_inplace("copy_", dst);
  detail::check_defined("copy_", src, "source");
  if (dst.device() != src.device()) {
    // Between devices the bytes move as they are (a batch into a step's input buffer: one copy).
    EF_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.is_contiguous(), "copy_: from ", src.str(),
             " into ", dst.str(),
             ": between devices the source needs the destination's dtype and shape, and the destination must be "
             "contiguous");
    const Tensor from = src.contiguous();
    copy_between_devices(dst.device(), dst.data_ptr(), src.device(), from.data_ptr(),
                         static_cast<size_t>(dst.numel()) * dtype_size(dst.dtype()));
    detail::mark_written(dst);
    return;
  }
  EF_CHECK(detail::broadcast_shapes("copy_", src.shape(), dst.shape()) == dst.shape(), "copy_: source shape ",
           shape_str(src.shape()), " does not broadcast to destination shape ", shape_str(dst.shape()));
  if (dst.numel() > 0) {
    // A source in dst's own memory, but not element for element (dst shifted by a row, say), is
    // copied first, as add_'s: the kernel would read elements it has already written.
    const bool overlaps =
        src.storage() == dst.storage() &&
        !(src.offset() == dst.offset() && src.shape() == dst.shape() && src.strides() == dst.strides());
    const Tensor source = overlaps ? src.detach().clone() : src;
    backend_of(dst).copy(dst.view(), detail::broadcast_view(source, dst.shape()));
  }
  detail::mark_written(dst);
}

void add_(const Tensor& x, const Tensor& other, double alpha) {
  check_inplace("add_", x);
  detail::check_compatible("add_", x, other, "tensor", "other");
  EF_CHECK(detail::broadcast_shapes("add_", other.shape(), x.shape()) == x.shape(), "add_: shape ",
           shape_str(other.shape()), " does not broadcast to ", shape_str(x.shape()));
  // As PyTorch: a scaled sum only of floating-point tensors (an integer tensor would cut alpha).
  if (alpha != 1.0) detail::check_float("add_ with alpha other than 1", x);
  if (x.numel() == 0) return;
  // `other` in x's own memory, but not element for element (a row of x broadcast over it), is copied
  // first: the kernel would read elements it has already written.
  const bool overlaps = other.storage() == x.storage() &&
                        !(other.offset() == x.offset() && other.shape() == x.shape() && other.strides() == x.strides());
  const Tensor source = overlaps ? other.detach().clone() : other;
  const View y = detail::broadcast_view(source, x.shape());
  if (alpha == 1.0)
    backend_of(x).binary(BinaryOp::Add, x.view(), x.view(), y, 0.0);
  else
    backend_of(x).binary(BinaryOp::AddScaled, x.view(), x.view(), y, alpha);
  detail::mark_written(x);
}

void add_(const Tensor& x, double s) {
  check_inplace("add_", x);
  if (x.dtype() == kInt64) {
    EF_CHECK(std::isfinite(s) && s == std::trunc(s) && std::abs(s) <= 0x1p62, "add_: ", s,
             " is not an integer to add to an int64 tensor");
  } else {
    detail::check_float("add_", x);
  }
  if (x.numel() > 0) backend_of(x).unary(UnaryOp::AddScalar, x.view(), x.view(), s, 0);
  detail::mark_written(x);
}

void mul_(const Tensor& x, double s) {
  check_inplace("mul_", x);
  detail::check_float("mul_", x);
  if (x.numel() > 0) backend_of(x).unary(UnaryOp::MulScalar, x.view(), x.view(), s, 0);
  detail::mark_written(x);
}

void adam_(const AdamArgs& args, const std::vector<AdamTensors>& params) {
  if (params.empty()) return;
  const Tensor& first = params[0].param;
  // Operands are named ("grad 3") only in a message: this runs for every parameter at every step.
  const auto label = [&](const char* what, size_t k) {
    return params.size() == 1 ? std::string(what) : detail::str_cat(what, " ", k);
  };
  const auto compatible = [](const Tensor& a, const Tensor& b) {
    return b.defined() && a.dtype() == b.dtype() && a.device() == b.device();
  };
  for (size_t k = 0; k < params.size(); ++k) {
    const AdamTensors& t = params[k];
    check_inplace("adam_", t.param);
    if (!t.param.defined() || !is_floating(t.param.dtype()))
      detail::check_float("adam_", t.param, label("param", k).c_str());
    if (!compatible(first, t.param))
      detail::check_compatible("adam_", first, t.param, "param 0", label("param", k).c_str());
    for (const auto& [what, x] :
         {std::pair{"grad", &t.grad}, std::pair{"exp_avg", &t.exp_avg}, std::pair{"exp_avg_sq", &t.exp_avg_sq},
          std::pair{"max_exp_avg_sq", &t.max_exp_avg_sq}}) {
      if (x == &t.max_exp_avg_sq && !args.amsgrad) continue;
      if (!compatible(t.param, *x))
        detail::check_compatible("adam_", t.param, *x, label("param", k).c_str(), label(what, k).c_str());
      EF_CHECK(x->shape() == t.param.shape(), "adam_: ", label(what, k), " has shape ", shape_str(x->shape()), " but ",
               label("param", k), " has ", shape_str(t.param.shape()));
    }
  }
  // The kernel walks flat memory: strided operands go through contiguous copies, written back after.
  NoGradGuard no_grad;
  const auto dense = [](const Tensor& x) { return x.is_contiguous() ? x : x.detach().contiguous(); };
  std::vector<AdamTensors> flat;
  std::vector<AdamOperands> operands;
  for (const AdamTensors& t : params) {
    if (t.param.numel() == 0) continue;
    flat.push_back({dense(t.param), dense(t.grad), dense(t.exp_avg), dense(t.exp_avg_sq),
                    args.amsgrad ? dense(t.max_exp_avg_sq) : Tensor()});
    const AdamTensors& f = flat.back();
    operands.push_back({f.param.view(), f.grad.view(), f.exp_avg.view(), f.exp_avg_sq.view(),
                        args.amsgrad ? f.max_exp_avg_sq.view() : View{}});
  }
  if (!operands.empty()) backend_of(first).adam(args, operands);
  size_t j = 0;
  for (const AdamTensors& t : params) {
    if (t.param.numel() == 0) continue;
    const AdamTensors& f = flat[j++];
    for (const auto& [updated, used] :
         {std::pair{&t.param, &f.param}, std::pair{&t.exp_avg, &f.exp_avg}, std::pair{&t.exp_avg_sq, &f.exp_avg_sq},
          std::pair{&t.max_exp_avg_sq, &f.max_exp_avg_sq}}) {
      if (updated == &t.max_exp_avg_sq && !args.amsgrad) continue;
      if (!updated->is_contiguous()) copy_(updated->detach(), *used);
      detail::mark_written(*updated);
    }
  }
}

}  // namespace evenflow
