// Matrix products, convolution, pooling, resampling, softmax, indexing, dropout and normalization.
// Fused kernels (gemm, conv, softmax, max-pool, gather/scatter) are ops whose backward is written
// in ops; pooling, resampling and normalization are composites of those, so they are closed under
// differentiation by construction.
#include <algorithm>
#include <cmath>

#include "evenflow/engine/ops.h"
#include "evenflow/engine/ops_util.h"

namespace evenflow {

using detail::backend_of;
using detail::Grads;

// --- matmul --------------------------------------------------------------------------------------------

namespace {

// One operand of a batched GEMM: a pointer, whether the stored matrix is transposed, its row
// stride and its batch stride (0 when shared by every batch entry). `keep` owns any copy made.
struct GemmOperand {
  Tensor keep;
  const void* data = nullptr;
  bool trans = false;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

// Describes t, broadcast to batch_shape + its own last two dims, without copying when its strides
// allow: a row-major or column-major matrix, batch dims that collapse to one stride.
GemmOperand gemm_operand(const Tensor& t_in, const Shape& batch_shape) {
  Tensor t = t_in.detach();
  const int64_t rows = t.size(-2), cols = t.size(-1);
  Shape full = batch_shape;
  full.push_back(rows);
  full.push_back(cols);
  if (t.shape() != full) t = expand(t, full);
  auto layout_ok = [&](const Tensor& m, bool& trans, int64_t& ld) {
    const int64_t rs = m.strides()[m.strides().size() - 2], cs = m.strides().back();
    if ((cs == 1 || cols == 1) && rs >= cols) {
      trans = false;
      ld = std::max<int64_t>(rs, std::max<int64_t>(cols, 1));
      return true;
    }
    if ((rs == 1 || rows == 1) && cs >= rows) {
      trans = true;
      ld = std::max<int64_t>(cs, std::max<int64_t>(rows, 1));
      return true;
    }
    return false;
  };
  // Batch dims must collapse to a single stride (all-zero strides count: a broadcast operand).
  auto batch_stride_of = [&](const Tensor& m, int64_t& stride) {
    stride = 0;
    bool first = true;
    int64_t expected = 0;
    for (size_t i = batch_shape.size(); i-- > 0;) {
      if (m.shape()[i] == 1) continue;
      const int64_t s = m.strides()[i];
      if (first) {
        stride = s;
        expected = s * m.shape()[i];
        first = false;
      } else {
        if (s != expected) return false;
        expected = s * m.shape()[i];
      }
    }
    return true;
  };
  GemmOperand op;
  if (!layout_ok(t, op.trans, op.ld) || !batch_stride_of(t, op.batch_stride)) {
    t = clone(t);
    layout_ok(t, op.trans, op.ld);
    batch_stride_of(t, op.batch_stride);
  }
  op.keep = t;
  op.data = t.data_ptr();
  return op;
}

// Note [bfloat16 compute]: the operand a product or convolution runs on, `t` itself or, for
// bfloat16 compute, t rounded to bfloat16 (held in float32: the float32 kernels then multiply
// exactly what bfloat16 ones would). A constant: the node records the unrounded inputs, and its
// backward rounds what it multiplies in turn.
Tensor operand_for(const char* op, const Tensor& t, DType compute) {
  if (compute != kBFloat16) return t;
  EF_CHECK(t.dtype() == kFloat32, op, ": bfloat16 compute takes float32 operands, got ", dtype_name(t.dtype()));
  Tensor rounded = detail::empty_in_format(t, t.shape(), detail::format_for(t.shape(), {&t}));
  if (t.numel() > 0) backend_of(t).unary(UnaryOp::RoundBfloat16, rounded.view(), t.view(), 0.0, 0.0);
  return rounded;
}

// Note [bfloat16 operands converted once]
// Where the backend multiplies a convolution pass in bfloat16 itself (Backend::bf16_conv), the op
// gives it bfloat16 operands; elsewhere, operands rounded to bfloat16 in float32 (operand_for). A
// tensor takes part in several passes -- an activation in the forward and the weight gradient, an
// output gradient in both gradients, the weight in the forward and the input gradient, and each
// again in a penalty's double backward -- and is converted once: a ConvOperand carries its copies
// from the pass that made them to the others, in the backward of its node and the nodes that
// backward records (the copy is of the value the node saved, whose version autograd checks). The
// nodes keep the float32 tensors too: they are what gets differentiated. A convolution's forward
// and backward so convert three tensors, not six; on wgan_gp's step that is about 1% of a bfloat16
// step on an AMD Zen 4 (docs/benchmarks.md, "Convolution operands converted to bfloat16 once"). The
// copies held for the backward cost half again the memory of each saved convolution input.
struct ConvOperand {
  explicit ConvOperand(Tensor t) : value(std::move(t)) {}
  Tensor value;    // what nodes record and differentiate
  Tensor bf16;     // `value` in bfloat16, once a pass needed it
  Tensor rounded;  // `value` rounded to bfloat16, in float32, once a pass needed it
};

// `o.value` in bfloat16 and `format`, converted at the first ask.
const Tensor& bf16_operand(ConvOperand& o, MemoryFormat format) {
  if (!o.bf16.defined()) {
    o.bf16 = detail::empty_in_format(o.value.shape(), format, {.dtype = kBFloat16, .device = o.value.device()});
    backend_of(o.value).copy(o.bf16.view(), o.value.view());  // rounds to nearest, ties to even
  }
  o.bf16 = o.bf16.contiguous(format);  // a pass of another layout (where the backend chose differently)
  return o.bf16;
}

// operand_for(o.value), kept for the next pass.
const Tensor& rounded_operand(const char* op, ConvOperand& o, DType compute) {
  if (compute != kBFloat16) return o.value;
  if (!o.rounded.defined()) o.rounded = operand_for(op, o.value, compute);
  return o.rounded;
}

// A convolution pass's geometry for the backend, and the operands it is given: with bfloat16
// compute, bfloat16 operands where the backend multiplies in bfloat16 itself (oneDNN's and cuDNN's
// bfloat16 kernels), else operand_for's. Contiguous, but the activations (every operand but the
// weight) channels-last where `layout` asks for it and the backend runs the pass on them (Note
// [Channels-last] in ops.h).
struct ConvCall {
  ConvArgs args;
  Tensor in0, in1;
};
ConvCall conv_call(const char* op, ConvArgs a, ConvPass pass, ConvOperand& in0, ConvOperand& in1, DType compute,
                   MemoryFormat layout) {
  bool backend_converts = false;
  if (compute == kBFloat16) {
    for (const ConvOperand* o : {&in0, &in1})
      EF_CHECK(o->value.dtype() == kFloat32, op, ": bfloat16 compute takes float32 operands, got ",
               dtype_name(o->value.dtype()));
    a.compute = DType::BFloat16;
    backend_converts = backend_of(in0.value).bf16_conv(a, pass);
    if (!backend_converts) a.compute = DType::Float32;
  }
  a.channels_last =
      layout == MemoryFormat::ChannelsLast && backend_of(in0.value).channels_last_conv(a, pass, in0.value.dtype());
  const MemoryFormat activations = a.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  // The weight's bfloat16 copy is OHWI beside channels-last activations (ConvArgs::channels_last).
  const MemoryFormat weight = backend_converts ? activations : MemoryFormat::Contiguous;
  // The second operand is the weight but in the weight gradient, where it is the output's gradient.
  const MemoryFormat second = pass == ConvPass::WeightGrad ? activations : weight;
  if (backend_converts) return {a, bf16_operand(in0, activations), bf16_operand(in1, second)};
  return {a, rounded_operand(op, in0, compute).contiguous(activations),
          rounded_operand(op, in1, compute).contiguous(second)};
}

// An empty activation for a pass to write: in the layout the backend runs it on.
Tensor empty_activation(const Tensor& like, const Shape& shape, const ConvArgs& a) {
  return detail::empty_in_format(like, shape, a.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& o) {
  detail::check_float("matmul", a, "first input");
  detail::check_compatible("matmul", a, b);
  EF_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: expected tensors with at least 2 dims, got ", shape_str(a.shape()),
           " and ", shape_str(b.shape()));
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  EF_CHECK(b.size(-2) == k, "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
           " cannot be multiplied (", k, " vs ", b.size(-2), ")");
  // [..., M, K] x [K, N]: one GEMM with the batch folded into M (its gradients follow the same path).
  if (b.dim() == 2 && a.dim() > 2) {
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    out_shape.push_back(n);
    return reshape(matmul(reshape(a, {-1, k}), b, o), out_shape);
  }
  const Shape batch = detail::broadcast_shapes("matmul", Shape(a.shape().begin(), a.shape().end() - 2),
                                               Shape(b.shape().begin(), b.shape().end() - 2));
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor y = detail::empty_like_shape(a, out_shape);
  if (y.numel() > 0) {
    if (k == 0) {
      backend_of(a).fill(y.view(), 0.0);
    } else {
      // Note [bfloat16 compute]: the unrounded operands where the backend multiplies in bfloat16
      // itself (oneDNN's matmul), else operand_for's rounded ones on the float32 kernel.
      const auto args_for = [&](const Tensor& ta, const Tensor& tb, GemmOperand& oa, GemmOperand& ob) {
        oa = gemm_operand(ta, batch);
        ob = gemm_operand(tb, batch);
        GemmArgs g;
        g.dtype = a.dtype();
        g.m = m;
        g.n = n;
        g.k = k;
        g.batch = numel_of(batch);
        g.a = oa.data;
        g.trans_a = oa.trans;
        g.lda = oa.ld;
        g.stride_a = oa.batch_stride;
        g.b = ob.data;
        g.trans_b = ob.trans;
        g.ldb = ob.ld;
        g.stride_b = ob.batch_stride;
        g.c = y.data_ptr();
        g.ldc = n;
        g.stride_c = m * n;
        return g;
      };
      GemmOperand oa, ob;
      GemmArgs g;
      if (o.compute == kBFloat16) {
        for (const Tensor* t : {&a, &b})
          EF_CHECK(t->dtype() == kFloat32, "matmul: bfloat16 compute takes float32 operands, got ",
                   dtype_name(t->dtype()));
        g = args_for(a, b, oa, ob);
        g.compute = DType::BFloat16;
        if (!backend_of(a).bf16_gemm(g))
          g = args_for(operand_for("matmul", a, o.compute), operand_for("matmul", b, o.compute), oa, ob);
      } else {
        g = args_for(a, b, oa, ob);
      }
      backend_of(a).gemm(g);
    }
  }
  // dA = g·Bᵀ [M,N]x[N,K], dB = Aᵀ·g [K,M]x[M,N], each summed over broadcast batch dims.
  record("matmul", {y}, {a, b}, {a, b}, [a, b, o](const Grads& g) {
    return Grads{input_grad_needed(0) ? sum_to(matmul(g[0], transpose(b, -1, -2), o), a.shape()) : Tensor(),
                 input_grad_needed(1) ? sum_to(matmul(transpose(a, -1, -2), g[0], o), b.shape()) : Tensor()};
  });
  return y;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const MatmulOptions& o) {
  detail::check_float("linear", x);
  detail::check_compatible("linear", x, weight, "input", "weight");
  EF_CHECK(weight.dim() == 2, "linear: weight must be 2-D [out, in], got ", shape_str(weight.shape()));
  EF_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input has ", x.dim() ? x.size(-1) : 0,
           " features, weight expects ", weight.size(1));
  const int64_t in = weight.size(1), out = weight.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = out;
  const Tensor flat = reshape(x, {-1, in});  // [N, in]: the batch dims folded
  Tensor y;
  {
    NoGradGuard no_grad;
    y = matmul(flat, transpose(weight, 0, 1), o);  // y = x·Wᵀ [N,in]x[in,out]
  }
  // dx = g·W [N,out]x[out,in]; dW = gᵀ·x [out,N]x[N,in], computed in the weight's own layout, so
  // the accumulated gradient needs no copy (Note [Gradient layout] in autograd.cpp), as matmul's
  // transposed Aᵀ·g would.
  record("linear", {y}, {flat, weight}, {flat, weight}, [flat, weight, o](const Grads& g) {
    return Grads{input_grad_needed(0) ? matmul(g[0], weight, o) : Tensor(),
                 input_grad_needed(1) ? matmul(transpose(g[0], 0, 1), flat, o) : Tensor()};
  });
  y = reshape(y, out_shape);
  if (bias.defined()) {
    detail::check_compatible("linear", x, bias, "input", "bias");
    EF_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: bias has shape ", shape_str(bias.shape()),
             ", expected [", weight.size(0), "]");
    y = y + bias;
  }
  return y;
}

// --- Convolution -----------------------------------------------------------------------------------------

// Note [Conv double backward]
// conv2d(x, w)              -> dx = conv2d_input_grad(gy, w),      dw = conv2d_weight_grad(x, gy)
// conv2d_input_grad(gy, w)  -> d/dgy = conv2d(ggx, w),            d/dw = conv2d_weight_grad(ggx, gy)
// conv2d_weight_grad(x, gy) -> d/dx = conv2d_input_grad(gy, ggw), d/dgy = conv2d(x, ggw)
// Each is linear in each argument, so the three ops are closed under differentiation.

namespace {

ConvArgs conv_args(const char* op, const Shape& x, const Shape& w, const Conv2dOptions& o) {
  EF_CHECK(x.size() == 4, op, ": input must be 4-D [N, C, H, W], got ", shape_str(x));
  EF_CHECK(w.size() == 4, op, ": weight must be 4-D [O, C/groups, kh, kw], got ", shape_str(w));
  EF_CHECK(o.groups >= 1, op, ": groups must be positive, got ", o.groups);
  EF_CHECK(o.stride.first >= 1 && o.stride.second >= 1, op, ": stride must be positive");
  EF_CHECK(o.dilation.first >= 1 && o.dilation.second >= 1, op, ": dilation must be positive");
  EF_CHECK(o.padding.first >= 0 && o.padding.second >= 0, op, ": padding must be non-negative");
  EF_CHECK(x[1] == w[1] * o.groups, op, ": input has ", x[1], " channels, weight expects ", w[1] * o.groups, " (", w[1],
           " per group x ", o.groups, " groups)");
  EF_CHECK(w[0] % o.groups == 0, op, ": ", w[0], " output channels are not divisible by ", o.groups, " groups");
  ConvArgs a;
  a.n = x[0];
  a.c_in = x[1];
  a.h = x[2];
  a.w = x[3];
  a.c_out = w[0];
  a.kh = w[2];
  a.kw = w[3];
  a.stride_h = o.stride.first;
  a.stride_w = o.stride.second;
  a.pad_h = o.padding.first;
  a.pad_w = o.padding.second;
  a.dil_h = o.dilation.first;
  a.dil_w = o.dilation.second;
  a.groups = o.groups;
  const int64_t eff_h = a.dil_h * (a.kh - 1) + 1, eff_w = a.dil_w * (a.kw - 1) + 1;
  EF_CHECK(a.h + 2 * a.pad_h >= eff_h && a.w + 2 * a.pad_w >= eff_w, op, ": input ", a.h, "x", a.w, " (padded ",
           a.h + 2 * a.pad_h, "x", a.w + 2 * a.pad_w, ") is smaller than the kernel ", eff_h, "x", eff_w);
  a.oh = (a.h + 2 * a.pad_h - eff_h) / a.stride_h + 1;
  a.ow = (a.w + 2 * a.pad_w - eff_w) / a.stride_w + 1;
  return a;
}

}  // namespace

namespace {

// conv2d and its two gradients on ConvOperands (Note [bfloat16 operands converted once]): each
// converts what its pass needs and its node keeps the copies for the passes of its backward.
Tensor conv2d_of(ConvOperand& x, ConvOperand& weight, const Tensor& bias, const Conv2dOptions& o);
Tensor conv2d_input_grad_of(ConvOperand& gy, ConvOperand& weight, const Shape& input_shape, const Conv2dOptions& o);
Tensor conv2d_weight_grad_of(ConvOperand& x, ConvOperand& gy, const Shape& weight_shape, const Conv2dOptions& o);

Tensor conv2d_of(ConvOperand& x_op, ConvOperand& w_op, const Tensor& bias, const Conv2dOptions& o) {
  const Tensor &x = x_op.value, &weight = w_op.value;
  detail::check_float("conv2d", x);
  detail::check_compatible("conv2d", x, weight, "input", "weight");
  const ConvArgs a = conv_args("conv2d", x.shape(), weight.shape(), o);
  if (bias.defined()) {
    detail::check_compatible("conv2d", x, bias, "input", "bias");
    EF_CHECK(bias.dim() == 1 && bias.size(0) == a.c_out, "conv2d: bias has shape ", shape_str(bias.shape()),
             ", expected [", a.c_out, "]");
  }
  const Shape y_shape{a.n, a.c_out, a.oh, a.ow};
  Tensor y = detail::empty_like_shape(x, y_shape);
  // The bias is added by the kernel (one pass over y fewer than a separate add); its gradient is
  // the output gradient summed over batch and space.
  if (y.numel() > 0) {
    const ConvCall c = conv_call("conv2d", a, ConvPass::Forward, x_op, w_op, o.compute, o.memory_format);
    y = empty_activation(x, y_shape, c.args);
    backend_of(x).conv2d(c.args, y.view(), c.in0.view(), c.in1.view(),
                         bias.defined() ? bias.contiguous().view() : View{});
  }
  record("conv2d", {y}, {x, weight, bias}, {x, weight}, [x_op, w_op, bias, o](const Grads& g) {
    ConvOperand gy(g[0]), input = x_op, w = w_op;
    return Grads{input_grad_needed(0) ? conv2d_input_grad_of(gy, w, input.value.shape(), o) : Tensor(),
                 input_grad_needed(1) ? conv2d_weight_grad_of(input, gy, w.value.shape(), o) : Tensor(),
                 input_grad_needed(2) ? sum(g[0], {0, 2, 3}) : Tensor()};
  });
  return y;
}

Tensor conv2d_input_grad_of(ConvOperand& gy_op, ConvOperand& w_op, const Shape& input_shape, const Conv2dOptions& o) {
  const Tensor &gy = gy_op.value, &weight = w_op.value;
  detail::check_float("conv2d_input_grad", gy);
  detail::check_compatible("conv2d_input_grad", gy, weight, "gradient", "weight");
  const ConvArgs a = conv_args("conv2d_input_grad", input_shape, weight.shape(), o);
  EF_CHECK(gy.shape() == Shape({a.n, a.c_out, a.oh, a.ow}), "conv2d_input_grad: gradient has shape ",
           shape_str(gy.shape()), ", the convolution's output is ", shape_str({a.n, a.c_out, a.oh, a.ow}));
  Tensor gx = detail::empty_like_shape(gy, input_shape);
  if (gx.numel() > 0) {
    const ConvCall c = conv_call("conv2d_input_grad", a, ConvPass::InputGrad, gy_op, w_op, o.compute, o.memory_format);
    gx = empty_activation(gy, input_shape, c.args);
    backend_of(gy).conv2d_input_grad(c.args, gx.view(), c.in0.view(), c.in1.view());
  }
  record("conv2d_input_grad", {gx}, {gy, weight}, {gy, weight}, [gy_op, w_op, o](const Grads& g) {
    ConvOperand ggx(g[0]), output_grad = gy_op, w = w_op;
    return Grads{input_grad_needed(0) ? conv2d_of(ggx, w, Tensor(), o) : Tensor(),
                 input_grad_needed(1) ? conv2d_weight_grad_of(ggx, output_grad, w.value.shape(), o) : Tensor()};
  });
  return gx;
}

Tensor conv2d_weight_grad_of(ConvOperand& x_op, ConvOperand& gy_op, const Shape& weight_shape, const Conv2dOptions& o) {
  const Tensor &x = x_op.value, &gy = gy_op.value;
  detail::check_float("conv2d_weight_grad", x);
  detail::check_compatible("conv2d_weight_grad", x, gy, "input", "gradient");
  const ConvArgs a = conv_args("conv2d_weight_grad", x.shape(), weight_shape, o);
  EF_CHECK(gy.shape() == Shape({a.n, a.c_out, a.oh, a.ow}), "conv2d_weight_grad: gradient has shape ",
           shape_str(gy.shape()), ", the convolution's output is ", shape_str({a.n, a.c_out, a.oh, a.ow}));
  Tensor gw = detail::empty_like_shape(x, weight_shape);
  if (gw.numel() > 0) {
    if (x.numel() == 0)
      backend_of(x).fill(gw.view(), 0.0);
    else {
      const ConvCall c =
          conv_call("conv2d_weight_grad", a, ConvPass::WeightGrad, x_op, gy_op, o.compute, o.memory_format);
      backend_of(x).conv2d_weight_grad(c.args, gw.view(), c.in0.view(), c.in1.view());
    }
  }
  record("conv2d_weight_grad", {gw}, {x, gy}, {x, gy}, [x_op, gy_op, o](const Grads& g) {
    ConvOperand ggw(g[0]), input = x_op, output_grad = gy_op;
    return Grads{input_grad_needed(0) ? conv2d_input_grad_of(output_grad, ggw, input.value.shape(), o) : Tensor(),
                 input_grad_needed(1) ? conv2d_of(input, ggw, Tensor(), o) : Tensor()};
  });
  return gw;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& o) {
  ConvOperand x_op(x), w_op(weight);
  return conv2d_of(x_op, w_op, bias, o);
}

Tensor conv2d_input_grad(const Tensor& gy, const Tensor& weight, const Shape& input_shape, const Conv2dOptions& o) {
  ConvOperand gy_op(gy), w_op(weight);
  return conv2d_input_grad_of(gy_op, w_op, input_shape, o);
}

Tensor conv2d_weight_grad(const Tensor& x, const Tensor& gy, const Shape& weight_shape, const Conv2dOptions& o) {
  ConvOperand x_op(x), gy_op(gy);
  return conv2d_weight_grad_of(x_op, gy_op, weight_shape, o);
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvTranspose2dOptions& o) {
  detail::check_float("conv_transpose2d", x);
  detail::check_compatible("conv_transpose2d", x, weight, "input", "weight");
  EF_CHECK(x.dim() == 4 && weight.dim() == 4, "conv_transpose2d: expected 4-D input and weight, got ",
           shape_str(x.shape()), " and ", shape_str(weight.shape()));
  EF_CHECK(x.size(1) == weight.size(0), "conv_transpose2d: input has ", x.size(1), " channels, weight expects ",
           weight.size(0));
  for (auto [op, s, d] : {std::tuple{o.output_padding.first, o.stride.first, o.dilation.first},
                          std::tuple{o.output_padding.second, o.stride.second, o.dilation.second}})
    EF_CHECK(op >= 0 && (op < s || op < d), "conv_transpose2d: output_padding ", op, " must be smaller than stride ", s,
             " or dilation ", d);
  const int64_t c_out = weight.size(1) * o.groups;
  const int64_t oh = (x.size(2) - 1) * o.stride.first - 2 * o.padding.first + o.dilation.first * (weight.size(2) - 1) +
                     o.output_padding.first + 1;
  const int64_t ow = (x.size(3) - 1) * o.stride.second - 2 * o.padding.second +
                     o.dilation.second * (weight.size(3) - 1) + o.output_padding.second + 1;
  EF_CHECK(oh > 0 && ow > 0, "conv_transpose2d: output size ", oh, "x", ow, " is not positive");
  // Note [Output padding past the stride]: an output_padding of stride or more (allowed when it is
  // below the dilation, as in PyTorch) makes the convolution from [oh, ow] produce op / stride more
  // rows (columns) than x has. The transposed convolution is the adjoint of that convolution with a
  // zero gradient at those extra outputs, so x gets them as zero rows (columns) at the end.
  const int64_t extra_h = o.output_padding.first / o.stride.first, extra_w = o.output_padding.second / o.stride.second;
  const Tensor x_full = extra_h || extra_w ? pad(x, {0, extra_w, 0, extra_h}) : x;
  Tensor y = conv2d_input_grad(x_full, weight, {x.size(0), c_out, oh, ow},
                               Conv2dOptions{.stride = o.stride,
                                             .padding = o.padding,
                                             .dilation = o.dilation,
                                             .groups = o.groups,
                                             .compute = o.compute,
                                             .memory_format = o.memory_format});
  if (bias.defined()) {
    detail::check_compatible("conv_transpose2d", x, bias, "input", "bias");
    EF_CHECK(bias.dim() == 1 && bias.size(0) == c_out, "conv_transpose2d: bias has shape ", shape_str(bias.shape()),
             ", expected [", c_out, "]");
    y = y + reshape(bias, {1, c_out, 1, 1});
  }
  return y;
}

// --- Pooling and resampling ------------------------------------------------------------------------------

namespace {

int64_t pooled_size(const char* op, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  EF_CHECK(k >= 1 && s >= 1 && d >= 1 && p >= 0, op,
           ": kernel, stride and dilation must be positive, padding non-negative");
  const int64_t eff = d * (k - 1) + 1;
  EF_CHECK(2 * p <= eff, op, ": padding ", p, " must be at most half the kernel size ", eff);
  const int64_t span = in + 2 * p - eff;
  EF_CHECK(span >= 0, op, ": input size ", in, " (padded ", in + 2 * p, ") is smaller than the kernel ", eff);
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;  // the last window must start inside the input
  return out;
}

}  // namespace

// The backward of gather, index_select and max pooling: scatter_add / index_add onto zeros, written
// straight into the new zero tensor (the general ops first copy their base: a pass over the whole
// input gradient). Differentiable in src, like the general ops; idx is contiguous and checked.
static Tensor scatter_add_into_zeros(const Shape& shape, int64_t d, const Tensor& idx, const Tensor& src) {
  Tensor y = zeros(shape, detail::options_of(src));
  if (src.numel() > 0) backend_of(src).scatter_add(y.view(), static_cast<int>(d), idx.view(), src.view());
  record("scatter_add", {y}, {src}, {}, [idx, d](const Grads& g) { return Grads{gather(g[0], d, idx)}; });
  return y;
}

// The gradient goes to each window's argmax (a scatter_add over the flattened planes, in one kernel
// that zeroes and scatters a plane at a time); its own derivative gathers with the same indices.
static Tensor max_pool2d_backward(const Tensor& gy, const Tensor& idx, const PoolArgs& a) {
  Tensor gx = detail::empty_like_shape(gy, {a.n, a.c, a.h, a.w});
  if (gx.numel() > 0) backend_of(gy).max_pool2d_backward(a, gx.view(), gy.contiguous().view(), idx.view());
  record("max_pool2d_backward", {gx}, {gy}, {}, [idx, a](const Grads& g) {
    const Tensor flat = gather(reshape(g[0], {a.n, a.c, a.h * a.w}), 2, reshape(idx, {a.n, a.c, a.oh * a.ow}));
    return Grads{reshape(flat, {a.n, a.c, a.oh, a.ow})};
  });
  return gx;
}

static Tensor index_add_into_zeros(const Shape& shape, int64_t d, const Tensor& idx, const Tensor& src) {
  Tensor y = zeros(shape, detail::options_of(src));
  if (src.numel() > 0) backend_of(src).index_add(y.view(), static_cast<int>(d), idx.view(), src.view());
  record("index_add", {y}, {src}, {}, [idx, d](const Grads& g) { return Grads{index_select(g[0], d, idx)}; });
  return y;
}

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o) {
  detail::check_float("max_pool2d", x);
  EF_CHECK(x.dim() == 4, "max_pool2d: input must be 4-D [N, C, H, W], got ", shape_str(x.shape()));
  const auto stride = o.stride.value_or(o.kernel);
  PoolArgs a;
  a.n = x.size(0);
  a.c = x.size(1);
  a.h = x.size(2);
  a.w = x.size(3);
  a.kh = o.kernel.first;
  a.kw = o.kernel.second;
  a.stride_h = stride.first;
  a.stride_w = stride.second;
  a.pad_h = o.padding.first;
  a.pad_w = o.padding.second;
  a.dil_h = o.dilation.first;
  a.dil_w = o.dilation.second;
  a.oh = pooled_size("max_pool2d", a.h, a.kh, a.stride_h, a.pad_h, a.dil_h, o.ceil_mode);
  a.ow = pooled_size("max_pool2d", a.w, a.kw, a.stride_w, a.pad_w, a.dil_w, o.ceil_mode);
  Tensor y = detail::empty_like_shape(x, {a.n, a.c, a.oh, a.ow});
  Tensor idx = empty({a.n, a.c, a.oh, a.ow}, {.dtype = kInt64, .device = x.device()});
  if (y.numel() > 0) backend_of(x).max_pool2d(a, y.view(), idx.view(), x.contiguous().view());
  record("max_pool2d", {y}, {x}, {}, [idx, a](const Grads& g) { return Grads{max_pool2d_backward(g[0], idx, a)}; });
  return y;
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o) {
  detail::check_float("avg_pool2d", x);
  EF_CHECK(x.dim() == 4, "avg_pool2d: input must be 4-D [N, C, H, W], got ", shape_str(x.shape()));
  EF_CHECK(!o.ceil_mode, "avg_pool2d: ceil_mode is not supported");
  EF_CHECK(o.dilation.first == 1 && o.dilation.second == 1, "avg_pool2d: dilation is not supported");
  const auto stride = o.stride.value_or(o.kernel);
  pooled_size("avg_pool2d", x.size(2), o.kernel.first, stride.first, o.padding.first, 1, false);
  pooled_size("avg_pool2d", x.size(3), o.kernel.second, stride.second, o.padding.second, 1, false);
  // A window average is a depthwise convolution with a constant kernel: it inherits conv2d's
  // derivatives of every order.
  const int64_t n = x.size(0), c = x.size(1);
  const Conv2dOptions co{.stride = stride, .padding = o.padding};
  const Tensor ones_kernel = ones({1, 1, o.kernel.first, o.kernel.second}, detail::options_of(x));
  const Tensor sums = conv2d(reshape(x, {n * c, 1, x.size(2), x.size(3)}), ones_kernel, Tensor(), co);
  Tensor avg;
  if (o.count_include_pad || (o.padding.first == 0 && o.padding.second == 0)) {
    avg = mul_scalar(sums, 1.0 / static_cast<double>(o.kernel.first * o.kernel.second));
  } else {
    Tensor counts;
    {
      NoGradGuard no_grad;
      counts = conv2d(ones({1, 1, x.size(2), x.size(3)}, detail::options_of(x)), ones_kernel, Tensor(), co);
    }
    avg = sums / counts;
  }
  return reshape(avg, {n, c, avg.size(2), avg.size(3)});
}

namespace {

Tensor matrix_from(const std::vector<double>& values, int64_t rows, int64_t cols, const Tensor& like) {
  return from_vector(values, {rows, cols}, detail::options_of(like));
}

Tensor adaptive_matrix(int64_t out, int64_t in, const Tensor& like) {
  std::vector<double> m(static_cast<size_t>(out * in), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = (i * in) / out, end = ((i + 1) * in + out - 1) / out;
    for (int64_t j = start; j < end; ++j) m[static_cast<size_t>(i * in + j)] = 1.0 / static_cast<double>(end - start);
  }
  return matrix_from(m, out, in, like);
}

// PyTorch's source coordinates: align_corners maps the corner pixels' centres onto each other;
// otherwise pixel centres are scaled by in/out and clamped at 0.
Tensor bilinear_matrix(int64_t out, int64_t in, bool align_corners, const Tensor& like) {
  std::vector<double> m(static_cast<size_t>(out * in), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    double src;
    if (align_corners)
      src = out > 1 ? static_cast<double>(i) * static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
    else
      src = std::max((static_cast<double>(i) + 0.5) * static_cast<double>(in) / static_cast<double>(out) - 0.5, 0.0);
    const int64_t i0 = std::min<int64_t>(static_cast<int64_t>(std::floor(src)), in - 1);
    const int64_t i1 = std::min<int64_t>(i0 + 1, in - 1);
    const double l = src - static_cast<double>(i0);
    m[static_cast<size_t>(i * in + i0)] += 1.0 - l;
    m[static_cast<size_t>(i * in + i1)] += l;
  }
  return matrix_from(m, out, in, like);
}

void check_resample(const char* op, const Tensor& x, std::pair<int64_t, int64_t> size) {
  detail::check_float(op, x);
  EF_CHECK(x.dim() == 4, op, ": input must be 4-D [N, C, H, W], got ", shape_str(x.shape()));
  EF_CHECK(size.first >= 1 && size.second >= 1, op, ": output size must be positive, got ", size.first, "x",
           size.second);
  EF_CHECK(x.size(2) >= 1 && x.size(3) >= 1, op, ": input has an empty spatial dim ", shape_str(x.shape()));
}

// rows·x·colsᵀ over the last two dims: [OH,H] x [N,C,H,W] x [W,OW].
Tensor separable(const Tensor& rows, const Tensor& x, const Tensor& cols) {
  return matmul(matmul(rows, x), transpose(cols, 0, 1));
}

}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& x, std::pair<int64_t, int64_t> size) {
  check_resample("adaptive_avg_pool2d", x, size);
  return separable(adaptive_matrix(size.first, x.size(2), x), x, adaptive_matrix(size.second, x.size(3), x));
}

