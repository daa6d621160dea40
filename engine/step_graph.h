/// @file
/// A training step recorded once and replayed: on CUDA devices as one CUDA graph (one launch for the
/// whole step, double backward, gradient sums and optimizer included), on CPU devices as the list of
/// its kernel calls. What a step must do to be recorded is the contract of Note [A step that can be
/// replayed]; a CPU replay checks it where CI runs, before a GPU sees the step.
///
/// Note [A step that can be replayed]
/// After warm-up a training step is the same work every time: the same kernels on buffers of the
/// same shapes. StepGraph::capture runs the step's host code once -- ops, autograd, collectives,
/// the optimizer -- while the devices' work is recorded instead of run; replay() then runs that work
/// again, without the host code. So a step that is replayed must:
///   - read its inputs from fixed buffers: copy each batch into the same device tensors before
///     replay() (a copy from the host inside the step is refused: it would repeat the bytes the host
///     held when the step was recorded);
///   - not read device values on the host (item(), to(cpu()), synchronize): nothing has run while
///     the step is recorded; read results after replay(), best with read_later() so the host need
///     not wait for the device;
///   - keep what changes from step to step out of kernel arguments: a random draw's seed and
///     offset, Adam's step size and bias corrections and the learning rate are written into device
///     memory at each replay (Note [Step scalars] in step_graph.cpp) -- the engine's random ops and
///     Adam do this themselves; other host counters are advanced with each_step();
///   - allocate only from the step's pool: every tensor a recorded step makes on its devices comes
///     from a pool private to the StepGraph, so its addresses stay the step's; warm_up() fills the
///     pool so that recording needs no new memory from the device.
/// One call of a step (warm_up, capture, ReplayedStep's eager calls) converts each convolution weight
/// to bfloat16 once while its version holds (Note [Conversions kept for a step] in
/// engine/capture_internal.h): inside a step, write a weight through ops (copy_, add_, an optimizer),
/// which bump its version, not through data().
/// Indexing ops may be recorded (a loss's class targets, gather, index_select): an index out of range
/// in a replayed step is an ef::Error naming it -- thrown by replay() on CPU devices, at the next
/// synchronization on a GPU (Note [Index checks in a recorded step] in cuda/deferred_errors.h).
/// What the host code does to host objects happens once, at capture: the tensors the step leaves
/// behind (a parameter's gradient, a loss) are the same tensors after every replay, with the new
/// values. The tensors it uses from outside -- parameters, optimizer states, input buffers -- are
/// used at their addresses: keep them alive and in place between replays (copying new values into
/// them is fine; replacing them, as Optimizer::load_state does, needs a new capture). The engine refuses what it can
/// tell is wrong with an ef::Error naming it; a counter passed by value is not caught there, but makes replayed steps
/// differ from eager ones, which the tests compare bit for bit (tests/parallel/test_step_graph.cpp on CPU devices, the
/// CUDA ones on a GPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "evenflow/engine/device.h"
#include "evenflow/engine/tensor.h"

namespace evenflow {

/// A step recorded once and replayed (Note [A step that can be replayed]). Its devices are CPU
/// devices, or CUDA logical devices of one GPU. Not copyable; destroying it waits for its devices.
class StepGraph {
 public:
  StepGraph();
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  /// Runs `step` as usual (eagerly), except that what it allocates on `devices` comes from this
  /// graph's pool: the warm-up steps before capture(), which size the pool, the libraries'
  /// workspaces and the algorithm choices. An earlier recording is dropped first, as by reset()
  /// (the pool's blocks it writes would be the warm-up's). Throws what `step` throws, what reset()
  /// throws, and ef::Error when `devices` cannot be recorded together (see capture()).
  void warm_up(const std::vector<Device>& devices, const std::function<void()>& step);

  /// Records what `step` does on `devices` without running it there (any earlier recording is
  /// dropped first). Its host code runs once, now. Throws ef::Error, leaving the graph empty, when
  /// `devices` mixes CPU and CUDA devices, spans several GPUs or is empty, when the step breaks the
  /// contract (the message names what it did), or when `step` throws; its device work then never
  /// ran and its host effects (counters) were not applied. First it waits for the devices (the
  /// earlier recording's and these), throwing a deferred error of their earlier work as
  /// synchronize() does -- a bad index of the last replay -- before anything changes.
  void capture(const std::vector<Device>& devices, const std::function<void()>& step);

