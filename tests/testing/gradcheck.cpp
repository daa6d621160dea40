#include "tests/testing/gradcheck.h"

#include <cmath>
#include <sstream>

namespace evenflow::testing {

namespace {

std::vector<Tensor> fresh_leaves(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    Tensor c = t.detach().clone();
    if (is_floating(c.dtype())) c.requires_grad_(true);
    out.push_back(c);
  }
  return out;
}

std::vector<double> values_of(const Tensor& t) {
  return t.detach().to_vector();
}

}  // namespace

std::string compare(const Tensor& a, const Tensor& b, double atol, double rtol) {
  if (a.shape() != b.shape()) return "shape " + shape_str(a.shape()) + " vs " + shape_str(b.shape());
  const std::vector<double> va = a.detach().to_vector(), vb = b.detach().to_vector();
  double worst = 0;
  size_t at = 0;
  bool bad = false;
  for (size_t i = 0; i < va.size(); ++i) {
    const double err = std::fabs(va[i] - vb[i]);
    const double excess = err - (atol + rtol * std::fabs(vb[i]));
    // An infinite reference makes the tolerance infinite (and excess NaN): infinities must match.
    const bool inf_mismatch = (std::isinf(va[i]) || std::isinf(vb[i])) && va[i] != vb[i];
    if (std::isnan(va[i]) != std::isnan(vb[i]) || inf_mismatch || excess > 0) {
      if (!bad || excess > worst) {
        worst = excess;
        at = i;
      }
      bad = true;
    }
  }
  if (!bad) return "";
  std::ostringstream os;
  os.precision(10);
  os << "element " << at << ": " << va[at] << " vs reference " << vb[at];
  return os.str();
}

std::string compare_normwise(const Tensor& a, const Tensor& b, double tol) {
  if (a.shape() != b.shape()) return "shape " + shape_str(a.shape()) + " vs " + shape_str(b.shape());
  const std::vector<double> va = a.detach().to_vector(), vb = b.detach().to_vector();
  std::ostringstream os;
  os.precision(10);
  double err2 = 0, ref2 = 0;
  size_t finite = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isfinite(vb[i])) {
      if (!std::isfinite(va[i])) {
        os << "element " << i << ": " << va[i] << " vs reference " << vb[i];
        return os.str();
      }
      err2 += (va[i] - vb[i]) * (va[i] - vb[i]);
      ref2 += vb[i] * vb[i];
      ++finite;
    } else if (std::isnan(va[i]) != std::isnan(vb[i]) || (std::isinf(vb[i]) && va[i] != vb[i])) {
      os << "element " << i << ": " << va[i] << " vs reference " << vb[i];
      return os.str();
    }
  }
  const double err = std::sqrt(err2), ref = std::sqrt(ref2);
  if (err > tol * ref) {
    os << "normwise relative error " << (ref > 0 ? err / ref : err) << " exceeds " << tol;
    return os.str();
  }
  const double element_limit = 10 * tol * (finite > 0 ? ref / std::sqrt(static_cast<double>(finite)) : 0.0);
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isfinite(vb[i]) && std::fabs(va[i] - vb[i]) > element_limit) {
      os << "element " << i << ": " << va[i] << " vs reference " << vb[i] << ", an error over 10 x " << tol
         << " x rms(reference) = " << element_limit;
      return os.str();
    }
  }
  return "";
}

std::string gradcheck(const Fn& fn, const std::vector<Tensor>& inputs_in, const GradcheckOptions& o) {
  std::vector<Tensor> inputs = fresh_leaves(inputs_in);
  Tensor out = fn(inputs);
  const int64_t n_out = out.numel();
  std::vector<size_t> diff;  // inputs that carry gradient
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].requires_grad()) diff.push_back(i);

  // Analytic Jacobian: one backward pass per output element.
  std::vector<std::vector<double>> analytic(diff.size());
  for (size_t k = 0; k < diff.size(); ++k)
    analytic[k].assign(static_cast<size_t>(inputs[diff[k]].numel() * n_out), 0.0);
  if (out.requires_grad()) {
    for (int64_t j = 0; j < n_out; ++j) {
      std::vector<double> onehot(static_cast<size_t>(n_out), 0.0);
      onehot[static_cast<size_t>(j)] = 1.0;
      const Tensor v = from_vector(onehot, out.shape(), {.dtype = out.dtype(), .device = out.device()});
      std::vector<Tensor> wrt;
      for (size_t k : diff) wrt.push_back(inputs[k]);
      const std::vector<Tensor> g = grad({out}, wrt, {v}, {.retain_graph = true, .allow_unused = true});
      for (size_t k = 0; k < diff.size(); ++k) {
        if (!g[k].defined()) continue;
        const std::vector<double> gv = values_of(g[k]);
        for (size_t e = 0; e < gv.size(); ++e)
          analytic[k][e * static_cast<size_t>(n_out) + static_cast<size_t>(j)] = gv[e];
      }
    }
  }

  // Numeric Jacobian by central differences, compared column by column.
  for (size_t k = 0; k < diff.size(); ++k) {
    const Tensor& x = inputs[diff[k]];
    std::vector<double> base = values_of(x);
    for (size_t e = 0; e < base.size(); ++e) {
      auto eval = [&](double delta) {
        std::vector<double> moved = base;
        moved[e] += delta;
        std::vector<Tensor> args = inputs;
        // Leaves that require grad, like the originals: fn may itself differentiate (first_derivative).
        args[diff[k]] =
            from_vector(moved, x.shape(), {.dtype = x.dtype(), .device = x.device(), .requires_grad = true});
        return values_of(fn(args));
      };
      const std::vector<double> plus = eval(o.eps), minus = eval(-o.eps);
      for (int64_t j = 0; j < n_out; ++j) {
        const double numeric = (plus[static_cast<size_t>(j)] - minus[static_cast<size_t>(j)]) / (2 * o.eps);
        const double a = analytic[k][e * static_cast<size_t>(n_out) + static_cast<size_t>(j)];
        if (!(std::fabs(a - numeric) <= o.atol + o.rtol * std::fabs(numeric))) {
          std::ostringstream os;
          os.precision(10);
          os << "input " << diff[k] << " element " << e << ", output element " << j << ": analytic " << a
             << " vs numeric " << numeric;
          return os.str();
        }
      }
    }
  }
  return "";
}

Fn first_derivative(const Fn& fn, size_t num_inputs) {
  return [fn, num_inputs](const std::vector<Tensor>& args) {
    const std::vector<Tensor> inputs(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(num_inputs));
    const Tensor& v = args[num_inputs];
    const Tensor out = fn(inputs);
    std::vector<Tensor> wrt;
    for (const Tensor& t : inputs)
      if (t.requires_grad()) wrt.push_back(t);
    const std::vector<Tensor> g = grad({out}, wrt, {v}, {.create_graph = true, .allow_unused = true});
    std::vector<Tensor> parts;
    for (size_t k = 0; k < g.size(); ++k) parts.push_back(reshape(g[k].defined() ? g[k] : zeros_like(wrt[k]), {-1}));
    return cat(parts, 0);
  };
}

std::string gradgradcheck(const Fn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& o) {
  const Tensor out = fn(fresh_leaves(inputs));  // for the shape of v
  std::vector<Tensor> args = inputs;
  args.push_back(randn(out.shape(), {.dtype = out.dtype(), .device = out.device()}));
  return gradcheck(first_derivative(fn, inputs.size()), args, o);
}

}  // namespace evenflow::testing
