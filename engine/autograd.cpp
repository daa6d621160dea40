#include "evenflow/engine/autograd.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/ops.h"
#include "evenflow/engine/ops_internal.h"

namespace evenflow {

namespace {
// Grad mode, per thread as in PyTorch: a NoGradGuard on one thread leaves the others recording.
// DeviceGroup::run and the backward engine carry the caller's mode to the workers that run its tasks.
thread_local bool tls_grad_enabled = true;
}  // namespace

bool grad_enabled() {
  return tls_grad_enabled;
}
GradModeGuard::GradModeGuard(bool enabled) : previous_(tls_grad_enabled) {
  tls_grad_enabled = enabled;
}
GradModeGuard::~GradModeGuard() {
  tls_grad_enabled = previous_;
}

// --- Nodes -----------------------------------------------------------------------------------------

Node::Node(const char* name, Device device, std::vector<Edge> next, std::vector<OutputInfo> outputs,
           std::vector<Tensor> saved, BackwardFn fn)
    : name_(name),
      device_(device),
      next_(std::move(next)),
      outputs_(std::move(outputs)),
      saved_(std::move(saved)),
      fn_(std::move(fn)) {
  static std::atomic<uint64_t> next_sequence_nr{0};
  sequence_nr_ = next_sequence_nr.fetch_add(1, std::memory_order_relaxed);
  saved_versions_.reserve(saved_.size());
  for (const Tensor& t : saved_) saved_versions_.push_back(t.version());
}

// Note [Saved tensor versions]
// Views share their storage's version counter and every in-place op bumps it. A node remembers the
// versions of the tensors its closure captured; if one changed before backward, the gradient
// would silently use the new values, so we refuse and name the op and both versions.
std::vector<Tensor> Node::apply(const std::vector<Tensor>& grads) {
  EF_CHECK(!released_, name_,
           ": backward through the graph a second time, after its saved tensors were freed; "
           "pass retain_graph=true to the first backward or grad call");
  for (size_t i = 0; i < saved_.size(); ++i) {
    EF_CHECK(saved_[i].version() == saved_versions_[i], name_, ": a tensor saved for backward (", saved_[i].str(),
             ") was modified in place: it is at version ", saved_[i].version(), ", the graph expects version ",
             saved_versions_[i]);
  }
  return fn_(grads);
}

void Node::release() {
  released_ = true;
  fn_ = nullptr;
  saved_.clear();
  saved_versions_.clear();
}

// Note [Gradient layout]
// A tensor's accumulated .grad() is its own tensor: contiguous, sharing storage with nothing else
// (PyTorch's gradient layout contract). Backward functions may hand back their incoming gradient
// unchanged (add, clone, sum_to of an equal shape), so one gradient tensor can reach several leaves,
// or a leaf and a node that still reads it; and a view (linear's weight gradient is a transpose) is
// strided. In-place work on .grad() -- the data-parallel all-reduce, clip_grad_norm_, zero_grad --
// would then change another parameter's gradient, or a value backward has yet to read, and NCCL
// needs contiguous buffers. So the first gradient is kept as it comes only when nothing else can see
// it: outside create_graph, a contiguous tensor covering all of its storage, whose handle (held by
// the engine) and storage have no other owner -- the common case, which costs no copy. Otherwise it
// is copied (a differentiable clone under create_graph). Later gradients are added in place when,
// by the same test, nothing but the leaf sees its .grad() (outside create_graph: PyTorch's
// AccumulateGrad does the same), and otherwise out of place, into a new tensor. In place reads and
// writes one tensor fewer: layer_norm of [8192, 1024]'s forward+backward, which accumulates a 32 MiB
// gradient, took 0.83-0.94 of the time (docs/benchmarks.md, "Normalizations' outputs streamed").
static bool owned_by_caller_alone(const Tensor& g) {
  return g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous() && g.offset() == 0 &&
         static_cast<size_t>(g.numel()) * dtype_size(g.dtype()) == g.storage()->nbytes;
}

// Adds gradient g into impl->grad, following Note [Gradient layout]; `may_take`: the engine is
// done with g once this returns. Runs with grad mode = create_graph; the caller holds impl->grad_mu.
static void accumulate_grad(TensorImpl* impl, const Tensor& g, bool may_take) {
  if (impl->grad.defined()) {
    if (!grad_enabled() && owned_by_caller_alone(impl->grad) && g.dtype() == impl->grad.dtype() &&
        g.shape() == impl->grad.shape())
      add_(impl->grad, g.detach());
    else
      impl->grad = add(impl->grad, grad_enabled() ? g : g.detach());
  } else if (may_take && !grad_enabled() && owned_by_caller_alone(g)) {
    impl->grad = g.requires_grad() ? g.detach() : g;
  } else {
    impl->grad = grad_enabled() ? clone(g) : clone(g.detach());
  }
}

// Note [Leaf accumulators]
// A leaf's AccumulateGrad node holds the leaf strongly; the leaf points back weakly, so there is no
// cycle, and all graphs that use the leaf share one accumulator while any of them is alive. The
// accumulated gradient is itself a differentiable sum (under create_graph the engine runs with
// grad mode on), so gradients accumulated with create_graph=true can be differentiated again.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const Tensor& leaf)
      : Node("AccumulateGrad", leaf.device(), {}, {{leaf.shape(), leaf.dtype(), leaf.device()}}, {}, nullptr),
        leaf_(leaf) {}

  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    TensorImpl* impl = leaf_.impl();
    std::function<void(const Tensor&)> hook;
    {
      std::lock_guard<std::mutex> lock(impl->grad_mu);
      accumulate_grad(impl, grads[0], /*may_take=*/true);
      hook = impl->post_accumulate_hook;
    }
    if (hook) hook(leaf_);
    return {};
  }
  void release() override {}

 private:
  Tensor leaf_;
};

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  TensorImpl* impl = leaf.impl();
  std::lock_guard<std::mutex> lock(impl->grad_mu);
  std::shared_ptr<Node> node = impl->grad_accumulator.lock();
  if (!node) {
    node = std::make_shared<AccumulateGrad>(leaf);
    impl->grad_accumulator = node;
  }
  return node;
}

