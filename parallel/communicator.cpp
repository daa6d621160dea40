#include "evenflow/parallel/communicator.h"

#include <cstring>
#include <set>

#include "evenflow/engine/autograd.h"
#include "evenflow/engine/capture_internal.h"
#include "evenflow/engine/ops.h"
#include "evenflow/parallel/process_group_internal.h"
#if EF_NCCL
#include "evenflow/parallel/nccl_communicator_internal.h"
#endif

namespace evenflow::parallel {

void check_distinct_devices(const char* who, const std::vector<Device>& devices) {
  EF_CHECK(!devices.empty(), who, ": no devices given");
  std::set<Device> seen;
  for (const Device& d : devices) {
    check_device(d);
    EF_CHECK(seen.insert(d).second, who, ": device ", d.str(), " is listed twice");
  }
}

Communicator::Communicator(std::vector<Device> devices, std::shared_ptr<ProcessGroup> processes)
    : devices_(std::move(devices)), processes_(processes ? std::move(processes) : single_process()) {
  check_distinct_devices("communicator", devices_);
  const int local = static_cast<int>(devices_.size());
  world_size_ = local;
  if (processes_->size() > 1) {
    // Global ranks need every process to hold as many as the others (Note [Processes]).
    Tensor mine = full({1}, static_cast<double>(local), {.dtype = kInt64});
    const Tensor all = processes_->all_gather(mine);
    for (int p = 0; p < processes_->size(); ++p) {
      EF_CHECK(all.data<int64_t>()[p] == local, "communicator: process ", p, " has ", all.data<int64_t>()[p],
               " devices and process ", processes_->rank(), " has ", local,
               "; every process of a job needs the same number");
    }
    first_rank_ = processes_->rank() * local;
    world_size_ = processes_->size() * local;
  }
  processes_->set_timeout(timeout_);
}

void Communicator::check_rank(const char* op, int rank, const Tensor& x) const {
  EF_CHECK(rank >= 0 && rank < local_size(), op, ": rank ", rank, " is out of range for ", local_size(),
           " ranks in this process");
  EF_CHECK(x.defined(), op, ": rank ", rank, " passed an undefined tensor");
  EF_CHECK(x.device() == devices_[static_cast<size_t>(rank)], op, ": rank ", rank, " passed a tensor on ",
           x.device().str(), ", but its device is ", devices_[static_cast<size_t>(rank)].str());
}

void Communicator::check_in_place(const std::vector<std::vector<Tensor>>& per_rank) const {
  EF_CHECK(per_rank.size() == devices_.size(), "all_reduce_in_place: ", per_rank.size(), " lists for ", local_size(),
           " ranks in this process");
  EF_CHECK(!per_rank[0].empty(), "all_reduce_in_place: rank 0's list is empty");
  const std::vector<Tensor>& first = per_rank[0];
  for (size_t r = 0; r < per_rank.size(); ++r) {
    EF_CHECK(per_rank[r].size() == first.size(), "all_reduce_in_place: rank ", r, " has ", per_rank[r].size(),
             " tensors, rank 0 has ", first.size());
    for (size_t i = 0; i < first.size(); ++i) {
      const Tensor& x = per_rank[r][i];
      check_rank("all_reduce_in_place", static_cast<int>(r), x);
      EF_CHECK(x.shape() == first[i].shape() && x.dtype() == first[0].dtype(), "all_reduce_in_place: rank ", r,
               "'s tensor ", i, " is ", shape_str(x.shape()), " ", dtype_name(x.dtype()), ", rank 0's is ",
               shape_str(first[i].shape()), " ", dtype_name(first[i].dtype()), " (one dtype for the list)");
      // NCCL reduces flat buffers; the local path holds to the same contract so CPU tests catch a
      // strided gradient before a multi-GPU run does.
      EF_CHECK(x.is_contiguous(), "all_reduce_in_place: rank ", r, "'s tensor ", i, " ", x.str(), " is not contiguous");
    }
  }
}

namespace {

std::string tag_of(const char* op, const Tensor& x, int root) {
  std::string tag = detail::str_cat(op, " ", shape_str(x.shape()), " ", dtype_name(x.dtype()));
  if (root >= 0) tag += detail::str_cat(" root ", root);
  return tag;
}

// The sum of the ranks' tensors, in rank order, computed once on `where`.
Tensor ordered_sum(const std::vector<Tensor>& xs, const Device& where) {
  Tensor total = xs[0].to(where).clone();
  for (size_t r = 1; r < xs.size(); ++r) total.add_(xs[r].to(where));
  return total;
}

bool across_processes(const Communicator& comm) {
  return comm.processes()->size() > 1;
}

// The sum over every rank of every process, on this process's first device: this process's ranks
// added in rank order, then the processes' partial sums (ProcessGroup::all_reduce, which gives the
// same bits on every process).
Tensor global_sum(const std::vector<Tensor>& xs, const Communicator& comm) {
  const Device& first = comm.devices()[0];
  Tensor total = ordered_sum(xs, first);
  if (!across_processes(comm)) return total;
  const Tensor host = host_copy(total);
  comm.processes()->all_reduce(host);
  return host.to(first);
}

// Every combine runs with no autograd recording, on the thread of the last rank of this process to
// arrive, and returns one result per local rank on that rank's device. A `root` is a global rank.
std::vector<Tensor> combine_all_reduce(const std::vector<Tensor>& xs, const Communicator& comm, int) {
  const Tensor total = global_sum(xs, comm);
  std::vector<Tensor> out;
  for (const Device& d : comm.devices()) out.push_back(total.to(d).clone());
  return out;
}

std::vector<Tensor> combine_broadcast(const std::vector<Tensor>& xs, const Communicator& comm, int root) {
  const int local_root = root - comm.first_rank();
  const bool here = local_root >= 0 && local_root < comm.local_size();
  Tensor value = here ? xs[static_cast<size_t>(local_root)] : xs[0];
  if (across_processes(comm)) {
    value = host_copy(value);
    comm.processes()->broadcast(value, root / comm.local_size());
  }
  std::vector<Tensor> out;
  for (const Device& d : comm.devices()) out.push_back(value.to(d).clone());
  return out;
}

std::vector<Tensor> combine_reduce(const std::vector<Tensor>& xs, const Communicator& comm, int root) {
  const Tensor total = global_sum(xs, comm);
  std::vector<Tensor> out(comm.devices().size());
  const int local_root = root - comm.first_rank();
  if (local_root >= 0 && local_root < comm.local_size()) {
    const Device& d = comm.devices()[static_cast<size_t>(local_root)];
    out[static_cast<size_t>(local_root)] = total.to(d).clone();
  }
  return out;
}

std::vector<Tensor> combine_all_gather(const std::vector<Tensor>& xs, const Communicator& comm, int) {
  std::vector<Tensor> on_first;
  for (const Tensor& x : xs) on_first.push_back(x.to(comm.devices()[0]));
  Tensor all = cat(on_first, 0);
  if (across_processes(comm)) all = comm.processes()->all_gather(host_copy(all));
  std::vector<Tensor> out;
  for (const Device& d : comm.devices()) out.push_back(all.to(d).clone());
  return out;
}

std::vector<Tensor> combine_reduce_scatter(const std::vector<Tensor>& xs, const Communicator& comm, int) {
  const Tensor total = global_sum(xs, comm);
  const std::vector<Tensor> parts = chunk(total, static_cast<int64_t>(comm.size()), 0);
  std::vector<Tensor> out;
  for (size_t r = 0; r < comm.devices().size(); ++r) {
    out.push_back(parts[static_cast<size_t>(comm.first_rank()) + r].to(comm.devices()[r]).contiguous());
  }
  return out;
}

}  // namespace

LocalCommunicator::LocalCommunicator(std::vector<Device> devices, std::shared_ptr<ProcessGroup> processes)
    : Communicator(std::move(devices), std::move(processes)),
      next_sequence_(devices_.size(), 0),
      in_place_processes_(processes_->duplicate()) {}

Tensor LocalCommunicator::meet(int rank, const Tensor& x, const std::string& tag, int root, Combine combine) {
  const size_t n = devices_.size();
  std::unique_lock<std::mutex> lock(mu_);
  EF_CHECK(aborted_.empty(), tag, " on ", devices_[static_cast<size_t>(rank)].str(),
           ": the communicator was aborted: ", aborted_);
  const uint64_t seq = next_sequence_[static_cast<size_t>(rank)]++;
  Round& round = rounds_[seq];
  if (round.inputs.empty()) {
    round.inputs.resize(n);
    round.tags.resize(n);
  }
  round.inputs[static_cast<size_t>(rank)] = x;
  round.tags[static_cast<size_t>(rank)] = tag;
  if (++round.arrived == static_cast<int>(n)) {
    for (size_t r = 1; r < n; ++r) {
      if (round.tags[r] != round.tags[0]) {
        const std::string why =
            detail::str_cat("collective mismatch at call ", seq, ": ", devices_[0].str(), " called ", round.tags[0],
                            " but ", devices_[r].str(), " called ", round.tags[r]);
        aborted_ = why;
        cv_.notify_all();
        throw Error(why);
      }
    }
    try {
      NoGradGuard no_grad;
      round.results = combine(round.inputs, *this, root);
    } catch (const std::exception& e) {
      aborted_ = detail::str_cat(tag, " failed on ", devices_[static_cast<size_t>(rank)].str(), ": ", e.what());
      cv_.notify_all();
      throw;
    }
    round.inputs.clear();
    round.complete = true;
    cv_.notify_all();
  } else {
    // Waits in slices, so that a backward pass that failed on another device (whose node will then
    // never arrive here) releases this one at once instead of at the timeout.
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    bool done = false;
    // Once every local rank is here, the last one is in the processes' collective, which has a
    // timeout of its own and aborts this communicator when it fails.
    while (!done && (std::chrono::steady_clock::now() < deadline || round.arrived == static_cast<int>(n))) {
      done = cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return round.complete || !aborted_.empty(); });
      if (!done && backward_pass_failed()) {
        aborted_ = detail::str_cat(tag, " on ", devices_[static_cast<size_t>(rank)].str(),
                                   ": the backward pass failed on another device");
        cv_.notify_all();
        done = true;
      }
    }
    if (!done) {
      std::string missing;
      for (size_t r = 0; r < n; ++r) {
        if (!round.inputs[r].defined()) missing += (missing.empty() ? "" : ", ") + devices_[r].str();
      }
      aborted_ =
          detail::str_cat(tag, " timed out after ", timeout_.count(), " ms on ",
                          devices_[static_cast<size_t>(rank)].str(), " (call ", seq, "): no call from ", missing);
      cv_.notify_all();
    }
    EF_CHECK(round.complete, tag, " on ", devices_[static_cast<size_t>(rank)].str(),
             ": the communicator was aborted: ", aborted_);
  }
  Tensor result = round.results[static_cast<size_t>(rank)];
  if (++round.departed == static_cast<int>(n)) rounds_.erase(seq);
  return result;
}

