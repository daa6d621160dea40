/// @file
/// Autograd: nodes, grad mode, and the engine behind backward() and grad().
///
/// Every op that sees an input requiring grad (with grad mode on) records a Node holding a backward
/// closure written in differentiable ops. The engine runs each node on its device's worker thread,
/// with grad mode set to create_graph, so the gradients it returns were themselves recorded and can
/// be differentiated again, to any order. Parts of one backward pass on different devices run
/// concurrently.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "evenflow/engine/tensor.h"

namespace evenflow {

/// Thread-local switch: while off, ops record nothing.
bool grad_enabled();
/// Sets this thread's grad mode for its lifetime and restores the previous mode when destroyed.
/// Other threads (the device workers running a backward pass among them) are not affected.
class GradModeGuard {
 public:
  /// Turns grad mode on (`enabled` = true) or off for the current thread.
  explicit GradModeGuard(bool enabled);
  /// Restores the mode the thread had at construction.
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};
/// Turns grad mode off for its lifetime on this thread: ops record nothing (PyTorch's no_grad).
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

/// Where a gradient goes: the node that consumes it and which of that node's outputs it is for.
struct Edge {
  std::shared_ptr<Node> fn;  ///< null: the input needs no gradient
  uint32_t input_nr = 0;     ///< which output of fn the gradient belongs to
};

/// Gradients of a node's outputs in, gradients of its inputs out (one per input; undefined = none).
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

/// Shape, dtype and device of one output of a node: what the engine needs to make a zero gradient
/// for an output that received none.
struct OutputInfo {
  Shape shape;                   ///< The output's shape.
  DType dtype = DType::Float32;  ///< The output's dtype.
  Device device;                 ///< The output's device.
};

/// One recorded op in the autograd graph (PyTorch's Function): its backward closure, the tensors
/// the closure saved, and one Edge per input to the nodes that produced them. Created by record()
/// (grad_accumulator() for leaves); tensors hold their producing node through grad_fn(), and a node
/// holds the nodes below it through its edges, so a graph lives while an output refers to it. The
/// engine runs apply() on device()'s worker thread, or on the calling thread for a pass wholly on
/// one CPU device started before any CPU worker exists (Note [Backward on the calling thread] in
/// autograd.cpp).
class Node {
 public:
  /// A node named `name` (kept as a pointer: a string literal), run on `device`, with one edge per
  /// input, one OutputInfo per output, the tensors `fn` captured (their versions are recorded now,
  /// see apply()) and the backward closure.
  Node(const char* name, Device device, std::vector<Edge> next, std::vector<OutputInfo> outputs,
       std::vector<Tensor> saved, BackwardFn fn);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const char* name() const { return name_; }  ///< The op's name, as error messages print it ("matmul").
  Device device() const { return device_; }   ///< The device of its outputs, where its backward runs.
  const std::vector<Edge>& next_edges() const { return next_; }        ///< One per input, in order.
  const std::vector<OutputInfo>& outputs() const { return outputs_; }  ///< One per output, in order.

  /// Checks saved tensors are unmodified, then runs the closure. Throws ef::Error naming the node
  /// if a saved tensor was modified in place since recording, or if release() has run. grads holds
  /// one defined tensor per output: the engine materializes zeros for outputs that received none,
  /// unless accept_missing_grads() was called (then such an output's tensor is undefined).
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grads);
  /// Drops the closure and saved tensors (backward without retain_graph).
  virtual void release();

  /// Non-leaf tensors that asked for retain_grad(), per output.
  std::vector<std::weak_ptr<TensorImpl>> retained;

  /// Marks this node's backward as a collective (comm_ops.h's all_reduce): a pass runs the
  /// collectives of each device in reverse order of creation (Note [Collectives in backward]).
  void mark_collective() { collective_ = true; }
  bool collective() const { return collective_; }  ///< Whether mark_collective() was called.
  /// Lets apply() receive an undefined tensor for an output no gradient reached, where the engine
  /// would fill one with zeros (a kernel each): for a closure that reads a missing gradient as zero
  /// (a normalization's first-order gradients, of which a penalty's double backward reaches only
  /// the input's). Outputs that grad() captures or retain_grad() keeps still get zeros.
  void accept_missing_grads() { materialize_grads_ = false; }
  bool materializes_grads() const { return materialize_grads_; }  ///< Unless accept_missing_grads() was called.
  /// The order nodes were created in, process-wide (increasing).
  uint64_t sequence_nr() const { return sequence_nr_; }