void set_post_accumulate_hook(const Tensor& leaf, std::function<void(const Tensor&)> hook) {
  EF_CHECK(leaf.defined() && leaf.requires_grad() && !leaf.grad_fn(),
           "set_post_accumulate_hook: needs a leaf tensor that requires grad");
  std::lock_guard<std::mutex> lock(leaf.impl()->grad_mu);
  leaf.impl()->post_accumulate_hook = std::move(hook);
}

static Edge edge_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.output_nr()};
  return {grad_accumulator(t), 0};
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record(const char* name, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
            const std::vector<Tensor>& saved, BackwardFn fn) {
  if (!grad_enabled() || !any_requires_grad(inputs)) return;
  std::vector<Edge> next;
  next.reserve(inputs.size());
  for (const Tensor& t : inputs) next.push_back(edge_of(t));
  std::vector<OutputInfo> infos;
  for (const Tensor& o : outputs) infos.push_back({o.shape(), o.dtype(), o.device()});
  auto node =
      std::make_shared<Node>(name, outputs.at(0).device(), std::move(next), std::move(infos), saved, std::move(fn));
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorImpl* impl = outputs[i].impl();
    EF_ASSERT(impl->grad_fn == nullptr, name, ": output already has a grad_fn");
    impl->requires_grad = true;
    impl->grad_fn = node;
    impl->output_nr = static_cast<uint32_t>(i);
  }
}

// --- The engine ----------------------------------------------------------------------------------

