// GradientSync (see gradient_sync_internal.h, Note [Gradient buckets]).
#include "evenflow/parallel/gradient_sync_internal.h"

#include <algorithm>

#include "evenflow/engine/autograd.h"
#include "evenflow/engine/capture_internal.h"
#include "evenflow/parallel/process_group_internal.h"

namespace evenflow::parallel {

GradientSync::GradientSync(std::vector<std::vector<Tensor>> params, std::vector<std::string> names,
                           std::shared_ptr<Communicator> comm, size_t bucket_bytes)
    : params_(std::move(params)),
      names_(std::move(names)),
      comm_(std::move(comm)),
      ordered_(comm_->processes()->size() > 1) {
  const size_t n = params_[0].size();
  bucket_of_.resize(n);
  size_t bytes = 0;
  for (size_t j = n; j-- > 0;) {
    const Tensor& p = params_[0][j];
    const size_t nbytes = static_cast<size_t>(p.numel()) * dtype_size(p.dtype());
    if (buckets_.empty() || (bytes > 0 && bytes + nbytes > bucket_bytes)) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().params.push_back(j);
    bytes += nbytes;
    bucket_of_[j] = buckets_.size() - 1;
  }
  ready_.assign(n, std::vector<char>(params_.size(), 0));
  reset();
  if (ordered_) bucket_thread_ = std::thread([this] { reduce_in_order(); });
}

GradientSync::~GradientSync() {
  if (!ordered_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  bucket_thread_.join();
}

void GradientSync::on_ready(int rank, size_t param) {
  if (no_sync_depth_.load() > 0) return;
  // Across processes the buckets are summed on a thread of their own, through the host.
  if (ordered_)
    detail::check_not_recording(params_[static_cast<size_t>(rank)][param].device(), "a gradient sum across processes",
                                "the processes meet on the host, which a replay does not repeat; record steps of one "
                                "process");
  Bucket* to_reduce = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finish_queued_) finish_queued_ = queue_backward_callback([self = shared_from_this()] { self->finish(); });
    Bucket& b = buckets_[bucket_of_[param]];
    char& flag = ready_[param][static_cast<size_t>(rank)];
    EF_CHECK(!flag && b.state == Bucket::Waiting, "data parallel: replica ", rank, "'s parameter '", names_[param],
             "' received a gradient again after it was synchronized; run all but the last backward of an "
             "accumulation under no_sync(), and zero_grad() between steps");
    flag = 1;
    if (--b.pending == 0) {
      if (ordered_) {
        b.state = Bucket::Ready;
        cv_.notify_all();
      } else {
        b.state = Bucket::Reducing;
        to_reduce = &b;
      }
    }
  }
  if (to_reduce != nullptr) reduce(*to_reduce);
}

void GradientSync::finish() {
  // Whatever happens below, the devices' later work must wait for the sums already queued (NCCL:
  // on side streams), since the gradients they write stay in use.
  struct Join {
    Communicator& comm;
    ~Join() {
      try {
        comm.join_in_place();
      } catch (const std::exception&) {  // an aborted communicator: the failure is reported already
      }
    }
  } join{*comm_};
  std::unique_lock<std::mutex> lock(mu_);
  finish_queued_ = false;
  if (ordered_) {
    // The rest in bucket order, on the bucket thread.
    for (Bucket& b : buckets_)
      if (b.state == Bucket::Waiting) b.state = Bucket::Ready;
    cv_.notify_all();
    cv_.wait(lock, [&] {
      for (const Bucket& b : buckets_)
        if (b.state != Bucket::Reduced) return false;
      return true;
    });
    if (!bucket_error_.empty()) {
      const std::string error = std::exchange(bucket_error_, std::string());
      EF_ERROR(error);
    }
  } else {
    cv_.wait(lock, [&] {
      for (const Bucket& b : buckets_)
        if (b.state == Bucket::Reducing) return false;
      return true;
    });
    for (Bucket& b : buckets_) {
      if (b.state != Bucket::Waiting) continue;
      b.state = Bucket::Reducing;
      lock.unlock();
      reduce(b);
      lock.lock();
    }
  }
  lock.unlock();
  // The sums may still be on their way (NCCL: side streams): their counts are read after the join.
  comm_->join_in_place();
  drop_unused_gradients();
}

