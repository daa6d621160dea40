/// @file
/// Communicators: collectives over the devices of a group, one rank per device.
///
/// Note [Collectives]
/// A collective is called by every rank, each from its own thread (its device's worker), in the same
/// order on every rank, as with NCCL. Each call names what it is (`tag`: the op, shape and dtype);
/// ranks that disagree are a bug in the caller. LocalCommunicator compares the tags and throws an
/// ef::Error naming both calls; NCCL cannot compare them cheaply, so there a disagreement gives
/// garbage or a timeout. A call waits at most timeout() for the other ranks; past it, or when another
/// rank fails, the communicator is aborted: every waiting and later call throws ef::Error saying why,
/// until reset(). DeviceGroup::run aborts its communicators when a task throws, and resets aborted
/// ones before it starts tasks again, so a failed step (forward or backward) leaves the group usable.
///
/// Results are bitwise identical on every rank (sums are taken in rank order, once), which is what
/// keeps replicas identical without re-broadcasting weights.
///
/// A communicator may span processes (Note [Processes] in process_group.h): then size() counts the
/// ranks of every process, and each process passes its own devices and calls with its local ranks
/// (0 .. local_size() - 1, global rank first_rank() + local).
///
/// LocalCommunicator serves CPU devices and several logical devices on one GPU: ranks meet in host
/// memory and the last one to arrive computes every rank's result (across processes, its process's
/// part, then the processes' collective). NcclCommunicator
/// (nccl_communicator_internal.h) serves distinct GPUs. make_communicator picks one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "evenflow/engine/tensor.h"
#include "evenflow/parallel/process_group.h"

namespace evenflow::parallel {

/// ef::Error, starting with `who`, unless `devices` is a non-empty list of existing devices, each once.
void check_distinct_devices(const char* who, const std::vector<Device>& devices);

/// How long a collective waits for the other ranks unless set otherwise (5 minutes): past it the
/// communicator is aborted (Note [Collectives]).
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{std::chrono::minutes(5)};

/// Collectives over a fixed list of devices, one rank per device (Note [Collectives]). Abstract:
/// make_communicator creates a LocalCommunicator or an NCCL one. Not copyable; shared through
/// std::shared_ptr by a DeviceGroup and the autograd nodes of comm_ops.h.
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int size() const { return world_size_; }  ///< The number of ranks, over every process.
  /// This process's ranks: its devices.
  int local_size() const { return static_cast<int>(devices_.size()); }
  /// The global rank of this process's local rank 0 (0 in one process).
  int first_rank() const { return first_rank_; }
  /// This process's ranks' devices: local rank r runs on devices()[r].
  const std::vector<Device>& devices() const { return devices_; }
  /// The channel to the other processes (a one-process group when there are none).
  const std::shared_ptr<ProcessGroup>& processes() const { return processes_; }
  /// How long a call waits for the other ranks before aborting the communicator
  /// (kDefaultCollectiveTimeout unless set).
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Sets timeout() for the calls that start after it. Not synchronized: call it while no
  /// collective is running (DeviceGroup::set_timeout does it for every communicator of a group).
  void set_timeout(std::chrono::milliseconds t) {
    timeout_ = t;
    processes_->set_timeout(t);
  }
  /// "local" or "nccl".
  virtual const char* kind() const = 0;

  /// @name Per-rank collectives
  /// Per-rank collectives (Note [Collectives]). `x` is on the rank's device; results are too. None
  /// records autograd nodes: comm_ops.h wraps them in differentiable ops.
  ///
  /// Each is called by every rank, from its own thread, with its local `rank` (in
  /// [0, local_size())) and its own `x`; ranks must pass equal shapes and dtypes (and the same
  /// `root`, a global rank). Each throws ef::Error
  /// for a rank (or root) out of range, an undefined `x`, an `x` not on the rank's device, ranks
  /// that disagree (LocalCommunicator detects it), an aborted communicator or a timeout.
  /// @{

  /// Sum over ranks.
  virtual Tensor all_reduce(int rank, const Tensor& x) = 0;
  /// The root's x on every rank (every rank passes a tensor of the same shape; non-roots' values
  /// are ignored).
  virtual Tensor broadcast(int rank, const Tensor& x, int root) = 0;
  /// Sum over ranks on the root; other ranks get an undefined tensor.
  virtual Tensor reduce(int rank, const Tensor& x, int root) = 0;
  /// The ranks' tensors (equal shapes) concatenated along dim 0, in rank order.
  virtual Tensor all_gather(int rank, const Tensor& x) = 0;
  /// Sum over ranks, then global rank r's r-th slice of dim 0 (size divisible by size()).
  virtual Tensor reduce_scatter(int rank, const Tensor& x) = 0;
  /// @}

