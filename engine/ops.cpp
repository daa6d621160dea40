// Elementwise ops, reductions, views and copies: argument checks, a backend kernel, and a node whose
// backward is written in these same ops. Matrix products, convolution, pooling, softmax, indexing
// and normalization are in ops_nn.cpp.
#include "evenflow/engine/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>

#include "evenflow/engine/ops_util.h"

namespace evenflow {

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

using detail::backend_of;
using detail::Grads;

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

// --- Reductions ------------------------------------------------------------------------------------

static Shape keepdim_shape(const Shape& in, const std::vector<int64_t>& dims) {
  Shape s = in;
  for (int64_t d : dims) s[static_cast<size_t>(d)] = 1;
  return s;
}

static Shape squeezed_shape(const Shape& in, const std::vector<int64_t>& dims) {
  Shape s;
  for (size_t i = 0; i < in.size(); ++i)
    if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(i)) == dims.end()) s.push_back(in[i]);
  return s;
}

static std::vector<int64_t> all_dims(int64_t ndim) {
  std::vector<int64_t> d(static_cast<size_t>(ndim));
  std::iota(d.begin(), d.end(), 0);
  return d;
}

Tensor sum(const Tensor& x, const Shape& dims_in, bool keepdim) {
  detail::check_float("sum", x);
  const std::vector<int64_t> dims =
      dims_in.empty() ? all_dims(x.dim()) : detail::normalize_dims(dims_in, x.dim(), "sum");
  const Shape kept = keepdim_shape(x.shape(), dims);
  Tensor y = detail::empty_like_shape(x, kept);
  if (y.numel() > 0) {
    if (x.numel() == 0)
      backend_of(x).fill(y.view(), 0.0);
    else
      backend_of(x).reduce(ReduceOp::Sum, y.view(), x.view());
  }
  if (!keepdim)
    y = make_view(y, squeezed_shape(x.shape(), dims), contiguous_strides(squeezed_shape(x.shape(), dims)), 0);
  record("sum", {y}, {x}, {},
         [kept, shape = x.shape()](const Grads& g) { return Grads{expand(reshape(g[0], kept), shape)}; });
  return y;
}

Tensor sum(const Tensor& x) {
  return sum(x, {}, false);
}

static int64_t count_over(const Tensor& x, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= x.shape()[static_cast<size_t>(d)];
  return n;
}

Tensor mean(const Tensor& x, const Shape& dims_in, bool keepdim) {
  detail::check_float("mean", x);
  const std::vector<int64_t> dims =
      dims_in.empty() ? all_dims(x.dim()) : detail::normalize_dims(dims_in, x.dim(), "mean");
  const int64_t n = count_over(x, dims);
  EF_CHECK(n > 0, "mean: reducing over an empty dim of shape ", shape_str(x.shape()));
  return mul_scalar(sum(x, Shape(dims.begin(), dims.end()), keepdim), 1.0 / static_cast<double>(n));
}

Tensor mean(const Tensor& x) {
  return mean(x, {}, false);
}

Tensor var(const Tensor& x, const Shape& dims_in, bool unbiased, bool keepdim) {
  detail::check_float("var", x);
  const std::vector<int64_t> dims =
      dims_in.empty() ? all_dims(x.dim()) : detail::normalize_dims(dims_in, x.dim(), "var");
  const Shape d(dims.begin(), dims.end());
  const int64_t n = count_over(x, dims);
  EF_CHECK(n > (unbiased ? 1 : 0), "var: need at least ", unbiased ? 2 : 1, " elements per reduction, got ", n);
  const Tensor centered = x - mean(x, d, true);
  return mul_scalar(sum(square(centered), d, keepdim), 1.0 / static_cast<double>(unbiased ? n - 1 : n));
}

