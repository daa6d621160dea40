#include "evenflow/engine/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>

#include "evenflow/engine/autograd.h"
#include "evenflow/engine/capture_internal.h"
#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/ops.h"

namespace evenflow {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Note [Checked sizes]
// A shape from a caller (or from a file) may have a negative dim, or dims whose product does not fit
// int64: unchecked, numel_of wraps, a tiny buffer is allocated for a huge tensor and the first
// kernel writes past it. So shapes are checked where they enter: empty(), through which every
// creation function and every op's output passes, checks the element count and the byte count;
// view/reshape and expand check the shapes they compute; the allocator refuses byte counts past
// int64. Zero-size dims are left out of the product, so that the strides (and byte strides) of an
// accepted shape fit int64 as well, even when it has no elements. Past these checks, numel_of,
// contiguous_strides and the kernels' index arithmetic cannot overflow.
namespace {
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// The product of the non-zero dims of a shape without negative dims, or -1 when it overflows int64.
int64_t extent_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d == 0) continue;
    if (n > kInt64Max / d) return -1;
    n *= d;
  }
  return n;
}
}  // namespace

int64_t checked_numel(const Shape& s, const char* op) {
  for (int64_t d : s) EF_CHECK(d >= 0, op, ": negative dimension in shape ", shape_str(s));
  const int64_t extent = extent_of(s);
  const bool has_zero = std::find(s.begin(), s.end(), int64_t{0}) != s.end();
  EF_CHECK(extent >= 0, op, ": shape ", shape_str(s), " has more elements than int64 can hold",
           has_zero ? " (not counting its zero-size dims, whose strides would overflow)" : "");
  return has_zero ? 0 : extent;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

Shape channels_last_strides(const Shape& s) {
  EF_ASSERT(s.size() == 4, "channels_last_strides: a 4-D shape is needed");
  const int64_t c = s[1], h = s[2], w = s[3];
  return {h * w * c, 1, w * c, c};
}

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  EF_CHECK(dim >= lo && dim <= hi, op, ": dim ", dim, " is out of range for a tensor with ", ndim, " dims (expected ",
           lo, "..", hi, ")");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Storage::Storage(Device d, size_t n) : device(d), context(&evenflow::context(d)), nbytes(n) {
  data = context->allocator().allocate(n, &block_bytes);
}

Storage::~Storage() {
  context->allocator().release(data, block_bytes);
}

// --- Tensor metadata ------------------------------------------------------------------------------

const Shape& Tensor::shape() const {
  return impl_->shape;
}
const Shape& Tensor::strides() const {
  return impl_->strides;
}
int64_t Tensor::dim() const {
  return static_cast<int64_t>(impl_->shape.size());
}
int64_t Tensor::size(int64_t d) const {
  EF_CHECK(dim() > 0, "size: a 0-d tensor has no dim ", d);
  return impl_->shape[static_cast<size_t>(normalize_dim(d, dim(), "size"))];
}
int64_t Tensor::numel() const {
  return numel_of(impl_->shape);
}
int64_t Tensor::offset() const {
  return impl_->offset;
}
DType Tensor::dtype() const {
  return impl_->dtype;
}
Device Tensor::device() const {
  return impl_->storage->device;
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  return impl_->storage;
}
uint64_t Tensor::version() const {
  return impl_->storage->version.load();
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t d = impl_->shape.size(); d-- > 0;) {
    if (impl_->shape[d] != 1 && impl_->strides[d] != expected) return false;
    expected *= impl_->shape[d];
  }
  return true;
}

bool Tensor::is_channels_last() const {
  return dim() == 4 && view().is_channels_last();
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor" + shape_str(shape()) + " " + dtype_name(dtype()) + " " + device().str();
}

void* Tensor::data_ptr() const {
  return static_cast<char*>(impl_->storage->data) + impl_->offset * static_cast<int64_t>(dtype_size(impl_->dtype));
}

