// StepGraph (step_graph.h) and the engine's side of a recording (capture_internal.h): the capture's state,
// the host effects and step scalars replayed with it, the CPU devices' recording of kernel calls,
// and values read back behind the device's work.
#include "evenflow/engine/step_graph.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <set>
#include <utility>

#include "evenflow/engine/autograd.h"
#include "evenflow/engine/capture_internal.h"
#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/error.h"
#include "evenflow/engine/ops.h"

namespace evenflow {

// Note [Step scalars]
// A kernel argument is part of what a recorded step replays: a value that changes from step to step
// (a random draw's seed and offset, Adam's step size and bias corrections, which also carry the
// learning rate) would be frozen at the value it had when the step was recorded. So inside a
// recording those values live in device memory instead: a table of the step's scalars on the first
// device, written at each replay by the host effects that compute them (step_scalars' `fill`, in the
// order the step made them, after the effects recorded before -- Adam's bias corrections after the
// step counts they follow) and copied to the device in one copy before the replayed work, which
// reads it. The host keeps the counters themselves (a generator's offset, each parameter's step
// count), advanced at each replay as an eager step advances them, so a checkpoint taken between
// replays holds what an eager run's would, and the kernels compute exactly what they compute when
// given the values: replayed steps equal eager ones bit for bit. Outside a recording the values are
// passed as arguments, as before.

namespace detail {

std::atomic<int> g_recording{0};

void Capture::refuse(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (violation.empty()) violation = message;
  }
  EF_ERROR(message);
}

namespace {
thread_local StepThread tls_step_thread;
}  // namespace

StepThread step_thread() {
  return tls_step_thread;
}
void set_step_thread(StepThread s) {
  tls_step_thread = s;
}

Tensor StepConversions::get(const Tensor& t, Key key, const std::function<Tensor()>& convert) {
  const auto same_view = [&](const Entry& e) {
    return e.source.storage() == t.storage() && e.source.offset() == t.offset() && e.source.dtype() == t.dtype() &&
           e.source.shape() == t.shape() && e.source.strides() == t.strides() && e.key == key;
  };
  const uint64_t version = t.version();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : entries_)
      if (same_view(e) && e.version == version) return e.copy;
  }
  // Converted outside the lock: another device's thread may be converting its own weights.
  Tensor copy = convert();
  std::lock_guard<std::mutex> lock(mu_);
  const auto stale = std::find_if(entries_.begin(), entries_.end(), same_view);
  if (stale != entries_.end()) {
    *stale = {t, version, key, copy};  // an older version's copy, which no later pass can use
  } else {
    entries_.push_back({t, version, key, copy});
  }
  return copy;
}

StepConversions* step_conversions() {
  return tls_step_thread.conversions;
}

Capture* capture_of(const Device& d) {
  if (g_recording.load(std::memory_order_acquire) == 0) return nullptr;
  Capture* c = tls_step_thread.capture;
  if (c == nullptr) return nullptr;
  return std::find(c->devices.begin(), c->devices.end(), d) != c->devices.end() ? c : nullptr;
}

const void* step_scalars(const Device& d, size_t bytes, std::function<void(void* host)> fill) {
  Capture* c = capture_of(d);
  if (c == nullptr) return nullptr;
  std::unique_lock<std::mutex> lock(c->mu);
  const size_t offset = (c->scalars_host.size() + 15) / 16 * 16;
  if (offset + bytes > c->scalars_capacity) {
    lock.unlock();
    c->refuse(str_cat("a recorded step needs more than ", c->scalars_capacity,
                      " bytes of step scalars (random draws and optimizer steps): record a shorter step"));
  }
  c->scalars_host.resize(offset + bytes);
  c->effects.push_back([c, offset, fill = std::move(fill)] { fill(c->scalars_host.data() + offset); });
  return static_cast<const unsigned char*>(c->scalars_device) + offset;
}

namespace {
// Appends a call to the capture's list, tagged with the team size its caller would have used.
void record_call(Capture* c, std::function<void()> run) {
  const int threads = kernel_threads();
  std::lock_guard<std::mutex> lock(c->mu);
  c->calls.push_back({std::move(run), threads});
}
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

void check_host_access(const Device& d) {
  check_not_recording(d, "the host reading or writing a tensor's memory (data<T>(), item(), to_vector())",
                      "nothing has run while a step is recorded; read results after replay() (read_later)");
}

void check_not_recording(const Device& d, const char* what, const char* why) {
  Capture* c = capture_of(d);
  if (c != nullptr) c->refuse(str_cat(what, " on ", d.str(), " inside a recorded step: ", why));
}

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

std::unique_ptr<Backend> make_recording_backend(std::unique_ptr<Backend> kernels) {
  return std::make_unique<RecordingBackend>(std::move(kernels));
}

namespace {

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

// How much device memory a recording's step scalars may take (Note [Step scalars]): a few thousand
// random draws and optimizer steps.
constexpr size_t kScalarCapacity = size_t{64} << 10;

}  // namespace
}  // namespace detail

