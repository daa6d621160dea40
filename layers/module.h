/// @file
/// Module: the base of every layer. It owns a module's tensors and children, so that moving,
/// copying, saving and loading a model is written once here and never in a layer.
///
/// Note [Tensors live in the base]
/// Parameters and buffers are stored in this class, in insertion-ordered (name, Tensor) vectors, and
/// child modules in an ordered (name, module) vector. A layer holds only its configuration and
/// reads its tensors by name (param("weight")). `to(device)`, `clone()` and `assign()` replace
/// tensors in one place and every layer sees the new ones; `load_state_dict` copies values into
/// the existing storage instead, so optimizers holding the parameters keep seeing them. Names and
/// order follow PyTorch ("features.3.running_mean"; per module its parameters, then its buffers,
/// then its children), so state dicts are interchangeable with PyTorch's. Copying a layer object
/// (`Linear b = a`) copies handles, so both share tensors and children, as Python references do;
/// clone() is the deep copy. A subclass reaches its children by name too (child("head")), never
/// through its own shared_ptr members, which clone() would leave pointing at the original.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "evenflow/engine/ops.h"

namespace evenflow::nn {

/// Ordered (name, tensor) pairs: a state dict, a module's parameters, an optimizer's state.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// Where and in which type a layer creates its tensors.
struct ModuleOptions {
  DType dtype = kFloat32;    ///< the type of the parameters and floating-point buffers (float32)
  Device device = Device();  ///< the device they are created on (cpu:0)
  /// dtype and device as TensorOptions (requires_grad false), for creating a layer's tensors.
  TensorOptions tensor_options() const { return {.dtype = dtype, .device = device}; }
};

/// A pair of sizes (kernel, stride, padding, ...): `3` means {3, 3}. It remembers whether it was
/// given as one number, because PyTorch prints pooling arguments as they were given.
struct Size2 {
  /// @var h
  /// The height (along dim 2 of an [N, C, H, W] tensor).
  /// @var w
  /// The width (along dim 3).
  int64_t h = 0, w = 0;
  bool single = false;  ///< given as one number
  /// {0, 0}.
  Size2() = default;
  /// {both, both}, remembered as one number; implicit, so that `.stride = 2` works.
  Size2(int64_t both) : h(both), w(both), single(true) {}  // NOLINT(google-explicit-constructor): `.stride = 2`
  /// {h_, w_}.
  Size2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  /// {h, w}, the form the engine's ops take.
  std::pair<int64_t, int64_t> pair() const { return {h, w}; }
  std::string str() const;        ///< "3" when given as one number, else "(3, 3)"
  std::string tuple_str() const;  ///< "(3, 3)"
  /// Compares the sizes only (`3` equals `(3, 3)`).
  bool operator==(const Size2& o) const { return h == o.h && w == o.w; }
};

/// The base of every layer: it holds the parameters, buffers and child modules (Note [Tensors live in
/// the base] in module.h) and implements naming, state dicts, placement, copies and printing for all
/// of them. A layer derives from Cloneable and implements forward() and name(). Copy assignment is
/// deleted; copying a layer object shares its tensors and children, clone() is the deep copy.
/// A module has no locks: use each one from one thread at a time (DataParallelModel gives every
/// device its own clone).
class Module {
 public:
  virtual ~Module() = default;
  Module& operator=(const Module&) = delete;

  /// @name Running
  /// @{

  /// The module's output for input `x`; each layer says which inputs it takes and throws ef::Error
  /// on another. Differentiable with respect to `x` and the parameters unless the layer says not.
  virtual Tensor forward(const Tensor& x) = 0;
  /// forward(x).
  Tensor operator()(const Tensor& x) { return forward(x); }
  /// @}

  /// @name Description
  /// @{
  virtual std::string name() const = 0;                  ///< the class name, "Conv2d"
  virtual std::string extra_repr() const { return ""; }  ///< the arguments, "1, 8, kernel_size=(3, 3)"
  std::string repr() const;                              ///< the module tree, as PyTorch prints it
  /// @}

