// The CPU devices' side of a recorded step (Note [Recording CPU devices]): the backend decorator that
// keeps their kernel calls while a capture is active, host code on their memory kept among the calls
// (on_device_memory), and the recording that replays the calls on the first device's worker. CUDA
// devices' recordings are CUDA graphs (cuda/cuda_graph.cu).
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "evenflow/engine/capture_internal.h"
#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/error.h"

namespace evenflow::detail {

// Note [Recording CPU devices]
// A CPU device runs each kernel when it is called, on the calling thread. While it is recorded, its
// backend -- this decorator around the CPU kernels -- keeps every call (its views, scalars and the
// OpenMP team size kernel_threads() would give it) in the capture's list instead, in the order the
// calls were made, whichever thread made them and on whichever of the capture's devices; a replay
// makes them again in that order, on the first device's worker. That order is one the eager step
// could have run in: a call that reads what another wrote was made after the other returned (the
// threads meet through tasks and collectives first), and a block the allocator hands out again was
// released after the calls that used it. Host code that moves CPU devices' memory itself (a copy
// between CPU devices, the local communicator's sums) is kept the same way (on_device_memory). The
// recorded team sizes keep each kernel's partition of its work, so a replay computes the eager
// step's values to the bit -- which is what lets CI check the contract of Note [A step that can be
// replayed] on CPU devices: a counter passed by value makes the replay differ, an item() or a copy
// from the host is refused while recording.

namespace {

// Appends a call to the capture's list, tagged with the team size its caller would have used.
void record_call(Capture* c, std::function<void()> run) {
  const int threads = kernel_threads();
  std::lock_guard<std::mutex> lock(c->mu);
  c->calls.push_back({std::move(run), threads});
}

class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(std::unique_ptr<Backend> kernels) : kernels_(std::move(kernels)) {}

  void start(Capture* c) { capture_.store(c, std::memory_order_release); }
  // Stops recording for `c` (and not another capture that took the device since).
  void stop(Capture* c) { capture_.compare_exchange_strong(c, nullptr, std::memory_order_acq_rel); }

  void* raw_alloc(size_t nbytes) override { return kernels_->raw_alloc(nbytes); }
  void raw_free(void* ptr) override { kernels_->raw_free(ptr); }
  // The engine refuses host copies into or out of a recorded device before they get here
  // (dispatch.cpp); a direct call is refused as well.
  void copy_from_host(void* dst, const void* src, size_t nbytes) override {
    refuse("a copy from host memory");
    kernels_->copy_from_host(dst, src, nbytes);
  }
  void copy_to_host(void* dst, const void* src, size_t nbytes) override {
    refuse("a copy to host memory");
    kernels_->copy_to_host(dst, src, nbytes);
  }
  std::function<void()> copy_to_host_later(void* dst, const void* src, size_t nbytes) override {
    refuse("a copy to host memory");
    return kernels_->copy_to_host_later(dst, src, nbytes);
  }
  void synchronize() override { refuse("synchronize"); }