// --- StepGraph ------------------------------------------------------------------------------------

struct StepGraph::Impl {
  std::vector<Device> devices;               // of the recording
  std::unique_ptr<detail::Capture> capture;  // null: empty
  std::unique_ptr<detail::DeviceRecording> recording;
  Tensor scalars;                    // the step scalars' device memory, on devices[0]
  std::map<Device, uint64_t> pools;  // the graph's pool on each device it used
  int64_t device_allocations = 0;

  // ef::Error unless `ds` can be recorded together.
  static void check_devices(const char* who, const std::vector<Device>& ds) {
    EF_CHECK(!ds.empty(), who, ": no devices given");
    std::set<Device> seen;
    for (const Device& d : ds) {
      check_device(d);
      EF_CHECK(seen.insert(d).second, who, ": device ", d.str(), " is listed twice");
      EF_CHECK(d.type == ds[0].type, who, ": ", ds[0].str(), " and ", d.str(),
               " are of different kinds; a step is recorded on CPU devices or on CUDA devices");
      // Logical devices of one GPU are recorded as one CUDA graph of their streams; GPUs of their own
      // would need one graph each, with NCCL's collectives inside: not supported yet.
      EF_CHECK(!d.is_cuda() || cuda_physical_id(d) == cuda_physical_id(ds[0]), who, ": ", ds[0].str(), " and ", d.str(),
               " are on different GPUs (", cuda_physical_id(ds[0]), " and ", cuda_physical_id(d),
               "); a recorded step runs on the logical devices of one GPU");
    }
  }

  // Makes `d`'s allocations by the step's threads come from the graph's pool (made on first use).
  void use_pool(const Device& d) {
    CachingAllocator& allocator = context(d).allocator();
    auto it = pools.find(d);
    if (it == pools.end()) it = pools.emplace(d, allocator.new_pool()).first;
    allocator.use_pool(it->second);
  }

  uint64_t pool_device_allocs() const {
    uint64_t n = 0;
    for (const auto& [d, pool] : pools) n += context(d).allocator().pool_usage(pool).second;
    return n;
  }

  // Waits for the devices (what they run may use the recording), then drops it. An error of the
  // replays that nobody read is lost here (the destructor cannot throw it): reset() and capture()
  // synchronize first, throwing it.
  void drop() {
    for (const Device& d : devices) {
      try {
        synchronize(d);
      } catch (const std::exception&) {
      }
    }
    recording.reset();
    capture.reset();
    scalars = Tensor();
    devices.clear();
  }

  ~Impl() {
    drop();
    for (const auto& [d, pool] : pools) context(d).allocator().retire_pool(pool);
  }
};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;

namespace {
// Makes the calling thread (and the tasks it posts) work for a step while it lives (Note [The
// step's threads]).
class StepThreadGuard {
 public:
  explicit StepThreadGuard(detail::Capture* capture) : previous_(detail::step_thread()) {
    detail::set_step_thread({.capture = capture, .in_step = true, .conversions = previous_.conversions});
  }
  ~StepThreadGuard() { detail::set_step_thread(previous_); }
  StepThreadGuard(const StepThreadGuard&) = delete;
  StepThreadGuard& operator=(const StepThreadGuard&) = delete;

 private:
  detail::StepThread previous_;
};

// Keeps the conversions of the calling thread's step, and of the tasks it posts, while it lives
// (Note [Conversions kept for a step] in capture_internal.h).
class KeptConversions {
 public:
  KeptConversions() : previous_(detail::step_thread()) {
    detail::StepThread s = previous_;
    s.conversions = &conversions_;
    detail::set_step_thread(s);
  }
  ~KeptConversions() { detail::set_step_thread(previous_); }
  KeptConversions(const KeptConversions&) = delete;
  KeptConversions& operator=(const KeptConversions&) = delete;

 private:
  detail::StepThread previous_;
  detail::StepConversions conversions_;
};

// Runs one call of `step`, its conversions kept until it returns: before a recording ends, so that
// the copies go back to the pool as the step's other intermediates do.
void call_step(const std::function<void()>& step) {
  const KeptConversions kept;
  step();
}
}  // namespace

// Puts `devices`' allocations in the graph's pools while it lives (undoing every one it set, however
// it ends).
class StepGraph::PoolScope {
 public:
  PoolScope(Impl& impl, const std::vector<Device>& devices) : impl_(impl) {
    for (const Device& d : devices) {
      impl_.use_pool(d);
      set_.push_back(d);
    }
  }
  ~PoolScope() {
    for (const Device& d : set_) context(d).allocator().use_pool(0);
  }
  PoolScope(const PoolScope&) = delete;
  PoolScope& operator=(const PoolScope&) = delete;