  /// Runs the recorded step once more: its host effects, then its device work (queued on CUDA
  /// devices: it returns before the GPU is done), ordered after the work queued on its devices
  /// before the call and before the work queued after it returns -- work other threads queue on its
  /// devices while it runs is ordered neither way, so it must not share data with the step.
  /// ef::Error when nothing is recorded; on CPU devices, what a kernel throws (a bad index).
  void replay();

  /// Drops the recording after the devices finished it, first throwing a deferred error of its
  /// replays as synchronize() does; the pool is kept for the next capture.
  void reset();
  /// Whether nothing is recorded.
  bool empty() const;
  /// The devices of the recording (empty when nothing is recorded).
  const std::vector<Device>& devices() const;

  /// What the recording holds.
  struct Stats {
    int64_t calls = 0;               ///< kernel calls (CPU devices) or graph nodes (CUDA) recorded
    int64_t effects = 0;             ///< host effects and step scalars applied at each replay
    size_t scalar_bytes = 0;         ///< step scalars copied to the device at each replay
    size_t pool_bytes = 0;           ///< memory in the graph's pool, over its devices
    int64_t device_allocations = 0;  ///< blocks the pool obtained from the devices during capture()
  };
  Stats stats() const;  ///< Counters of the recording (zeros when empty).

 private:
  struct Impl;
  class PoolScope;
  std::unique_ptr<Impl> impl_;
};

/// A training step that runs eagerly for its first calls, in a StepGraph's pool, then is recorded
/// once and replayed (Note [A step that can be replayed]): the loop a program writes once, with or
/// without recording. It says on `log` when it records the step, and why it runs it eagerly when the
/// step cannot be recorded (then every later call is eager). Not copyable.
class ReplayedStep {
 public:
  /// How it runs the step.
  struct Options {
    bool record = true;  ///< false: every call eager
    int warm_up = 2;     ///< eager calls before recording (at least 1: Adam's first step makes its moments)
    /// Where it says what it does (one line each); default: standard output, prefixed "step graph: ".
    std::function<void(const std::string&)> log;
  };
  /// `step` on `devices` (see StepGraph::capture for which can be recorded). ef::Error when warm_up < 1.
  ReplayedStep(std::vector<Device> devices, std::function<void()> step, Options options);

  /// Runs the step once: eagerly, or by replaying its recording (queued on CUDA devices). `signature`
  /// names what the step's work depends on besides its buffers' values -- their shapes, the settings;
  /// when it differs from the last call's, the recording is dropped and the step warms up again
  /// before it is recorded anew, saying so (the CUDA math settings are part of it already). Throws
  /// what the step throws, and a deferred error of earlier steps (a bad index) found where it waits
  /// for the devices before recording; only what keeps the step from being recorded makes it eager.
  void operator()(const std::string& signature = "");
  /// Whether the last call replayed a recording.
  bool replayed() const { return replayed_; }
  /// The recording (empty before the step is recorded, or where it could not be).
  const StepGraph& graph() const { return graph_; }

 private:
  std::vector<Device> devices_;
  std::function<void()> step_;
  Options options_;
  StepGraph graph_;
  std::string signature_;
  bool signed_ = false;
  int eager_calls_ = 0;
  bool cannot_record_ = false;
  bool replayed_ = false;
};

/// Whether `d`'s work is being recorded by a StepGraph now (inside StepGraph::capture).
bool recording(const Device& d);

/// Host work a step does every time it runs (advance a counter, copy a learning rate to another
/// replica's optimizer): done now, outside a recording; inside one, kept by the StepGraph and done
/// at each replay, in the order recorded, before the replayed device work -- and not while the step
/// is recorded, since its device work does not run then. `effect` may refer to objects the step uses:
/// they must outlive the StepGraph's replays.
void each_step(const Device& d, std::function<void()> effect);

/// A tensor's values on their way to the host: the copy is queued behind the device's work and
/// read when get() is called, so that a training loop can read a step's losses after queuing the
/// next step instead of waiting for the device at every step (Note [A step that can be replayed]).
class HostValues {
 public:
  HostValues() = default;
  /// The values as doubles, in row-major order; waits for the copy (and throws the device's
  /// deferred errors, as synchronize does). ef::Error on an empty HostValues or a second call.
  std::vector<double> get();
  /// Whether get() can be called.
  bool valid() const { return static_cast<bool>(wait_); }

 private:
  friend HostValues read_later(const Tensor& t);
  std::function<void()> wait_;
  std::shared_ptr<std::vector<double>> values_;
};

/// Starts copying `t`'s values to the host behind the work queued on its device (ef::Error for an
/// undefined tensor, or when its device is being recorded).
HostValues read_later(const Tensor& t);

}  // namespace evenflow
