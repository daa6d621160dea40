// Convolution: conv2d and its two gradients, each an op whose backward is the other two (Note [Conv
// double backward]), on operands converted to bfloat16 once (Note [bfloat16 operands converted
// once]); conv_transpose2d is conv2d_input_grad.
#include "evenflow/engine/ops.h"

#include "evenflow/engine/capture_internal.h"
#include "evenflow/engine/ops_internal.h"

namespace evenflow {

using detail::backend_of;
using detail::Grads;
using detail::operand_for;

// --- Convolution -----------------------------------------------------------------------------------------

// Note [Conv double backward]
// conv2d(x, w)              -> dx = conv2d_input_grad(gy, w),      dw = conv2d_weight_grad(x, gy)
// conv2d_input_grad(gy, w)  -> d/dgy = conv2d(ggx, w),            d/dw = conv2d_weight_grad(ggx, gy)
// conv2d_weight_grad(x, gy) -> d/dx = conv2d_input_grad(gy, ggw), d/dgy = conv2d(x, ggw)
// Each is linear in each argument, so the three ops are closed under differentiation.

namespace {

// Note [bfloat16 operands converted once]
// Where the backend multiplies a convolution pass in bfloat16 itself (Backend::bf16_conv), the op
// gives it bfloat16 operands; elsewhere, operands rounded to bfloat16 in float32 (operand_for). A
// tensor takes part in several passes -- an activation in the forward and the weight gradient, an
// output gradient in both gradients, the weight in the forward and the input gradient, and each
// again in a penalty's double backward -- and is converted once: a ConvOperand carries its copies
// from the pass that made them to the others, in the backward of its node and the nodes that
// backward records (the copy is of the value the node saved, whose version autograd checks). The
// nodes keep the float32 tensors too: they are what gets differentiated. A convolution's forward
// and backward so convert three tensors, not six: a small gain on wgan_gp's bfloat16 step
// (docs/benchmarks.md, "Convolution operands converted to bfloat16 once"). The
// copies held for the backward cost half again the memory of each saved convolution input. Inside a
// training step a weight's copy serves later ops too (Note [Conversions kept for a step] in
// capture_internal.h).
struct ConvOperand {
  explicit ConvOperand(Tensor t) : value(std::move(t)) {}
  Tensor value;    // what nodes record and differentiate
  Tensor bf16;     // `value` in bfloat16, once a pass needed it
  Tensor rounded;  // `value` rounded to bfloat16, in float32, once a pass needed it
};

enum class Conversion { Bfloat16, Rounded };

// `convert()`, which converts `t`: for a weight that is a leaf (a parameter), the copy an earlier pass
// of the step made, if any (Note [Conversions kept for a step] in capture_internal.h).
Tensor converted(const Tensor& t, bool weight, Conversion kind, MemoryFormat format,
                 const std::function<Tensor()>& convert) {
  detail::StepConversions* kept = weight && t.is_leaf() ? detail::step_conversions() : nullptr;
  return kept != nullptr ? kept->get(t, {.kind = static_cast<int>(kind), .format = format}, convert) : convert();
}

// `o.value` in bfloat16 and `format`, converted at the first ask.
const Tensor& bf16_operand(ConvOperand& o, bool weight, MemoryFormat format) {
  if (!o.bf16.defined()) {
    o.bf16 = converted(o.value, weight, Conversion::Bfloat16, format, [&] {
      Tensor copy = detail::empty_in_format(o.value.shape(), format, {.dtype = kBFloat16, .device = o.value.device()});
      backend_of(o.value).copy(copy.view(), o.value.view());  // rounds to nearest, ties to even
      return copy;
    });
  }
  o.bf16 = o.bf16.contiguous(format);  // a pass of another layout (where the backend chose differently)
  return o.bf16;
}

// operand_for(o.value), kept for the next pass.
const Tensor& rounded_operand(const char* op, ConvOperand& o, bool weight, DType compute) {
  if (compute != kBFloat16) return o.value;
  if (!o.rounded.defined()) {
    o.rounded = converted(o.value, weight, Conversion::Rounded, MemoryFormat::Contiguous,
                          [&] { return operand_for(op, o.value, compute); });
  }
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
  const bool second_is_weight = pass != ConvPass::WeightGrad;
  const MemoryFormat second = second_is_weight ? weight : activations;
  if (backend_converts) return {a, bf16_operand(in0, false, activations), bf16_operand(in1, second_is_weight, second)};
  return {a, rounded_operand(op, in0, false, compute).contiguous(activations),
          rounded_operand(op, in1, second_is_weight, compute).contiguous(second)};
}

// An empty activation for a pass to write: in the layout the backend runs it on.
Tensor empty_activation(const Tensor& like, const Shape& shape, const ConvArgs& a) {
  return detail::empty_in_format(like, shape, a.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
}

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

}  // namespace evenflow
