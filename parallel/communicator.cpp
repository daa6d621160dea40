#include "evenflow/parallel/communicator.h"

#include <set>

#include "evenflow/engine/autograd.h"
#include "evenflow/engine/ops.h"
#if EF_NCCL
#include "evenflow/parallel/nccl_communicator.h"
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

Communicator::Communicator(std::vector<Device> devices) : devices_(std::move(devices)) {
  check_distinct_devices("communicator", devices_);
}

void Communicator::check_rank(const char* op, int rank, const Tensor& x) const {
  EF_CHECK(rank >= 0 && rank < size(), op, ": rank ", rank, " is out of range for ", size(), " ranks");
  EF_CHECK(x.defined(), op, ": rank ", rank, " passed an undefined tensor");
  EF_CHECK(x.device() == devices_[static_cast<size_t>(rank)], op, ": rank ", rank, " passed a tensor on ",
           x.device().str(), ", but its device is ", devices_[static_cast<size_t>(rank)].str());
}

void Communicator::check_in_place(const std::vector<Tensor>& per_rank) const {
  EF_CHECK(per_rank.size() == devices_.size(), "all_reduce_in_place: ", per_rank.size(), " tensors for ", size(),
           " ranks");
  for (size_t r = 0; r < per_rank.size(); ++r) {
    check_rank("all_reduce_in_place", static_cast<int>(r), per_rank[r]);
    EF_CHECK(per_rank[r].shape() == per_rank[0].shape() && per_rank[r].dtype() == per_rank[0].dtype(),
             "all_reduce_in_place: rank ", r, " has ", shape_str(per_rank[r].shape()), " ",
             dtype_name(per_rank[r].dtype()), ", rank 0 has ", shape_str(per_rank[0].shape()), " ",
             dtype_name(per_rank[0].dtype()));
    // NCCL reduces flat buffers; the local path holds to the same contract so CPU tests catch a
    // strided gradient before a multi-GPU run does.
    EF_CHECK(per_rank[r].is_contiguous(), "all_reduce_in_place: rank ", r, "'s tensor ", per_rank[r].str(),
             " is not contiguous");
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

// Every combine runs with no autograd recording, on the thread of the last rank to arrive, and
// returns one result per rank on that rank's device.
std::vector<Tensor> combine_all_reduce(const std::vector<Tensor>& xs, const std::vector<Device>& devices, int) {
  const Tensor total = ordered_sum(xs, devices[0]);
  std::vector<Tensor> out;
  for (const Device& d : devices) out.push_back(total.to(d).clone());
  return out;
}

std::vector<Tensor> combine_broadcast(const std::vector<Tensor>& xs, const std::vector<Device>& devices, int root) {
  std::vector<Tensor> out;
  for (const Device& d : devices) out.push_back(xs[static_cast<size_t>(root)].to(d).clone());
  return out;
}

std::vector<Tensor> combine_reduce(const std::vector<Tensor>& xs, const std::vector<Device>& devices, int root) {
  std::vector<Tensor> out(devices.size());
  out[static_cast<size_t>(root)] = ordered_sum(xs, devices[static_cast<size_t>(root)]);
  return out;
}

std::vector<Tensor> combine_all_gather(const std::vector<Tensor>& xs, const std::vector<Device>& devices, int) {
  std::vector<Tensor> on_first;
  for (const Tensor& x : xs) on_first.push_back(x.to(devices[0]));
  const Tensor all = cat(on_first, 0);
  std::vector<Tensor> out;
  for (const Device& d : devices) out.push_back(all.to(d).clone());
  return out;
}

std::vector<Tensor> combine_reduce_scatter(const std::vector<Tensor>& xs, const std::vector<Device>& devices, int) {
  const Tensor total = ordered_sum(xs, devices[0]);
  const std::vector<Tensor> parts = chunk(total, static_cast<int64_t>(devices.size()), 0);
  std::vector<Tensor> out;
  for (size_t r = 0; r < devices.size(); ++r) out.push_back(parts[r].to(devices[r]).contiguous());
  return out;
}

}  // namespace

LocalCommunicator::LocalCommunicator(std::vector<Device> devices)
    : Communicator(std::move(devices)), next_sequence_(devices_.size(), 0) {}

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
      round.results = combine(round.inputs, devices_, root);
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
    while (!done && std::chrono::steady_clock::now() < deadline) {
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

void LocalCommunicator::all_reduce_in_place(const std::vector<Tensor>& per_rank) {
  check_in_place(per_rank);
  {
    std::lock_guard<std::mutex> lock(mu_);
    EF_CHECK(aborted_.empty(), "all_reduce_in_place: the communicator was aborted: ", aborted_);
  }
  // One rank's sum is its own tensor (a one-device model syncs every step, so this is hot). With
  // more, rank 0's tensor takes the sum, in rank order as ordered_sum adds, and the others copy it:
  // every rank gets the same bits, with no temporary.
  if (per_rank.size() == 1) return;
  NoGradGuard no_grad;
  const Tensor& total = per_rank[0];
  for (size_t r = 1; r < per_rank.size(); ++r) total.add_(per_rank[r].to(total.device()));
  for (size_t r = 1; r < per_rank.size(); ++r) per_rank[r].copy_(total.to(per_rank[r].device()));
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

std::shared_ptr<Communicator> make_communicator(const std::vector<Device>& devices) {
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
  if (all_cuda && devices.size() > 1 && gpus.size() == devices.size()) return make_nccl_communicator(devices);
#endif
  return std::make_shared<LocalCommunicator>(devices);
}

}  // namespace evenflow::parallel