Tensor upsample_bilinear2d(const Tensor& x, std::pair<int64_t, int64_t> size, bool align_corners) {
  check_resample("upsample_bilinear2d", x, size);
  return separable(bilinear_matrix(size.first, x.size(2), align_corners, x), x,
                   bilinear_matrix(size.second, x.size(3), align_corners, x));
}

Tensor upsample_nearest2d(const Tensor& x, std::pair<int64_t, int64_t> size) {
  check_resample("upsample_nearest2d", x, size);
  auto nearest = [&](int64_t out, int64_t in) {
    std::vector<int64_t> idx(static_cast<size_t>(out));
    for (int64_t i = 0; i < out; ++i)
      idx[static_cast<size_t>(i)] = std::min<int64_t>(
          static_cast<int64_t>(std::floor(static_cast<double>(i) * static_cast<double>(in) / static_cast<double>(out))),
          in - 1);
    return from_int_vector(idx, {out}, x.device());
  };
  return index_select(index_select(x, 2, nearest(size.first, x.size(2))), 3, nearest(size.second, x.size(3)));
}

// --- Softmax ---------------------------------------------------------------------------------------------

static Tensor softmax_kernel(const char* op, const Tensor& x, int64_t dim, bool log) {
  detail::check_float(op, x);
  const int64_t d = normalize_dim(dim, x.dim(), op);
  if (x.dim() == 0) return log ? zeros_like(x) : ones_like(x);
  const int64_t last = x.dim() - 1;
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

// --- Indexing ----------------------------------------------------------------------------------------------

static void check_gather_shapes(const char* op, const Tensor& x, int64_t d, const Tensor& index) {
  EF_CHECK(index.dim() == x.dim(), op, ": index has ", index.dim(), " dims, input has ", x.dim());
  for (int64_t i = 0; i < x.dim(); ++i)
    EF_CHECK(i == d || index.size(i) <= x.size(i), op, ": index shape ", shape_str(index.shape()),
             " is larger than input shape ", shape_str(x.shape()), " in dim ", i);
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  detail::check_float("gather", x);
  detail::check_index("gather", index, x);
  const int64_t d = normalize_dim(dim, x.dim(), "gather");
  check_gather_shapes("gather", x, d, index);
  const Tensor idx = index.contiguous();
  Tensor y = detail::empty_like_shape(x, index.shape());
  if (y.numel() > 0) backend_of(x).gather(y.view(), x.view(), static_cast<int>(d), idx.view());
  record("gather", {y}, {x}, {},
         [idx, d, in = x.shape()](const Grads& g) { return Grads{scatter_add_into_zeros(in, d, idx, g[0])}; });
  return y;
}

Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src) {
  detail::check_float("scatter_add", base);
  detail::check_compatible("scatter_add", base, src, "input", "source");
  detail::check_index("scatter_add", index, base);
  const int64_t d = normalize_dim(dim, base.dim(), "scatter_add");
  check_gather_shapes("scatter_add", base, d, index);
  EF_CHECK(src.shape() == index.shape(), "scatter_add: source shape ", shape_str(src.shape()),
           " differs from index shape ", shape_str(index.shape()));
  const Tensor idx = index.contiguous();
  Tensor y = clone(base.detach());
  if (src.numel() > 0) backend_of(base).scatter_add(y.view(), static_cast<int>(d), idx.view(), src.view());
  record("scatter_add", {y}, {base, src}, {}, [idx, d](const Grads& g) { return Grads{g[0], gather(g[0], d, idx)}; });
  return y;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  detail::check_float("index_select", x);
  detail::check_index("index_select", index, x);
  EF_CHECK(index.dim() == 1, "index_select: index must be 1-D, got ", shape_str(index.shape()));
  const int64_t d = normalize_dim(dim, x.dim(), "index_select");
  const Tensor idx = index.contiguous();
  Shape shape = x.shape();
  shape[static_cast<size_t>(d)] = index.numel();
  Tensor y = detail::empty_like_shape(x, shape);
  if (y.numel() > 0) backend_of(x).index_select(y.view(), x.view(), static_cast<int>(d), idx.view());
  record("index_select", {y}, {x}, {},
         [idx, d, in = x.shape()](const Grads& g) { return Grads{index_add_into_zeros(in, d, idx, g[0])}; });
  return y;
}

