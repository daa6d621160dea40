/// @file
/// Tensor: a strided view of a device's storage, plus what autograd needs (requires_grad, the node
/// that produced it, the accumulated gradient). A Tensor is a shared handle: copies alias.
/// Views (reshape of a contiguous tensor, permute, transpose, slice, expand) share storage and its
/// version counter; in-place writes bump the counter, and autograd refuses to use a saved tensor
/// whose version changed (Note [Saved tensor versions] in autograd.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "evenflow/engine/backend.h"
#include "evenflow/engine/device.h"
#include "evenflow/engine/dtype.h"

namespace evenflow {

/// The sizes of a tensor's dims ({} for a 0-d scalar); also used for lists of dims and for strides.
using Shape = std::vector<int64_t>;

/// How a tensor's elements lie in memory (Note [Channels-last] in ops.h).
enum class MemoryFormat {
  Contiguous,    ///< row-major: the last dim's neighbours are adjacent
  ChannelsLast,  ///< a 4-D [N, C, H, W] tensor stored as [N, H, W, C]: a pixel's channels adjacent
};
/// A shape as text: "[2, 3]", or "[]" for a 0-d scalar.
std::string shape_str(const Shape& s);

class Node;
class Tensor;
class DeviceContext;

/// The memory behind a tensor and its views: one block of its device's caching allocator, given
/// back to the allocator's cache when the last tensor that uses it is destroyed.
struct Storage {
  /// Takes a block of at least `nbytes` from the allocator of `device`; its contents are not
  /// initialized. Throws ef::Error when the device does not exist or has no memory left.
  Storage(Device device, size_t nbytes);
  ~Storage();  ///< Returns the block to the allocator's cache.
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Device device;                     ///< The device that holds the memory.
  DeviceContext* context = nullptr;  ///< cached: looking it up by Device takes a lock
  void* data = nullptr;              ///< The block (device memory for a CUDA device).
  size_t nbytes = 0;                 ///< requested bytes
  size_t block_bytes = 0;            ///< bytes of the allocator block
  /// Bumped by every in-place write through a tensor over this storage (Note [Saved tensor
  /// versions] in autograd.cpp).
  std::atomic<uint64_t> version{0};
};

/// What a creation function makes, e.g. `{.dtype = kFloat64, .device = cuda(0)}`.
struct TensorOptions {
  DType dtype = DType::Float32;  ///< The element type.
  Device device = Device();      ///< The device (cpu:0 by default).
  /// Makes the result a leaf that requires grad (float dtypes only: ef::Error otherwise).
  bool requires_grad = false;
};

struct TensorImpl;

namespace detail {
// ef::Error when `d` is being recorded by a StepGraph: the host may not touch its memory then
// (Note [A step that can be replayed] in step_graph.h).
void check_host_access(const Device& d);
}  // namespace detail

/// A tensor: a shared handle to a TensorImpl (shape, strides, offset and dtype over a Storage, and
/// the autograd state). Copying a Tensor copies the handle, so copies alias: an in-place write or a
/// requires_grad_() through one is seen through all. A default-constructed Tensor is undefined: only
/// defined(), str(), impl(), impl_ptr() and same() may be called on it. The methods that run an op
/// are the ops of ops.h; they throw ef::Error naming the op when an argument is wrong.
class Tensor {
 public:
  Tensor() = default;  ///< An undefined tensor.
  /// Wraps an existing implementation (how the ops and make_view build their results).
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }                      ///< Whether it refers to a tensor.
  TensorImpl* impl() const { return impl_.get(); }                       ///< The state (null when undefined).
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }  ///< The state, shared.
  /// Whether both handles refer to the same TensorImpl (two views of one storage are not the same).
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

  /// @name Metadata
  /// @{
  const Shape& shape() const;    ///< The size of each dim ({} for a 0-d scalar).
  const Shape& strides() const;  ///< The step, in elements, between neighbours along each dim.
  int64_t dim() const;           ///< The number of dims.
  /// The size of dim `d`; negative d counts from the end. ef::Error when d is not in [-dim(), dim())
  /// (a 0-d tensor has no dim to ask about).
  int64_t size(int64_t d) const;
  int64_t numel() const;   ///< The number of elements (1 for a 0-d scalar).
  int64_t offset() const;  ///< Where element 0 is in the storage, in elements.
  DType dtype() const;     ///< The element type.
  Device device() const;   ///< The device of the storage.
  /// Whether the elements are laid out row-major without gaps (dims of size 1 may have any stride).
  bool is_contiguous() const;
  /// Whether this is a 4-D tensor with exactly the strides channels_last_strides() gives its shape
  /// (View::is_channels_last): what the ops take for a channels-last tensor (Note [Channels-last] in
  /// ops.h).
  bool is_channels_last() const;
  std::string str() const;  ///< "Tensor[2, 3] float32 cpu:0" ("Tensor(undefined)" for an undefined one)
  /// @}

  /// @name Raw data
  /// @{

  /// The address of element 0 (the storage's block plus offset()): device memory for a CUDA tensor.
  void* data_ptr() const;
  /// The address of element 0 of a CPU tensor as a `T*` (float, double or int64_t), for the host to
  /// read and write. ef::Error when T is not the dtype, or when the tensor is on a CUDA device (its
  /// memory is not the host's: copy it with .to(cpu()) first, or take data_ptr()).
  template <typename T>
  T* data() const {
    EF_CHECK(dtype() == dtype_of<T>::value, "data<", dtype_name(dtype_of<T>::value), ">() on a ", dtype_name(dtype()),
             " tensor");
    EF_CHECK(device().is_cpu(), "data<", dtype_name(dtype()), ">() on a tensor of ", device().str(),
             ": the host cannot read device memory (.to(cpu()) first, or data_ptr() for the device address)");
    detail::check_host_access(device());
    return static_cast<T*>(data_ptr());
  }
  /// The address, dtype, shape and strides as the backends take them (ef::Error past kMaxDims dims).
  View view() const;
  const std::shared_ptr<Storage>& storage() const;  ///< The storage this tensor views.
  uint64_t version() const;                         ///< The storage's version counter (Storage::version).
  /// @}

  /// @name Values
  /// Copied to the host (synchronizes with the device).
  /// @{
  double item() const;                    ///< The only value (ef::Error unless numel() is 1).
  std::vector<double> to_vector() const;  ///< Every value as a double, in row-major order.
  /// Every value converted to int64 (floats truncated toward zero), in row-major order.
  std::vector<int64_t> to_int_vector() const;
  /// @}

  /// @name Autograd
  /// @{

  /// Whether gradients flow to this tensor: set on a leaf with requires_grad_(), and on an op's
  /// output when grad mode is on and an input requires grad.
  bool requires_grad() const;
  /// Sets requires_grad; only on leaves (ef::Error on an op's output: detach() it first), and only
  /// float tensors can require grad. Returns *this.
  Tensor& requires_grad_(bool on = true);
  /// Whether no recorded op produced this tensor (grad_fn() is null). A tensor created by a creation
  /// function, by detach(), or by an op while grad mode was off or with no input requiring grad is a
  /// leaf.
  bool is_leaf() const;
  const std::shared_ptr<Node>& grad_fn() const;  ///< The node of the op that produced it; null for a leaf.
  uint32_t output_nr() const;                    ///< Which output of grad_fn() this tensor is.
  /// The accumulated gradient; undefined until a backward pass reaches this leaf (or this non-leaf,
  /// after retain_grad()). Safe to call while another thread runs backward().
  Tensor grad() const;
  /// Replaces grad(); an undefined g clears it. A defined g must have this tensor's shape, device
  /// and dtype (ef::Error otherwise).
  void set_grad(const Tensor& g) const;
  /// A gradient flowing into this non-leaf tensor is kept in grad() too (PyTorch's retain_grad).
  /// Nothing to do on a leaf; ef::Error when the tensor does not require grad. Returns *this.
  Tensor& retain_grad();
  /// Accumulates the gradient of this tensor into the grad() of every leaf it depends on:
  /// evenflow::backward({*this}, {grad_output}, retain_graph, create_graph) (autograd.h).
  /// Throws ef::Error when the tensor does not require grad, or when a saved tensor was modified in
  /// place or freed by an earlier pass.
  /// @param grad_output the gradient of this tensor, same shape, dtype and device; may be left
  ///   undefined only when the tensor has one element (the gradient is then 1).
  /// @param retain_graph keep the graph's saved tensors for another backward pass through it.
  /// @param create_graph record the backward pass so the gradients can be differentiated again
  ///   (implies retain_graph).
  void backward(const Tensor& grad_output = Tensor(), bool retain_graph = false, bool create_graph = false) const;
  Tensor detach() const;  ///< shares storage, no autograd history
  /// @}

  /// @name Copies and conversions
  /// Differentiable: the gradient is converted back to this tensor's device or dtype.
  /// @{

  /// A copy on device `d`, or this tensor itself when it is already there (ef::Error for a device
  /// that does not exist).
  Tensor to(const Device& d) const;
  /// A copy converted to dtype `t` (float to int64 truncates toward zero), or this tensor itself when
  /// it already is `t`. Only a float-to-float conversion records autograd history.
  Tensor to(DType t) const;
  /// This tensor if is_contiguous(), else a contiguous copy (clone()). With ChannelsLast: this tensor
  /// if is_channels_last(), else a view or copy that is (ops.h contiguous(x, format)).
  Tensor contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  Tensor clone() const;  ///< A copy in new, contiguous storage (the gradient passes through).
  /// @}

  /// @name In-place
  /// These bump the version counter and are refused on tensors that need grad while grad mode is on.
  /// Not differentiable. Each returns *this.
  /// @{
  const Tensor& zero_() const;                   ///< Sets every element to 0.
  const Tensor& fill_(double v) const;           ///< Sets every element to `v` (converted to the dtype).
  const Tensor& copy_(const Tensor& src) const;  ///< same shape (src broadcast), same device
  /// Adds alpha·other: other has this tensor's dtype and device and broadcasts to its shape.
  const Tensor& add_(const Tensor& other, double alpha = 1.0) const;
  const Tensor& add_(double s) const;  ///< Adds `s` to every element (int64 tensors: `s` integral).
  const Tensor& mul_(double s) const;  ///< Multiplies every element by `s` (float tensors only).
  /// @}

  /// @name Shape and views
  /// See ops.h for the full list. Dims may be negative, counting from the end.
  /// A view shares this tensor's storage (and version counter): no copy is made.
  /// @{

  /// This tensor with shape `s`, in which one dim may be -1 (inferred from the element count): a
  /// view when this tensor is contiguous, else a copy; this tensor itself when `s` is its shape.
  Tensor reshape(const Shape& s) const;
  Tensor view(const Shape& s) const;  ///< must not need a copy
  /// Dims `start_dim` to `end_dim` (inclusive) merged into one, by reshape(); a 0-d tensor gives [1].
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  /// A view whose dim i is dim dims[i] of this tensor; dims lists every dim once.
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;  ///< A view with dims d0 and d1 swapped.
  Tensor t() const;                                ///< 2-D transpose
  /// A view of positions start, start + step, ... before end along `dim`. Negative start and end
  /// count from the end and out-of-range ones are clamped (as in Python); step must be positive.
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  /// A view of `length` positions from `start` along `dim` (a negative start counts from the end);
  /// ef::Error when they do not fit.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  /// A view of position `index` along `dim`, without that dim (a negative index counts from the end).
  Tensor select(int64_t dim, int64_t index) const;
  /// A view with a new dim of size 1 at position `dim`, which may be 0 to dim() (or -dim()-1 to -1).
  Tensor unsqueeze(int64_t dim) const;
  /// A view without dim `dim` when its size is 1; otherwise this tensor itself.
  Tensor squeeze(int64_t dim) const;
  /// A view that repeats size-1 dims (and adds leading dims) to reach shape `s`, with stride 0, no
  /// copy; -1 in `s` keeps a dim. Gradient: g summed back to this tensor's shape.
  Tensor expand(const Shape& s) const;
  /// @}

  /// @name Reductions
  /// Float tensors only. `dims` may be negative; empty `dims` means every dim. keepdim keeps
  /// the reduced dims with size 1. Gradient: g expanded back (divided by the count for the means).
  /// @{
  Tensor sum() const;                                         ///< The sum of every element, 0-d.
  Tensor sum(const Shape& dims, bool keepdim = false) const;  ///< The sums over `dims`.
  Tensor mean() const;  ///< The mean of every element, 0-d (ef::Error for an empty tensor).
  /// The means over `dims` (ef::Error when a reduced dim is empty).
  Tensor mean(const Shape& dims, bool keepdim = false) const;
  /// @}

 private:
  std::shared_ptr<TensorImpl> impl_;
};