namespace {

std::string str_cat_backward(const Node* node, const std::string& what) {
  return detail::str_cat("in backward of ", node->name(), " on ", node->device().str(), ": ", what);
}

// One backward pass: the graph below the roots, its dependency counts, and the gradients in flight.
struct GraphTask {
  bool create_graph = false;
  bool retain_graph = false;
  bool accumulate = true;  // backward(): leaves accumulate; grad(): gradients are captured

  std::mutex mu;
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::vector<std::vector<Tensor>>> buffers;           // per output, partial grads
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> captures;  // output -> result slot
  std::unordered_set<Node*> needed;
  std::vector<std::shared_ptr<Node>> nodes;  // keeps every node alive for the pass
  std::vector<Tensor> captured;

  int outstanding = 0;
  bool done = false;
  std::string error;
  std::condition_variable done_cv;
  Worker* waiting_worker = nullptr;
  // Note [Collectives in backward]: per device, the needed collective nodes yet to run (by
  // sequence_nr, last created first), and those ready but waiting for their turn.
  std::map<Device, std::map<uint64_t, Node*, std::greater<>>> collectives_left;
  std::map<Device, std::map<uint64_t, Node*, std::greater<>>> collectives_waiting;
  // Note [Backward on the calling thread]: nodes queue here instead of on their device's worker.
  bool on_caller = false;
  std::deque<Node*> caller_queue;
  std::vector<std::function<void()>> callbacks;  // queue_backward_callback
};

void schedule(const std::shared_ptr<GraphTask>& task, Node* node);
std::vector<Node*> collectives_released(GraphTask& task, Node* node);

// Note [Gradients summed in one kernel]
// A tensor used several times gets a gradient from each use: a WGAN-GP critic's parameters four, from
// the real and fake batches' backward and the penalty's double backward. Added pair by pair they
// were n - 1 kernels; where the partial gradients are contiguous tensors of one shape, dtype and
// device, add_n sums them in one, with the same bits (left to right, rounded after each add): 40 of
// wgan_gp's 749 recorded kernel calls a generator step (docs/benchmarks.md, "A recorded WGAN-GP step
// in fewer kernels"). Two partials keep the add, one kernel either way.
static bool summable_in_one_kernel(const std::vector<Tensor>& partials) {
  if (partials.size() < 3) return false;
  for (const Tensor& g : partials) {
    if (!g.defined() || !g.is_contiguous() || g.shape() != partials[0].shape() || g.dtype() != partials[0].dtype() ||
        g.device() != partials[0].device() || !is_floating(g.dtype()))
      return false;
  }
  return true;
}

// Sums a node's partial gradients per output (a differentiable add under create_graph) and fills
// outputs that received nothing with zeros (unless the node accepts missing gradients and no
// grad() capture or retained gradient reads them).
std::vector<Tensor> take_grads(GraphTask& task, Node* node) {
  std::vector<std::vector<Tensor>> partials;
  {
    std::lock_guard<std::mutex> lock(task.mu);
    auto it = task.buffers.find(node);
    if (it != task.buffers.end()) {
      partials = std::move(it->second);
      task.buffers.erase(it);
    }
  }
  const auto& outs = node->outputs();
  const bool zeros_for_missing =
      node->materializes_grads() || task.captures.count(node) != 0 || !node->retained.empty();
  std::vector<Tensor> grads(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    if (i < partials.size()) {
      if (summable_in_one_kernel(partials[i]))
        grads[i] = detail::add_n(partials[i]);
      else
        for (Tensor& g : partials[i]) grads[i] = grads[i].defined() ? add(grads[i], g) : g;
    }
    if (!grads[i].defined() && zeros_for_missing)
      grads[i] = zeros(outs[i].shape, {.dtype = outs[i].dtype, .device = outs[i].device});
  }
  return grads;
}

// The graph task whose node this thread is running: a grad() called inside a node (a backward that
// differentiates) starts a task of its own and restores this one after (run_node).
thread_local GraphTask* tls_running_task = nullptr;
// The node whose closure this thread is running (input_grad_needed asks about its edges), set for
// the closure's run; a grad() inside it runs nodes of its own and restores this one after.
thread_local const Node* tls_applying_node = nullptr;
struct ApplyingNode {
  const Node* const outer = tls_applying_node;
  explicit ApplyingNode(const Node* node) { tls_applying_node = node; }
  ~ApplyingNode() { tls_applying_node = outer; }
  ApplyingNode(const ApplyingNode&) = delete;
  ApplyingNode& operator=(const ApplyingNode&) = delete;
};

void run_node(const std::shared_ptr<GraphTask>& task, Node* node) {
  std::vector<Tensor> input_grads;
  std::string failure;
  GraphTask* const outer_task = tls_running_task;  // a grad() inside a node runs nodes of its own
  tls_running_task = task.get();
  try {
    GradModeGuard mode(task->create_graph);
    bool failed;
    {
      std::lock_guard<std::mutex> lock(task->mu);
      failed = !task->error.empty();
    }
    const bool captures = task->captures.count(node) != 0;
    const bool needed = task->needed.count(node) != 0;
    if (failed || (!needed && !captures && node->retained.empty())) {
      std::lock_guard<std::mutex> lock(task->mu);
      task->buffers.erase(node);
    } else {
      std::vector<Tensor> grads = take_grads(*task, node);
      if (auto it = task->captures.find(node); it != task->captures.end()) {
        std::lock_guard<std::mutex> lock(task->mu);
        for (auto [output, slot] : it->second) task->captured[slot] = grads[output];
      }
      for (size_t i = 0; i < node->retained.size() && i < grads.size(); ++i) {
        if (auto impl = node->retained[i].lock()) {
          Tensor owner(impl);
          std::lock_guard<std::mutex> lock(impl->grad_mu);
          accumulate_grad(impl.get(), grads[i], /*may_take=*/false);  // the node reads it next
        }
      }
      if (needed) {
        const ApplyingNode applying(node);
        input_grads = node->apply(grads);
        if (!task->retain_graph) node->release();
        EF_ASSERT(input_grads.empty() || input_grads.size() == node->next_edges().size(), node->name(),
                  " backward returned ", input_grads.size(), " gradients for ", node->next_edges().size(), " inputs");
      }
    }
  } catch (const std::exception& e) {
    failure = str_cat_backward(node, e.what());
  } catch (...) {
    failure = str_cat_backward(node, "unknown exception");
  }
  tls_running_task = outer_task;

  std::vector<Node*> ready;
  Worker* to_wake = nullptr;
  {
    std::lock_guard<std::mutex> lock(task->mu);
    if (!failure.empty() && task->error.empty()) task->error = failure;
    if (task->error.empty()) {
      const auto& edges = node->next_edges();
      for (size_t i = 0; i < edges.size(); ++i) {
        Node* next = edges[i].fn.get();
        if (next == nullptr) continue;
        if (i < input_grads.size() && input_grads[i].defined()) {
          auto& buf = task->buffers[next];
          if (buf.size() < next->outputs().size()) buf.resize(next->outputs().size());
          buf[edges[i].input_nr].push_back(std::move(input_grads[i]));
        }
        if (--task->deps[next] == 0) ready.push_back(next);
      }
    }
    task->outstanding += static_cast<int>(ready.size()) - 1;
    if (task->outstanding == 0) {
      task->done = true;
      to_wake = task->waiting_worker;
      task->done_cv.notify_all();
    }
  }
  if (to_wake) to_wake->wake();
  for (Node* n : collectives_released(*task, node)) schedule(task, n);
  for (Node* n : ready) schedule(task, n);
}

// Note [Collectives in backward]
// Every rank of a data-parallel pass must run its backward collectives (the all_reduce nodes of
// comm_ops.h: SyncBatchNorm's statistics, their gradients under a penalty) in the same order: the
// communicators pair the ranks' calls by order, and calls of the same shape cannot tell each other
// apart. The order the engine would run them in depends on each rank's graph, and graphs differ
// where a backward function takes a shortcut for a shape (sum_to of an equal shape adds no node: a
// chunk of one row). So a pass runs each device's collective nodes in reverse order of creation,
// which every rank shares (they make the same calls in the same order): a collective node that is
// ready waits until every later-created one of its device has run. That never waits for ever: a
// node's backward feeds only nodes created before it, so a later-created node never depends on an
// earlier one having run. A failed pass releases the waiting nodes (they are skipped).
bool must_wait_turn(GraphTask& task, Node* node) {
  if (!node->collective()) return false;
  std::lock_guard<std::mutex> lock(task.mu);
  auto left = task.collectives_left.find(node->device());
  if (left == task.collectives_left.end() || !left->second.count(node->sequence_nr())) return false;
  if (!task.error.empty() || left->second.begin()->first == node->sequence_nr()) return false;
  task.collectives_waiting[node->device()][node->sequence_nr()] = node;
  return true;
}

// After `node` ran: the next collective of its device, if it is waiting. With an error, every
// waiting node.
std::vector<Node*> collectives_released(GraphTask& task, Node* node) {
  std::vector<Node*> out;
  std::lock_guard<std::mutex> lock(task.mu);
  if (node->collective()) {
    if (auto left = task.collectives_left.find(node->device()); left != task.collectives_left.end()) {
      left->second.erase(node->sequence_nr());
      auto& waiting = task.collectives_waiting[node->device()];
      if (!left->second.empty()) {
        if (auto next = waiting.find(left->second.begin()->first); next != waiting.end()) {
          out.push_back(next->second);
          waiting.erase(next);
        }
      }
    }
  }
  if (!task.error.empty()) {
    for (auto& [device, waiting] : task.collectives_waiting) {
      for (auto& [nr, n] : waiting) out.push_back(n);
      waiting.clear();
    }
  }
  return out;
}

void schedule(const std::shared_ptr<GraphTask>& task, Node* node) {
  if (must_wait_turn(*task, node)) return;
  if (task->on_caller) {
    std::lock_guard<std::mutex> lock(task->mu);
    task->caller_queue.push_back(node);
    return;
  }
  context(node->device()).worker().post([task, node] { run_node(task, node); });
}

// Note [Backward on the calling thread]
// A pass runs each node on its device's worker. One exception: a pass whose nodes are all on one
// CPU device, started by a thread that is not a worker while no CPU device has a worker yet -- a
// program training on one CPU device without the parallel module, as PyTorch runs it. Its nodes run
// on the calling thread, in the order the worker would run them. Otherwise this pass would start
// the device's worker, and from then on the calling thread, which runs the forward passes, would
// run its kernels on one thread (Note [One OpenMP team per core] in device.cpp): bench_engine's
// forward convolutions and matmuls slowed down after their first backward (docs/benchmarks.md, "Engine").
bool runs_on_caller(const GraphTask& task) {
  if (Worker::current() != nullptr || cpu_workers_started()) return false;
  const Device first = task.nodes.front()->device();
  if (!first.is_cpu()) return false;
  for (const auto& n : task.nodes)
    if (n->device() != first) return false;
  return true;
}

}  // namespace