  /// From one thread: replaces each tensor of every local rank's list `per_rank[r]` by the sum over
  /// ranks of the tensors at its place in their lists, in place, with one collective for the list
  /// (a gradient bucket). The lists have the same length, and tensors at one place the same shape;
  /// every tensor is defined, contiguous, on its rank's device, of one dtype. Gradient buckets use
  /// it from whichever thread finishes a bucket last, so no rank waits for another. Throws ef::Error
  /// when an argument breaks these rules or the communicator is aborted. Records no autograd node.
  /// It may return before the sums are in place (NCCL: queued on side streams); join_in_place()
  /// then orders every device's later work after them.
  virtual void all_reduce_in_place(const std::vector<std::vector<Tensor>>& per_rank) = 0;
  /// Makes every local device's work queued from now on wait for the all_reduce_in_place calls made
  /// so far (a no-op where those finish before returning). Throws ef::Error if the communicator
  /// was aborted.
  virtual void join_in_place() {}

  /// Makes every waiting and later call throw ef::Error with `why`, until reset().
  virtual void abort(const std::string& why) = 0;
  /// After an abort (all calls having returned): usable again, sequence numbers restarted. The NCCL
  /// communicator re-creates its NCCL handles here and throws ef::Error (staying aborted) if that
  /// fails.
  virtual void reset() = 0;
  /// Whether abort() was called (or a call failed) since the last reset().
  virtual bool aborted() const = 0;

 protected:
  /// Takes this process's devices and the channel to the other processes (none: one process).
  /// Throws ef::Error unless the devices are a non-empty list of existing devices, each once
  /// (check_distinct_devices), or when processes have different numbers of devices.
  explicit Communicator(std::vector<Device> devices, std::shared_ptr<ProcessGroup> processes = nullptr);
  /// The argument checks of every per-rank collective: ef::Error, starting with `op`, unless `rank`
  /// is in [0, local_size()) and `x` is defined and on that rank's device.
  void check_rank(const char* op, int rank, const Tensor& x) const;
  /// The argument checks of all_reduce_in_place (every implementation has the same contract).
  void check_in_place(const std::vector<std::vector<Tensor>>& per_rank) const;

  std::vector<Device> devices_;                                    ///< local rank r's device is devices_[r]
  std::chrono::milliseconds timeout_ = kDefaultCollectiveTimeout;  ///< what timeout() returns
  std::shared_ptr<ProcessGroup> processes_;                        ///< what processes() returns
  int first_rank_ = 0;                                             ///< what first_rank() returns
  int world_size_ = 0;                                             ///< what size() returns
};

/// The communicator of CPU devices and of logical devices sharing one GPU: ranks meet in host
/// memory, and the last rank to arrive at a collective computes every rank's result (with device
/// copies), in rank order. Thread-safe: every rank calls from its own thread.
class LocalCommunicator final : public Communicator {
 public:
  /// Ranks over `devices` (any mix of CPU and CUDA devices is accepted here; make_communicator
  /// refuses mixes), and over the other processes' when `processes` has several: it becomes this
  /// communicator's channel, used by one thread at a time. Throws as Communicator's constructor.
  explicit LocalCommunicator(std::vector<Device> devices, std::shared_ptr<ProcessGroup> processes = nullptr);
  const char* kind() const override { return "local"; }

  Tensor all_reduce(int rank, const Tensor& x) override;
  Tensor broadcast(int rank, const Tensor& x, int root) override;
  Tensor reduce(int rank, const Tensor& x, int root) override;
  Tensor all_gather(int rank, const Tensor& x) override;
  Tensor reduce_scatter(int rank, const Tensor& x) override;
  void all_reduce_in_place(const std::vector<std::vector<Tensor>>& per_rank) override;
  void abort(const std::string& why) override;
  void reset() override;
  bool aborted() const override;

 private:
  /// One collective in progress: the ranks' inputs and tags, then their results.
  struct Round {
    std::vector<Tensor> inputs;
    std::vector<std::string> tags;
    std::vector<Tensor> results;
    int arrived = 0;
    int departed = 0;
    bool complete = false;
  };
  using Combine = std::vector<Tensor> (*)(const std::vector<Tensor>& inputs, const Communicator& comm, int root);
  Tensor meet(int rank, const Tensor& x, const std::string& tag, int root, Combine combine);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Round> rounds_;
  std::vector<uint64_t> next_sequence_;  ///< per rank
  std::string aborted_;                  ///< why, when aborted
  /// all_reduce_in_place's channel to the other processes: its calls come from other threads than
  /// the per-rank collectives', in an order of their own.
  std::shared_ptr<ProcessGroup> in_place_processes_;
};

/// NCCL for distinct GPUs, otherwise local; across processes when `processes` has several (it
/// becomes the communicator's channel). `parent`, optional, is a communicator of this process over
/// a device list that starts with `devices` (a DeviceGroup's, for fewer active ranks): an NCCL one
/// is split from it rather than created anew. Throws ef::Error for an empty or mixed device list.
std::shared_ptr<Communicator> make_communicator(const std::vector<Device>& devices,
                                                std::shared_ptr<ProcessGroup> processes = nullptr,
                                                const std::shared_ptr<Communicator>& parent = nullptr);

}  // namespace evenflow::parallel