View Tensor::view() const {
  EF_CHECK(dim() <= kMaxDims, "tensor with ", dim(), " dims: at most ", kMaxDims, " are supported");
  View v;
  v.data = data_ptr();
  v.dtype = dtype();
  v.ndim = static_cast<int>(dim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = impl_->shape[static_cast<size_t>(d)];
    v.strides[d] = impl_->strides[static_cast<size_t>(d)];
  }
  return v;
}

Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

// --- Values ------------------------------------------------------------------------------------

std::vector<double> Tensor::to_vector() const {
  detail::check_host_access(device());
  NoGradGuard no_grad;
  Tensor host = to(cpu()).to(kFloat64).contiguous();
  const double* p = host.data<double>();
  return std::vector<double>(p, p + host.numel());
}

std::vector<int64_t> Tensor::to_int_vector() const {
  detail::check_host_access(device());
  NoGradGuard no_grad;
  Tensor host = to(cpu()).to(kInt64).contiguous();
  const int64_t* p = host.data<int64_t>();
  return std::vector<int64_t>(p, p + host.numel());
}

double Tensor::item() const {
  EF_CHECK(numel() == 1, "item: expected a tensor with one element, got shape ", shape_str(shape()));
  return to_vector()[0];
}

// --- Autograd accessors ------------------------------------------------------------------------

bool Tensor::requires_grad() const {
  return impl_->requires_grad;
}

Tensor& Tensor::requires_grad_(bool on) {
  EF_CHECK(is_leaf(), "requires_grad_: only leaf tensors can change requires_grad (this one comes from ",
           impl_->grad_fn->name(), "); use detach() first");
  EF_CHECK(!on || is_floating(dtype()), "requires_grad_: only float tensors can require grad, got ",
           dtype_name(dtype()));
  impl_->requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const {
  return impl_->grad_fn == nullptr;
}
const std::shared_ptr<Node>& Tensor::grad_fn() const {
  return impl_->grad_fn;
}
uint32_t Tensor::output_nr() const {
  return impl_->output_nr;
}

Tensor Tensor::grad() const {
  std::lock_guard<std::mutex> lock(impl_->grad_mu);
  return impl_->grad;
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    EF_CHECK(g.shape() == shape(), "set_grad: gradient shape ", shape_str(g.shape()), " differs from tensor shape ",
             shape_str(shape()));
    EF_CHECK(g.device() == device(), "set_grad: gradient on ", g.device().str(), ", tensor on ", device().str());
    EF_CHECK(g.dtype() == dtype(), "set_grad: gradient is ", dtype_name(g.dtype()), ", tensor is ",
             dtype_name(dtype()));
  }
  std::lock_guard<std::mutex> lock(impl_->grad_mu);
  impl_->grad = g;
}

Tensor& Tensor::retain_grad() {
  EF_CHECK(requires_grad(), "retain_grad: the tensor does not require grad");
  if (is_leaf()) return *this;
  impl_->retains_grad = true;
  auto& slots = impl_->grad_fn->retained;
  if (slots.size() <= impl_->output_nr) slots.resize(impl_->output_nr + 1);
  slots[impl_->output_nr] = impl_;
  return *this;
}

void Tensor::backward(const Tensor& grad_output, bool retain_graph, bool create_graph) const {
  evenflow::backward({*this}, grad_output.defined() ? std::vector<Tensor>{grad_output} : std::vector<Tensor>{},
                     retain_graph, create_graph);
}

Tensor Tensor::detach() const {
  return make_view(*this, shape(), strides(), offset());
}

// --- Conversions and in-place ops (bodies in ops/views.cpp and ops/elementwise.cpp) -------------