 protected:
  const char* name_;                      ///< See name().
  Device device_;                         ///< See device().
  std::vector<Edge> next_;                ///< See next_edges().
  std::vector<OutputInfo> outputs_;       ///< See outputs().
  std::vector<Tensor> saved_;             ///< The tensors the closure captured (cleared by release()).
  std::vector<uint64_t> saved_versions_;  ///< Their versions when the node was made.
  BackwardFn fn_;                         ///< The backward closure (null after release()).
  bool released_ = false;                 ///< Set by release(): apply() then throws.
  bool collective_ = false;               ///< See collective().
  bool materialize_grads_ = true;         ///< See materializes_grads().
  uint64_t sequence_nr_;                  ///< See sequence_nr().
};

/// Attaches a node named `name` to `outputs` if grad mode is on and any input requires grad.
/// `saved` lists the tensors the closure captured: modifying one in place before backward is an
/// error. Capture inputs, never outputs (an output refers to this node: a reference cycle).
/// `name` is kept as a pointer (pass a string literal). Undefined inputs are allowed (no edge).
void record(const char* name, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
            const std::vector<Tensor>& saved, BackwardFn fn);
/// True if any defined tensor of `inputs` requires grad (grad mode is not consulted).
bool any_requires_grad(const std::vector<Tensor>& inputs);
/// The AccumulateGrad node of a leaf that requires grad (created on first use).
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf);
/// Runs hook(leaf) each time backward() has accumulated a gradient into leaf.grad(), on the worker
/// thread that did it, after the accumulation (an empty hook removes it). An exception from the hook
/// fails the backward pass. grad() never calls it: it does not touch .grad().
void set_post_accumulate_hook(const Tensor& leaf, std::function<void(const Tensor&)> hook);
/// From inside a backward pass (a node or a hook, on any thread running the pass): runs `fn` on the
/// thread that started the pass, after its last node and before backward() or grad() returns
/// (PyTorch's queue_callback). An exception from it is thrown from backward(). Returns false, and
/// queues nothing, when no pass is running on this thread. The data-parallel gradient sync uses it
/// to have gradients synchronized when backward() returns.
bool queue_backward_callback(std::function<void()> fn);

/// From inside a backward closure (record()'s BackwardFn), on the thread running it: whether the
/// pass needs the gradient of the node's input `i`. False when the input has no edge (it does not
/// require grad) or when nothing below its edge leads to what grad() was asked for (a critic's
/// weights in grad(D(x), x)); backward() needs every edge. Outside a closure, true. A closure may
/// return an undefined tensor for an input that is not needed instead of computing it (Note
/// [Gradients nobody asked for] in autograd.cpp).
bool input_grad_needed(size_t i);

/// Options of grad().
struct GradOptions {
  /// Record the backward pass, so that the returned gradients can be differentiated again.
  bool create_graph = false;
  std::optional<bool> retain_graph = std::nullopt;  ///< keep the graph for another pass; default: create_graph
  /// Return an undefined tensor for an input the outputs do not depend on, instead of throwing.
  bool allow_unused = false;
};

/// True on a thread running a backward node of a pass that has already failed elsewhere (another
/// device's node threw). Code that waits for other devices inside a node (a collective) polls it,
/// so that it stops waiting for a partner that will never come.
bool backward_pass_failed();

/// Gradients of `outputs` with respect to `inputs`, without touching any .grad(). grad_outputs may
/// be empty when every output is a one-element tensor (its gradient is then 1). Returns one
/// gradient per input, in order. Throws ef::Error if inputs is empty, an input does not require
/// grad, an input is unused (unless opts.allow_unused; it then gets an undefined tensor), a
/// grad_outputs entry differs from its output in shape, dtype or device, or a node of the pass
/// throws.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, const GradOptions& opts = {});

/// Accumulates gradients of `outputs` into the .grad() of every leaf they depend on. With
/// create_graph=true a leaf's .grad() holds a graph that refers back to the leaf: a reference cycle
/// (as in PyTorch), so clear .grad() (set_grad(Tensor())) when done with it; grad() has no such cycle.
/// Without retain_graph (create_graph implies it) the graph's saved tensors are freed, and a second
/// pass through it throws. grad_outputs are as for grad().
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs = {},
              bool retain_graph = false, bool create_graph = false);

}  // namespace evenflow