  /// @name Tensors and children (recursive, PyTorch's names and order)
  /// @{

  /// Every parameter of this module and its descendants with its dotted name ("0.weight"); the
  /// module's own tensors, not copies.
  NamedTensors named_parameters() const;
  /// Every buffer (running_mean, ...) of this module and its descendants with its dotted name.
  NamedTensors named_buffers() const;
  /// named_parameters() without the names: what an optimizer takes.
  std::vector<Tensor> parameters() const;
  /// named_buffers() without the names.
  std::vector<Tensor> buffers() const;
  /// The direct children, in registration order, with their names.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  /// This module ("") and every descendant, pre-order, with dotted names.
  std::vector<std::pair<std::string, Module*>> named_modules();
  /// The child called `name` (a direct child; dotted names reach deeper), or ef::Error.
  std::shared_ptr<Module> child(const std::string& name) const;
  /// Puts `module` in the place of the existing child `name` (dotted: a descendant).
  void replace_child(const std::string& name, std::shared_ptr<Module> module);
  /// The parameter or buffer with this dotted name, or ef::Error.
  Tensor tensor(const std::string& name) const;
  /// Rebinds the parameter or buffer `name` (dotted) to `value` without copying: the module uses that
  /// tensor from now on, even a non-leaf one (a functional call: gradients flow to what made it).
  /// Shape and dtype must match.
  void assign(const std::string& name, const Tensor& value);
  /// The number of parameter elements, this module's and its descendants'.
  int64_t num_parameters() const;
  /// @}

  /// @name State dict
  /// @{

  /// Parameters and buffers, detached, sharing storage with the module.
  NamedTensors state_dict() const;
  /// Copies the values of `sd` into the module's tensors (their storage, under NoGradGuard), moving
  /// them to each tensor's device. Every key is checked before anything is copied: a missing or
  /// unexpected key (when strict), or a wrong shape or dtype, raises ef::Error naming the key.
  void load_state_dict(const NamedTensors& sd, bool strict = true);
  /// @}

  /// @name Mode, placement, copies
  /// @{
  Module& train(bool on = true);  ///< this module and its descendants
  /// train(false): evaluation mode (Dropout is the identity, BatchNorm uses its running statistics).
  Module& eval() { return train(false); }
  /// Whether the module is in training mode (the default) rather than evaluation mode.
  bool is_training() const { return training_; }
  /// Moves every parameter and buffer (and gradient); parameters stay leaves that require grad.
  Module& to(const Device& device);
  /// Converts floating-point parameters and buffers (integer buffers such as num_batches_tracked stay).
  Module& to(DType dtype);
  /// The dtype the matrix products and convolutions of this module and its descendants compute in
  /// (Linear, Conv2d, ConvTranspose2d; Note [bfloat16 compute] in engine/ops.h): kBFloat16 for
  /// bfloat16 operands with float32 accumulation (float32 parameters), kFloat32 (the default) for
  /// the parameters' own dtype. The parameters, their gradients and everything else stay as they are.
  Module& set_compute_dtype(DType compute);
  /// This module's setting of set_compute_dtype (kFloat32 unless set).
  DType compute_dtype() const { return compute_dtype_; }
  /// A deep copy: same configuration and values, new storage, no gradients.
  std::shared_ptr<Module> clone() const;
  /// Clears every parameter's gradient (set_to_none) or zeroes it in place.
  void zero_grad(bool set_to_none = true);
  /// @}

 protected:
  Module() = default;
  Module(const Module&) = default;  ///< shallow; clone() deep-copies after clone_impl()

  /// A copy of the most-derived object sharing tensors and children (see Cloneable).
  virtual std::shared_ptr<Module> clone_impl() const = 0;

  /// @name Registration
  /// Registration, in the order PyTorch registers (it decides the state dict's order). A name is
  /// non-empty, has no '.' and is not taken (ef::Error otherwise).
  /// @{