Tensor Tensor::to(const Device& d) const {
  return evenflow::to_device(*this, d);
}
Tensor Tensor::to(DType t) const {
  return evenflow::to_dtype(*this, t);
}
Tensor Tensor::contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::Contiguous) return is_contiguous() ? *this : evenflow::clone(*this);
  return evenflow::contiguous(*this, format);
}
Tensor Tensor::clone() const {
  return evenflow::clone(*this);
}
const Tensor& Tensor::zero_() const {
  return fill_(0.0);
}
const Tensor& Tensor::fill_(double v) const {
  evenflow::fill_(*this, v);
  return *this;
}
const Tensor& Tensor::copy_(const Tensor& src) const {
  evenflow::copy_(*this, src);
  return *this;
}
const Tensor& Tensor::add_(const Tensor& other, double alpha) const {
  evenflow::add_(*this, other, alpha);
  return *this;
}
const Tensor& Tensor::add_(double s) const {
  evenflow::add_(*this, s);
  return *this;
}
const Tensor& Tensor::mul_(double s) const {
  evenflow::mul_(*this, s);
  return *this;
}

Tensor Tensor::reshape(const Shape& s) const {
  return evenflow::reshape(*this, s);
}
Tensor Tensor::view(const Shape& s) const {
  return evenflow::view(*this, s);
}
Tensor Tensor::flatten(int64_t a, int64_t b) const {
  return evenflow::flatten(*this, a, b);
}
Tensor Tensor::permute(const Shape& dims) const {
  return evenflow::permute(*this, dims);
}
Tensor Tensor::transpose(int64_t a, int64_t b) const {
  return evenflow::transpose(*this, a, b);
}
Tensor Tensor::t() const {
  EF_CHECK(dim() == 2, "t: expected a 2-D tensor, got shape ", shape_str(shape()));
  return evenflow::transpose(*this, 0, 1);
}
Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  return evenflow::slice(*this, d, start, end, step);
}
Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  return evenflow::narrow(*this, d, start, length);
}
Tensor Tensor::select(int64_t d, int64_t index) const {
  return evenflow::select(*this, d, index);
}
Tensor Tensor::unsqueeze(int64_t d) const {
  return evenflow::unsqueeze(*this, d);
}
Tensor Tensor::squeeze(int64_t d) const {
  return evenflow::squeeze(*this, d);
}
Tensor Tensor::expand(const Shape& s) const {
  return evenflow::expand(*this, s);
}
Tensor Tensor::sum() const {
  return evenflow::sum(*this);
}
Tensor Tensor::sum(const Shape& dims, bool keepdim) const {
  return evenflow::sum(*this, dims, keepdim);
}
Tensor Tensor::mean() const {
  return evenflow::mean(*this);
}
Tensor Tensor::mean(const Shape& dims, bool keepdim) const {
  return evenflow::mean(*this, dims, keepdim);
}

// --- Creation ------------------------------------------------------------------------------------