 private:
  Impl& impl_;
  std::vector<Device> set_;
};

void StepGraph::warm_up(const std::vector<Device>& devices, const std::function<void()>& step) {
  Impl::check_devices("StepGraph::warm_up", devices);
  // The pool's free blocks include those a recording's replays write (its intermediates, and the
  // tensors its host code let go): an eager step given them would have its results overwritten by
  // the next replay. So an earlier recording is dropped first, as capture() drops it.
  reset();
  const PoolScope pools(*impl_, devices);
  const StepThreadGuard in_step(nullptr);
  call_step(step);
}

namespace {
// Marks `devices` as recorded by `capture` while it lives (Note [The step's threads]).
class RecordingScope {
 public:
  RecordingScope(const std::vector<Device>& devices, detail::Capture* capture) : devices_(devices) {
    detail::g_recording.fetch_add(1, std::memory_order_acq_rel);
    for (const Device& d : devices_) context(d).set_capture(capture);
  }
  ~RecordingScope() {
    for (const Device& d : devices_) context(d).set_capture(nullptr);
    detail::g_recording.fetch_sub(1, std::memory_order_acq_rel);
  }
  RecordingScope(const RecordingScope&) = delete;
  RecordingScope& operator=(const RecordingScope&) = delete;

 private:
  const std::vector<Device>& devices_;
};
}  // namespace

void StepGraph::capture(const std::vector<Device>& devices, const std::function<void()>& step) {
  Impl::check_devices("StepGraph::capture", devices);
  for (const Device& d : devices)
    EF_CHECK(context(d).capture() == nullptr, "StepGraph::capture: ", d.str(), " is being recorded already");
  // The devices' deferred errors -- the last replays', earlier eager work's -- are thrown here as
  // they are, before anything is dropped or recorded.
  for (const Device& d : impl_->devices) synchronize(d);
  for (const Device& d : devices) synchronize(d);
  impl_->drop();
  auto capture = std::make_unique<detail::Capture>();
  capture->devices = devices;
  capture->scalars_capacity = detail::kScalarCapacity;
  // Outside the pool: the table is the graph's, not the step's.
  Tensor scalars =
      evenflow::empty({static_cast<int64_t>(detail::kScalarCapacity / 8)}, {.dtype = kInt64, .device = devices[0]});
  capture->scalars_device = scalars.data_ptr();
  const uint64_t allocs_before = impl_->pool_device_allocs();
  std::unique_ptr<detail::DeviceRecording> recording;
  bool failed = false;
  std::string failure;
  {
    const PoolScope pools(*impl_, devices);
    const RecordingScope recorded(devices, capture.get());
    // The calling thread works for the step from the recording's start to its end, its
    // abandonment included (CudaBackend::activate keeps other threads' work out: Note [Work beside a
    // recording] in engine/cuda/recording_gate.h).
    const StepThreadGuard in_step(capture.get());
    try {
      recording = devices[0].is_cuda() ? detail::begin_cuda_recording(devices)
                                       : std::make_unique<detail::CpuRecording>(devices, capture.get());
      call_step(step);
      // The backward passes' bookkeeping ends with the step: nothing of it may run after.
      recording->end();
    } catch (const std::exception& e) {
      failed = true;
      failure = e.what();
    } catch (...) {
      failed = true;
      failure = "an exception that is not a std::exception";
    }
    if (failed && recording) recording->abandon();
  }
  if (!failed && !capture->violation.empty()) {  // the step caught the refusal
    failed = true;
    failure = capture->violation;
  }
  if (failed) {
    EF_ERROR("StepGraph::capture: the step on ", devices[0].str(), devices.size() > 1 ? " and others" : "",
             " cannot be recorded: ", failure);
  }
  impl_->device_allocations = static_cast<int64_t>(impl_->pool_device_allocs() - allocs_before);
  impl_->devices = devices;
  impl_->scalars = std::move(scalars);
  impl_->capture = std::move(capture);
  impl_->recording = std::move(recording);
}

void StepGraph::replay() {
  EF_CHECK(!empty(), "StepGraph::replay: nothing is recorded (capture a step first)");
  detail::Capture& c = *impl_->capture;
  for (const auto& effect : c.effects) effect();
  if (!c.scalars_host.empty()) {
    context(impl_->devices[0]).backend().copy_from_host(c.scalars_device, c.scalars_host.data(), c.scalars_host.size());
  }
  impl_->recording->replay();
}

void StepGraph::reset() {
  for (const Device& d : impl_->devices) synchronize(d);  // the replays' deferred errors, thrown
  impl_->drop();
}

bool StepGraph::empty() const {
  return impl_->capture == nullptr;
}

