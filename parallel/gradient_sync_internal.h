// The gradient all-reduce of DataParallelModel, in one place (Note [Gradient buckets]): which
// parameters form a bucket, when a bucket is complete, who reduces it and in what order, what a
// rank without a gradient contributes, and when backward() may return. DataParallelModel owns one
// and registers its hooks; nothing else drives it. An internal header of the parallel library (not
// installed).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "evenflow/parallel/communicator.h"

namespace evenflow::parallel {

// Note [Gradient buckets]
// Each replica parameter's post-accumulate hook (engine/autograd.h) tells GradientSync that rank r's
// gradient of parameter i is final for this backward pass; it runs on rank r's worker. Parameters
// are grouped into buckets in reverse registration order. When every active rank has reported every
// parameter of a bucket, the thread that reported last all-reduces the bucket's gradients (one call
// for all ranks, Communicator::all_reduce_in_place), while the other workers go on with backward.
// Nobody waits for anybody during backward, so a backward that also runs collectives (SyncBatchNorm)
// cannot deadlock against the buckets. finish() waits for buckets in flight and reduces the ones
// that never completed: parameters no replica used this time, or ranks that had no data (their
// gradients count as zeros). A gradient arriving for a parameter already synchronized since the
// last reset would be summed twice, so it is an error (use no_sync for accumulation).
//
// The first gradient of a backward pass queues finish() to run when the pass ends
// (queue_backward_callback), so the gradients are synchronized when backward() returns, as with
// PyTorch's DDP; an explicit finish() afterwards finds nothing left to do.
//
// With NCCL a bucket's reduce is queued on side streams and the call returns (Note [NCCL bucket
// reduce] in nccl_communicator.cu); finish() then makes every device's later work wait for the sums
// (Communicator::join_in_place), once backward has ended.
//
// Across processes (Note [Processes]) every process must reduce the buckets in the same order, and
// the order in which a process's buckets complete depends on its threads' timing. So there a
// thread of the model's own, the bucket thread, reduces them in bucket order as they complete,
// and no worker ever waits on another process during backward.
//
// Buckets hold the gradients in their own dtype, float32 under `--precision bf16` too (Note
// [bfloat16 compute] in engine/ops.h: weights and their gradients stay float32). bfloat16 buckets
// would halve the bytes, but the whole gradient sync of wgan_gp's critic is a tiny share of its
// step (docs/benchmarks.md, "The gradient all-reduce stays float32"), and every step would
// round each gradient to bfloat16 (relative 2^-9), which one device does not.
class GradientSync : public std::enable_shared_from_this<GradientSync> {
 public:
  // params[r][j]: rank r's replica of parameter j (names[j]), buckets of about bucket_bytes, sums
  // over `comm` (every rank of every process).
  GradientSync(std::vector<std::vector<Tensor>> params, std::vector<std::string> names,
               std::shared_ptr<Communicator> comm, size_t bucket_bytes);

  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Gradient accumulation (DataParallelModel::NoSync): while paused, ready gradients are not reduced.
  void pause(bool on) { no_sync_depth_ += on ? 1 : -1; }
  // Rank `rank`'s gradient of parameter `param` is final for this pass (its post-accumulate hook).
  void on_ready(int rank, size_t param);
  // Waits for the buckets in flight and reduces the incomplete ones; called when backward ends.
  void finish();
  // Forgets what was synchronized (zero_grad, step).
  void reset();

 private:
  struct Bucket {
    enum State { Waiting, Ready, Reducing, Reduced };  // Ready: complete, for the bucket thread
    std::vector<size_t> params;
    int pending = 0;
    State state = Waiting;
  };

  // Sums each parameter's gradients over ranks into every rank's gradient. A rank without one
  // (idle, or the parameter unused there) contributes zeros; a parameter no rank has stays without.
  // One collective per bucket (per dtype, where a bucket mixes them). A collective per parameter
  // would pay its fixed cost per parameter: across processes, far more than the whole bucket for
  // wgan_gp's critic (docs/benchmarks.md, "Data parallel across processes").
  void reduce(Bucket& b);

  // reduce() for parameters `js` of one dtype, in one collective. Which parameters some rank has a
  // gradient of is known here in one process; across processes the list ends with one value per
  // parameter saying whether the rank has its gradient (small integers, exact in the sum), so every
  // process learns it from the same call, and reads it when backward has ended
  // (drop_unused_gradients): reading it here would wait for the collective, in the middle of
  // backward.
  void reduce_together(std::vector<size_t> js);

  // After the collectives: a parameter no rank of any process had a gradient of loses the zeros
  // reduce_together gave it (across processes; in one process it never got them).
  void drop_unused_gradients();

  // The bucket thread: reduces the Ready buckets in bucket order, one after another.
  void reduce_in_order();

  std::vector<std::vector<Tensor>> params_;  // [rank][parameter]
  std::vector<std::string> names_;
  std::shared_ptr<Communicator> comm_;
  bool ordered_;  // across processes: the bucket thread reduces them, in order (see above)
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<std::vector<char>> ready_;  // [parameter][rank]
  std::atomic<int> no_sync_depth_{0};
  bool finish_queued_ = false;  // a pass will call finish() when it ends (guarded by mu_)
  size_t next_ = 0;             // the bucket the bucket thread reduces next (guarded by mu_)
  std::string bucket_error_;    // the bucket thread's first failure, for finish() (guarded by mu_)
  // Across processes: each reduced list's parameters and its count of ranks with a gradient of
  // each, read by drop_unused_gradients (guarded by mu_).
  std::vector<std::pair<std::vector<size_t>, Tensor>> with_grad_counts_;
  bool stopping_ = false;      // guarded by mu_
  std::thread bucket_thread_;  // only when ordered_
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace evenflow::parallel
