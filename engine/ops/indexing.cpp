// Indexing: gather, scatter_add, index_select and index_add (fused kernels, each differentiated by
// another of them), and check_index_range for data about to be used as indices.
#include "evenflow/engine/ops.h"

#include "evenflow/engine/ops_internal.h"

namespace evenflow {

using detail::backend_of;
using detail::Grads;

// --- Indexing ----------------------------------------------------------------------------------------------

static void check_gather_shapes(const char* op, const Tensor& x, int64_t d, const Tensor& index) {
  EF_CHECK(index.dim() == x.dim(), op, ": index has ", index.dim(), " dims, input has ", x.dim());
  for (int64_t i = 0; i < x.dim(); ++i)
    EF_CHECK(i == d || index.size(i) <= x.size(i), op, ": index shape ", shape_str(index.shape()),
             " is larger than input shape ", shape_str(x.shape()), " in dim ", i);
}

// The backward of gather, index_select and max pooling: scatter_add / index_add onto zeros, written
// straight into the new zero tensor (the general ops first copy their base: a pass over the whole
// input gradient). Differentiable in src, like the general ops; idx is contiguous and checked.
static Tensor scatter_add_into_zeros(const Shape& shape, int64_t d, const Tensor& idx, const Tensor& src) {
  Tensor y = zeros(shape, detail::options_of(src));
  if (src.numel() > 0) backend_of(src).scatter_add(y.view(), static_cast<int>(d), idx.view(), src.view());
  record("scatter_add", {y}, {src}, {}, [idx, d](const Grads& g) { return Grads{gather(g[0], d, idx)}; });
  return y;
}

static Tensor index_add_into_zeros(const Shape& shape, int64_t d, const Tensor& idx, const Tensor& src) {
  Tensor y = zeros(shape, detail::options_of(src));
  if (src.numel() > 0) backend_of(src).index_add(y.view(), static_cast<int>(d), idx.view(), src.view());
  record("index_add", {y}, {src}, {}, [idx, d](const Grads& g) { return Grads{index_select(g[0], d, idx)}; });
  return y;
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

}  // namespace evenflow