/// The state a Tensor handle shares: the geometry over a Storage, the dtype and the autograd state.
/// The ops and the autograd engine read and write it; programs use Tensor's methods.
struct TensorImpl {
  std::shared_ptr<Storage> storage;  ///< The memory viewed (shared with other views).
  int64_t offset = 0;                ///< in elements
  Shape shape;                       ///< The size of each dim.
  Shape strides;                     ///< The step, in elements, between neighbours along each dim.
  DType dtype = DType::Float32;      ///< The element type.

  /// @name Autograd
  /// grad_fn is set on op outputs; grad_accumulator is the AccumulateGrad node of a leaf
  /// (weak: the node holds the leaf, see Note [Leaf accumulators] in autograd.cpp).
  /// @{
  bool requires_grad = false;            ///< See Tensor::requires_grad().
  bool retains_grad = false;             ///< Set by Tensor::retain_grad() on a non-leaf.
  std::shared_ptr<Node> grad_fn;         ///< The node that produced this tensor; null for a leaf.
  uint32_t output_nr = 0;                ///< Which output of grad_fn this tensor is.
  std::mutex grad_mu;                    ///< Guards grad.
  std::weak_ptr<Node> grad_accumulator;  ///< Expired until grad_accumulator() (autograd.h) makes it.
  Tensor grad;                           ///< The accumulated gradient (read it under grad_mu).
  /// Called (with the leaf) after backward() accumulated into grad, on the worker that did it; the
  /// data-parallel gradient buckets use it. Set it with set_post_accumulate_hook (autograd.h).
  std::function<void(const Tensor&)> post_accumulate_hook;
  /// @}
};

