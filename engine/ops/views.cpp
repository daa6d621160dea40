// Views and copies: reshape, permute, slice, expand, cat and split, pad; clone, layout, dtype and
// device copies. A view shares its input's storage; every backward is again a view or a copy.
#include "evenflow/engine/ops.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "evenflow/engine/ops_internal.h"

namespace evenflow {

using detail::backend_of;
using detail::Grads;

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

}  // namespace evenflow
