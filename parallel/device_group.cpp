#include "evenflow/parallel/device_group.h"

#include <algorithm>
#include <condition_variable>
#include <sstream>
#include <thread>

#include "evenflow/engine/autograd.h"
#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/step_graph.h"

namespace evenflow::parallel {

namespace {
// The group and rank whose task this thread is running (DeviceGroup::run), or nullptr: what a
// collective inside a task (SyncBatchNorm, all_reduce) reads to find its communicator and rank, and
// what refuses a run() nested inside a task.
thread_local const RankContext* tls_rank = nullptr;

std::vector<int> parse_indices(const std::string& list, const std::string& spec) {
  std::vector<int> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    EF_CHECK(!item.empty() && item.size() < 4 && item.find_first_not_of("0123456789") == std::string::npos,
             "devices: expected a comma-separated list of numbers after ':' in '", spec, "', got '", item, "'");
    out.push_back(std::stoi(item));
  }
  EF_CHECK(!out.empty(), "devices: no device numbers in '", spec, "'");
  return out;
}
}  // namespace

std::vector<Device> devices(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  std::vector<Device> out;
  if (kind == "cpu") {
    const int n = rest.empty() ? 1 : parse_indices(rest, spec).at(0);
    EF_CHECK(rest.find(',') == std::string::npos && n >= 1 && n <= kMaxCpuDevices, "devices: '", spec,
             "' should be cpu:N with N the number of CPU devices, 1..", kMaxCpuDevices);
    for (int i = 0; i < n; ++i) out.push_back(cpu(i));
  } else if (kind == "cuda") {
    if (rest.empty()) {
      const int n = cuda_device_count();
      EF_CHECK(n > 0, "devices: '", spec, "' asks for every GPU, but there is none: ", cuda_unavailable_reason());
      for (int i = 0; i < n; ++i) out.push_back(cuda(i));
    } else {
      for (int i : parse_indices(rest, spec)) {
        out.push_back(cuda(i));
        check_device(out.back());
      }
    }
  } else {
    EF_ERROR("devices: unknown device kind in '", spec, "'; expected cpu, cpu:N, cuda or cuda:0,1,...");
  }
  return out;
}

int cpu_threads_per_device(const std::vector<Device>& devices) {
  const unsigned hw = std::thread::hardware_concurrency();
  const int threads = hw == 0 ? 1 : static_cast<int>(hw);
  const auto cpus = std::count_if(devices.begin(), devices.end(), [](const Device& d) { return d.is_cpu(); });
  return cpus == 0 ? threads : std::max(1, threads / static_cast<int>(cpus));
}

const RankContext* current_rank() {
  return tls_rank;
}

DeviceGroup::DeviceGroup(std::vector<Device> devices, const std::shared_ptr<ProcessGroup>& processes)
    : devices_(std::move(devices)), processes_(processes ? processes->duplicate() : single_process()) {
  check_distinct_devices("DeviceGroup", devices_);
  comms_.resize(devices_.size());
  if (processes_->size() > 1) comm();  // checks that every process has as many devices
}

const std::shared_ptr<Communicator>& DeviceGroup::comm(int active) {
  const int k = active < 0 ? size() : active;
  EF_CHECK(k >= 1 && k <= size(), "DeviceGroup: ", k, " active ranks requested of ", size());
  EF_CHECK(k == size() || processes_->size() == 1, "DeviceGroup: ", k, " active ranks of ", size(),
           ": across processes every device of every process takes part (give each at least one item)");
  std::lock_guard<std::mutex> lock(mu_);
  return comm_locked(k);
}

// Fewer active ranks (a last batch smaller than the group, in one process) get a communicator
// derived from the whole group's: for NCCL a split of its handles, not a second full set.
const std::shared_ptr<Communicator>& DeviceGroup::comm_locked(int k) {
  std::shared_ptr<Communicator>& c = comms_[static_cast<size_t>(k - 1)];
  if (!c) {
    const std::shared_ptr<Communicator> parent = k < size() ? comm_locked(size()) : nullptr;
    c = make_communicator(std::vector<Device>(devices_.begin(), devices_.begin() + k),
                          processes_->size() > 1 ? processes_->duplicate() : nullptr, parent);
    c->set_timeout(timeout_);
  }
  return c;
}

void DeviceGroup::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  timeout_ = timeout;
  processes_->set_timeout(timeout);
  for (auto& c : comms_)
    if (c) c->set_timeout(timeout);
}

void DeviceGroup::share_first_generator(int active) {
  const int k = active < 0 ? size() : active;
  // At each replay of a recorded step too, where the generators move (Note [Step scalars]).
  each_step(devices_[0], [this, k] {
    const GeneratorState start = generator_state(devices_[0]);
    for (int rank = 1; rank < k; ++rank) set_generator_state(devices_[static_cast<size_t>(rank)], start);
  });
}

// Note [Group failures]
// A rank that throws may leave others waiting for it in a collective; aborting the communicators
// wakes them with an error, so every task returns and none is left blocked on a worker. The first
// failure in time is the cause; the others are usually its echo ("the communicator was aborted").
void DeviceGroup::run(const std::function<void(int rank)>& task, int active) {
  EF_CHECK(tls_rank == nullptr, "DeviceGroup::run called from inside a task of a group (on ",
           tls_rank ? devices_.at(0).str() : "", "); call the replica directly there");
  const int k = active < 0 ? size() : active;
  EF_CHECK(k >= 0 && k <= size(), "DeviceGroup::run: ", k, " active ranks requested of ", size());
  if (k == 0) return;
  const std::shared_ptr<Communicator> communicator = comm(k);  // checks k across processes
  {
    // A failed backward pass aborts communicators outside any run; nothing is in flight now.
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : comms_)
      if (c && c->aborted()) c->reset();
  }

  std::mutex mu;
  std::condition_variable cv;
  int remaining = k;
  const bool grad_mode = grad_enabled();  // the caller's NoGradGuard holds inside the tasks too
  std::string first_error;
  Worker* const waiting_worker = Worker::current();
  auto fail_all = [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : comms_)
      if (c) c->abort(why);
  };

  for (int rank = 0; rank < k; ++rank) {
    const Device device = devices_[static_cast<size_t>(rank)];
    context(device).worker().post([&, rank, device, waiting_worker] {
      std::string error;
      try {
        const GradModeGuard mode(grad_mode);
        const RankContext ctx{communicator, rank};
        tls_rank = &ctx;
        struct Reset {
          ~Reset() { tls_rank = nullptr; }
        } reset;
        task(rank);
      } catch (const std::exception& e) {
        error = detail::str_cat("on ", device.str(), ": ", e.what());
      } catch (...) {
        error = detail::str_cat("on ", device.str(), ": unknown exception");
      }
      if (!error.empty()) {
        {
          std::lock_guard<std::mutex> lock(mu);  // before the abort, which makes the others fail too
          if (first_error.empty()) first_error = error;
        }
        fail_all(detail::str_cat(device.str(), " failed: ", error));
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        --remaining;
        cv.notify_all();
      }
      if (waiting_worker != nullptr) waiting_worker->wake();
    });
  }
  if (waiting_worker != nullptr) {
    waiting_worker->run_until([&] {
      std::lock_guard<std::mutex> lock(mu);
      return remaining == 0;
    });
  } else {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return remaining == 0; });
  }
  if (!first_error.empty()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& c : comms_)
        if (c) c->reset();
    }
    throw Error(first_error);
  }
}

}  // namespace evenflow::parallel