/// Writes str() and, for a defined tensor, its first 20 values (6 significant digits, "..." after
/// them when there are more), copied to the host.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

/// @name Creation
/// Shapes may be empty (a 0-d scalar). rand/randn/bernoulli draw from the device's
/// generator (see manual_seed); CPU and CUDA draw the same numbers for the same state.
/// A shape with a negative dim, more than kMaxDims (8) dims or more elements or bytes than int64
/// can hold is an ef::Error naming the function. With opts.requires_grad the result is a leaf
/// that requires grad (float dtypes only).
/// @{

/// A contiguous tensor whose values are not initialized.
Tensor empty(const Shape& shape, const TensorOptions& opts = {});
Tensor zeros(const Shape& shape, const TensorOptions& opts = {});  ///< Filled with 0.
Tensor ones(const Shape& shape, const TensorOptions& opts = {});   ///< Filled with 1.
/// Filled with `value` (converted to the dtype).
Tensor full(const Shape& shape, double value, const TensorOptions& opts = {});
/// 1-D: start, start + step, ... up to but not including end, ceil((end - start) / step) values
/// (none when that is not positive); step must be non-zero.
Tensor arange(double start, double end, double step = 1.0, const TensorOptions& opts = {});
Tensor rand(const Shape& shape, const TensorOptions& opts = {});   ///< uniform [0, 1)
Tensor randn(const Shape& shape, const TensorOptions& opts = {});  ///< standard normal
/// Uniform in [low, high) (ef::Error when low > high); float dtypes only, as rand and randn.
Tensor uniform(const Shape& shape, double low, double high, const TensorOptions& opts = {});
/// 1 with probability p, else 0; p in [0, 1]; float dtypes only.
Tensor bernoulli(const Shape& shape, double p, const TensorOptions& opts = {});
/// Zeros with t's shape, dtype and device (not requiring grad).
Tensor zeros_like(const Tensor& t);
/// Ones with t's shape, dtype and device (not requiring grad).
Tensor ones_like(const Tensor& t);
/// `value` with t's shape, dtype and device (not requiring grad).
Tensor full_like(const Tensor& t, double value);
/// A tensor holding `values` (row-major) with the given shape ({} and one value: a scalar).
/// The values are converted to opts.dtype; ef::Error when their number is not the shape's.
Tensor from_vector(const std::vector<double>& values, const Shape& shape, const TensorOptions& opts = {});
/// An int64 tensor on `device` holding `values` (row-major) with the given shape, as from_vector.
Tensor from_int_vector(const std::vector<int64_t>& values, const Shape& shape, const Device& device = Device());
/// @}

