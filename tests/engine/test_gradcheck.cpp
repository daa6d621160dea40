// gradcheck and gradgradcheck of every differentiable op, in float64 on the CPU, driven by the op
// table; third-order gradients of a small conv net; the comparison they rest on.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "evenflow/engine/ops_internal.h"
#include "tests/engine/op_table.h"

using namespace evenflow;
using namespace evenflow::testing;

TEST_CASE("op table: every differentiable op has an entry") {
  std::set<std::string> covered;
  for (const OpCase& c : op_table()) covered.insert(c.name);
#define EF_EXPECT_COVERED(name) CHECK_MESSAGE(covered.count(#name) == 1, "no op-table entry for " #name);
  EF_DIFFERENTIABLE_OPS(EF_EXPECT_COVERED)
#undef EF_EXPECT_COVERED
  std::set<std::string> known;
#define EF_KNOWN(name) known.insert(#name);
  EF_DIFFERENTIABLE_OPS(EF_KNOWN)
#undef EF_KNOWN
  for (const std::string& name : covered)
    CHECK_MESSAGE(known.count(name) == 1, "op-table entry for unknown op " << name);
}

TEST_CASE("gradcheck: every op, float64, CPU") {
  size_t index = 0;
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    CAPTURE(index++);
    const std::string failure = gradcheck(c.fn, make_inputs(c, kFloat64, cpu()), c.tolerance);
    CHECK_MESSAGE(failure.empty(), c.name << ": " << failure);
  }
}

TEST_CASE("gradgradcheck: every op, float64, CPU") {
  size_t index = 0;
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    CAPTURE(index++);
    const std::string failure = gradgradcheck(c.fn, make_inputs(c, kFloat64, cpu()), c.tolerance);
    CHECK_MESSAGE(failure.empty(), c.name << ": " << failure);
  }
}

TEST_CASE("third-order gradients of a small conv net") {
  // conv -> tanh -> conv -> softplus -> mean: smooth, so every order exists.
  const Fn net = [](const std::vector<Tensor>& p) {
    Tensor h = tanh(conv2d(p[0], p[1], p[2], {.padding = {1, 1}}));
    h = softplus(conv2d(h, p[3], Tensor(), {.stride = {2, 2}}));
    return mean(h * h);
  };
  manual_seed(cpu(), 3);
  const TensorOptions f64{.dtype = kFloat64};
  const std::vector<Tensor> params{randn({1, 2, 4, 4}, f64), mul_scalar(randn({3, 2, 3, 3}, f64), 0.5), randn({3}, f64),
                                   mul_scalar(randn({2, 3, 2, 2}, f64), 0.5)};
  // d³ checked as gradgradcheck of the first derivative.
  const Fn first = first_derivative(net, params.size());
  std::vector<Tensor> args = params;
  args.push_back(ones({}, f64));
  const std::string failure = gradgradcheck(first, args, {.eps = 1e-5, .atol = 1e-5, .rtol = 1e-3});
  CHECK_MESSAGE(failure.empty(), failure);
}

TEST_CASE("compare: infinities and NaNs must match; an infinite reference is no infinite tolerance") {
  const TensorOptions f64{.dtype = kFloat64};
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor ref = from_vector({1.0, inf, -inf}, {3}, f64);
  CHECK(compare(from_vector({1.0, inf, -inf}, {3}, f64), ref, 1e-5, 1e-3).empty());
  CHECK(compare(from_vector({1.0, 12.0, -inf}, {3}, f64), ref, 1e-5, 1e-3) == "element 1: 12 vs reference inf");
  CHECK(compare(from_vector({1.0, inf, inf}, {3}, f64), ref, 1e-5, 1e-3) == "element 2: inf vs reference -inf");
  CHECK(compare(from_vector({1.0, inf, -inf}, {3}, f64), from_vector({1.0, inf, 7.0}, {3}, f64), 1e-5, 1e-3) ==
        "element 2: -inf vs reference 7");
  CHECK_FALSE(compare(from_vector({std::nan("")}, {1}, f64), from_vector({0.0}, {1}, f64), 1e-5, 1e-3).empty());
}

