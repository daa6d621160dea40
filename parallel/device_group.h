/// @file
/// A device group: the devices a data-parallel program runs on, one rank per device, each rank's
/// work running on its device's persistent worker thread (the one the autograd engine uses, so a
/// backward pass started inside a task runs there too).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "evenflow/parallel/communicator.h"

namespace evenflow::parallel {

/// Element i belongs to device i of a group. A batch smaller than the group fills only the first
/// size() devices: the others are idle for that step and get nothing, not an empty tensor.
template <typename T>
using PerDevice = std::vector<T>;

/// Devices from a spec: "cpu" (cpu:0), "cpu:N" (N CPU devices cpu:0..cpu:N-1), "cuda" (every CUDA
/// logical device), "cuda:0,2" (those). Throws ef::Error naming what is wrong (an unknown kind, no
/// GPU, a device that does not exist).
std::vector<Device> devices(const std::string& spec);

/// Intra-op threads for each CPU device when these devices run at once: the machine's hardware
/// threads shared evenly among the CPU devices (at least 1), so N CPU devices do not oversubscribe
/// the cores. All hardware threads when there is no CPU device.
int cpu_threads_per_device(const std::vector<Device>& devices);

/// What a rank's task can ask about where it runs (SyncBatchNorm does).
struct RankContext {
  std::shared_ptr<Communicator> comm;  ///< over the ranks taking part in this run
  int rank = 0;                        ///< this task's rank in `comm`
};
/// The context of the group task running on this thread, or nullptr outside one.
const RankContext* current_rank();

/// The devices of a data-parallel program, one rank per device, with the communicators over them
/// (made on first use, make_communicator). DataParallelModel owns one. In a job of several
/// processes (Note [Processes] in process_group.h) the group spans them: each process makes its
/// own group over its own devices, in the same order as the others, and every rank of every
/// process takes part in every run.
class DeviceGroup {
 public:
  /// This process's devices, and the job's processes the group spans (nullptr: this process
  /// alone; processes() for the whole job). Throws ef::Error unless `devices` is a non-empty list
  /// of existing devices, each once, or when processes hold different numbers of devices.
  explicit DeviceGroup(std::vector<Device> devices, const std::shared_ptr<ProcessGroup>& processes = nullptr);

  int size() const { return static_cast<int>(devices_.size()); }  ///< This process's ranks.
  /// The ranks over every process: size() times the number of processes.
  int world_size() const { return size() * processes_->size(); }
  /// The global rank of this process's rank 0.
  int first_rank() const { return size() * processes_->rank(); }
  /// The group's own channel to the other processes (a duplicate of the one it was given), for the
  /// calls its owner makes from the thread that calls run(); a one-process group in one process.
  ProcessGroup& processes() { return *processes_; }
  /// processes(), shared: for what outlives a call (a loader's batch_part).
  const std::shared_ptr<ProcessGroup>& shared_processes() const { return processes_; }
  const std::vector<Device>& devices() const { return devices_; }  ///< Rank r is on devices()[r].
  /// Rank `rank`'s device; throws std::out_of_range for a rank outside [0, size()).
  const Device& device(int rank) const { return devices_.at(static_cast<size_t>(rank)); }

  /// Runs task(rank) for ranks 0..active-1 (default all; across processes, all only), each on its
  /// device's worker, concurrently,
  /// with the caller's grad mode (a NoGradGuard around run covers the tasks), and returns when all
  /// are done. If tasks throw, the group's communicator is aborted (so ranks
  /// waiting in a collective stop waiting), every task is still waited for, the communicator is
  /// reset, and the first failure is rethrown as ef::Error naming its device. The group is then
  /// usable again. Must not be called from inside a task of a group.
  void run(const std::function<void(int rank)>& task, int active = -1);
  /// Sets the generators of ranks 1..active-1 (default all) to rank 0's state, so that every rank
  /// draws as rank 0 would and per-sample draws (batch_rand, dropout) depend on the sample alone
  /// (Note [Random numbers per sample] in engine/tensor.h). DataParallelModel's forward and map and
  /// DataParallelCriterion call it before their tasks; run() itself leaves generators alone.
  void share_first_generator(int active = -1);

  /// The communicator over the first `active` ranks (all by default); shared with the autograd nodes
  /// of collectives recorded through it. A negative `active` means all; otherwise it must be in
  /// [1, size()], and size() across processes (ef::Error). Thread-safe; across processes, the first
  /// call (which makes the communicator) is made by every process at the same point.
  const std::shared_ptr<Communicator>& comm(int active = -1);
  /// Sets the timeout of collectives (every communicator of the group).
  void set_timeout(std::chrono::milliseconds timeout);

 private:
  const std::shared_ptr<Communicator>& comm_locked(int k);  ///< comm(k) with mu_ held

  std::vector<Device> devices_;
  std::shared_ptr<ProcessGroup> processes_;
  std::vector<std::shared_ptr<Communicator>> comms_;  ///< comms_[k - 1]: over ranks 0..k-1, made on first use
  std::chrono::milliseconds timeout_ = kDefaultCollectiveTimeout;
  std::mutex mu_;
};

}  // namespace evenflow::parallel