/// @name Random numbers per sample
/// Note [Random numbers per sample]
/// Data parallelism must not change what a sample sees: N devices (of one process or several) must
/// compute what one device computes on the whole batch, dropout included. So a draw for a batch
/// (dropout's mask, a gradient penalty's interpolation weights) gives row i of the batch the
/// numbers row i gets when one device draws for the whole batch, whichever device holds it: the
/// thread's BatchRows say which rows of the whole batch it holds, and every device reserves the
/// whole batch's count from its generator, so all of them advance alike. DeviceGroup::run starts
/// every rank at rank 0's generator state, and DataParallelModel and DataParallelCriterion set each
/// rank's BatchRows. Off a group (one device, no BatchRows), a batch draw is the plain draw.
/// @{

/// Which rows of a whole batch (dim 0) this thread's tensors hold.
struct BatchRows {
  int64_t start = 0;  ///< The first of them, in the whole batch.
  int64_t count = 0;  ///< How many.
  int64_t total = 0;  ///< The whole batch's rows (over every device of every process).
};
/// Sets this thread's BatchRows for its lifetime (restoring the previous ones after).
class BatchRowsGuard {
 public:
  /// Sets `rows` as this thread's. ef::Error unless 0 ≤ start, 0 < count and start + count ≤ total.
  explicit BatchRowsGuard(const BatchRows& rows);
  /// Restores the rows that were set before.
  ~BatchRowsGuard();
  BatchRowsGuard(const BatchRowsGuard&) = delete;
  BatchRowsGuard& operator=(const BatchRowsGuard&) = delete;