static Tensor arg_reduce(const char* name, ReduceOp op, const Tensor& x, int64_t dim, bool keepdim) {
  detail::check_float(name, x);
  EF_CHECK(x.numel() > 0, name, ": input is empty");
  const int64_t d = normalize_dim(dim, x.dim(), name);
  const std::vector<int64_t> dims = x.dim() == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{d};
  Tensor idx = empty(keepdim_shape(x.shape(), dims), {.dtype = kInt64, .device = x.device()});
  if (x.dim() == 0)
    backend_of(x).fill(idx.view(), 0.0);
  else
    backend_of(x).reduce(op, idx.view(), x.view());
  if (!keepdim)
    idx = make_view(idx, squeezed_shape(x.shape(), dims), contiguous_strides(squeezed_shape(x.shape(), dims)), 0);
  return idx;
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return arg_reduce("argmax", ReduceOp::ArgMax, x, dim, keepdim);
}
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  return arg_reduce("argmin", ReduceOp::ArgMin, x, dim, keepdim);
}

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  const Tensor idx = argmax(x, dim, true);
  if (x.dim() == 0) return {clone(x), make_view(idx, {}, {}, 0)};
  const int64_t d = normalize_dim(dim, x.dim(), "max");
  Tensor values = gather(x, d, idx);
  if (keepdim) return {values, idx};
  return {squeeze(values, d), squeeze(idx, d)};
}

Tensor amax(const Tensor& x) {
  detail::check_float("amax", x);
  return max(reshape(x, {-1}), 0, false).first;
}

Tensor norm(const Tensor& x, double p, const Shape& dims, bool keepdim) {
  detail::check_float("norm", x);
  EF_CHECK(p > 0, "norm: p must be positive, got ", p);
  if (p == 1.0) return sum(abs(x), dims, keepdim);
  const Tensor s = p == 2.0 ? sum(square(x), dims, keepdim) : sum(pow(abs(x), p), dims, keepdim);
  // Note [Norm at zero]: d/ds s^(1/p) is infinite at s = 0, and times ds/dx = 0 it would make the
  // gradient NaN (a WGAN-GP penalty at a point where the critic is flat would poison every
  // parameter). As in PyTorch, the gradient there is 0: the root reads 1 where s is 0, and its result
  // is then replaced by 0, so neither branch's gradient is NaN, to any order. A NaN s stays NaN.
  const Tensor zero = eq(s, zeros_like(s));
  const Tensor safe = where(zero, ones_like(s), s);
  return where(zero, zeros_like(s), p == 2.0 ? sqrt(safe) : pow(safe, 1.0 / p));
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  EF_CHECK(lead >= 0, "sum_to: cannot sum shape ", shape_str(x.shape()), " to the larger shape ", shape_str(shape));
  Shape dims;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < lead) {
      dims.push_back(i);
      continue;
    }
    const int64_t target = shape[static_cast<size_t>(i - lead)];
    const int64_t have = x.shape()[static_cast<size_t>(i)];
    EF_CHECK(target == have || target == 1, "sum_to: shape ", shape_str(x.shape()), " does not broadcast from ",
             shape_str(shape));
    if (target == 1 && have != 1) dims.push_back(i);
  }
  if (dims.empty()) return reshape(x, shape);
  return reshape(sum(x, dims, true), shape);
}

// --- Views -------------------------------------------------------------------------------------------

// The shape a view/reshape asks for, its -1 filled in; its products are checked (Note [Checked sizes]).
static Shape infer_shape(const char* op, const Shape& shape, int64_t numel) {
  Shape out = shape;
  int64_t infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      EF_CHECK(infer < 0, op, ": only one dim may be -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      EF_CHECK(out[i] >= 0, op, ": invalid size ", out[i], " in ", shape_str(shape));
    }
  }
  if (infer >= 0) {
    int64_t known = 1;  // the product of the given dims
    for (size_t i = 0; i < out.size(); ++i) {
      if (static_cast<int64_t>(i) == infer) continue;
      EF_CHECK(out[i] == 0 || known <= std::numeric_limits<int64_t>::max() / out[i], op, ": shape ", shape_str(shape),
               " has more elements than int64 can hold");
      known *= out[i];
    }
    EF_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(shape), " is invalid for ", numel,
             " elements");
    out[static_cast<size_t>(infer)] = numel / known;
  }
  EF_CHECK(checked_numel(out, op) == numel, op, ": shape ", shape_str(shape), " is invalid for ", numel, " elements");
  return out;
}

Tensor view(const Tensor& x, const Shape& shape_in) {
  detail::check_defined("view", x);
  const Shape shape = infer_shape("view", shape_in, x.numel());
  EF_CHECK(x.is_contiguous(), "view: the input ", x.str(), " is not contiguous; use reshape (which copies)");
  Tensor y = make_view(x, shape, contiguous_strides(shape), x.offset());
  record("reshape", {y}, {x}, {}, [in = x.shape()](const Grads& g) { return Grads{reshape(g[0], in)}; });
  return y;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  detail::check_defined("reshape", x);
  const Shape inferred = infer_shape("reshape", shape, x.numel());
  if (x.shape() == inferred) return x;
  return view(x.is_contiguous() ? x : clone(x), inferred);
}