  /// Adds a parameter: `value` must be a defined leaf (no op produced it; ef::Error otherwise), and
  /// requires grad from then on.
  void register_parameter(const std::string& name, Tensor value);
  /// Adds a buffer: state that is saved and moved with the module but not trained (running_mean).
  void register_buffer(const std::string& name, Tensor value);
  /// Adds a child module (not null); its tensors appear under "name.".
  void register_module(const std::string& name, std::shared_ptr<Module> module);
  /// @}

  /// @name A layer's own tensors by name
  /// A layer's own tensors by name: param/buffer raise an internal error when absent;
  /// optional_param returns an undefined tensor (a layer built without bias).
  /// @{
  const Tensor& param(const std::string& name) const;    ///< the parameter `name`
  const Tensor& buffer(const std::string& name) const;   ///< the buffer `name`
  Tensor optional_param(const std::string& name) const;  ///< the parameter `name`, or undefined
  /// @}

  /// Raises ef::Error naming the layer when x's dtype or device differs from its parameters'.
  void check_input_matches_params(const Tensor& x) const;

 private:
  /// Calls f(dotted name, module) on m and its descendants, pre-order (M: Module or const Module).
  template <typename M, typename F>
  static void visit(M& m, const std::string& prefix, F&& f);
  template <typename M>
  static M& owner_of(M& root, const std::string& name, std::string* last);
  template <typename M>
  static auto find_tensor(M& root, const std::string& name) -> decltype(&root.params_.front().second);
  void repr_into(std::string& out, int indent) const;

  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  DType compute_dtype_ = kFloat32;
};

/// Writes m.repr(), the module tree as PyTorch prints it.
std::ostream& operator<<(std::ostream& os, const Module& m);

/// Implements clone_impl() for a layer by copy-constructing it: `class Linear : public Cloneable<Linear>`.
/// Base is Module or a shared layer base (BatchNorm2d : Cloneable<BatchNorm2d, BatchNorm>).
template <typename Derived, typename Base = Module>
class Cloneable : public Base {
 protected:
  using Base::Base;

  /// A copy-constructed Derived: it shares tensors and children with this one until clone() replaces
  /// them with copies.
  std::shared_ptr<Module> clone_impl() const override {
    return std::make_shared<Derived>(static_cast<const Derived&>(*this));
  }
};

/// A clone of `m` with its static type: `std::shared_ptr<Linear> copy = nn::clone(linear)`.
template <typename M>
std::shared_ptr<M> clone(const M& m) {
  return std::static_pointer_cast<M>(m.clone());
}

/// Helpers for writing layers: PyTorch-style printing and the argument checks the layers share.
namespace util {
/// @name Python's repr
/// Python's repr of a float ("1e-05", "0.1", "2.0") and of a tuple of ints ("(5,)", "(3, 4)"), so
/// that a module prints as it does in PyTorch.
/// @{
std::string py_float(double v);        ///< "1e-05", "0.1", "2.0", "nan", "-inf"
std::string py_tuple(const Shape& s);  ///< "(5,)", "(3, 4)", "()"
/// "True" or "False".
inline const char* py_bool(bool b) {
  return b ? "True" : "False";
}
/// @}
/// @name Shared argument checks
/// Throws ef::Error "<layer>: <what> must be positive, got <value>" etc. (shared argument checks).
/// @{
void check_positive(const char* layer, const char* what, int64_t value);           ///< value > 0
void check_positive(const char* layer, const char* what, const Size2& value);      ///< both sizes > 0
void check_non_negative(const char* layer, const char* what, const Size2& value);  ///< both sizes >= 0
/// @}
/// Throws ef::Error when x is undefined or has fewer than min_dim or more than max_dim dims (-1: no limit).
void check_input_dims(const char* layer, const Tensor& x, int64_t min_dim, int64_t max_dim = -1);
}  // namespace util

}  // namespace evenflow::nn