TEST_CASE("norm: where the norm is 0 its gradient is 0, to third order, and a NaN stays NaN") {
  for (double p : {2.0, 3.0}) {
    CAPTURE(p);
    // Row 0 is all zeros (norm 0), row 1 is not.
    Tensor x = from_vector({0, 0, 0, 1, -2, 2}, {2, 3}, {.dtype = kFloat64}).requires_grad_();
    const Tensor n = norm(x, p, {1});
    CHECK(n.to_vector()[0] == 0.0);
    const Tensor g = grad({sum(n)}, {x}, {}, {.create_graph = true})[0];
    const std::vector<double> gv = g.to_vector();
    for (int i = 0; i < 3; ++i) CHECK(gv[static_cast<size_t>(i)] == 0.0);
    // Row 1: d/dx ||x||_p = sign(x)·|x|^(p-1) / ||x||_p^(p-1).
    const double row_norm = std::pow(1.0 + std::pow(2.0, p) * 2, 1.0 / p);
    const double want[] = {1, -std::pow(2.0, p - 1), std::pow(2.0, p - 1)};
    for (int i = 0; i < 3; ++i)
      CHECK(gv[static_cast<size_t>(3 + i)] == doctest::Approx(want[i] / std::pow(row_norm, p - 1)).epsilon(1e-12));
    // A gradient penalty's second order: every entry finite, row 0's zero; and the third.
    const Tensor gg = grad({sum(square(g))}, {x}, {}, {.create_graph = true})[0];
    const std::vector<double> ggg = grad({sum(square(gg))}, {x})[0].to_vector();
    for (const std::vector<double>& d : {gg.to_vector(), ggg}) {
      for (size_t i = 0; i < d.size(); ++i) CHECK(std::isfinite(d[i]));
      for (int i = 0; i < 3; ++i) CHECK(d[static_cast<size_t>(i)] == 0.0);
    }
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(std::isnan(norm(from_vector({0, nan}, {2}, {.dtype = kFloat64})).item()));
  CHECK(std::isnan(norm(from_vector({0, nan}, {2}, {.dtype = kFloat64}), 3.0).item()));
}

// Note [Fused normalization]: the kernels against the unfused formula they replaced: forward, running
// statistics, the first-order backward kernel (also for the affine parameters alone), and the
// differentiable backward of create_graph (which computes the statistics again).
TEST_CASE("layer_norm and batch_norm: the fused kernel equals the unfused formula") {
  manual_seed(cpu(), 11);
  for (const DType dtype : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dtype));
    const TensorOptions o{.dtype = dtype};
    const double tol = dtype == kFloat64 ? 1e-12 : 2e-5;
    auto unfused = [](const Tensor& x, const Shape& dims, const Tensor& w, const Tensor& b, double eps) {
      const Tensor centered = x - mean(x, dims, true);
      return centered * rsqrt(mean(square(centered), dims, true) + eps) * w + b;
    };
    for (const bool create_graph : {false, true}) {
      CAPTURE(create_graph);
      // Layer norm over the last two dims of a [3, 4, 5] input (with a mean far from 0).
      const Tensor x = add_scalar(randn({3, 4, 5}, o), 3.0).requires_grad_();
      const Tensor w = randn({4, 5}, o).requires_grad_(), b = randn({4, 5}, o).requires_grad_();
      const Tensor gy = randn({3, 4, 5}, o);
      const Tensor y = layer_norm(x, {4, 5}, w, b, 1e-3);
      const Tensor ref = unfused(x, {1, 2}, w, b, 1e-3);
      CHECK(compare(y, ref, tol, tol).empty());
      const auto g = grad({y}, {x, w, b}, {gy}, {.create_graph = create_graph});
      const auto g_ref = grad({ref}, {x, w, b}, {gy}, {.create_graph = create_graph});
      for (size_t i = 0; i < 3; ++i) CHECK_MESSAGE(compare(g[i], g_ref[i], tol, tol).empty(), "input " << i);
      // Only the affine parameters' gradients (the input needs none).
      const Tensor x_const = x.detach();
      const auto g_affine = grad({layer_norm(x_const, {4, 5}, w, b, 1e-3)}, {w, b}, {gy});
      const auto g_affine_ref = grad({unfused(x_const, {1, 2}, w, b, 1e-3)}, {w, b}, {gy});
      for (size_t i = 0; i < 2; ++i) CHECK(compare(g_affine[i], g_affine_ref[i], tol, tol).empty());
      if (create_graph) {
        const auto gg = grad({sum(square(g[0]))}, {x, w});
        const auto gg_ref = grad({sum(square(g_ref[0]))}, {x, w});
        for (size_t i = 0; i < 2; ++i) CHECK_MESSAGE(compare(gg[i], gg_ref[i], tol, tol).empty(), "input " << i);
      }
    }
    // Batch norm in training on [4, 3, 2, 5], running statistics updated like the unfused ones.
    const Tensor x = add_scalar(mul_scalar(randn({4, 3, 2, 5}, o), 2.0), -1.0).requires_grad_();
    const Tensor w = randn({3}, o).requires_grad_(), b = randn({3}, o).requires_grad_();
    Tensor running_mean = zeros({3}, o), running_var = ones({3}, o);
    const Tensor y = batch_norm(x, w, b, running_mean, running_var, true, 0.25, 1e-4);
    const Tensor ref = unfused(x, {0, 2, 3}, reshape(w, {1, 3, 1, 1}), reshape(b, {1, 3, 1, 1}), 1e-4);
    CHECK(compare(y, ref, tol, tol).empty());
    const Tensor gy = randn({4, 3, 2, 5}, o);
    const auto g = grad({y}, {x, w, b}, {gy});
    const auto g_ref = grad({ref}, {x, w, b}, {gy});
    for (size_t i = 0; i < 3; ++i) CHECK_MESSAGE(compare(g[i], g_ref[i], tol, tol).empty(), "input " << i);
    const auto g_affine = grad({batch_norm(x.detach(), w, b, {}, {}, true, 0.25, 1e-4)}, {w, b}, {gy});
    for (size_t i = 0; i < 2; ++i) CHECK(compare(g_affine[i], g_ref[i + 1], tol, tol).empty());
    NoGradGuard no_grad;
    const Tensor batch_mean = reshape(mean(x, {0, 2, 3}), {3});
    const Tensor batch_var = reshape(var(x, {0, 2, 3}, true), {3});  // unbiased, as PyTorch keeps it
    CHECK(compare(running_mean, mul_scalar(batch_mean, 0.25), tol, tol).empty());
    CHECK(compare(running_var, add_scalar(mul_scalar(batch_var, 0.25), 0.75), tol, tol).empty());
  }
}