Tensor permute(const Tensor& x, const Shape& dims_in) {
  detail::check_defined("permute", x);
  EF_CHECK(static_cast<int64_t>(dims_in.size()) == x.dim(), "permute: ", dims_in.size(),
           " dims given for a tensor with ", x.dim(), " dims");
  Shape dims(dims_in.size()), inverse(dims_in.size()), shape(dims_in.size()), strides(dims_in.size());
  std::vector<bool> seen(dims_in.size(), false);
  for (size_t i = 0; i < dims_in.size(); ++i) {
    const int64_t d = normalize_dim(dims_in[i], x.dim(), "permute");
    EF_CHECK(!seen[static_cast<size_t>(d)], "permute: dim ", dims_in[i], " appears twice in ", shape_str(dims_in));
    seen[static_cast<size_t>(d)] = true;
    dims[i] = d;
    inverse[static_cast<size_t>(d)] = static_cast<int64_t>(i);
    shape[i] = x.shape()[static_cast<size_t>(d)];
    strides[i] = x.strides()[static_cast<size_t>(d)];
  }
  Tensor y = make_view(x, shape, strides, x.offset());
  record("permute", {y}, {x}, {}, [inverse](const Grads& g) { return Grads{permute(g[0], inverse)}; });
  return y;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  detail::check_defined("transpose", x);
  Shape dims(static_cast<size_t>(x.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[static_cast<size_t>(normalize_dim(d0, x.dim(), "transpose"))],
            dims[static_cast<size_t>(normalize_dim(d1, x.dim(), "transpose"))]);
  return permute(x, dims);
}

// Python-style bounds: negative start/end count from the end, out-of-range ends are clamped.
static void normalize_slice(const char* op, int64_t size, int64_t& start, int64_t& end, int64_t step) {
  EF_CHECK(step >= 1, op, ": step must be positive, got ", step);
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  detail::check_defined("slice", x);
  EF_CHECK(x.dim() > 0, "slice: cannot slice a 0-d tensor");
  const int64_t d = normalize_dim(dim, x.dim(), "slice");
  normalize_slice("slice", x.shape()[static_cast<size_t>(d)], start, end, step);
  Shape shape = x.shape(), strides = x.strides();
  shape[static_cast<size_t>(d)] = (end - start + step - 1) / step;
  strides[static_cast<size_t>(d)] *= step;
  Tensor y = make_view(x, shape, strides, x.offset() + start * x.strides()[static_cast<size_t>(d)]);
  record("slice", {y}, {x}, {}, [in = x.shape(), d, start, end, step](const Grads& g) {
    return Grads{slice_backward(g[0], in, d, start, end, step)};
  });
  return y;
}

Tensor slice_backward(const Tensor& g, const Shape& input_shape, int64_t dim, int64_t start, int64_t end,
                      int64_t step) {
  detail::check_float("slice_backward", g);
  Tensor out = zeros(input_shape, detail::options_of(g));
  Tensor window = slice(out.detach(), dim, start, end, step);
  EF_CHECK(window.shape() == g.shape(), "slice_backward: gradient shape ", shape_str(g.shape()),
           " does not match the slice ", shape_str(window.shape()));
  if (g.numel() > 0) backend_of(g).copy(window.view(), g.view());
  record("slice_backward", {out}, {g}, {},
         [dim, start, end, step](const Grads& gg) { return Grads{slice(gg[0], dim, start, end, step)}; });
  return out;
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  detail::check_defined("narrow", x);
  const int64_t d = normalize_dim(dim, x.dim(), "narrow");
  const int64_t size = x.shape()[static_cast<size_t>(d)];
  if (start < 0) start += size;
  EF_CHECK(start >= 0 && length >= 0 && start + length <= size, "narrow: start ", start, " and length ", length,
           " are out of range for dim ", dim, " of size ", size);
  return slice(x, d, start, start + length, 1);
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  detail::check_defined("select", x);
  const int64_t d = normalize_dim(dim, x.dim(), "select");
  const int64_t size = x.shape()[static_cast<size_t>(d)];
  EF_CHECK(index >= -size && index < size, "select: index ", index, " is out of range for dim ", dim, " of size ",
           size);
  if (index < 0) index += size;
  return squeeze(slice(x, d, index, index + 1, 1), d);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  detail::check_defined("squeeze", x);
  const int64_t d = normalize_dim(dim, x.dim(), "squeeze");
  if (x.dim() == 0 || x.shape()[static_cast<size_t>(d)] != 1) return x;
  Shape shape = x.shape(), strides = x.strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  Tensor y = make_view(x, shape, strides, x.offset());
  record("reshape", {y}, {x}, {}, [in = x.shape()](const Grads& g) { return Grads{reshape(g[0], in)}; });
  return y;
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  detail::check_defined("unsqueeze", x);
  const int64_t d = normalize_dim(dim, x.dim() + 1, "unsqueeze");
  Shape shape = x.shape(), strides = x.strides();
  const int64_t stride = d < x.dim() ? strides[static_cast<size_t>(d)] * shape[static_cast<size_t>(d)] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  Tensor y = make_view(x, shape, strides, x.offset());
  record("reshape", {y}, {x}, {}, [in = x.shape()](const Grads& g) { return Grads{reshape(g[0], in)}; });
  return y;
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  detail::check_defined("flatten", x);
  if (x.dim() == 0) return reshape(x, {1});
  const int64_t s = normalize_dim(start_dim, x.dim(), "flatten"), e = normalize_dim(end_dim, x.dim(), "flatten");
  EF_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  int64_t n = 1;
  for (int64_t i = s; i <= e; ++i) n *= x.shape()[static_cast<size_t>(i)];
  shape.push_back(n);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor expand(const Tensor& x, const Shape& shape_in) {
  detail::check_defined("expand", x);
  const int64_t nd = static_cast<int64_t>(shape_in.size());
  EF_CHECK(nd >= x.dim(), "expand: cannot expand shape ", shape_str(x.shape()), " to fewer dims ", shape_str(shape_in));
  Shape shape(shape_in.size()), strides(shape_in.size());
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t src = i - (nd - x.dim());
    const int64_t have = src >= 0 ? x.shape()[static_cast<size_t>(src)] : 1;
    int64_t want = shape_in[static_cast<size_t>(i)];
    if (want == -1) {
      EF_CHECK(src >= 0, "expand: -1 is not allowed for a new leading dim in ", shape_str(shape_in));
      want = have;
    }
    EF_CHECK(have == want || have == 1, "expand: shape ", shape_str(x.shape()), " cannot be expanded to ",
             shape_str(shape_in), " (dim ", i, ": ", have, " vs ", want, ")");
    shape[static_cast<size_t>(i)] = want;
    strides[static_cast<size_t>(i)] = (src >= 0 && have == want) ? x.strides()[static_cast<size_t>(src)] : 0;
  }
  // A view of any size costs nothing, so the size is checked here and not by an allocation.
  checked_numel(shape, "expand");
  if (shape == x.shape()) return x;
  Tensor y = make_view(x, shape, strides, x.offset());
  record("expand", {y}, {x}, {}, [in = x.shape()](const Grads& g) { return Grads{sum_to(g[0], in)}; });
  return y;
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  EF_CHECK(!xs.empty(), "cat: no tensors given");
  const Tensor& first = xs[0];
  detail::check_defined("cat", first, "tensors[0]");
  EF_CHECK(first.dim() > 0, "cat: cannot concatenate 0-d tensors; use stack");
  const int64_t d = normalize_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[static_cast<size_t>(d)] = 0;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < xs.size(); ++i) {
    detail::check_compatible("cat", first, xs[i], "tensors[0]", "another tensor");
    EF_CHECK(xs[i].dim() == first.dim(), "cat: tensors[", i, "] has ", xs[i].dim(), " dims, tensors[0] has ",
             first.dim());
    for (int64_t k = 0; k < first.dim(); ++k)
      EF_CHECK(k == d || xs[i].shape()[static_cast<size_t>(k)] == first.shape()[static_cast<size_t>(k)],
               "cat: tensors[", i, "] has shape ", shape_str(xs[i].shape()), ", tensors[0] has ",
               shape_str(first.shape()), " (only dim ", d, " may differ)");
    sizes.push_back(xs[i].shape()[static_cast<size_t>(d)]);
    EF_CHECK(sizes.back() <= std::numeric_limits<int64_t>::max() - shape[static_cast<size_t>(d)],
             "cat: the sizes along dim ", d, " add up to more than int64 can hold (at tensors[", i, "] of shape ",
             shape_str(xs[i].shape()), ")");
    shape[static_cast<size_t>(d)] += sizes.back();
  }
  Tensor y = detail::empty_like_shape(first, shape);
  int64_t offset = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].numel() > 0) backend_of(y).copy(narrow(y.detach(), d, offset, sizes[i]).view(), xs[i].view());
    offset += sizes[i];
  }
  record("cat", {y}, xs, {}, [d, sizes](const Grads& g) {
    Grads out;
    int64_t at = 0;
    for (int64_t s : sizes) {
      out.push_back(narrow(g[0], d, at, s));
      at += s;
    }
    return out;
  });
  return y;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  EF_CHECK(!xs.empty(), "stack: no tensors given");
  const int64_t d = normalize_dim(dim, xs[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < xs.size(); ++i) {
    EF_CHECK(xs[i].defined() && xs[i].shape() == xs[0].shape(), "stack: tensors[", i, "] has shape ",
             xs[i].defined() ? shape_str(xs[i].shape()) : "undefined", ", tensors[0] has ", shape_str(xs[0].shape()));
    parts.push_back(unsqueeze(xs[i], d));
  }
  return cat(parts, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  detail::check_defined("split", x);
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    EF_CHECK(s >= 0, "split: negative size ", s);
    total += s;
  }
  EF_CHECK(total == x.shape()[static_cast<size_t>(d)], "split: sizes add up to ", total, " but dim ", dim, " has size ",
           x.shape()[static_cast<size_t>(d)]);
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(x, d, at, s));
    at += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim) {
  detail::check_defined("split", x);
  EF_CHECK(size > 0, "split: size must be positive, got ", size);
  const int64_t n = x.shape()[static_cast<size_t>(normalize_dim(dim, x.dim(), "split"))];
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < n; at += size) sizes.push_back(std::min(size, n - at));
  return split(x, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  detail::check_defined("chunk", x);
  EF_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  const int64_t n = x.shape()[static_cast<size_t>(normalize_dim(dim, x.dim(), "chunk"))];
  return split(x, std::max<int64_t>((n + chunks - 1) / chunks, 1), dim);
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value) {
  detail::check_float("pad", x);
  EF_CHECK(pads.size() % 2 == 0 && static_cast<int64_t>(pads.size()) / 2 <= x.dim(),
           "pad: expected (before, after) pairs for at most ", x.dim(), " dims, got ", pads.size(), " values");
  Shape shape = x.shape();
  std::vector<std::pair<int64_t, int64_t>> per_dim(static_cast<size_t>(x.dim()), {0, 0});
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    const size_t d = static_cast<size_t>(x.dim()) - 1 - i;
    EF_CHECK(pads[2 * i] >= 0 && pads[2 * i + 1] >= 0, "pad: negative padding ", pads[2 * i], ", ", pads[2 * i + 1],
             " is not supported; use slice");
    per_dim[d] = {pads[2 * i], pads[2 * i + 1]};
    shape[d] += pads[2 * i] + pads[2 * i + 1];
  }
  Tensor y = full(shape, value, detail::options_of(x));
  Tensor window = y.detach();
  for (size_t d = 0; d < per_dim.size(); ++d)
    window = narrow(window, static_cast<int64_t>(d), per_dim[d].first, x.shape()[d]);
  if (x.numel() > 0) backend_of(x).copy(window.view(), x.view());
  record("pad", {y}, {x}, {}, [per_dim, in = x.shape()](const Grads& g) {
    Tensor r = g[0];
    for (size_t d = 0; d < per_dim.size(); ++d) r = narrow(r, static_cast<int64_t>(d), per_dim[d].first, in[d]);
    return Grads{r};
  });
  return y;
}