Tensor LocalCommunicator::all_reduce(int rank, const Tensor& x) {
  check_rank("all_reduce", rank, x);
  return meet(rank, x, tag_of("all_reduce", x, -1), -1, combine_all_reduce);
}

Tensor LocalCommunicator::broadcast(int rank, const Tensor& x, int root) {
  check_rank("broadcast", rank, x);
  EF_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is out of range for ", size(), " ranks");
  return meet(rank, x, tag_of("broadcast", x, root), root, combine_broadcast);
}

Tensor LocalCommunicator::reduce(int rank, const Tensor& x, int root) {
  check_rank("reduce", rank, x);
  EF_CHECK(root >= 0 && root < size(), "reduce: root ", root, " is out of range for ", size(), " ranks");
  return meet(rank, x, tag_of("reduce", x, root), root, combine_reduce);
}

Tensor LocalCommunicator::all_gather(int rank, const Tensor& x) {
  check_rank("all_gather", rank, x);
  EF_CHECK(x.dim() >= 1, "all_gather: needs at least one dim, got a scalar on rank ", rank);
  return meet(rank, x, tag_of("all_gather", x, -1), -1, combine_all_gather);
}

Tensor LocalCommunicator::reduce_scatter(int rank, const Tensor& x) {
  check_rank("reduce_scatter", rank, x);
  EF_CHECK(x.dim() >= 1 && x.size(0) % size() == 0, "reduce_scatter: dim 0 of ", shape_str(x.shape()),
           " is not divisible by the ", size(), " ranks");
  return meet(rank, x, tag_of("reduce_scatter", x, -1), -1, combine_reduce_scatter);
}