void GradientSync::reset() {
  std::unique_lock<std::mutex> lock(mu_);
  // A bucket the bucket thread took is finished first (a failed step can leave one behind).
  cv_.wait(lock, [&] {
    for (const Bucket& b : buckets_)
      if (b.state == Bucket::Reducing) return false;
    return true;
  });
  next_ = 0;
  bucket_error_.clear();
  with_grad_counts_.clear();
  for (auto& r : ready_) std::fill(r.begin(), r.end(), 0);
  for (Bucket& b : buckets_) {
    b.state = Bucket::Waiting;
    b.pending = static_cast<int>(b.params.size()) * static_cast<int>(params_.size());
  }
}

void GradientSync::reduce(Bucket& b) {
  std::string error;
  try {
    if (comm_->size() > 1) {
      std::vector<DType> dtypes;
      for (size_t j : b.params)
        if (std::find(dtypes.begin(), dtypes.end(), params_[0][j].dtype()) == dtypes.end())
          dtypes.push_back(params_[0][j].dtype());
      for (DType dtype : dtypes) {
        std::vector<size_t> of_dtype;
        for (size_t j : b.params)
          if (params_[0][j].dtype() == dtype) of_dtype.push_back(j);
        reduce_together(of_dtype);
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    b.state = Bucket::Reduced;
  }
  cv_.notify_all();
  EF_CHECK(error.empty(), "data parallel: gradient all-reduce failed: ", error);
}

void GradientSync::reduce_together(std::vector<size_t> js) {
  NoGradGuard no_grad;
  if (!ordered_) {
    std::erase_if(js, [&](size_t j) {
      return std::none_of(params_.begin(), params_.end(), [&](const auto& ps) { return ps[j].grad().defined(); });
    });
    if (js.empty()) return;
  }
  std::vector<std::vector<Tensor>> lists;
  for (const auto& rank_params : params_) {
    std::vector<Tensor> list;
    std::vector<double> has_grad;
    for (size_t j : js) {
      const Tensor& p = rank_params[j];
      has_grad.push_back(p.grad().defined() ? 1.0 : 0.0);
      if (!p.grad().defined()) p.set_grad(zeros_like(p));  // dropped again after if no rank has one
      list.push_back(p.grad());
    }
    if (ordered_) {
      const Tensor& first = rank_params[js[0]];
      list.push_back(
          from_vector(has_grad, {static_cast<int64_t>(js.size())}, {.dtype = first.dtype(), .device = first.device()}));
    }
    lists.push_back(std::move(list));
  }
  comm_->all_reduce_in_place(lists);
  if (ordered_) {
    std::lock_guard<std::mutex> lock(mu_);
    with_grad_counts_.emplace_back(std::move(js), lists[0].back());
  }
}

void GradientSync::drop_unused_gradients() {
  std::vector<std::pair<std::vector<size_t>, Tensor>> counts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    counts.swap(with_grad_counts_);
  }
  NoGradGuard no_grad;
  for (const auto& [js, count] : counts) {
    const Tensor ranks_with_grad = count.to(cpu()).to(kFloat64);
    for (size_t i = 0; i < js.size(); ++i) {
      if (ranks_with_grad.data<double>()[i] != 0) continue;
      for (const auto& rank_params : params_) rank_params[js[i]].set_grad(Tensor());
    }
  }
}

void GradientSync::reduce_in_order() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || (next_ < buckets_.size() && buckets_[next_].state == Bucket::Ready); });
    if (stopping_) return;
    Bucket& b = buckets_[next_++];
    b.state = Bucket::Reducing;
    lock.unlock();
    try {
      reduce(b);
    } catch (const std::exception& e) {
      lock.lock();
      if (bucket_error_.empty()) bucket_error_ = e.what();
      continue;
    }
    lock.lock();
  }
}

}  // namespace evenflow::parallel
