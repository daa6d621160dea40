/// @file
/// The processes of a job (several processes, on one machine or several, started by `mpirun` or
/// Slurm's `srun`) and the collectives between them, on host memory.
///
/// Note [Processes]
/// Each process drives its own devices, one thread per device, as in a one-process program; a
/// communicator over a process's devices (communicator.h) spans every process of the job when the
/// job has more than one: rank numbers run over all devices of all processes, process p's devices
/// holding ranks p·D to p·D + D - 1 (every process has the same number D of devices). Between
/// processes the data moves through MPI (Open MPI, MPICH: what `mpirun` and `srun` start); NCCL
/// communicators use it only to share their unique id.
///
/// A ProcessGroup is a channel: collectives on it are called by every process in the same order,
/// one at a time (a second thread calling while one call is in progress is an error). Independent
/// streams of collectives (a device communicator's calls, a model's gradient buckets) each get
/// their own channel (duplicate()), so their relative order may differ between processes. Every
/// call waits at most timeout(); a process that failed and said so (fail()) makes the others'
/// calls throw ef::Error naming it at once, and a process that died without a word makes them
/// throw at the timeout (launchers usually end the others first: `mpirun` does).
///
/// Results are bitwise identical on every process (each element of a sum is added up by one
/// process, in process order, and sent to the others), which keeps replicas identical.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "evenflow/engine/tensor.h"

namespace evenflow::parallel {

/// The processes of a job, and one channel of collectives between them (Note [Processes]).
/// Abstract: processes() gives the job's. Not copyable.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }  ///< This process's number, in [0, size()).
  int size() const { return size_; }  ///< The number of processes.
  /// "single" (one process) or "mpi".
  virtual const char* kind() const = 0;

  /// How long a call waits for the other processes (5 minutes unless set).
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Sets timeout() for the calls that start after it.
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  /// A new channel over the same processes (every process calls it, in the same order as its other
  /// calls on this channel); it starts with this one's timeout.
  virtual std::shared_ptr<ProcessGroup> duplicate() = 0;

  /// @name Collectives
  /// Each is called by every process with a tensor of the same shape and dtype (float32, float64
  /// or int64), contiguous and on the CPU. Each throws ef::Error for a tensor breaking these rules,
  /// a process that failed, a timeout or an MPI error; after one, this channel is unusable.
  /// @{

  /// Replaces x by the sum over processes, in place.
  virtual void all_reduce(const Tensor& x) = 0;
  /// Replaces x by process `root`'s x, in place.
  virtual void broadcast(const Tensor& x, int root) = 0;
  /// The processes' tensors concatenated along dim 0 (x must have at least one dim), in process order.
  virtual Tensor all_gather(const Tensor& x) = 0;
  /// Process `root`'s `bytes` (the others' are ignored, of any length).
  virtual std::string broadcast_bytes(const std::string& bytes, int root) = 0;
  /// The sum over processes of a host number (a loss's share, a count), the same on every process:
  /// all_reduce of it as a float64 tensor.
  double sum(double x);
  /// @}

  /// Tells the other processes that this one failed, with `why`, so that their waiting and later
  /// calls throw ef::Error naming this process and `why` instead of timing out. Waits (at most a
  /// few seconds) for the message to leave. Call it before exiting on an error; it never throws.
  virtual void fail(const std::string& why) noexcept = 0;

 protected:
  /// Process `rank` of `size`.
  ProcessGroup(int rank, int size);

 private:
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_{std::chrono::minutes(5)};
};

/// The job's processes: over MPI when this build has it and the process was started by a launcher
/// (`mpirun`, `mpiexec`, `srun`: their environment says so), otherwise this process alone. The first
/// call initializes MPI (with MPI_THREAD_SERIALIZED at least: ef::Error when the library offers
/// less); MPI is finalized at exit. Thread-safe.
const std::shared_ptr<ProcessGroup>& processes();

/// A new group of this process alone, whatever processes() is: what a communicator uses when it
/// is given none (a one-process reference run inside a multi-process job, in tests).
std::shared_ptr<ProcessGroup> single_process();

/// Whether this build can run several processes (it was built with MPI).
bool multi_process_support();

/// The rows of a global batch one process reads (a distributed sampler's share).
struct ProcessShare {
  int64_t start = 0;  ///< Its first row in the global batch.
  int64_t count = 0;  ///< How many rows.
};
/// Process `group.rank()`'s share of a global batch of `batch` items when every process has
/// `devices_per_process` devices: the rows split_sizes(batch, P·D) gives to its devices' ranks, so
/// that model.scatter of the share gives each device the chunk it would get in one process with
/// all P·D devices. ef::Error when the batch has fewer items than P·D and there are several
/// processes (every rank takes part in every collective, so each needs at least one item).
ProcessShare process_share(int64_t batch, int devices_per_process, const ProcessGroup& group);

}  // namespace evenflow::parallel