// Backend::add_n (Note [Gradients summed in one kernel] in autograd.cpp): the bits of the adds, left
// to right, for 3 to 9 tensors (the CUDA kernel takes 8 a launch) of sizes around the CPU's block
// of 2048 and past one thread's share; each input's gradient is the output's; and a tensor used
// four times gets the sum of its four gradients.
TEST_CASE("add_n: the bits of adding left to right, one gradient for every input") {
  manual_seed(cpu(), 14);
  for (const DType dtype : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dtype));
    for (const int64_t size : {1, 2049, 300001}) {
      for (const size_t count : {3, 5, 9}) {
        CAPTURE(size);
        CAPTURE(count);
        std::vector<Tensor> xs;
        for (size_t k = 0; k < count; ++k) xs.push_back(mul_scalar(randn({size}, {.dtype = dtype}), 1e3));
        Tensor want = xs[0] + xs[1];
        for (size_t k = 2; k < count; ++k) want = want + xs[k];
        CHECK(detail::add_n(xs).to_vector() == want.to_vector());
      }
    }
    std::vector<Tensor> leaves;
    for (int k = 0; k < 3; ++k) leaves.push_back(randn({2, 3}, {.dtype = dtype}).requires_grad_());
    const Tensor w = randn({2, 3}, {.dtype = dtype});
    for (const Tensor& g : grad({sum(detail::add_n(leaves) * w)}, leaves)) CHECK(g.to_vector() == w.to_vector());
    // x·x·x·x: the gradients 3 products reach x by, summed, are 4x³.
    const Tensor x = randn({5}, {.dtype = dtype}).requires_grad_();
    const Tensor gx = grad({sum(x * x * x * x)}, {x})[0];
    CHECK(compare(gx, mul_scalar(x.detach() * x.detach() * x.detach(), 4.0), 1e-6, 1e-5).empty());
  }
}

