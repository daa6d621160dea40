// Softmax and normalization: softmax and log_softmax (a fused kernel, its backward in ops); batch_norm
// and layer_norm, their forward and backward fused kernels under a closed form in differentiable ops
// (Note [Fused normalization]); batch_norm in eval is composite.
#include "evenflow/engine/ops.h"

#include "evenflow/engine/ops_internal.h"

namespace evenflow {

using detail::backend_of;
using detail::Grads;

// --- Softmax ---------------------------------------------------------------------------------------------

static Tensor softmax_kernel(const char* op, const Tensor& x, int64_t dim, bool log) {
  detail::check_float(op, x);
  const int64_t d = normalize_dim(dim, x.dim(), op);
  if (x.dim() == 0) return log ? zeros_like(x) : ones_like(x);
  const int64_t last = x.dim() - 1;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= x.size(i);
  for (int64_t i = d + 1; i <= last; ++i) inner *= x.size(i);
  // Over dim 1 of [outer, cols, inner] where the backend can (a segmentation's classes of each
  // pixel: moved last, rows of a few elements, and two copies). From 8 positions on: a vector's
  // worth; with fewer, softmax's rows are faster (with inner 1, 1.7x: the dim is last already).
  if (inner >= 8 && backend_of(x).has_softmax_dim1()) {
    const Tensor in = x.detach().contiguous();
    Tensor out = detail::empty_like_shape(x, x.shape());
    View in_v = in.view(), out_v = out.view();
    for (View* v : {&in_v, &out_v}) {
      v->ndim = 3;
      v->shape[0] = outer;
      v->shape[1] = x.size(d);
      v->shape[2] = inner;
      v->strides[0] = x.size(d) * inner;
      v->strides[1] = inner;
      v->strides[2] = 1;
    }
    backend_of(x).softmax_dim1(out_v, in_v, log);
    return out;
  }
  const Tensor moved = transpose(x.detach(), d, last).contiguous();
  Tensor out = detail::empty_like_shape(x, moved.shape());
  if (out.numel() > 0) {
    const int64_t cols = moved.size(-1);
    View in_v = moved.view(), out_v = out.view();
    for (View* v : {&in_v, &out_v}) {
      v->ndim = 2;
      v->shape[0] = moved.numel() / cols;
      v->shape[1] = cols;
      v->strides[0] = cols;
      v->strides[1] = 1;
    }
    backend_of(x).softmax(out_v, in_v, log);
  }
  NoGradGuard no_grad;
  return transpose(out, d, last);
}

Tensor softmax(const Tensor& x, int64_t dim) {
  Tensor y = softmax_kernel("softmax", x, dim, false);
  record("softmax", {y}, {x}, {x}, [x, dim](const Grads& g) {
    const Tensor s = softmax(x, dim);  // recomputed from the input: capturing y would be a cycle
    return Grads{s * (g[0] - sum(g[0] * s, {dim}, true))};
  });
  return y;
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  Tensor y = softmax_kernel("log_softmax", x, dim, true);
  record("log_softmax", {y}, {x}, {x},
         [x, dim](const Grads& g) { return Grads{g[0] - softmax(x, dim) * sum(g[0], {dim}, true)}; });
  return y;
}

// --- Normalization ---------------------------------------------------------------------------------------

namespace {

// Note [Fused normalization]
// layer_norm, and batch_norm in training, normalize by statistics of their own input. The forward
// is one backend kernel (Backend::normalize) writing the output and the statistics in three passes
// over memory at most, where the composite (mean, sub, square, mean, add, rsqrt, mul, mul, add)
// made about ten, each with a temporary (CUDA: a row of up to 1024 features read once, into
// registers; a large group split over blocks in two kernels, Note [Group statistics in chunks]).
// Over the n elements of a group, with x̂ = (x - μ)·r and ĝ = gy·w,
//   gx = r·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)),  gw = Σ gy·x̂,  gb = Σ gy.
// The backward computes that in one kernel too (Backend::normalize_backward: two passes). Under
// create_graph (a gradient penalty) those gradients are recorded as one node, whose backward, the
// second-order gradients, is again one kernel (Backend::normalize_double_backward: two passes)
// where no graph of it is needed; otherwise (a third order, or a backend without that kernel) it is
// the same closed form as differentiable ops, with μ and r computed again from x so that the next
// derivative sees their dependence on x. (The first order as differentiable ops, differentiated by
// autograd, was about fifty elementwise ops and reductions per normalization in a penalty; the
// critic's LayerNorm through a penalty now takes a fraction of the closed form's time as ops:
// docs/benchmarks.md, "The normalization's double backward in one kernel".)
struct Normalization {
  const char* op;
  NormArgs args;
  Shape stat_shape;    // μ and r broadcast against x: x's shape with 1 on the reduced dims
  Shape reduce_dims;   // the dims a group spans
  Shape affine_shape;  // weight and bias broadcast against x
  Shape affine_dims;   // the dims gw and gb sum over
  Shape param_shape;   // weight's and bias's own shape
  // Whether a channels-last input is normalized in its own layout (Note [Channels-last] in ops.h),
  // as its [N, H, W, C] memory (kernel_args): layer_norm over [C, H, W], whose group is then still
  // one contiguous block, in H, W, C order, its parameters indexed to match (NormArgs::param_channels:
  // copying them into that order was a tenth of the kernels of wgan_gp's recorded step); batch_norm
  // of a 4-D tensor, whose channels are then the columns of an [N·H·W, C] matrix.
  bool takes_channels_last = false;
};

// An activation (x, y or a gradient of one) as the normalize kernels take it: itself, or with nhwc
// (a channels-last tensor) its [N, H, W, C] memory, contiguous (a view, no autograd); undefined
// where t is.
Tensor kernel_activation(const Tensor& t, bool nhwc) {
  if (!nhwc || !t.defined()) return t;
  Shape shape, strides;
  for (const size_t d : {0, 2, 3, 1}) {
    shape.push_back(t.shape()[d]);
    strides.push_back(t.strides()[d]);
  }
  return make_view(t, shape, strides, t.offset());
}
// The kernels' geometry: of x's own layout with nhwc, else of its contiguous copy. Channels-last,
// a per-channel group (batch_norm's) spans the rows of an [N·H·W, C] matrix; layer_norm's sample
// groups are laid out as before, in H, W, C order, and its [C, H, W] parameters indexed to match.
NormArgs kernel_args(const Normalization& n, bool nhwc) {
  if (!nhwc) return n.args;
  NormArgs a = n.args;
  if (a.affine_per_group) {
    a.outer *= a.inner;
    a.inner = 1;
  } else if (n.param_shape.size() == 3) {
    a.param_channels = n.param_shape[0];
  }
  return a;
}
// An affine parameter as the normalize kernels take it: contiguous; undefined where p is.
Tensor kernel_param(const Tensor& p) {
  return p.defined() ? p.contiguous() : p;
}

// t's view for a kernel, or an empty View where t is undefined (an operand the kernel goes without).
View view_or_none(const Tensor& t) {
  return t.defined() ? t.view() : View{};
}

// Whether normalize runs on x channels-last (else on a contiguous copy).
bool normalizes_channels_last(const Normalization& n, const Tensor& x) {
  return n.takes_channels_last && x.is_channels_last();
}

// The sum of t over n.affine_dims, shaped like weight.
Tensor sum_to_param(const Normalization& n, const Tensor& t) {
  return reshape(n.affine_dims.empty() ? t : sum(t, n.affine_dims), n.param_shape);
}

// The first-order gradients of normalize (no graph of them needed): one backend kernel.
detail::Grads normalize_backward(const Normalization& n, const Tensor& gy, const Tensor& x, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& weight, const Tensor& bias) {
  const bool nhwc = normalizes_channels_last(n, x);
  const MemoryFormat layout = nhwc ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  // The kernel's operands: contiguous, or channels-last ones seen as [N, H, W, C].
  const Tensor xc = x.contiguous(layout), gyc = gy.contiguous(layout);
  Tensor gx, gw, gb;
  if (x.requires_grad()) gx = detail::empty_in_format(x, x.shape(), layout);
  if (weight.defined() && weight.requires_grad()) gw = detail::empty_like_shape(x, n.param_shape);
  if (bias.defined() && bias.requires_grad()) gb = detail::empty_like_shape(x, n.param_shape);
  if (x.numel() > 0) {
    backend_of(x).normalize_backward(kernel_args(n, nhwc), view_or_none(kernel_activation(gx, nhwc)), view_or_none(gw),
                                     view_or_none(gb), kernel_activation(gyc, nhwc).view(),
                                     kernel_activation(xc, nhwc).view(), mean.view(), rstd.view(),
                                     view_or_none(kernel_param(weight)));
  } else {
    for (Tensor* t : {&gw, &gb})
      if (t->defined()) t->fill_(0.0);
  }
  return {gx, gw, gb};
}

// normalize's second-order gradients -- of gy, x and the weight, given ggx, ggw and ggb reaching gx,
// gw and gb (each undefined where none does) -- as differentiable ops: the closed form of
// normalize_double_backward_typed (cpu_normalization.cpp), with μ and r computed again from x where the
// result is itself differentiated with respect to x (a third order), as the first order's composite
// did. For a backend without the kernel, and for a double backward under create_graph.
detail::Grads normalize_double_backward_ops(const Normalization& n, const Tensor& ggx, const Tensor& ggw,
                                            const Tensor& ggb, const Tensor& gy, const Tensor& x, const Tensor& mean,
                                            const Tensor& rstd, const Tensor& weight) {
  Tensor mu = mean, r = rstd;
  if (grad_enabled() && x.requires_grad()) {
    mu = ::evenflow::mean(x, n.reduce_dims, true);
    r = rsqrt(add_scalar(::evenflow::mean(square(x - mu), n.reduce_dims, true), n.args.eps));
  }
  const auto group_mean = [&n](const Tensor& t) { return ::evenflow::mean(t, n.reduce_dims, true); };
  const Tensor x_hat = (x - mu) * r;
  const Tensor w = weight.defined() ? reshape(weight, n.affine_shape) : Tensor();
  const Tensor bw = ggw.defined() ? reshape(ggw, n.affine_shape) : Tensor();
  const Tensor g_hat = w.defined() ? gy * w : gy;
  const Tensor a = ggx.defined() ? ggx : zeros_like(x);
  const Tensor a2 = group_mean(a * x_hat);
  const Tensor t = r * (a - group_mean(a) - x_hat * a2);  // the gradient reaching ĝ
  Tensor dgy, dx, dw;
  if (input_grad_needed(0)) {
    dgy = w.defined() ? t * w : t;
    if (ggb.defined()) dgy = dgy + reshape(ggb, n.affine_shape);
    if (bw.defined()) dgy = dgy + bw * x_hat;
  }
  if (input_grad_needed(1)) {
    const Tensor m2 = group_mean(g_hat * x_hat);
    const Tensor gx = r * (g_hat - group_mean(g_hat) - x_hat * m2);
    Tensor big_g = -(r * m2 * a) - r * a2 * g_hat;  // the gradient reaching x̂
    if (bw.defined()) big_g = big_g + bw * gy;
    dx = r * (big_g - group_mean(big_g) - x_hat * group_mean(big_g * x_hat)) - r * x_hat * group_mean(a * gx);
  }
  if (weight.defined() && input_grad_needed(2)) dw = sum_to_param(n, gy * t);
  return {dgy, dx, dw};
}

// The same, by the backend's kernel where it has one and no graph of the result is needed.
detail::Grads normalize_double_backward(const Normalization& n, const Tensor& ggx, const Tensor& ggw, const Tensor& ggb,
                                        const Tensor& gy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& weight) {
  if (grad_enabled()) return normalize_double_backward_ops(n, ggx, ggw, ggb, gy, x, mean, rstd, weight);
  const bool nhwc = normalizes_channels_last(n, x);
  const MemoryFormat layout = nhwc ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  const Tensor xc = x.contiguous(layout), gyc = gy.contiguous(layout);
  const Tensor ggxc = ggx.defined() ? ggx.contiguous(layout) : Tensor();
  Tensor dgy, dx, dw;
  if (input_grad_needed(0)) dgy = detail::empty_in_format(x, x.shape(), layout);
  if (input_grad_needed(1)) dx = detail::empty_in_format(x, x.shape(), layout);
  if (weight.defined() && input_grad_needed(2)) dw = detail::empty_like_shape(x, n.param_shape);
  if (!backend_of(x).normalize_double_backward(
          kernel_args(n, nhwc), view_or_none(kernel_activation(dgy, nhwc)), view_or_none(kernel_activation(dx, nhwc)),
          view_or_none(dw), view_or_none(kernel_activation(ggxc, nhwc)), view_or_none(kernel_param(ggw)),
          view_or_none(kernel_param(ggb)), kernel_activation(gyc, nhwc).view(), kernel_activation(xc, nhwc).view(),
          mean.view(), rstd.view(), view_or_none(kernel_param(weight))))
    return normalize_double_backward_ops(n, ggx, ggw, ggb, gy, x, mean, rstd, weight);
  return {dgy, dx, dw};
}

// The first-order gradients under create_graph: normalize_backward's, recorded as one node whose
// backward is normalize_double_backward (Note [Fused normalization]).
detail::Grads differentiable_normalize_backward(const Normalization& n, const Tensor& gy, const Tensor& x,
                                                const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                                const Tensor& bias) {
  detail::Grads first;
  {
    NoGradGuard no_grad;
    first = normalize_backward(n, gy, x, mean, rstd, weight, bias);
  }
  std::vector<Tensor> outputs;  // gx, gw and gb, those computed
  for (const Tensor& t : first)
    if (t.defined()) outputs.push_back(t);
  if (outputs.empty()) return first;
  const bool has_gx = first[0].defined(), has_gw = first[1].defined(), has_gb = first[2].defined();
  std::vector<Tensor> saved{gy, x};
  if (weight.defined()) saved.push_back(weight);
  record("normalize_backward", outputs, {gy, x, weight}, saved,
         [n, gy, x, mean, rstd, weight, has_gx, has_gw, has_gb](const Grads& g) {
           size_t k = 0;
           const Tensor ggx = has_gx ? g[k++] : Tensor();
           const Tensor ggw = has_gw ? g[k++] : Tensor();
           const Tensor ggb = has_gb ? g[k++] : Tensor();
           return normalize_double_backward(n, ggx, ggw, ggb, gy, x, mean, rstd, weight);
         });
  // A penalty's double backward reaches gx alone: gw's and gb's missing gradients are zero to the
  // closure (undefined, a null view to the kernel) without a fill each.
  if (outputs[0].grad_fn()) outputs[0].grad_fn()->accept_missing_grads();
  return first;
}

// y, and the group statistics μ, biased variance and 1 / sqrt(var + eps) in n.stat_shape (Note
// [Fused normalization]).
struct Normalized {
  Tensor y, mean, var, rstd;
};

// `running`: a batch norm's running statistics, which the kernel updates (RunningStats).
Normalized normalize(const Normalization& n, const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                     const RunningStats& running = {}) {
  const bool nhwc = normalizes_channels_last(n, x_in);
  const Tensor x = nhwc ? x_in : x_in.contiguous();
  Normalized out{detail::empty_in_format(x, x.shape(), nhwc ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous),
                 detail::empty_like_shape(x, n.stat_shape), detail::empty_like_shape(x, n.stat_shape),
                 detail::empty_like_shape(x, n.stat_shape)};
  if (x.numel() > 0) {
    const Tensor w = kernel_param(weight), b = kernel_param(bias);
    backend_of(x).normalize(kernel_args(n, nhwc), kernel_activation(out.y, nhwc).view(), out.mean.view(),
                            out.var.view(), out.rstd.view(), kernel_activation(x, nhwc).view(), view_or_none(w),
                            view_or_none(b), running);
  }
  std::vector<Tensor> saved{x_in};
  if (weight.defined()) saved.push_back(weight);
  record(n.op, {out.y}, {x_in, weight, bias}, saved,
         [x = x_in, weight, bias, mean = out.mean, rstd = out.rstd, n](const Grads& g) {
           if (!grad_enabled()) return normalize_backward(n, g[0], x, mean, rstd, weight, bias);
           return differentiable_normalize_backward(n, g[0], x, mean, rstd, weight, bias);
         });
  return out;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps) {
  detail::check_float("batch_norm", x);
  EF_CHECK(x.dim() >= 2, "batch_norm: input must have at least 2 dims [N, C, ...], got ", shape_str(x.shape()));
  const int64_t c = x.size(1);
  EF_CHECK(c > 0, "batch_norm: input shape ", shape_str(x.shape()), " has no channels");
  Shape stat_shape(static_cast<size_t>(x.dim()), 1);
  stat_shape[1] = c;
  Shape dims{0};
  for (int64_t i = 2; i < x.dim(); ++i) dims.push_back(i);
  for (auto [t, what] : {std::pair{weight, "weight"}, std::pair{bias, "bias"}, std::pair{running_mean, "running_mean"},
                         std::pair{running_var, "running_var"}}) {
    if (!t.defined()) continue;
    detail::check_compatible("batch_norm", x, t, "input", what);
    EF_CHECK(t.dim() == 1 && t.size(0) == c, "batch_norm: ", what, " has shape ", shape_str(t.shape()), ", expected [",
             c, "]");
  }
  if (training) {
    const int64_t n = x.numel() / c;
    EF_CHECK(n > 1, "batch_norm: expected more than 1 value per channel when training, got input shape ",
             shape_str(x.shape()));
    const Normalization geometry{
        "batch_norm", {.outer = x.size(0), .groups = c, .inner = n / x.size(0), .eps = eps, .affine_per_group = true},
        stat_shape,   dims,
        stat_shape,   dims,
        {c},          x.dim() == 4};
    // The running statistics are updated by the normalization kernel (RunningStats: PyTorch's
    // formula, rounded as the MulScalar and AddScaled kernels that took four launches until
    // 2026-12-01), into contiguous copies where a buffer is not contiguous.
    const Tensor run_mean = running_mean.defined() ? running_mean.contiguous() : Tensor();
    const Tensor run_var = running_var.defined() ? running_var.contiguous() : Tensor();
    const RunningStats running{view_or_none(run_mean), view_or_none(run_var), 1.0 - momentum, momentum,
                               momentum * static_cast<double>(n) / static_cast<double>(n - 1)};
    const Normalized out = normalize(geometry, x, weight, bias, running);
    for (const auto& [buffer, updated] : {std::pair{running_mean, run_mean}, std::pair{running_var, run_var}}) {
      if (!buffer.defined()) continue;
      if (updated.same(buffer))
        detail::mark_written(buffer);
      else
        buffer.copy_(updated);
    }
    return out.y;
  }
  EF_CHECK(running_mean.defined() && running_var.defined(), "batch_norm: eval mode needs running_mean and running_var");
  Tensor y = (x - reshape(running_mean, stat_shape)) * rsqrt(reshape(running_var, stat_shape) + eps);
  if (weight.defined()) y = y * reshape(weight, stat_shape);
  if (bias.defined()) y = y + reshape(bias, stat_shape);
  return y;
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  detail::check_float("layer_norm", x);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  EF_CHECK(k >= 1 && k <= x.dim() && Shape(x.shape().end() - k, x.shape().end()) == normalized_shape,
           "layer_norm: input shape ", shape_str(x.shape()), " does not end with normalized_shape ",
           shape_str(normalized_shape));
  int64_t features = 1;
  for (int64_t s : normalized_shape) features *= s;
  EF_CHECK(features > 0, "layer_norm: normalized_shape ", shape_str(normalized_shape), " has no elements");
  for (auto [t, what] : {std::pair{weight, "weight"}, std::pair{bias, "bias"}}) {
    if (!t.defined()) continue;
    detail::check_compatible("layer_norm", x, t, "input", what);
    EF_CHECK(t.shape() == normalized_shape, "layer_norm: ", what, " has shape ", shape_str(t.shape()), ", expected ",
             shape_str(normalized_shape));
  }
  Shape stat_shape = x.shape(), reduce_dims, leading_dims;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < x.dim() - k) {
      leading_dims.push_back(i);
    } else {
      stat_shape[static_cast<size_t>(i)] = 1;
      reduce_dims.push_back(i);
    }
  }
  const Normalization geometry{
      "layer_norm",     {.outer = 1, .groups = x.numel() / features, .inner = features, .eps = eps},
      stat_shape,       reduce_dims,
      normalized_shape, leading_dims,
      normalized_shape, x.dim() == 4 && k == 3};
  return normalize(geometry, x, weight, bias).y;
}

}  // namespace evenflow