const std::vector<Device>& StepGraph::devices() const {
  return impl_->devices;
}

StepGraph::Stats StepGraph::stats() const {
  Stats s;
  for (const auto& [d, pool] : impl_->pools) s.pool_bytes += context(d).allocator().pool_usage(pool).first;
  if (empty()) return s;
  s.calls = impl_->recording->size();
  s.effects = static_cast<int64_t>(impl_->capture->effects.size());
  s.scalar_bytes = impl_->capture->scalars_host.size();
  s.device_allocations = impl_->device_allocations;
  return s;
}

// --- ReplayedStep -----------------------------------------------------------------------------------

ReplayedStep::ReplayedStep(std::vector<Device> devices, std::function<void()> step, Options options)
    : devices_(std::move(devices)), step_(std::move(step)), options_(std::move(options)) {
  EF_CHECK(options_.warm_up >= 1,
           "ReplayedStep: warm_up must be at least 1 (Adam's first step makes its moments), got ", options_.warm_up);
  if (!options_.log) options_.log = [](const std::string& line) { std::printf("step graph: %s\n", line.c_str()); };
}

void ReplayedStep::operator()(const std::string& signature) {
  replayed_ = false;
  if (!options_.record) {
    call_step(step_);
    return;
  }
  const CudaMath math = cuda_math();
  const std::string full =
      detail::str_cat(signature, signature.empty() ? "" : ", ", "TF32 convolutions ", math.allow_tf32_conv,
                      ", TF32 products ", math.allow_tf32_matmul, ", deterministic ", math.deterministic,
                      ", benchmark ", math.benchmark, ", bfloat16 convolution results ", math.allow_bf16_conv_results);
  if (!signed_ || full != signature_) {
    if (signed_) {
      options_.log(detail::str_cat("the step changed (", signature_, " -> ", full, "): recording it again after ",
                                   options_.warm_up, " eager step", options_.warm_up == 1 ? "" : "s"));
    }
    // First, as it may throw a deferred error of the last replays: the signature stays the old one
    // then, so that the next call comes here again instead of replaying the old recording.
    graph_.reset();
    signed_ = true;
    signature_ = full;
    eager_calls_ = 0;
    cannot_record_ = false;
  }
  if (cannot_record_) {
    call_step(step_);
    return;
  }
  if (eager_calls_ < options_.warm_up) {
    graph_.warm_up(devices_, step_);
    ++eager_calls_;
    return;
  }
  if (graph_.empty()) {
    // A deferred error of earlier steps is the caller's, not a reason the step cannot be recorded.
    for (const Device& d : devices_) synchronize(d);
    try {
      graph_.capture(devices_, step_);
    } catch (const Error& e) {
      cannot_record_ = true;
      options_.log(detail::str_cat("running the step eagerly: ", e.what()));
      call_step(step_);  // the recording did not run it
      return;
    }
    const StepGraph::Stats s = graph_.stats();
    options_.log(detail::str_cat("recorded the step on ", devices_[0].str(),
                                 devices_.size() > 1 ? detail::str_cat(" and ", devices_.size() - 1, " more") : "",
                                 ": ", s.calls, devices_[0].is_cuda() ? " graph nodes, " : " kernel calls, ", s.effects,
                                 " host effects, ", s.scalar_bytes, " bytes of step scalars, ", s.pool_bytes >> 20,
                                 " MiB pool (", s.device_allocations, " blocks obtained while recording)"));
  }
  graph_.replay();
  replayed_ = true;
}

bool recording(const Device& d) {
  return detail::capture_of(d) != nullptr;
}

void each_step(const Device& d, std::function<void()> effect) {
  detail::Capture* c = detail::capture_of(d);
  if (c == nullptr) {
    effect();
    return;
  }
  std::lock_guard<std::mutex> lock(c->mu);
  c->effects.push_back(std::move(effect));
}

// --- Values read later -----------------------------------------------------------------------------

HostValues read_later(const Tensor& t) {
  EF_CHECK(t.defined(), "read_later: undefined tensor");
  detail::check_not_recording(t.device(), "read_later",
                              "nothing has run while a step is recorded; read its results after replay()");
  NoGradGuard no_grad;
  const Tensor src = t.to(kFloat64).contiguous();
  HostValues h;
  h.values_ = std::make_shared<std::vector<double>>(static_cast<size_t>(src.numel()));
  h.wait_ = context(src.device())
                .backend()
                .copy_to_host_later(h.values_->data(), src.data_ptr(), h.values_->size() * sizeof(double));
  return h;
}

std::vector<double> HostValues::get() {
  EF_CHECK(valid(), "HostValues::get: no values (read once, from read_later)");
  const std::function<void()> wait = std::exchange(wait_, nullptr);
  wait();
  return std::move(*values_);
}

}  // namespace evenflow