// ReduceOp::Mean: mean() as one kernel, with the bits of the sum and mul_scalar(1 / n) it was, and
// the same gradient: over one dim, several, all; kept or dropped; a transposed input; rows long
// enough for several threads.
TEST_CASE("mean: one kernel with the bits of sum then mul_scalar, and the same gradient") {
  manual_seed(cpu(), 13);
  for (const DType dtype : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dtype));
    const Tensor x = randn({6, 70000}, {.dtype = dtype}).requires_grad_();
    const Tensor small = randn({2, 3, 5}, {.dtype = dtype});
    const auto check = [](const Tensor& in, const Shape& dims, bool keepdim) {
      int64_t n = 1;
      for (const int64_t d : dims) n *= in.size(d);
      const Tensor want = mul_scalar(sum(in, dims, keepdim), 1.0 / static_cast<double>(n));
      const Tensor got = mean(in, dims, keepdim);
      CHECK(got.shape() == want.shape());
      CHECK(got.to_vector() == want.to_vector());
      if (in.requires_grad()) {
        const Tensor g = randn(got.shape(), {.dtype = in.dtype()});
        CHECK(grad({got}, {in}, {g})[0].to_vector() == grad({want}, {in}, {g})[0].to_vector());
      }
    };
    check(x, {1}, false);
    check(x, {0}, true);
    check(x, {0, 1}, false);
    check(transpose(x, 0, 1), {1}, true);
    check(small, {0, 2}, false);
    CHECK(mean(x).to_vector() == mul_scalar(sum(x), 1.0 / static_cast<double>(x.numel())).to_vector());
  }
}

// RunningStats (engine/backend.h): the normalization kernel updates batch norm's running statistics
// with the bits of the mul_ and add_ the op ran until 2026-12-01. Groups of 2 values (n / (n - 1) =
// 2, exact), so that momentum 1 into zeros reads the kernel's own mean and, halved, its variance; then
// from other buffers with momentum 0.3, against mul_scalar and add_ of those. Both layouts, either
// statistic alone, a strided buffer (written back, its neighbours untouched), the version counter.
TEST_CASE("batch_norm: the kernel updates the running statistics with the bits of mul_ then add_") {
  manual_seed(cpu(), 12);
  for (const DType dtype : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dtype));
    const TensorOptions o{.dtype = dtype};
    for (const MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      const Tensor x = contiguous(add_scalar(randn({1, 5, 1, 2}, o), 0.7), format);
      Tensor group_mean = zeros({5}, o), group_var = zeros({5}, o);
      (void)batch_norm(x, {}, {}, group_mean, group_var, true, 1.0);
      group_var = mul_scalar(group_var, 0.5);  // exact
      for (const int which : {0, 1, 2}) {      // both, the mean alone, the variance alone
        CAPTURE(which);
        const Tensor start_mean = randn({5}, o), start_var = add_scalar(rand({5}, o), 0.5);
        // Every other element of a [10] buffer: not contiguous.
        const Tensor backing = full({10}, 9.0, o);
        const Tensor strided_mean = slice(backing, 0, 0, 10, 2);
        strided_mean.copy_(start_mean);
        const Tensor running_var = start_var.clone();
        const Tensor running_mean = which == 2 ? Tensor() : strided_mean;
        const Tensor var_buffer = which == 1 ? Tensor() : running_var;
        const uint64_t version = running_var.version();
        (void)batch_norm(x, {}, {}, running_mean, var_buffer, true, 0.3);
        Tensor want_mean = start_mean.clone(), want_var = start_var.clone();
        want_mean.mul_(0.7);
        want_mean.add_(group_mean, 0.3);
        want_var.mul_(0.7);
        want_var.add_(group_var, 0.3 * 2.0);
        CHECK(strided_mean.to_vector() == (which == 2 ? start_mean : want_mean).to_vector());
        CHECK(running_var.to_vector() == (which == 1 ? start_var : want_var).to_vector());
        CHECK((running_var.version() > version) == (which != 1));
        const std::vector<double> b = backing.to_vector();
        for (size_t i = 1; i < b.size(); i += 2) CHECK(b[i] == 9.0);
      }
    }
  }
}

