// StepGraph (step_graph.h) and the engine's side of a recording (capture_internal.h): the capture's state,
// the host effects and step scalars replayed with it, and values read back behind the device's work.
// The CPU devices' recording of kernel calls is cpu_recording.cpp.
#include "evenflow/engine/step_graph.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
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

void check_host_access(const Device& d) {
  check_not_recording(d, "the host reading or writing a tensor's memory (data<T>(), item(), to_vector())",
                      "nothing has run while a step is recorded; read results after replay() (read_later)");
}

void check_not_recording(const Device& d, const char* what, const char* why) {
  Capture* c = capture_of(d);
  if (c != nullptr) c->refuse(str_cat(what, " on ", d.str(), " inside a recorded step: ", why));
}

namespace {

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
                                       : detail::begin_cpu_recording(devices, capture.get());
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