Tensor index_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src) {
  detail::check_float("index_add", base);
  detail::check_compatible("index_add", base, src, "input", "source");
  detail::check_index("index_add", index, base);
  EF_CHECK(index.dim() == 1, "index_add: index must be 1-D, got ", shape_str(index.shape()));
  const int64_t d = normalize_dim(dim, base.dim(), "index_add");
  Shape expected = base.shape();
  expected[static_cast<size_t>(d)] = index.numel();
  EF_CHECK(src.shape() == expected, "index_add: source shape ", shape_str(src.shape()), ", expected ",
           shape_str(expected));
  const Tensor idx = index.contiguous();
  Tensor y = clone(base.detach());
  if (src.numel() > 0) backend_of(base).index_add(y.view(), static_cast<int>(d), idx.view(), src.view());
  record("index_add", {y}, {base, src}, {}, [idx, d](const Grads& g) {
    return Grads{g[0], index_select(g[0], d, idx)};
  });
  return y;
}

void check_index_range(const Tensor& index, int64_t size, int64_t allowed,
                       std::function<std::string(int64_t)> describe) {
  EF_CHECK(index.defined() && index.dtype() == kInt64, "check_index_range: expects an int64 tensor, got ",
           index.defined() ? dtype_name(index.dtype()) : "an undefined one");
  if (index.numel() == 0) return;
  const Tensor idx = index.contiguous();
  backend_of(idx).check_index_range(idx.view(), size, allowed, std::move(describe));
}

