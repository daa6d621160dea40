#include <atomic>
#include <cstdlib>
#include <map>
#include <sstream>
#include <thread>

#include "evenflow/engine/capture_internal.h"
#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/cpu/threads.h"
#include "evenflow/engine/error.h"

namespace evenflow {

Device::Device(const std::string& spec) {
  std::string kind = spec;
  std::string number;
  if (auto colon = spec.find(':'); colon != std::string::npos) {
    kind = spec.substr(0, colon);
    number = spec.substr(colon + 1);
  }
  if (kind == "cpu")
    type = DeviceType::CPU;
  else if (kind == "cuda")
    type = DeviceType::CUDA;
  else
    EF_ERROR("unknown device '", spec, "': expected cpu, cpu:N, cuda or cuda:N");
  this->index = 0;
  if (spec.find(':') != std::string::npos) {
    EF_CHECK(!number.empty() && number.size() <= 4 && number.find_first_not_of("0123456789") == std::string::npos,
             "unknown device '", spec, "': the index after ':' must be a non-negative integer");
    this->index = std::stoi(number);
  }
}

std::string Device::str() const {
  return std::string(is_cpu() ? "cpu:" : "cuda:") + std::to_string(index);
}

// Note [Logical CUDA devices]
// cuda:i is a logical device: a physical GPU, its own stream, its own cuBLAS/cuDNN handles, its own
// allocator and worker thread. By default logical device i is physical GPU i. Mapping several
// logical devices onto one GPU (set_cuda_logical_devices({0, 0}) or EF_CUDA_DEVICES=0,0) lets the
// multi-device code run on a one-GPU machine; their streams then run concurrently on that GPU.
namespace {

struct Registry {
  std::mutex mu;
  std::map<Device, std::unique_ptr<DeviceContext>> contexts;
  uint64_t default_seed = 0x5eedULL;
  bool cuda_probed = false;
  int physical_count = 0;
  std::string cuda_why_none;
  std::vector<int> logical_to_physical;
  bool cuda_mapping_fixed = false;  // set once a CUDA context exists
};

// Read by every CPU kernel, so an atomic rather than a field under the registry's lock.
std::atomic<int> g_num_threads{0};

// Never destroyed: worker threads may still be releasing tensors (and so calling allocators) while
// the process runs its static destructors, and tensors held in globals outlive everything. Device
// contexts therefore live until the process ends; the OS reclaims their threads and memory.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

std::vector<int> parse_id_list(const std::string& s, const char* what) {
  std::vector<int> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    EF_CHECK(!item.empty() && item.find_first_not_of("0123456789") == std::string::npos, what,
             ": expected comma-separated GPU ids like 0,0,1, got '", s, "'");
    ids.push_back(std::stoi(item));
  }
  return ids;
}

void probe_cuda_locked(Registry& r) {
  if (r.cuda_probed) return;
  r.cuda_probed = true;
  r.physical_count = cuda_physical_device_count(&r.cuda_why_none);
  if (r.logical_to_physical.empty()) {
    if (const char* env = std::getenv("EF_CUDA_DEVICES"); env != nullptr && *env != '\0') {
      r.logical_to_physical = parse_id_list(env, "EF_CUDA_DEVICES");
    } else {
      for (int i = 0; i < r.physical_count; ++i) r.logical_to_physical.push_back(i);
    }
  }
  if (r.physical_count == 0) r.logical_to_physical.clear();
  for (int id : r.logical_to_physical) {
    EF_CHECK(id < r.physical_count, "CUDA logical device mapping names GPU ", id, " but ", r.physical_count,
             " GPU(s) are visible");
  }
}

void check_device_locked(Registry& r, const Device& d) {
  if (d.is_cpu()) {
    EF_CHECK(d.index >= 0 && d.index < kMaxCpuDevices, "unknown device ", d.str(),
             ": CPU devices are cpu:0..cpu:", kMaxCpuDevices - 1);
    return;
  }
  probe_cuda_locked(r);
  const int n = static_cast<int>(r.logical_to_physical.size());
  if (n == 0) EF_ERROR("unknown device ", d.str(), ": no CUDA device is available (", r.cuda_why_none, ")");
  EF_CHECK(d.index >= 0 && d.index < n, "unknown device ", d.str(), ": ", n,
           " CUDA logical device(s) exist (cuda:0..cuda:", n - 1, ")");
}

}  // namespace

namespace {
// One word, read by every CUDA call that depends on it: bit 0 TF32 convolutions, bit 1 TF32
// matrix products, bit 2 deterministic algorithms, bit 3 timed algorithm choice, bit 4 bfloat16
// convolution results (Note [CUDA math settings]).
std::atomic<unsigned> g_cuda_math{1u};
}  // namespace

CudaMath cuda_math() {
  const unsigned bits = g_cuda_math.load(std::memory_order_relaxed);
  return {.allow_tf32_conv = (bits & 1u) != 0,
          .allow_tf32_matmul = (bits & 2u) != 0,
          .deterministic = (bits & 4u) != 0,
          .benchmark = (bits & 8u) != 0,
          .allow_bf16_conv_results = (bits & 16u) != 0};
}

