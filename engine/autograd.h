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
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

struct Edge {
  std::shared_ptr<Node> fn;  ///< null: the input needs no gradient
  uint32_t input_nr = 0;     ///< which output of fn the gradient belongs to
};

/// Gradients of a node's outputs in, gradients of its inputs out (one per input; undefined = none).
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

struct OutputInfo {
  Shape shape;
  DType dtype = DType::Float32;
  Device device;
};

class Node {
 public:
  Node(const char* name, Device device, std::vector<Edge> next, std::vector<OutputInfo> outputs,
       std::vector<Tensor> saved, BackwardFn fn);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const char* name() const { return name_; }
  Device device() const { return device_; }
  const std::vector<Edge>& next_edges() const { return next_; }
  const std::vector<OutputInfo>& outputs() const { return outputs_; }

  /// Checks saved tensors are unmodified, then runs the closure. grads holds one defined tensor
  /// per output (the engine materializes zeros for outputs that received none).
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grads);
  /// Drops the closure and saved tensors (backward without retain_graph).
  virtual void release();

  /// Non-leaf tensors that asked for retain_grad(), per output.
  std::vector<std::weak_ptr<TensorImpl>> retained;

 protected:
  const char* name_;
  Device device_;
  std::vector<Edge> next_;
  std::vector<OutputInfo> outputs_;
  std::vector<Tensor> saved_;
  std::vector<uint64_t> saved_versions_;
  BackwardFn fn_;
  bool released_ = false;
};

/// Attaches a node named `name` to `outputs` if grad mode is on and any input requires grad.
/// `saved` lists the tensors the closure captured: modifying one in place before backward is an
/// error. Capture inputs, never outputs (an output refers to this node: a reference cycle).
void record(const char* name, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
            const std::vector<Tensor>& saved, BackwardFn fn);
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

struct GradOptions {
  bool create_graph = false;
  std::optional<bool> retain_graph = std::nullopt;  ///< default: create_graph
  bool allow_unused = false;
};

/// True on a thread running a backward node of a pass that has already failed elsewhere (another
/// device's node threw). Code that waits for other devices inside a node (a collective) polls it,
/// so that it stops waiting for a partner that will never come.
bool backward_pass_failed();

/// Gradients of `outputs` with respect to `inputs`, without touching any .grad(). grad_outputs may
/// be empty when every output is a one-element tensor.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, const GradOptions& opts = {});

/// Accumulates gradients of `outputs` into the .grad() of every leaf they depend on. With
/// create_graph=true a leaf's .grad() holds a graph that refers back to the leaf: a reference cycle
/// (as in PyTorch), so clear .grad() (set_grad(Tensor())) when done with it; grad() has no such cycle.
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs = {},
              bool retain_graph = false, bool create_graph = false);

}  // namespace evenflow
