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

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);

class Node;
class Tensor;
class DeviceContext;

struct Storage {
  Storage(Device device, size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Device device;
  DeviceContext* context = nullptr;  ///< cached: looking it up by Device takes a lock
  void* data = nullptr;
  size_t nbytes = 0;       ///< requested bytes
  size_t block_bytes = 0;  ///< bytes of the allocator block
  std::atomic<uint64_t> version{0};
};

struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = Device();
  bool requires_grad = false;
};

struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

  /// Metadata
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const;
  int64_t size(int64_t d) const;  ///< negative d counts from the end
  int64_t numel() const;
  int64_t offset() const;
  DType dtype() const;
  Device device() const;
  bool is_contiguous() const;
  std::string str() const;  ///< "Tensor[2, 3] float32 cpu:0"

  /// Raw data (device memory for CUDA tensors). data<T>() checks T against dtype.
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    EF_CHECK(dtype() == dtype_of<T>::value, "data<", dtype_name(dtype_of<T>::value), ">() on a ", dtype_name(dtype()),
             " tensor");
    return static_cast<T*>(data_ptr());
  }
  View view() const;
  const std::shared_ptr<Storage>& storage() const;
  uint64_t version() const;

  /// Values, copied to the host (synchronizes with the device).
  double item() const;
  std::vector<double> to_vector() const;
  std::vector<int64_t> to_int_vector() const;

  /// Autograd
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);  ///< only on leaves
  bool is_leaf() const;
  const std::shared_ptr<Node>& grad_fn() const;
  uint32_t output_nr() const;
  Tensor grad() const;                   ///< undefined until a backward pass reaches this leaf
  void set_grad(const Tensor& g) const;  ///< undefined g clears it
  /// A gradient flowing into this non-leaf tensor is kept in grad() too (PyTorch's retain_grad).
  Tensor& retain_grad();
  void backward(const Tensor& grad_output = Tensor(), bool retain_graph = false, bool create_graph = false) const;
  Tensor detach() const;  ///< shares storage, no autograd history

  /// Copies and conversions (differentiable)
  Tensor to(const Device& d) const;
  Tensor to(DType t) const;
  Tensor contiguous() const;
  Tensor clone() const;

  /// In-place (bump the version counter; refused on tensors that need grad while grad mode is on)
  const Tensor& zero_() const;
  const Tensor& fill_(double v) const;
  const Tensor& copy_(const Tensor& src) const;  ///< same shape (src broadcast), same device
  const Tensor& add_(const Tensor& other, double alpha = 1.0) const;
  const Tensor& mul_(double s) const;

  /// Shape and views (see ops.h for the full list)
  Tensor reshape(const Shape& s) const;
  Tensor view(const Shape& s) const;  ///< must not need a copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  ///< 2-D transpose
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor expand(const Shape& s) const;

  /// Reductions
  Tensor sum() const;
  Tensor sum(const Shape& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Shape& dims, bool keepdim = false) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  ///< in elements
  Shape shape;
  Shape strides;
  DType dtype = DType::Float32;

  /// Autograd. grad_fn is set on op outputs; grad_accumulator is the AccumulateGrad node of a leaf
  /// (weak: the node holds the leaf, see Note [Leaf accumulators] in autograd.cpp).
  bool requires_grad = false;
  bool retains_grad = false;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  std::mutex grad_mu;
  std::weak_ptr<Node> grad_accumulator;
  Tensor grad;
  /// Called (with the leaf) after backward() accumulated into grad, on the worker that did it; the
  /// data-parallel gradient buckets use it. Set it with set_post_accumulate_hook (autograd.h).
  std::function<void(const Tensor&)> post_accumulate_hook;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

/// Creation. Shapes may be empty (a 0-d scalar). rand/randn/bernoulli draw from the device's
/// generator (see manual_seed); CPU and CUDA draw the same numbers for the same state.
Tensor empty(const Shape& shape, const TensorOptions& opts = {});
Tensor zeros(const Shape& shape, const TensorOptions& opts = {});
Tensor ones(const Shape& shape, const TensorOptions& opts = {});
Tensor full(const Shape& shape, double value, const TensorOptions& opts = {});
Tensor arange(double start, double end, double step = 1.0, const TensorOptions& opts = {});
Tensor rand(const Shape& shape, const TensorOptions& opts = {});   ///< uniform [0, 1)
Tensor randn(const Shape& shape, const TensorOptions& opts = {});  ///< standard normal
Tensor uniform(const Shape& shape, double low, double high, const TensorOptions& opts = {});
Tensor bernoulli(const Shape& shape, double p, const TensorOptions& opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
/// A tensor holding `values` (row-major) with the given shape ({} and one value: a scalar).
Tensor from_vector(const std::vector<double>& values, const Shape& shape, const TensorOptions& opts = {});
Tensor from_int_vector(const std::vector<int64_t>& values, const Shape& shape, const Device& device = Device());
Tensor scalar_tensor(double value, const TensorOptions& opts = {});

/// Helpers shared by the ops
/// The element count of a shape that has passed checked_numel (unchecked: it may wrap otherwise).
int64_t numel_of(const Shape& s);
/// The element count of a shape from a caller, or an ef::Error naming `op` and the shape when a dim
/// is negative or the dims multiply past int64 (Note [Checked sizes] in tensor.cpp).
int64_t checked_numel(const Shape& s, const char* op);
Shape contiguous_strides(const Shape& s);
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);
/// A tensor over the same storage with new geometry (no copy, no autograd).
Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset);

}  // namespace evenflow