// --- Copies --------------------------------------------------------------------------------------------

Tensor clone(const Tensor& x) {
  detail::check_defined("clone", x);
  Tensor y = detail::empty_like_shape(x, x.shape());
  if (x.numel() > 0) backend_of(x).copy(y.view(), x.view());
  // A channels-last x gets its gradient channels-last, so that the backward past the copy (a
  // flatten's, say) keeps the layout the forward had (Note [Channels-last] in ops.h).
  record("clone", {y}, {x}, {}, [channels_last = x.is_channels_last()](const Grads& g) {
    return Grads{channels_last ? contiguous(g[0], MemoryFormat::ChannelsLast) : g[0]};
  });
  return y;
}

Tensor contiguous(const Tensor& x, MemoryFormat format) {
  detail::check_defined("contiguous", x);
  if (format == MemoryFormat::Contiguous) return x.contiguous();
  EF_CHECK(x.dim() == 4, "contiguous: channels-last needs a 4-D [N, C, H, W] tensor, got ", x.str());
  if (x.is_channels_last()) return x;
  const Shape strides = channels_last_strides(x.shape());
  bool same_memory = true;  // the strides differ only where a dim has size 1
  for (size_t d = 0; d < 4; ++d) same_memory = same_memory && (x.shape()[d] == 1 || x.strides()[d] == strides[d]);
  Tensor y;
  if (same_memory) {
    y = make_view(x, x.shape(), strides, x.offset());
  } else {
    y = detail::empty_in_format(x, x.shape(), format);
    if (x.numel() > 0) backend_of(x).copy(y.view(), x.view());
  }
  record("contiguous", {y}, {x}, {}, [](const Grads& g) { return Grads{g[0]}; });
  return y;
}