// Note [Streaming stores]: a normalization whose output is past 16 MiB writes it around the caches.
// Rows of a layer norm are independent, so the first and last rows of a large one (streamed, rows of
// 1027 elements: not 16-byte aligned) must equal, bit for bit, the same rows normalized alone (plain
// stores): forward and input gradient.
TEST_CASE("layer_norm: outputs past the streaming threshold equal the same rows computed small, bit for bit") {
  manual_seed(cpu(), 17);
  for (const DType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dtype));
    const TensorOptions o{.dtype = dtype};
    const int64_t features = 1027,
                  rows = (int64_t{17} << 20) / (features * static_cast<int64_t>(dtype_size(dtype))) + 1;
    const Tensor x = add_scalar(randn({rows, features}, o), 2.0).requires_grad_();
    const Tensor w = randn({features}, o), b = randn({features}, o), gy = randn({rows, features}, o);
    const Tensor y = layer_norm(x, {features}, w, b);
    const Tensor gx = grad({y}, {x}, {gy})[0];
    for (const int64_t start : {int64_t{0}, rows - 5}) {
      CAPTURE(start);
      const Tensor x_rows = x.detach().narrow(0, start, 5).contiguous().requires_grad_();
      const Tensor y_rows = layer_norm(x_rows, {features}, w, b);
      CHECK(compare(y.detach().narrow(0, start, 5), y_rows, 0, 0).empty());
      const Tensor gx_rows = grad({y_rows}, {x_rows}, {gy.narrow(0, start, 5).contiguous()})[0];
      CHECK(compare(gx.narrow(0, start, 5), gx_rows, 0, 0).empty());
    }
  }
}

// Note [Streaming stores] for elementwise kernels (map_elements): a unary and a binary op past 16 MiB
// (streamed, each thread's part starting anywhere in a 16-byte block) against the same ops on a few
// of their elements (plain stores), bit for bit; and an in-place add past 16 MiB (not streamed).
TEST_CASE("elementwise ops past the streaming threshold equal the same ops computed small, bit for bit") {
  manual_seed(cpu(), 19);
  const int64_t n = (int64_t{17} << 20) / 4 + 3;
  const Tensor x = randn({n}), z = randn({n});
  const Tensor y = add(mul_scalar(x, 3.0), z);
  Tensor acc = clone(x);
  acc.add_(z);
  for (const int64_t start : {int64_t{0}, n / 2 - 5, n - 11}) {
    CAPTURE(start);
    const Tensor xs = x.narrow(0, start, 11).contiguous(), zs = z.narrow(0, start, 11).contiguous();
    CHECK(compare(y.narrow(0, start, 11), add(mul_scalar(xs, 3.0), zs), 0, 0).empty());
    CHECK(compare(acc.narrow(0, start, 11), add(xs, zs), 0, 0).empty());
  }
}