Tensor dropout(const Tensor& x, double p, bool training) {
  detail::check_float("dropout", x);
  EF_CHECK(p >= 0 && p <= 1, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0) return x;
  if (p == 1) return x * zeros_like(x);
  // Per sample, so that N devices draw the masks one device draws (Note [Random numbers per sample]).
  const Tensor mask = mul_scalar(batch_bernoulli(x.shape(), 1.0 - p, detail::options_of(x)), 1.0 / (1.0 - p));
  return x * mask;
}

// --- Normalization ---------------------------------------------------------------------------------------

namespace {

// Note [Fused normalization]
// layer_norm, and batch_norm in training, normalize by statistics of their own input. The forward
// is one backend kernel (Backend::normalize) writing the output and the statistics in three passes
// over memory, where the composite (mean, sub, square, mean, add, rsqrt, mul, mul, add) made about
// ten, each with a temporary. Over the n elements of a group, with x̂ = (x - μ)·r and ĝ = gy·w,
//   gx = r·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)),  gw = Σ gy·x̂,  gb = Σ gy.
// The backward computes that in one kernel too (Backend::normalize_backward: two passes). Under
// create_graph (a gradient penalty) those gradients are recorded as one node, whose backward, the
// second-order gradients, is again one kernel (Backend::normalize_double_backward: two passes)
// where no graph of it is needed; otherwise (a third order, or a backend without that kernel) it is
// the same closed form as differentiable ops, with μ and r computed again from x so that the next
// derivative sees their dependence on x. (The first order as differentiable ops, differentiated by
// autograd, was about fifty elementwise ops and reductions per normalization in a penalty; the
// critic's LayerNorm through a penalty now takes 0.49 ms against the closed form's 1.8-2.1 ms as
// ops: bench_engine --only layer_norm_penalty, AMD Zen 4, 2 threads.)
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
  // one contiguous block, in H, W, C order, its parameters permuted to match; batch_norm of a 4-D
  // tensor, whose channels are then the columns of an [N·H·W, C] matrix, its parameters as they are.
  bool takes_channels_last = false;
};