  void fill(const View& out, double value) override {
    call([=, this] { kernels_->fill(out, value); });
  }
  void arange(const View& out, double start, double step) override {
    call([=, this] { kernels_->arange(out, start, step); });
  }
  void copy(const View& out, const View& x) override {
    call([=, this] { kernels_->copy(out, x); });
  }
  void unary(UnaryOp op, const View& out, const View& x, double a, double b) override {
    call([=, this] { kernels_->unary(op, out, x, a, b); });
  }
  void binary(BinaryOp op, const View& out, const View& x, const View& y, double a) override {
    call([=, this] { kernels_->binary(op, out, x, y, a); });
  }
  void where(const View& out, const View& cond, const View& x, const View& y) override {
    call([=, this] { kernels_->where(out, cond, x, y); });
  }
  void add_n(const View& out, const std::vector<View>& xs) override {
    call([=, this] { kernels_->add_n(out, xs); });
  }
  void reduce(ReduceOp op, const View& out, const View& x) override {
    call([=, this] { kernels_->reduce(op, out, x); });
  }
  void gemm(const GemmArgs& args) override {
    call([=, this] { kernels_->gemm(args); });
  }
  bool bf16_gemm(const GemmArgs& args) const override { return kernels_->bf16_gemm(args); }
  void conv2d(const ConvArgs& args, const View& y, const View& x, const View& w, const View& bias) override {
    call([=, this] { kernels_->conv2d(args, y, x, w, bias); });
  }
  void conv2d_input_grad(const ConvArgs& args, const View& gx, const View& gy, const View& w) override {
    call([=, this] { kernels_->conv2d_input_grad(args, gx, gy, w); });
  }
  void conv2d_weight_grad(const ConvArgs& args, const View& gw, const View& x, const View& gy) override {
    call([=, this] { kernels_->conv2d_weight_grad(args, gw, x, gy); });
  }
  bool bf16_conv(const ConvArgs& args, ConvPass pass) override { return kernels_->bf16_conv(args, pass); }
  bool channels_last_conv(const ConvArgs& args, ConvPass pass, DType dtype) override {
    return kernels_->channels_last_conv(args, pass, dtype);
  }
  void normalize(const NormArgs& args, const View& y, const View& mean, const View& var, const View& rstd,
                 const View& x, const View& weight, const View& bias, const RunningStats& running) override {
    call([=, this] { kernels_->normalize(args, y, mean, var, rstd, x, weight, bias, running); });
  }
  void normalize_backward(const NormArgs& args, const View& gx, const View& gw, const View& gb, const View& gy,
                          const View& x, const View& mean, const View& rstd, const View& weight) override {
    call([=, this] { kernels_->normalize_backward(args, gx, gw, gb, gy, x, mean, rstd, weight); });
  }
  // The CPU kernels have the double backward for every NormArgs (they return true), so the answer
  // does not need the call to run.
  bool normalize_double_backward(const NormArgs& args, const View& dgy, const View& dx, const View& dw, const View& ggx,
                                 const View& ggw, const View& ggb, const View& gy, const View& x, const View& mean,
                                 const View& rstd, const View& weight) override {
    Capture* c = capture_.load(std::memory_order_acquire);
    if (c == nullptr || step_thread().capture != c)
      return kernels_->normalize_double_backward(args, dgy, dx, dw, ggx, ggw, ggb, gy, x, mean, rstd, weight);
    call([=, this] {
      const bool ran = kernels_->normalize_double_backward(args, dgy, dx, dw, ggx, ggw, ggb, gy, x, mean, rstd, weight);
      EF_ASSERT(ran, "the CPU kernels declined a normalization double backward they were recorded for");
    });
    return true;
  }
  void softmax(const View& out, const View& x, bool log) override {
    call([=, this] { kernels_->softmax(out, x, log); });
  }
  bool has_softmax_dim1() const override { return kernels_->has_softmax_dim1(); }
  void softmax_dim1(const View& out, const View& x, bool log) override {
    call([=, this] { kernels_->softmax_dim1(out, x, log); });
  }
  void max_pool2d(const PoolArgs& args, const View& out, const View& indices, const View& x) override {
    call([=, this] { kernels_->max_pool2d(args, out, indices, x); });
  }
  void max_pool2d_backward(const PoolArgs& args, const View& gx, const View& gy, const View& indices) override {
    call([=, this] { kernels_->max_pool2d_backward(args, gx, gy, indices); });
  }
  // Recorded: a replayed kernel meets a bad index when it runs, and replay() throws it; a GPU
  // reports it at the next synchronization (Note [Index checks in a recorded step]).
  void gather(const View& out, const View& x, int dim, const View& index) override {
    call([=, this] { kernels_->gather(out, x, dim, index); });
  }
  void scatter_add(const View& out, int dim, const View& index, const View& src) override {
    call([=, this] { kernels_->scatter_add(out, dim, index, src); });
  }
  void index_select(const View& out, const View& x, int dim, const View& index) override {
    call([=, this] { kernels_->index_select(out, x, dim, index); });
  }
  void index_add(const View& out, int dim, const View& index, const View& src) override {
    call([=, this] { kernels_->index_add(out, dim, index, src); });
  }
  void check_index_range(const View& index, int64_t size, int64_t allowed,
                         std::function<std::string(int64_t)> describe) override {
    call([=, this] { kernels_->check_index_range(index, size, allowed, describe); });
  }
  void adam(const AdamArgs& args, const std::vector<AdamOperands>& params) override {
    call([=, this] { kernels_->adam(args, params); });
  }
  void random(const View& out, RandomKind kind, double a, double b, const RandomKey& key) override {
    call([=, this] { kernels_->random(out, kind, a, b, key); });
  }