Tensor to_dtype(const Tensor& x, DType t) {
  detail::check_defined("to", x);
  if (x.dtype() == t) return x;
  Tensor y = empty(x.shape(), {.dtype = t, .device = x.device()});
  if (x.numel() > 0) backend_of(x).copy(y.view(), x.view());
  if (carries_gradient(t) && carries_gradient(x.dtype()))
    record("to_dtype", {y}, {x}, {}, [from = x.dtype()](const Grads& g) { return Grads{to_dtype(g[0], from)}; });
  return y;
}

Tensor to_device(const Tensor& x, const Device& d) {
  detail::check_defined("to", x);
  check_device(d);
  if (x.device() == d) return x;
  const Tensor src = x.contiguous();
  Tensor y = empty(x.shape(), {.dtype = x.dtype(), .device = d});
  copy_between_devices(d, y.data_ptr(), x.device(), src.data_ptr(),
                       static_cast<size_t>(x.numel()) * dtype_size(x.dtype()));
  record("to_device", {y}, {x}, {}, [from = x.device()](const Grads& g) { return Grads{to_device(g[0], from)}; });
  return y;
}

// --- In place ------------------------------------------------------------------------------------------

static void bump(const Tensor& x) {
  x.storage()->version.fetch_add(1);
}

void fill_(const Tensor& x, double v) {
  check_inplace("fill_", x);
  if (x.numel() > 0) backend_of(x).fill(x.view(), v);
  bump(x);
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
    bump(dst);
    return;
  }
  EF_CHECK(detail::broadcast_shapes("copy_", src.shape(), dst.shape()) == dst.shape(), "copy_: source shape ",
           shape_str(src.shape()), " does not broadcast to destination shape ", shape_str(dst.shape()));
  if (dst.numel() > 0) backend_of(dst).copy(dst.view(), detail::broadcast_view(src, dst.shape()));
  bump(dst);
}

void add_(const Tensor& x, const Tensor& other, double alpha) {
  check_inplace("add_", x);
  detail::check_compatible("add_", x, other, "tensor", "other");
  EF_CHECK(detail::broadcast_shapes("add_", other.shape(), x.shape()) == x.shape(), "add_: shape ",
           shape_str(other.shape()), " does not broadcast to ", shape_str(x.shape()));
  if (x.numel() == 0) return;
  NoGradGuard no_grad;
  if (alpha == 1.0) {
    backend_of(x).binary(BinaryOp::Add, x.view(), x.view(), detail::broadcast_view(other, x.shape()), 0.0);
  } else {
    const Tensor scaled = mul_scalar(other.detach(), alpha);
    backend_of(x).binary(BinaryOp::Add, x.view(), x.view(), detail::broadcast_view(scaled, x.shape()), 0.0);
  }
  bump(x);
}

void mul_(const Tensor& x, double s) {
  check_inplace("mul_", x);
  if (x.numel() > 0) backend_of(x).unary(UnaryOp::MulScalar, x.view(), x.view(), s, 0);
  bump(x);
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
      bump(*updated);
    }
  }
}

}  // namespace evenflow