// t with its dims in the order `dims` (a view, no autograd): a channels-last [N, C, H, W] tensor as
// {0, 2, 3, 1} is its [N, H, W, C] memory, contiguous; a [C, H, W] affine parameter as {1, 2, 0}
// (copied) is in the order a channels-last group meets it, and its [H, W, C] gradient as {2, 0, 1}
// is back in [C, H, W] order.
Tensor dims_in_order(const Tensor& t, const Shape& dims) {
  Shape shape, strides;
  for (const int64_t d : dims) {
    shape.push_back(t.shape()[static_cast<size_t>(d)]);
    strides.push_back(t.strides()[static_cast<size_t>(d)]);
  }
  return make_view(t, shape, strides, t.offset());
}
const Shape kNhwc{0, 2, 3, 1}, kHwc{1, 2, 0}, kChw{2, 0, 1};

// An activation (x, y or a gradient of one) as the normalize kernels take it: itself, or with nhwc
// (a channels-last tensor) its [N, H, W, C] memory; undefined where t is.
Tensor kernel_activation(const Tensor& t, bool nhwc) {
  return nhwc && t.defined() ? dims_in_order(t, kNhwc) : t;
}
// The kernels' geometry: of x's own layout with nhwc, else of its contiguous copy. Channels-last,
// a per-channel group (batch_norm's) spans the rows of an [N·H·W, C] matrix; layer_norm's sample
// groups are laid out as before.
NormArgs kernel_args(const Normalization& n, bool nhwc) {
  if (!nhwc || !n.args.affine_per_group) return n.args;
  NormArgs a = n.args;
  a.outer *= a.inner;
  a.inner = 1;
  return a;
}
// Whether the kernels take the affine parameters permuted: [C, H, W] ones (layer_norm's) on a
// channels-last input, in H, W, C order; per-channel ones (batch_norm's) stay as they are.
bool permutes_params(const Normalization& n, bool nhwc) {
  return nhwc && n.param_shape.size() == 3;
}
// An affine parameter as the normalize kernels take it: contiguous, and permuted where
// permutes_params; undefined where p is.
Tensor kernel_param(const Normalization& n, const Tensor& p, bool nhwc) {
  if (!p.defined()) return Tensor();
  return permutes_params(n, nhwc) ? dims_in_order(p, kHwc).contiguous() : p.contiguous();
}