// Note [Fused normalization]: the second-order gradients, from the kernel (a double backward without
// create_graph) and from its differentiable form (with it), against those of the unfused formula:
// reaching the input, the output gradient and the weight through all three first-order gradients,
// and through the input's alone (a gradient penalty: the weight's and bias's first-order gradients
// get none, which the kernel reads as zero without their fills; Node::accept_missing_grads), for
// layer norm (also channels-last and without affine parameters) and batch norm (also of [N, C]).
TEST_CASE("layer_norm and batch_norm: the double backward, kernel and differentiable form, equals the unfused one") {
  manual_seed(cpu(), 13);
  using Norm = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;
  const auto unfused = [](const Shape& dims, const Shape& affine, double eps) {
    return [dims, affine, eps](const Tensor& x, const Tensor& w, const Tensor& b) {
      const Tensor centered = x - mean(x, dims, true);
      const Tensor y = centered * rsqrt(mean(square(centered), dims, true) + eps);
      return w.defined() ? y * reshape(w, affine) + reshape(b, affine) : y;
    };
  };
  struct Case {
    const char* name;
    Shape x_shape, param_shape;
    bool channels_last;
    Norm fused, reference;
  };
  const std::vector<Case> cases{
      {"layer_norm",
       {3, 4, 5},
       {4, 5},
       false,
       [](const Tensor& x, const Tensor& w, const Tensor& b) {
         return layer_norm(x, {4, 5}, w, b, 1e-3);
       },
       unfused({1, 2}, {1, 4, 5}, 1e-3)},
      {"layer_norm, channels-last",
       {2, 3, 4, 5},
       {3, 4, 5},
       true,
       [](const Tensor& x, const Tensor& w, const Tensor& b) {
         return layer_norm(x, {3, 4, 5}, w, b, 1e-3);
       },
       unfused({1, 2, 3}, {1, 3, 4, 5}, 1e-3)},
      {"layer_norm, no affine",
       {3, 8},
       {},
       false,
       [](const Tensor& x, const Tensor&, const Tensor&) { return layer_norm(x, {8}, {}, {}, 1e-3); },
       unfused({1}, {}, 1e-3)},
      {"batch_norm",
       {4, 3, 2, 5},
       {3},
       false,
       [](const Tensor& x, const Tensor& w, const Tensor& b) { return batch_norm(x, w, b, {}, {}, true, 0.1, 1e-4); },
       unfused({0, 2, 3}, {1, 3, 1, 1}, 1e-4)},
      {"batch_norm of [N, C]",
       {6, 5},
       {5},
       false,
       [](const Tensor& x, const Tensor& w, const Tensor& b) { return batch_norm(x, w, b, {}, {}, true, 0.1, 1e-4); },
       unfused({0}, {1, 5}, 1e-4)},
  };
  for (const DType dtype : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dtype));
    const TensorOptions o{.dtype = dtype};
    const double tol = dtype == kFloat64 ? 1e-11 : 1e-4;
    for (const Case& c : cases) {
      CAPTURE(c.name);
      Tensor x = add_scalar(randn(c.x_shape, o), 2.0);
      if (c.channels_last) x = contiguous(x, MemoryFormat::ChannelsLast);
      x.requires_grad_();
      const bool affine = !c.param_shape.empty();
      const Tensor w = affine ? randn(c.param_shape, o).requires_grad_() : Tensor();
      const Tensor b = affine ? randn(c.param_shape, o).requires_grad_() : Tensor();
      const Tensor gy = randn(c.x_shape, o).requires_grad_();
      const Tensor cw = affine ? randn(c.param_shape, o) : Tensor(), cb = affine ? randn(c.param_shape, o) : Tensor();
      // A second loss of all three first-order gradients, or of the input's alone; its gradients with
      // respect to x, gy and w.
      const auto second = [&](const Norm& norm, bool create_graph, bool input_only) {
        const std::vector<Tensor> inputs = affine ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x};
        const std::vector<Tensor> g = grad({norm(x, w, b)}, inputs, {gy}, {.create_graph = true});
        Tensor loss = sum(square(g[0]));
        if (affine && !input_only) loss = loss + sum(g[1] * cw) + sum(g[2] * cb);
        const std::vector<Tensor> wrt = affine ? std::vector<Tensor>{x, gy, w} : std::vector<Tensor>{x, gy};
        return grad({loss}, wrt, {}, {.create_graph = create_graph});
      };
      for (const bool input_only : {false, true}) {
        CAPTURE(input_only);
        const std::vector<Tensor> expected = second(c.reference, false, input_only);
        for (const bool create_graph : {false, true}) {
          CAPTURE(create_graph);
          const std::vector<Tensor> got = second(c.fused, create_graph, input_only);
          for (size_t i = 0; i < got.size(); ++i)
            CHECK_MESSAGE(compare(got[i], expected[i], tol, tol).empty(),
                          "gradient " << i << ": " << compare(got[i], expected[i], tol, tol));
        }
      }
    }
  }
}