bool queue_backward_callback(std::function<void()> fn) {
  GraphTask* task = tls_running_task;
  if (task == nullptr) return false;
  std::lock_guard<std::mutex> lock(task->mu);
  task->callbacks.push_back(std::move(fn));
  return true;
}

bool backward_pass_failed() {
  GraphTask* task = tls_running_task;
  if (task == nullptr) return false;
  std::lock_guard<std::mutex> lock(task->mu);
  return !task->error.empty();
}

static std::vector<Tensor> run_backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs,
                                        const std::vector<Tensor>* inputs, bool retain_graph, bool create_graph,
                                        bool allow_unused, const char* api) {
  EF_CHECK(!outputs.empty(), api, ": no outputs given");
  EF_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), api, ": ", grad_outputs.size(),
           " grad_outputs for ", outputs.size(), " outputs");
  auto task = std::make_shared<GraphTask>();
  task->create_graph = create_graph;
  task->retain_graph = retain_graph;
  task->accumulate = inputs == nullptr;

  // Roots and their seed gradients.
  std::vector<std::pair<Edge, Tensor>> roots;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    EF_CHECK(out.defined(), api, ": outputs[", i, "] is undefined");
    EF_CHECK(out.requires_grad(), api, ": outputs[", i, "] (", out.str(), ") does not require grad and has no grad_fn");
    Tensor seed;
    if (!grad_outputs.empty() && grad_outputs[i].defined()) {
      seed = grad_outputs[i];
      EF_CHECK(seed.shape() == out.shape(), api, ": grad_outputs[", i, "] has shape ", shape_str(seed.shape()),
               " but outputs[", i, "] has shape ", shape_str(out.shape()));
      EF_CHECK(seed.device() == out.device(), api, ": grad_outputs[", i, "] is on ", seed.device().str(),
               " but outputs[", i, "] is on ", out.device().str());
      EF_CHECK(seed.dtype() == out.dtype(), api, ": grad_outputs[", i, "] is ", dtype_name(seed.dtype()),
               " but outputs[", i, "] is ", dtype_name(out.dtype()));
    } else {
      EF_CHECK(out.numel() == 1, api, ": grad can be created implicitly only for one-element outputs, but outputs[", i,
               "] has shape ", shape_str(out.shape()), "; pass grad_outputs");
      seed = ones_like(out);
    }
    roots.emplace_back(edge_of(out), seed);
  }

  // Discover the graph and count each node's incoming edges.
  std::vector<Node*> stack;
  auto visit = [&](const std::shared_ptr<Node>& n) {
    if (task->deps.emplace(n.get(), 0).second) {
      task->nodes.push_back(n);
      stack.push_back(n.get());
    }
  };
  for (auto& [edge, seed] : roots) visit(edge.fn);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.fn) continue;
      visit(e.fn);
      ++task->deps[e.fn.get()];
    }
  }

  // Which nodes must run: all for backward(); for grad(), those on a path to an input.
  if (inputs != nullptr) {
    task->captured.resize(inputs->size());
    for (size_t i = 0; i < inputs->size(); ++i) {
      const Tensor& in = (*inputs)[i];
      EF_CHECK(in.defined() && in.requires_grad(), api, ": inputs[", i, "] ",
               in.defined() ? "(" + in.str() + ") does not require grad" : "is undefined");
      Edge e{in.grad_fn(), in.output_nr()};
      if (!e.fn) {
        std::lock_guard<std::mutex> lock(in.impl()->grad_mu);
        e = Edge{in.impl()->grad_accumulator.lock(), 0};
      }
      if (e.fn && task->deps.count(e.fn.get())) task->captures[e.fn.get()].emplace_back(e.input_nr, i);
    }
    // A node is needed if an edge below it leads to a capture point.
    std::unordered_map<Node*, bool> memo;
    std::function<bool(Node*)> leads_to_capture = [&](Node* n) -> bool {
      if (auto it = memo.find(n); it != memo.end()) return it->second;
      memo[n] = false;
      bool any = false;
      for (const Edge& e : n->next_edges())
        if (e.fn && (task->captures.count(e.fn.get()) || leads_to_capture(e.fn.get()))) any = true;
      memo[n] = any;
      return any;
    };
    for (auto& n : task->nodes)
      if (dynamic_cast<AccumulateGrad*>(n.get()) == nullptr && leads_to_capture(n.get())) task->needed.insert(n.get());
  } else {
    for (auto& n : task->nodes) task->needed.insert(n.get());
  }
  for (Node* n : task->needed)
    if (n->collective()) task->collectives_left[n->device()][n->sequence_nr()] = n;

  // Seed and start the nodes nobody else feeds.
  std::vector<Node*> ready;
  for (auto& [edge, seed] : roots) {
    auto& buf = task->buffers[edge.fn.get()];
    if (buf.size() < edge.fn->outputs().size()) buf.resize(edge.fn->outputs().size());
    buf[edge.input_nr].push_back(seed);
  }
  for (auto& [edge, seed] : roots)
    if (task->deps[edge.fn.get()] == 0 && std::find(ready.begin(), ready.end(), edge.fn.get()) == ready.end())
      ready.push_back(edge.fn.get());
  EF_ASSERT(!ready.empty(), api, ": the graph has a cycle");
  Worker* self = Worker::current();
  task->waiting_worker = self;
  task->on_caller = runs_on_caller(*task);
  task->outstanding = static_cast<int>(ready.size());
  for (Node* n : ready) schedule(task, n);

  // Wait. A worker thread keeps running its own queue meanwhile: the pass may need it.
  if (task->on_caller) {
    for (;;) {
      Node* n = nullptr;
      {
        std::lock_guard<std::mutex> lock(task->mu);
        if (task->caller_queue.empty()) break;
        n = task->caller_queue.front();
        task->caller_queue.pop_front();
      }
      run_node(task, n);
    }
    EF_ASSERT(task->done, api, ": the pass stopped with nodes outstanding");
  } else if (self != nullptr) {
    self->run_until([&] {
      std::lock_guard<std::mutex> lock(task->mu);
      return task->done;
    });
  } else {
    std::unique_lock<std::mutex> lock(task->mu);
    task->done_cv.wait(lock, [&] { return task->done; });
  }
  if (!task->error.empty()) throw Error(task->error);
  for (const auto& fn : task->callbacks) fn();  // every node has run: nothing adds to the list now

  if (inputs == nullptr) return {};
  for (size_t i = 0; i < inputs->size(); ++i) {
    EF_CHECK(allow_unused || task->captured[i].defined(), api, ": inputs[", i, "] (", (*inputs)[i].str(),
             ") was not used to compute the outputs; pass allow_unused=true if that is expected");
  }
  return task->captured;
}

