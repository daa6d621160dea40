#include "tests/engine/op_table.h"

namespace evenflow::testing {

namespace {

using V = std::vector<Tensor>;
const Values P = Values::Positive, A = Values::AwayFromZero;

std::vector<OpCase> build() {
  std::vector<OpCase> t;
  auto add_case = [&](std::string name, std::vector<InputSpec> in, Fn fn, GradcheckOptions tol = {}) {
    t.push_back({std::move(name), std::move(in), std::move(fn), tol, false});
  };
  // Elementwise
  add_case("add", {{{2, 3}}, {{3}}}, [](const V& x) { return add(x[0], x[1]); });
  add_case("sub", {{{2, 3}}, {{2, 1}}}, [](const V& x) { return sub(x[0], x[1]); });
  add_case("mul", {{{2, 3}}, {{1, 3}}}, [](const V& x) { return mul(x[0], x[1]); });
  // A tensor used four times: its four partial gradients summed in one kernel (Note [Gradients
  // summed in one kernel] in autograd.cpp), and again in its second derivatives.
  add_case("mul", {{{3, 4}}}, [](const V& x) { return x[0] * x[0] * x[0] * x[0]; });
  add_case("div", {{{2, 3}}, {{2, 3}, P}}, [](const V& x) { return div(x[0], x[1]); });
  add_case("neg", {{{2, 3}}}, [](const V& x) { return neg(x[0]); });
  add_case("add_scalar", {{{2, 3}}}, [](const V& x) { return add_scalar(x[0], 0.5); });
  add_case("mul_scalar", {{{2, 3}}}, [](const V& x) { return mul_scalar(x[0], 1.7); });
  add_case("pow", {{{2, 3}, P}}, [](const V& x) { return pow(x[0], 2.5); });
  add_case("sqrt", {{{2, 3}, P}}, [](const V& x) { return sqrt(x[0]); });
  add_case("rsqrt", {{{2, 3}, P}}, [](const V& x) { return rsqrt(x[0]); });
  add_case("reciprocal", {{{2, 3}, A}}, [](const V& x) { return reciprocal(x[0]); });
  add_case("exp", {{{2, 3}}}, [](const V& x) { return exp(x[0]); });
  add_case("log", {{{2, 3}, P}}, [](const V& x) { return log(x[0]); });
  add_case("abs", {{{2, 3}, A}}, [](const V& x) { return abs(x[0]); });
  add_case("square", {{{2, 3}}}, [](const V& x) { return square(x[0]); });
  add_case("clamp", {{{3, 4}}}, [](const V& x) { return clamp(x[0], -0.5, 0.7); });
  add_case("where", {{{2, 3}}, {{2, 3}}, {{3}}},
           [](const V& x) { return where(gt(x[0], zeros_like(x[0])), x[1], x[2]); });
  add_case("maximum", {{{2, 3}}, {{2, 3}}}, [](const V& x) { return maximum(x[0], x[1]); });
  add_case("minimum", {{{2, 3}}, {{1, 3}}}, [](const V& x) { return minimum(x[0], x[1]); });
  add_case("relu", {{{2, 3}, A}}, [](const V& x) { return relu(x[0]); });
  add_case("leaky_relu", {{{2, 3}, A}}, [](const V& x) { return leaky_relu(x[0], 0.2); });
  add_case("elu", {{{2, 3}, A}}, [](const V& x) { return elu(x[0], 1.3); });
  add_case("sigmoid", {{{2, 3}}}, [](const V& x) { return sigmoid(x[0]); });
  add_case("tanh", {{{2, 3}}}, [](const V& x) { return tanh(x[0]); });
  add_case("erf", {{{2, 3}}}, [](const V& x) { return erf(x[0]); });
  add_case("softplus", {{{3, 4}, A}}, [](const V& x) { return softplus(x[0], 2.0, 1.0); });
  // Reductions
  add_case("sum", {{{2, 3, 4}}}, [](const V& x) { return sum(x[0], {0, 2}); });
  add_case("sum", {{{2, 3}}}, [](const V& x) { return sum(x[0]); });
  add_case("mean", {{{2, 3, 4}}}, [](const V& x) { return mean(x[0], {1}, true); });
  add_case("sum", {{{2, 3, 2, 2}}}, [](const V& x) {
    return sum(contiguous(x[0], MemoryFormat::ChannelsLast), {0, 2, 3});
  });
  add_case("mean", {{{2, 3, 2, 2}}}, [](const V& x) {
    return mean(contiguous(x[0], MemoryFormat::ChannelsLast), {1, 2, 3}, true);
  });
  add_case("var", {{{3, 4}}}, [](const V& x) { return var(x[0], {1}); });
  add_case("var", {{{3, 4}}}, [](const V& x) { return var(x[0], {0}, false, true); });
  add_case("max", {{{3, 4}}}, [](const V& x) { return max(x[0], 1).first; });
  add_case("amax", {{{3, 4}}}, [](const V& x) { return amax(x[0]); });
  add_case("norm", {{{3, 4}, A}}, [](const V& x) { return norm(x[0], 2.0, {1}); });
  add_case("norm", {{{3, 4}, A}}, [](const V& x) { return norm(x[0], 3.0); });
  // Shape
  add_case("reshape", {{{2, 3, 2}}}, [](const V& x) { return reshape(x[0], {3, -1}) * x[0].reshape({3, 4}); });
  add_case("reshape", {{{3, 4}}}, [](const V& x) { return reshape(transpose(x[0], 0, 1), {2, 6}); });
  add_case("permute", {{{2, 3, 4}}}, [](const V& x) { return permute(x[0], {2, 0, 1}) * 2.0; });
  add_case("transpose", {{{2, 3}}}, [](const V& x) { return transpose(x[0], 0, 1); });
  add_case("slice", {{{3, 5}}}, [](const V& x) { return slice(x[0], 1, 1, 5, 2) * slice(x[0], 1, 0, 2); });
  add_case("select", {{{3, 4}}}, [](const V& x) { return select(x[0], 0, -1) * select(x[0], 1, 2).sum(); });
  add_case("cat", {{{2, 3}}, {{2, 1}}}, [](const V& x) { return square(cat({x[0], x[1]}, 1)); });
  add_case("stack", {{{2, 3}}, {{2, 3}}}, [](const V& x) { return stack({x[0], square(x[1])}, 1); });
  add_case("split", {{{2, 5}}}, [](const V& x) {
    const auto parts = split(x[0], 2, 1);
    return cat({parts[0] * 2.0, square(parts[1]), parts[2]}, 1);
  });
  add_case("chunk", {{{4, 3}}}, [](const V& x) {
    const auto parts = chunk(x[0], 2, 0);
    return parts[0] * parts[1];
  });
  add_case("expand", {{{1, 3}}}, [](const V& x) { return square(expand(x[0], {2, 3})); });
  add_case("sum_to", {{{2, 3}}}, [](const V& x) { return sum_to(square(x[0]), {1, 3}); });
  add_case("flatten", {{{2, 3, 2}}}, [](const V& x) { return square(flatten(x[0], 1)); });
  add_case("squeeze", {{{2, 1, 3}}}, [](const V& x) { return square(squeeze(x[0], 1)); });
  add_case("unsqueeze", {{{2, 3}}}, [](const V& x) { return unsqueeze(x[0], 1) * unsqueeze(x[0], 0); });
  add_case("pad", {{{2, 2, 3}}}, [](const V& x) { return square(pad(x[0], {1, 2, 0, 1}, 0.5)); });
  add_case("clone", {{{2, 3}}}, [](const V& x) { return clone(x[0]) * x[0]; });
  // Channels-last (Note [Channels-last]): a layout change, elementwise ops on mixed layouts, and a
  // clone of a channels-last tensor, whose gradient goes back channels-last.
  constexpr MemoryFormat cl = MemoryFormat::ChannelsLast;
  add_case("contiguous", {{{2, 3, 2, 2}}}, [](const V& x) { return contiguous(square(x[0]), cl) * x[0]; });
  add_case("contiguous", {{{2, 3, 2, 2}}}, [](const V& x) {
    return reshape(contiguous(x[0], cl), {2, -1}) * reshape(x[0], {2, -1});
  });
  add_case("to_dtype", {{{2, 3}}}, [](const V& x) { return to_dtype(to_dtype(x[0], kFloat32) * 3.0, x[0].dtype()); },
           {.eps = 1e-2, .atol = 1e-4, .rtol = 1e-3});
  t.push_back({"to_device",
               {{{2, 3}}},
               [](const V& x) { return to_device(square(to_device(x[0], cpu(1))), x[0].device()) * x[0]; },
               {},
               true});
  // Linear algebra and convolution
  add_case("matmul", {{{2, 3, 4}}, {{4, 2}}}, [](const V& x) { return matmul(x[0], x[1]); });
  add_case("matmul", {{{2, 2, 3}}, {{1, 3, 2}}}, [](const V& x) { return matmul(x[0], x[1]); });
  add_case("matmul", {{{3, 2}}, {{4, 3}}},
           [](const V& x) { return matmul(transpose(x[0], 0, 1), transpose(x[1], 0, 1)); });
  add_case("linear", {{{3, 4}}, {{2, 4}}, {{2}}}, [](const V& x) { return linear(x[0], x[1], x[2]); });
  const Conv2dOptions co{.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2};
  add_case("conv2d", {{{2, 4, 5, 6}}, {{6, 2, 3, 2}}, {{6}}},
           [co](const V& x) { return conv2d(x[0], x[1], x[2], co); });
  add_case("conv2d", {{{1, 2, 4, 4}}, {{3, 2, 3, 3}}}, [](const V& x) {
    return conv2d(x[0], x[1], Tensor(), {.padding = {1, 1}});
  });
  Conv2dOptions co_cl = co;  // outputs channels-last (copies here: float64 runs on our kernels)
  co_cl.memory_format = MemoryFormat::ChannelsLast;
  add_case("conv2d", {{{2, 4, 5, 6}}, {{6, 2, 3, 2}}, {{6}}},
           [co_cl](const V& x) { return conv2d(contiguous(x[0], MemoryFormat::ChannelsLast), x[1], x[2], co_cl); });
  add_case("conv2d_input_grad", {{{2, 6, 3, 4}}, {{6, 2, 3, 2}}}, [co_cl](const V& x) {
    return conv2d_input_grad(x[0], x[1], {2, 4, 5, 6}, co_cl);
  });
  add_case("conv2d_weight_grad", {{{2, 4, 5, 6}}, {{2, 6, 3, 4}}}, [co_cl](const V& x) {
    return conv2d_weight_grad(contiguous(x[0], MemoryFormat::ChannelsLast), x[1], {6, 2, 3, 2}, co_cl);
  });
  // A one-channel input's gradient from a channels-last output gradient (the CPU's own kernel reads it).
  add_case("conv2d_input_grad", {{{2, 3, 3, 3}}, {{3, 1, 3, 2}}}, [](const V& x) {
    return conv2d_input_grad(contiguous(x[0], MemoryFormat::ChannelsLast), x[1], {2, 1, 6, 6},
                             {.stride = {2, 2}, .padding = {1, 0}, .memory_format = MemoryFormat::ChannelsLast});
  });
  add_case("conv2d_input_grad", {{{2, 6, 3, 4}}, {{6, 2, 3, 2}}}, [co](const V& x) {
    return conv2d_input_grad(x[0], x[1], {2, 4, 5, 6}, co);
  });
  add_case("conv2d_weight_grad", {{{2, 4, 5, 6}}, {{2, 6, 3, 4}}}, [co](const V& x) {
    return conv2d_weight_grad(x[0], x[1], {6, 2, 3, 2}, co);
  });
  add_case("conv_transpose2d", {{{1, 4, 3, 3}}, {{4, 3, 3, 3}}, {{3}}}, [](const V& x) {
    return conv_transpose2d(x[0], x[1], x[2], {.stride = {2, 2}, .padding = {1, 1}, .output_padding = {1, 1}});
  });
  // output_padding past the stride (below the dilation): Note [Output padding past the stride].
  add_case("conv_transpose2d", {{{1, 4, 3, 3}}, {{4, 3, 3, 3}}}, [](const V& x) {
    return conv_transpose2d(x[0], x[1], Tensor(),
                            {.stride = {1, 2}, .padding = {1, 0}, .output_padding = {1, 1}, .dilation = {2, 1}});
  });
  add_case("conv_transpose2d", {{{1, 4, 3, 3}}, {{4, 1, 2, 2}}}, [](const V& x) {
    return conv_transpose2d(x[0], x[1], Tensor(), {.stride = {2, 2}, .groups = 2});
  });
  // To one channel with a 4x4 kernel, channels-last: the CPU's own kernel (Note [One-channel input
  // gradient] in cpu_conv.cpp) reading a channels-last input.
  add_case("conv_transpose2d", {{{2, 3, 3, 3}}, {{3, 1, 4, 4}}, {{1}}}, [](const V& x) {
    return conv_transpose2d(contiguous(x[0], cl), x[1], x[2],
                            {.stride = {2, 2}, .padding = {1, 1}, .memory_format = cl});
  });
  // Pooling and resampling
  add_case("max_pool2d", {{{1, 2, 5, 5}}}, [](const V& x) { return max_pool2d(x[0], {.kernel = {2, 2}}); });
  add_case("max_pool2d", {{{1, 2, 5, 5}}}, [](const V& x) {
    return max_pool2d(x[0], {.kernel = {3, 3}, .stride = {{2, 2}}, .padding = {1, 1}, .ceil_mode = true});
  });
  add_case("avg_pool2d", {{{1, 2, 5, 5}}}, [](const V& x) { return avg_pool2d(x[0], {.kernel = {2, 2}}); });
  add_case("avg_pool2d", {{{1, 2, 5, 5}}}, [](const V& x) {
    return avg_pool2d(x[0], {.kernel = {3, 3}, .stride = {{2, 2}}, .padding = {1, 1}, .count_include_pad = false});
  });
  add_case("adaptive_avg_pool2d", {{{1, 2, 5, 7}}}, [](const V& x) { return adaptive_avg_pool2d(x[0], {3, 4}); });
  add_case("upsample_bilinear2d", {{{1, 2, 3, 4}}}, [](const V& x) {
    return upsample_bilinear2d(x[0], {5, 7}, false);
  });
  add_case("upsample_bilinear2d", {{{1, 2, 3, 4}}}, [](const V& x) { return upsample_bilinear2d(x[0], {5, 7}, true); });
  add_case("upsample_nearest2d", {{{1, 2, 3, 4}}}, [](const V& x) { return upsample_nearest2d(x[0], {5, 7}); });
  add_case("resample2d", {{{1, 2, 3, 4}}}, [](const V& x) {
    const TensorOptions o{.dtype = x[0].dtype(), .device = x[0].device()};
    return resample2d(x[0], resampling(ResampleMode::Bilinear, {3, 4}, {5, 2}, o));
  });
  add_case("resample2d", {{{1, 2, 5, 7}}}, [](const V& x) {
    const TensorOptions o{.dtype = x[0].dtype(), .device = x[0].device()};
    return resample2d(x[0], resampling(ResampleMode::Nearest, {5, 7}, {3, 9}, o));
  });
  // Softmax, indexing, dropout
  add_case("softmax", {{{3, 4}}}, [](const V& x) { return softmax(x[0], 1); });
  add_case("softmax", {{{3, 4, 2}}}, [](const V& x) { return softmax(x[0], 1); });
  add_case("log_softmax", {{{3, 4}}}, [](const V& x) { return log_softmax(x[0], 0); });
  add_case("gather", {{{3, 4}}, {{3, 2}, Values::Normal, {0, 3, 2, 2, 1, 0}}},
           [](const V& x) { return gather(x[0], 1, x[1]); });
  add_case("scatter_add", {{{3, 4}}, {{3, 2}, Values::Normal, {0, 3, 2, 2, 1, 0}}, {{3, 2}}},
           [](const V& x) { return square(scatter_add(x[0], 1, x[1], x[2])); });
  add_case("index_select", {{{4, 3}}, {{3}, Values::Normal, {2, 0, 2}}},
           [](const V& x) { return index_select(x[0], 0, x[1]); });
  add_case("index_add", {{{4, 3}}, {{3}, Values::Normal, {1, 3, 1}}, {{3, 3}}},
           [](const V& x) { return square(index_add(x[0], 0, x[1], x[2])); });
  add_case("dropout", {{{4, 5}}}, [](const V& x) {
    manual_seed(x[0].device(), 7);  // the same mask on every evaluation
    return dropout(x[0], 0.3, true);
  });
  // Normalization
  add_case("batch_norm", {{{4, 3, 2, 2}}, {{3}}, {{3}}},
           [](const V& x) { return batch_norm(x[0], x[1], x[2], Tensor(), Tensor(), true); });
  add_case("batch_norm", {{{4, 3, 2, 2}}, {{3}}, {{3}}}, [](const V& x) {  // channels-last (Note [Channels-last])
    return batch_norm(contiguous(x[0], cl), x[1], x[2], Tensor(), Tensor(), true);
  });
  add_case("batch_norm", {{{4, 3}}, {{3}}, {{3}}, {{3}}, {{3}, P}},
           [](const V& x) { return batch_norm(x[0], x[1], x[2], x[3], x[4], false); });
  add_case("layer_norm", {{{2, 3, 4}}, {{4}}, {{4}}}, [](const V& x) { return layer_norm(x[0], {4}, x[1], x[2]); });
  add_case("batch_norm", {{{3, 2, 2, 3}}}, [](const V& x) { return batch_norm(x[0], {}, {}, {}, {}, true); });
  add_case("batch_norm", {{{5, 2, 3}}, {{2}}}, [](const V& x) { return batch_norm(x[0], x[1], {}, {}, {}, true); });
  add_case("layer_norm", {{{2, 3, 4}}}, [](const V& x) { return layer_norm(x[0], {3, 4}); });
  add_case("layer_norm", {{{2, 3, 2, 2}}, {{3, 2, 2}}, {{3, 2, 2}}}, [](const V& x) {  // channels-last
    return layer_norm(contiguous(x[0], MemoryFormat::ChannelsLast), {3, 2, 2}, x[1], x[2]);
  });
  add_case("layer_norm", {{{5}}, {{5}}, {{5}}}, [](const V& x) { return layer_norm(x[0], {5}, x[1], x[2]); });
  add_case("layer_norm", {{{4, 3}}, {{4}}},
           [](const V& x) { return layer_norm(transpose(x[0], 0, 1), {4}, {}, x[1]); });
  return t;
}

}  // namespace

const std::vector<OpCase>& op_table() {
  static const std::vector<OpCase> table = build();
  return table;
}

std::vector<Tensor> make_inputs(const OpCase& c, DType dtype, const Device& device, uint64_t seed) {
  manual_seed(cpu(), seed);
  std::vector<Tensor> out;
  for (const InputSpec& s : c.inputs) {
    if (!s.ints.empty()) {
      out.push_back(from_int_vector(s.ints, s.shape, device));
      continue;
    }
    Tensor v = randn(s.shape, {.dtype = kFloat64});
    if (s.values == Values::Positive) v = add_scalar(mul_scalar(rand(s.shape, {.dtype = kFloat64}), 1.5), 0.5);
    if (s.values == Values::AwayFromZero) {
      const Tensor mag = add_scalar(mul_scalar(rand(s.shape, {.dtype = kFloat64}), 0.9), 0.1);
      v = mag * sign(v);
    }
    out.push_back(v.to(dtype).to(device));
  }
  return out;
}

}  // namespace evenflow::testing