// empty() under the name of the creation function that called it, for its error messages.
static Tensor empty_for(const char* op, const Shape& shape, const TensorOptions& opts) {
  const int64_t n = checked_numel(shape, op);
  EF_CHECK(static_cast<int64_t>(shape.size()) <= kMaxDims, op, ": shape ", shape_str(shape), " has more than ",
           kMaxDims, " dims");
  // Byte offsets are int64 too (Note [Checked sizes]).
  const auto elem_bytes = static_cast<int64_t>(dtype_size(opts.dtype));
  EF_CHECK(extent_of(shape) <= kInt64Max / elem_bytes, op, ": shape ", shape_str(shape), " of ", dtype_name(opts.dtype),
           " has more bytes than int64 can hold (", elem_bytes, " bytes per element)");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(opts.device, static_cast<size_t>(n * elem_bytes));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = opts.dtype;
  Tensor t(std::move(impl));
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor empty(const Shape& shape, const TensorOptions& opts) {
  return empty_for("empty", shape, opts);
}

static Tensor filled(const char* op, const Shape& shape, double value, const TensorOptions& opts) {
  TensorOptions o = opts;
  o.requires_grad = false;
  Tensor t = empty_for(op, shape, o);
  if (t.numel() > 0) context(t.device()).backend().fill(t.view(), value);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor zeros(const Shape& shape, const TensorOptions& opts) {
  return filled("zeros", shape, 0.0, opts);
}
Tensor ones(const Shape& shape, const TensorOptions& opts) {
  return filled("ones", shape, 1.0, opts);
}
Tensor full(const Shape& shape, double value, const TensorOptions& opts) {
  return filled("full", shape, value, opts);
}
Tensor zeros_like(const Tensor& t) {
  return zeros(t.shape(), {.dtype = t.dtype(), .device = t.device()});
}
Tensor ones_like(const Tensor& t) {
  return ones(t.shape(), {.dtype = t.dtype(), .device = t.device()});
}
Tensor full_like(const Tensor& t, double v) {
  return full(t.shape(), v, {.dtype = t.dtype(), .device = t.device()});
}

Tensor arange(double start, double end, double step, const TensorOptions& opts) {
  EF_CHECK(step != 0, "arange: step must be non-zero");
  const double span = std::ceil((end - start) / step);
  // 2^63 as a double: converting a span at or past it (or infinite) to int64 is undefined.
  EF_CHECK(!(span >= 0x1p63), "arange: [", start, ", ", end, ") in steps of ", step,
           " has more elements than int64 can hold");
  const int64_t n = span > 0 ? static_cast<int64_t>(span) : 0;
  TensorOptions o = opts;
  o.requires_grad = false;
  Tensor t = empty_for("arange", {n}, o);
  if (n > 0) context(t.device()).backend().arange(t.view(), start, step);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

// `rows`: draw as rows [start, start + count) of a draw for `total` rows (Note [Random numbers per
// sample]); nullptr: a plain draw.
static Tensor random_tensor(const char* op, const Shape& shape, RandomKind kind, double a, double b,
                            const TensorOptions& opts, const BatchRows* rows = nullptr) {
  EF_CHECK(is_floating(opts.dtype), op, ": random tensors must be float32 or float64, got ", dtype_name(opts.dtype));
  TensorOptions o = opts;
  o.requires_grad = false;
  Tensor t = empty_for(op, shape, o);
  if (rows) {
    EF_CHECK(!shape.empty() && shape[0] == rows->count, op, ": shape ", shape_str(shape), " does not start with the ",
             rows->count, " rows this device holds of the batch (Note [Random numbers per sample])");
  }
  if (t.numel() > 0) {
    DeviceContext& ctx = context(t.device());
    const uint64_t per_row = rows ? static_cast<uint64_t>(t.numel() / rows->count) : 0;
    const uint64_t count = rows ? per_row * static_cast<uint64_t>(rows->total) : static_cast<uint64_t>(t.numel());
    const uint64_t first = rows ? per_row * static_cast<uint64_t>(rows->start) : 0;
    // In a recorded step the generator advances at each replay, and the kernel reads its key from
    // the step's scalars (Note [Step scalars] in step_graph.cpp).
    Generator& generator = ctx.generator();
    RandomKey key;
    key.in_device = static_cast<const uint64_t*>(
        detail::step_scalars(t.device(), 2 * sizeof(uint64_t), [&generator, count, first](void* out) {
          const GeneratorState s = generator.reserve(count);
          static_cast<uint64_t*>(out)[0] = s.seed;
          static_cast<uint64_t*>(out)[1] = s.offset + first;
        }));
    if (key.in_device == nullptr) {
      const GeneratorState s = generator.reserve(count);
      key.seed = s.seed;
      key.offset = s.offset + first;
    }
    ctx.backend().random(t.view(), kind, a, b, key);
  }
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

// The rows of the whole batch this thread's tensors hold, set by BatchRowsGuard for the duration of a
// rank's task (DataParallelModel, DataParallelCriterion): per thread because every rank's task runs
// on its own device's worker at once, each drawing for its own rows. nullptr: plain draws.
static thread_local const BatchRows* tls_batch_rows = nullptr;

BatchRowsGuard::BatchRowsGuard(const BatchRows& rows) : previous_(tls_batch_rows), rows_(rows) {
  EF_CHECK(rows.start >= 0 && rows.count > 0 && rows.start + rows.count <= rows.total, "BatchRows: rows ", rows.start,
           " to ", rows.start + rows.count, " do not fit a batch of ", rows.total);
  tls_batch_rows = &rows_;
}
BatchRowsGuard::~BatchRowsGuard() {
  tls_batch_rows = previous_;
}
const BatchRows* current_batch_rows() {
  return tls_batch_rows;
}

Tensor batch_rand(const Shape& shape, const TensorOptions& opts) {
  return random_tensor("batch_rand", shape, RandomKind::Uniform, 0, 1, opts, tls_batch_rows);
}
Tensor batch_randn(const Shape& shape, const TensorOptions& opts) {
  return random_tensor("batch_randn", shape, RandomKind::Normal, 0, 1, opts, tls_batch_rows);
}
Tensor batch_bernoulli(const Shape& shape, double p, const TensorOptions& opts) {
  EF_CHECK(p >= 0 && p <= 1, "batch_bernoulli: p must be in [0, 1], got ", p);
  return random_tensor("batch_bernoulli", shape, RandomKind::Bernoulli, p, 0, opts, tls_batch_rows);
}

Tensor rand(const Shape& shape, const TensorOptions& opts) {
  return random_tensor("rand", shape, RandomKind::Uniform, 0, 1, opts);
}
Tensor randn(const Shape& shape, const TensorOptions& opts) {
  return random_tensor("randn", shape, RandomKind::Normal, 0, 1, opts);
}
Tensor uniform(const Shape& shape, double low, double high, const TensorOptions& opts) {
  EF_CHECK(low <= high, "uniform: low ", low, " is greater than high ", high);
  return random_tensor("uniform", shape, RandomKind::Uniform, low, high, opts);
}
Tensor bernoulli(const Shape& shape, double p, const TensorOptions& opts) {
  EF_CHECK(p >= 0 && p <= 1, "bernoulli: p must be in [0, 1], got ", p);
  return random_tensor("bernoulli", shape, RandomKind::Bernoulli, p, 0, opts);
}

// Host values enter a recorded step only through its input buffers.
static void check_host_values(const char* op, const Device& d) {
  detail::check_not_recording(d, op,
                              "the host's values would be those of the step's recording at every replay; copy "
                              "them into the step's own buffers before replay()");
  detail::check_not_recording(cpu(), op, "the host's values would be those of the step's recording at every replay");
}

Tensor from_vector(const std::vector<double>& values, const Shape& shape, const TensorOptions& opts) {
  check_host_values("from_vector", opts.device);
  const int64_t n = checked_numel(shape, "from_vector");
  EF_CHECK(static_cast<int64_t>(values.size()) == n, "from_vector: ", values.size(), " values for shape ",
           shape_str(shape), " (", n, " elements)");
  Tensor host = empty_for("from_vector", shape, {.dtype = kFloat64, .device = cpu()});
  if (!values.empty()) std::memcpy(host.data_ptr(), values.data(), values.size() * sizeof(double));
  Tensor t = host.to(opts.dtype).to(opts.device);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor from_int_vector(const std::vector<int64_t>& values, const Shape& shape, const Device& device) {
  check_host_values("from_int_vector", device);
  const int64_t n = checked_numel(shape, "from_int_vector");
  EF_CHECK(static_cast<int64_t>(values.size()) == n, "from_int_vector: ", values.size(), " values for shape ",
           shape_str(shape), " (", n, " elements)");
  Tensor host = empty_for("from_int_vector", shape, {.dtype = kInt64, .device = cpu()});
  if (!values.empty()) std::memcpy(host.data_ptr(), values.data(), values.size() * sizeof(int64_t));
  return host.to(device);
}

Tensor scalar_tensor(double value, const TensorOptions& opts) {
  return filled("scalar_tensor", {}, value, opts);
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  os << t.str();
  if (!t.defined()) return os;
  const std::vector<double> v = t.to_vector();
  os << " {";
  const size_t shown = std::min<size_t>(v.size(), 20);
  for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << std::setprecision(6) << v[i];
  if (shown < v.size()) os << ", ...";
  return os << "}";
}

}  // namespace evenflow