void set_cuda_math(const CudaMath& settings) {
  g_cuda_math.store((settings.allow_tf32_conv ? 1u : 0u) | (settings.allow_tf32_matmul ? 2u : 0u) |
                        (settings.deterministic ? 4u : 0u) | (settings.benchmark ? 8u : 0u) |
                        (settings.allow_bf16_conv_results ? 16u : 0u),
                    std::memory_order_relaxed);
}

int cuda_device_count() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  try {
    probe_cuda_locked(r);
  } catch (const Error&) {
    return 0;
  }
  return static_cast<int>(r.logical_to_physical.size());
}

std::string cuda_unavailable_reason() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  try {
    probe_cuda_locked(r);
  } catch (const Error& e) {
    return e.what();
  }
  return r.logical_to_physical.empty() ? r.cuda_why_none : std::string();
}

int cuda_physical_id(const Device& d) {
  EF_CHECK(d.is_cuda(), "cuda_physical_id: ", d.str(), " is not a CUDA device");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  check_device_locked(r, d);
  return r.logical_to_physical[static_cast<size_t>(d.index)];
}

void set_cuda_logical_devices(const std::vector<int>& physical_ids) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  EF_CHECK(!r.cuda_mapping_fixed, "set_cuda_logical_devices: CUDA devices are already in use; call it first");
  r.cuda_probed = false;
  r.logical_to_physical = physical_ids;
  probe_cuda_locked(r);
}

void check_device(const Device& d) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  check_device_locked(r, d);
}

DeviceContext& context(const Device& d) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.contexts.find(d);
  if (it != r.contexts.end()) return *it->second;
  check_device_locked(r, d);
  std::unique_ptr<Backend> backend;
  if (d.is_cpu()) {
    backend = make_cpu_backend();
  } else {
    r.cuda_mapping_fixed = true;
    backend = make_cuda_backend(d.index, r.logical_to_physical[static_cast<size_t>(d.index)]);
  }
  auto ctx = std::make_unique<DeviceContext>(d, std::move(backend), r.default_seed);
  DeviceContext& ref = *ctx;
  r.contexts.emplace(d, std::move(ctx));
  return ref;
}

DeviceContext::DeviceContext(Device device, std::unique_ptr<Backend> backend, uint64_t seed)
    : device_(device),
      backend_(std::move(backend)),
      allocator_(std::make_unique<CachingAllocator>(device, *backend_)),
      generator_(seed) {}

// Note [One OpenMP team per core]
// Each thread that opens OpenMP parallel regions gets its own libgomp team, whose threads stay. Once
// CPU devices have worker threads (the replicas run there, one team each, sized so that the teams
// share the cores), a team of another thread -- the main thread, which loaded the data before and
// prepares batches now -- makes libgomp count more threads than cores. It then stops spinning
// between parallel regions (its "throttled" mode) and every region wakes its threads through the
// kernel: on one CPU device with 2 threads, wgan_gp spent much of its CPU time in futex wake-ups,
// and both programs ran slower (docs/benchmarks.md, "wgan_gp (batch 64, ...)"). So when the first
// CPU worker starts, the thread starting it frees its own team (omp_pause_resource), and from then
// on threads that are not device workers run kernels on one thread (kernel_threads); the work they
// do beside the workers is small.
namespace {
std::atomic<bool> g_cpu_workers{false};
}

Worker& DeviceContext::worker() {
  std::call_once(worker_once_, [&] {
    worker_ = std::make_unique<Worker>(device_.str());
    if (device_.is_cpu() && !g_cpu_workers.exchange(true)) cpu_backend::release_team();
  });
  return *worker_;
}

namespace {
// A replayed call's recorded team size (Note [Recording CPU devices] in cpu_recording.cpp); 0: none.
thread_local int tls_kernel_threads = 0;
}  // namespace

detail::KernelThreadsGuard::KernelThreadsGuard(int n) : previous_(tls_kernel_threads) {
  tls_kernel_threads = n;
}
detail::KernelThreadsGuard::~KernelThreadsGuard() {
  tls_kernel_threads = previous_;
}

int kernel_threads() {
  if (tls_kernel_threads > 0) return tls_kernel_threads;
  if (cpu_workers_started() && Worker::current() == nullptr) return 1;
  return num_threads();
}

bool cpu_workers_started() {
  return g_cpu_workers.load(std::memory_order_relaxed);
}

void synchronize(const Device& d) {
  detail::check_not_recording(d, "synchronize", "nothing runs while a step is recorded; wait after replay()");
  context(d).backend().synchronize();
}

void manual_seed(uint64_t seed) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.default_seed = seed;
  for (auto& [dev, ctx] : r.contexts) ctx->generator().set_state({seed, 0});
}

void manual_seed(const Device& d, uint64_t seed) {
  context(d).generator().set_state({seed, 0});
}

GeneratorState generator_state(const Device& d) {
  return context(d).generator().state();
}
void set_generator_state(const Device& d, const GeneratorState& s) {
  context(d).generator().set_state(s);
}

void set_num_threads(int n) {
  EF_CHECK(n >= 1, "set_num_threads: expected at least 1 thread, got ", n);
  g_num_threads.store(n);
}

int num_threads() {
  const int n = g_num_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace evenflow