// The double backward's differentiable form, differentiated once more: third-order gradients of
// layer norm (also channels-last) and batch norm, in float64 against central differences.
TEST_CASE("layer_norm and batch_norm: third-order gradients") {
  manual_seed(cpu(), 14);
  const TensorOptions f64{.dtype = kFloat64};
  const std::vector<std::pair<const char*, Fn>> cases{
      {"layer_norm",
       [](const std::vector<Tensor>& p) {
         return layer_norm(p[0], {3}, slice(p[1], 0, 0, 3), slice(p[2], 0, 0, 3), 1e-3);
       }},
      {"layer_norm, channels-last",
       [](const std::vector<Tensor>& p) {
         return layer_norm(contiguous(p[0], MemoryFormat::ChannelsLast), {2, 1, 3}, reshape(p[1], {2, 1, 3}),
                           reshape(p[2], {2, 1, 3}), 1e-3);
       }},
      {"batch_norm", [](const std::vector<Tensor>& p) {
         return batch_norm(p[0], slice(p[1], 0, 0, 2), slice(p[2], 0, 0, 2), {}, {}, true, 0.1, 1e-3);
       }}};
  for (const auto& [name, fn] : cases) {
    CAPTURE(name);
    const bool layer = std::string(name).starts_with("layer_norm");
    const std::vector<Tensor> inputs{add_scalar(randn(layer ? Shape{2, 2, 1, 3} : Shape{3, 2, 1, 3}, f64), 1.0),
                                     randn({6}, f64), randn({6}, f64)};
    std::vector<Tensor> args = inputs;
    args.push_back(randn(fn(inputs).shape(), f64));
    const std::string failure =
        gradgradcheck(first_derivative(fn, inputs.size()), args, {.eps = 1e-5, .atol = 1e-5, .rtol = 1e-3});
    CHECK_MESSAGE(failure.empty(), failure);
  }
}

// batch_norm of [N, C] (one element a row and a group: the column kernels of the CPU backend), with
// more channels than a block of columns, with and without affine parameters, to second order.
TEST_CASE("batch_norm of [N, C]: the fused kernel equals the unfused formula") {
  manual_seed(cpu(), 12);
  for (const DType dtype : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dtype));
    const TensorOptions o{.dtype = dtype};
    const double tol = dtype == kFloat64 ? 1e-12 : 2e-5;
    for (const bool affine : {true, false}) {
      CAPTURE(affine);
      const Tensor x = add_scalar(randn({6, 300}, o), 2.0).requires_grad_();
      const Tensor w = affine ? randn({300}, o).requires_grad_() : Tensor();
      const Tensor b = affine ? randn({300}, o).requires_grad_() : Tensor();
      const Tensor gy = randn({6, 300}, o);
      const Tensor y = batch_norm(x, w, b, {}, {}, true, 0.1, 1e-4);
      const Tensor centered = x - mean(x, {0}, true);
      Tensor ref = centered * rsqrt(mean(square(centered), {0}, true) + 1e-4);
      if (affine) ref = ref * w + b;
      CHECK(compare(y, ref, tol, tol).empty());
      const std::vector<Tensor> inputs = affine ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x};
      // The backward kernel (first order), then the differentiable backward (create_graph).
      for (const bool create_graph : {false, true}) {
        CAPTURE(create_graph);
        const auto g = grad({y}, inputs, {gy}, {.create_graph = create_graph, .retain_graph = true});
        const auto g_ref = grad({ref}, inputs, {gy}, {.create_graph = create_graph, .retain_graph = true});
        for (size_t i = 0; i < inputs.size(); ++i)
          CHECK_MESSAGE(compare(g[i], g_ref[i], tol, tol).empty(), "input " << i);
        if (create_graph) {
          const auto gg = grad({sum(square(g[0]))}, {x});
          const auto gg_ref = grad({sum(square(g_ref[0]))}, {x});
          CHECK(compare(gg[0], gg_ref[0], tol, tol).empty());
        }
      }
      if (affine) {  // only the affine parameters' gradients (the input needs none)
        const auto g_affine = grad({batch_norm(x.detach(), w, b, {}, {}, true, 0.1, 1e-4)}, {w, b}, {gy});
        const auto g_affine_ref = grad({ref}, {w, b}, {gy});
        for (size_t i = 0; i < 2; ++i) CHECK(compare(g_affine[i], g_affine_ref[i], tol, tol).empty());
      }
    }
  }
}