 private:
  template <typename F>
  void call(F&& run) {
    Capture* c = capture_.load(std::memory_order_acquire);
    if (c == nullptr || step_thread().capture != c) {  // not the step's call (Note [The step's threads])
      run();
      return;
    }
    record_call(c, std::function<void()>(std::forward<F>(run)));
  }
  void refuse(const char* what, const char* why = "nothing runs while a step is recorded") {
    Capture* c = capture_.load(std::memory_order_acquire);
    if (c == nullptr || step_thread().capture != c) return;
    c->refuse(str_cat(what, " on a CPU device inside a recorded step: ", why));
  }

  std::unique_ptr<Backend> kernels_;
  std::atomic<Capture*> capture_{nullptr};
};

// Runs fn on `d`'s worker thread and waits for it (at once when called there); rethrows what fn
// throws.
void run_on_worker(const Device& d, const std::function<void()>& fn) {
  Worker& worker = context(d).worker();
  if (Worker::current() == &worker) {
    fn();
    return;
  }
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  worker.post([&] {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (error) std::rethrow_exception(error);
}

// The CPU devices' recording: their backends keep every call in the capture's list.
class CpuRecording final : public DeviceRecording {
 public:
  CpuRecording(std::vector<Device> devices, Capture* capture) : devices_(std::move(devices)), capture_(capture) {
    for (const Device& d : devices_) backend(d).start(capture_);
  }
  ~CpuRecording() override { stop(); }
  void end() override { stop(); }
  void abandon() noexcept override {
    stop();
    capture_->calls.clear();
  }
  void replay() override {
    run_on_worker(devices_[0], [this] {
      for (const RecordedCall& call : capture_->calls) {
        const KernelThreadsGuard threads(call.kernel_threads);
        call.run();
      }
    });
  }
  int64_t size() const override { return static_cast<int64_t>(capture_->calls.size()); }

 private:
  static RecordingBackend& backend(const Device& d) {
    auto* b = dynamic_cast<RecordingBackend*>(&context(d).backend());
    EF_ASSERT(b != nullptr, d.str(), "'s backend does not record");
    return *b;
  }
  void stop() noexcept {
    for (const Device& d : devices_) {
      if (auto* b = dynamic_cast<RecordingBackend*>(&context(d).backend())) b->stop(capture_);
    }
  }
  std::vector<Device> devices_;
  Capture* capture_;
};

}  // namespace

void on_device_memory(const std::vector<Device>& devices, std::function<void()> fn) {
  Capture* c = nullptr;
  for (const Device& d : devices)
    if (d.is_cpu() && (c = capture_of(d)) != nullptr) break;
  if (c == nullptr) {
    fn();
    return;
  }
  for (const Device& d : devices) {
    if (capture_of(d) != c) {
      c->refuse(str_cat("a copy between ", devices[0].str(), " and ", devices.back().str(),
                        " inside a recorded step of ", d == devices[0] ? devices.back().str() : devices[0].str(),
                        " alone: host values enter a recorded step through its own buffers, copied before replay(), "
                        "and results leave it after (read_later)"));
    }
  }
  record_call(c, std::move(fn));
}

std::unique_ptr<Backend> make_recording_backend(std::unique_ptr<Backend> kernels) {
  return std::make_unique<RecordingBackend>(std::move(kernels));
}

std::unique_ptr<DeviceRecording> begin_cpu_recording(const std::vector<Device>& devices, Capture* capture) {
  return std::make_unique<CpuRecording>(devices, capture);
}

}  // namespace evenflow::detail