void LocalCommunicator::all_reduce_in_place(const std::vector<std::vector<Tensor>>& per_rank) {
  check_in_place(per_rank);
  {
    std::lock_guard<std::mutex> lock(mu_);
    EF_CHECK(aborted_.empty(), "all_reduce_in_place: the communicator was aborted: ", aborted_);
  }
  // One rank's sums are its own tensors (a one-device model syncs every step, so this is hot).
  // With more, each sum is taken in rank order, as ordered_sum adds, and copied to every rank: the
  // same bits everywhere.
  if (size() == 1) return;
  NoGradGuard no_grad;
  const std::vector<Tensor>& first = per_rank[0];
  const bool across_processes = in_place_processes_->size() > 1;
  if (across_processes) in_place_processes_->set_timeout(timeout_);
  bool on_host = true;
  for (const auto& tensors : per_rank)
    for (const Tensor& x : tensors) on_host = on_host && x.device().is_cpu();
  if (on_host) {
    // CPU devices share the host's memory: summed and copied where they lie, without the device
    // copies (.to) of the engine's ops, in one host buffer when the processes sum it too (one
    // call for the list). These copies are most of the time a bucket takes besides the processes'
    // sum (scripts/bench_processes.sh).
    // Each tensor's sum: in rank 0's tensor, or across processes in its slice of one flat buffer.
    if (across_processes) {
      for (const Device& d : devices_)
        detail::check_not_recording(d, "a gradient sum across processes",
                                    "the processes' collective runs on the host; not supported in a recorded step");
    }
    int64_t total = 0;
    for (const Tensor& x : first) total += x.numel();
    const Tensor flat = across_processes ? empty({total}, {.dtype = first[0].dtype()}) : Tensor();
    // In a recorded step, the sums are recorded with the kernels (Note [Recording CPU devices]).
    detail::on_device_memory(devices_, [per_rank, flat, across_processes, this] {
      const std::vector<Tensor>& sums_into = per_rank[0];
      const size_t esize = dtype_size(sums_into[0].dtype());
      std::vector<char*> sums;
      size_t offset = 0;
      for (const Tensor& x : sums_into) {
        sums.push_back(across_processes ? static_cast<char*>(flat.data_ptr()) + offset
                                        : static_cast<char*>(x.data_ptr()));
        offset += static_cast<size_t>(x.numel()) * esize;
      }
      const auto bytes = [&](size_t i) { return static_cast<size_t>(sums_into[i].numel()) * esize; };
      for (size_t i = 0; i < sums_into.size(); ++i) {
        if (across_processes) std::memcpy(sums[i], sums_into[i].data_ptr(), bytes(i));
        for (size_t r = 1; r < per_rank.size(); ++r)
          add_host(sums[i], per_rank[r][i].data_ptr(), sums_into[i].numel(), sums_into[i].dtype());
      }
      if (across_processes) in_place_processes_->all_reduce(flat);
      for (size_t i = 0; i < sums_into.size(); ++i)
        for (size_t r = across_processes ? 0 : 1; r < per_rank.size(); ++r)
          std::memcpy(per_rank[r][i].data_ptr(), sums[i], bytes(i));
    });
    for (const auto& tensors : per_rank)
      for (const Tensor& x : tensors) x.storage()->version.fetch_add(1);  // written in place, as copy_ marks
    return;
  }
  for (size_t r = 1; r < per_rank.size(); ++r)
    for (size_t i = 0; i < first.size(); ++i) first[i].add_(per_rank[r][i].to(first[i].device()));
  if (across_processes) {
    std::vector<Tensor> flattened;
    for (const Tensor& x : first) flattened.push_back(reshape(x, {x.numel()}));
    const Tensor host = host_copy(cat(flattened, 0));
    in_place_processes_->all_reduce(host);
    int64_t offset = 0;
    for (const Tensor& x : first) {
      x.copy_(host.narrow(0, offset, x.numel()).view(x.shape()).to(x.device()));
      offset += x.numel();
    }
  }
  for (size_t r = 1; r < per_rank.size(); ++r)
    for (size_t i = 0; i < first.size(); ++i) per_rank[r][i].copy_(first[i].to(per_rank[r][i].device()));
}