// The affine parameters' shape as the normalize kernels take them (kernel_param), and a gradient
// the kernels wrote in that shape back in the parameters' own order.
Shape kernel_param_shape(const Normalization& n, bool nhwc) {
  return permutes_params(n, nhwc) ? Shape{n.param_shape[1], n.param_shape[2], n.param_shape[0]} : n.param_shape;
}
Tensor param_from_kernel(const Normalization& n, const Tensor& g, bool nhwc) {
  return permutes_params(n, nhwc) && g.defined() ? dims_in_order(g, kChw).contiguous() : g;
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
  // The kernel's operands: contiguous, or channels-last ones seen as [N, H, W, C] with the affine
  // parameters (and their gradients) in H, W, C order.
  const Shape param_shape = kernel_param_shape(n, nhwc);
  const Tensor xc = x.contiguous(layout), gyc = gy.contiguous(layout);
  Tensor gx, gw, gb;
  if (x.requires_grad()) gx = detail::empty_in_format(x, x.shape(), layout);
  if (weight.defined() && weight.requires_grad()) gw = detail::empty_like_shape(x, param_shape);
  if (bias.defined() && bias.requires_grad()) gb = detail::empty_like_shape(x, param_shape);
  if (x.numel() > 0) {
    backend_of(x).normalize_backward(kernel_args(n, nhwc), view_or_none(kernel_activation(gx, nhwc)), view_or_none(gw),
                                     view_or_none(gb), kernel_activation(gyc, nhwc).view(),
                                     kernel_activation(xc, nhwc).view(), mean.view(), rstd.view(),
                                     view_or_none(kernel_param(n, weight, nhwc)));
  } else {
    for (Tensor* t : {&gw, &gb})
      if (t->defined()) t->fill_(0.0);
  }
  return {gx, param_from_kernel(n, gw, nhwc), param_from_kernel(n, gb, nhwc)};
}