 private:
  const BatchRows* previous_;
  BatchRows rows_;
};
/// This thread's BatchRows, or nullptr when none is set.
const BatchRows* current_batch_rows();

/// As rand, for a tensor whose dim 0 is the batch: row i holds the numbers of row start + i of the
/// whole batch's draw. With BatchRows set, shape[0] must be their count (ef::Error otherwise).
Tensor batch_rand(const Shape& shape, const TensorOptions& opts = {});
/// As randn, per sample (batch_rand's rules).
Tensor batch_randn(const Shape& shape, const TensorOptions& opts = {});
/// As bernoulli, per sample (batch_rand's rules).
Tensor batch_bernoulli(const Shape& shape, double p, const TensorOptions& opts = {});
/// @}

/// @name Creation (continued)
/// @{

/// A 0-d tensor holding `value`.
Tensor scalar_tensor(double value, const TensorOptions& opts = {});
/// @}

/// @name Helpers shared by the ops
/// @{

/// The element count of a shape that has passed checked_numel (unchecked: it may wrap otherwise).
int64_t numel_of(const Shape& s);
/// The element count of a shape from a caller, or an ef::Error naming `op` and the shape when a dim
/// is negative or the dims multiply past int64 (Note [Checked sizes] in tensor.cpp).
int64_t checked_numel(const Shape& s, const char* op);
/// The strides of a contiguous, row-major tensor of shape `s` (the last dim's is 1).
Shape contiguous_strides(const Shape& s);
/// The strides of a channels-last tensor of 4-D shape `s` = [N, C, H, W]: [H·W·C, 1, W·C, C].
Shape channels_last_strides(const Shape& s);
/// `dim` made non-negative for a tensor with `ndim` dims: -ndim to ndim - 1 are accepted (-1 and 0
/// when ndim is 0, both giving 0); anything else is an ef::Error naming `op`.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);
/// A tensor over the same storage with new geometry (no copy, no autograd).
Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset);
/// @}

}  // namespace evenflow