// Note [Gradients nobody asked for]
// A closure returns a gradient for every input that requires grad, but a grad() with respect to
// some inputs prunes the nodes that lead nowhere it was asked for (run_backward: task->needed), and
// their gradients are dropped unread. A gradient penalty, grad(D(x), x), is the costly case: every
// convolution of the critic would compute its weight gradient, and under create_graph record it,
// for nothing (on the wgan_gp critic, one of the five weight gradients of a critic step's
// largest convolution). Closures whose inputs' gradients cost a kernel each ask this first, as
// PyTorch's formulas ask should_compute_output.
bool input_grad_needed(size_t i) {
  const GraphTask* task = tls_running_task;
  const Node* node = tls_applying_node;
  if (task == nullptr || node == nullptr) return true;
  const std::vector<Edge>& edges = node->next_edges();
  if (i >= edges.size() || !edges[i].fn) return false;
  // Built before the pass started and only read since: no lock.
  Node* next = edges[i].fn.get();
  return task->needed.count(next) != 0 || task->captures.count(next) != 0 || !next->retained.empty();
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, const GradOptions& opts) {
  EF_CHECK(!inputs.empty(), "grad: no inputs given");
  return run_backward(outputs, grad_outputs, &inputs, opts.retain_graph.value_or(opts.create_graph), opts.create_graph,
                      opts.allow_unused, "grad");
}

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, bool retain_graph,
              bool create_graph) {
  run_backward(outputs, grad_outputs, nullptr, retain_graph || create_graph, create_graph, false, "backward");
}

}  // namespace evenflow