// normalize's second-order gradients -- of gy, x and the weight, given ggx, ggw and ggb reaching gx,
// gw and gb (each undefined where none does) -- as differentiable ops: the closed form of
// normalize_double_backward_typed (cpu_backend.cpp), with μ and r computed again from x where the
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
  const Shape param_shape = kernel_param_shape(n, nhwc);
  const Tensor xc = x.contiguous(layout), gyc = gy.contiguous(layout);
  const Tensor ggxc = ggx.defined() ? ggx.contiguous(layout) : Tensor();
  Tensor dgy, dx, dw;
  if (input_grad_needed(0)) dgy = detail::empty_in_format(x, x.shape(), layout);
  if (input_grad_needed(1)) dx = detail::empty_in_format(x, x.shape(), layout);
  if (weight.defined() && input_grad_needed(2)) dw = detail::empty_like_shape(x, param_shape);
  if (!backend_of(x).normalize_double_backward(
          kernel_args(n, nhwc), view_or_none(kernel_activation(dgy, nhwc)), view_or_none(kernel_activation(dx, nhwc)),
          view_or_none(dw), view_or_none(kernel_activation(ggxc, nhwc)), view_or_none(kernel_param(n, ggw, nhwc)),
          view_or_none(kernel_param(n, ggb, nhwc)), kernel_activation(gyc, nhwc).view(),
          kernel_activation(xc, nhwc).view(), mean.view(), rstd.view(), view_or_none(kernel_param(n, weight, nhwc))))
    return normalize_double_backward_ops(n, ggx, ggw, ggb, gy, x, mean, rstd, weight);
  return {dgy, dx, param_from_kernel(n, dw, nhwc)};
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
  return first;
}

