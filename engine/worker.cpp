#include "evenflow/engine/worker_internal.h"

#include "evenflow/engine/capture_internal.h"
#include "evenflow/engine/error.h"

namespace evenflow {

namespace {
// The worker whose thread this is (nullptr on any other thread): Worker::current(), so that a task
// that waits for others on its own worker's queue runs them instead of deadlocking.
thread_local Worker* tls_current_worker = nullptr;
}  // namespace

Worker::Worker(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] {
    tls_current_worker = this;
    loop();
  });
}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Worker* Worker::current() {
  return tls_current_worker;
}

namespace {
// Runs a task with its poster's step state, restoring the thread's own after (Note [The step's
// threads] in capture_internal.h): a task of a step works for the step, and another task that a step's
// thread runs while it waits (run_until) does not.
class StepThreadSwap {
 public:
  explicit StepThreadSwap(detail::StepThread s) : previous_(detail::step_thread()) { detail::set_step_thread(s); }
  ~StepThreadSwap() { detail::set_step_thread(previous_); }
  StepThreadSwap(const StepThreadSwap&) = delete;
  StepThreadSwap& operator=(const StepThreadSwap&) = delete;

 private:
  detail::StepThread previous_;
};
}  // namespace

void Worker::post(std::function<void()> task) {
  task = [poster = detail::step_thread(), inner = std::move(task)] {
    const StepThreadSwap as_poster(poster);
    inner();
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void Worker::wake() {
  // Taking the lock orders the caller's state change before the waiter's re-check.
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

void Worker::loop() {
  run_until([this] { return stop_; });
}

void Worker::run_until(const std::function<bool()>& done) {
  EF_ASSERT(tls_current_worker == this, "run_until called off the worker's thread");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (done()) return;
    if (tasks_.empty()) {
      cv_.wait(lock);
      continue;
    }
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace evenflow