void LocalCommunicator::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.empty()) aborted_ = why;
  cv_.notify_all();
}

bool LocalCommunicator::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !aborted_.empty();
}

void LocalCommunicator::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_.clear();
  rounds_.clear();
  std::fill(next_sequence_.begin(), next_sequence_.end(), 0);
}

std::shared_ptr<Communicator> make_communicator(const std::vector<Device>& devices,
                                                std::shared_ptr<ProcessGroup> processes,
                                                [[maybe_unused]] const std::shared_ptr<Communicator>& parent) {
  EF_CHECK(!devices.empty(), "make_communicator: no devices given");
  bool all_cuda = true, any_cuda = false;
  std::set<int> gpus;
  for (const Device& d : devices) {
    all_cuda = all_cuda && d.is_cuda();
    any_cuda = any_cuda || d.is_cuda();
    if (d.is_cuda()) gpus.insert(cuda_physical_id(d));
  }
  EF_CHECK(all_cuda || !any_cuda, "make_communicator: a group mixes CPU and CUDA devices (", devices.front().str(),
           ", ...); use one kind");
  // NCCL needs distinct GPUs; logical devices sharing one meet in host memory.
#if EF_NCCL
  const bool several_processes = processes && processes->size() > 1;
  if (all_cuda && (devices.size() > 1 || several_processes) && gpus.size() == devices.size())
    return make_nccl_communicator(devices, std::move(processes),
                                  parent && std::string(parent->kind()) == "nccl" ? parent : nullptr);
#endif
  return std::make_shared<LocalCommunicator>(devices, std::move(processes));
}

}  // namespace evenflow::parallel