// y, and the group statistics μ and biased variance in n.stat_shape (Note [Fused normalization]).
struct Normalized {
  Tensor y, mean, var;
};

Normalized normalize(const Normalization& n, const Tensor& x_in, const Tensor& weight, const Tensor& bias) {
  const bool nhwc = normalizes_channels_last(n, x_in);
  const Tensor x = nhwc ? x_in : x_in.contiguous();
  Normalized out{detail::empty_in_format(x, x.shape(), nhwc ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous),
                 detail::empty_like_shape(x, n.stat_shape), detail::empty_like_shape(x, n.stat_shape)};
  if (x.numel() > 0) {
    const Tensor w = kernel_param(n, weight, nhwc), b = kernel_param(n, bias, nhwc);
    backend_of(x).normalize(kernel_args(n, nhwc), kernel_activation(out.y, nhwc).view(), out.mean.view(),
                            out.var.view(), kernel_activation(x, nhwc).view(), view_or_none(w), view_or_none(b));
  }
  const Tensor rstd = rsqrt(add_scalar(out.var, n.args.eps));
  std::vector<Tensor> saved{x_in};
  if (weight.defined()) saved.push_back(weight);
  record(n.op, {out.y}, {x_in, weight, bias}, saved,
         [x = x_in, weight, bias, mean = out.mean, rstd, n](const Grads& g) {
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
    const Normalized out = normalize(geometry, x, weight, bias);
    if (running_mean.defined() || running_var.defined()) {
      NoGradGuard no_grad;
      if (running_mean.defined()) {
        running_mean.mul_(1.0 - momentum);
        running_mean.add_(reshape(out.mean, {c}), momentum);
      }
      if (running_var.defined()) {
        running_var.mul_(1.0 - momentum);
        running_var.add_(reshape(out.var, {c}), momentum * static_cast<double>(n) / static_cast<double>(n - 1));
      }
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
