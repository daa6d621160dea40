// A device's worker: one persistent thread draining a task queue. The autograd engine runs each
// node on its device's worker; the parallel module runs each replica's work there. A thread that
// must wait for tasks that may be queued on its own worker (a backward pass started from inside a
// worker task, as a gradient penalty does) keeps draining its queue while it waits: run_until.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace evenflow {

class Worker {
 public:
  explicit Worker(std::string name);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  const std::string& name() const { return name_; }
  // Queues a task. Tasks must not throw: callers capture their own exceptions.
  void post(std::function<void()> task);
  // The worker whose thread is calling, or nullptr.
  static Worker* current();
  // On this worker's thread: runs queued tasks until done() holds. done() is re-checked after each
  // task and whenever wake() is called.
  void run_until(const std::function<bool()>& done);
  void wake();

 private:
  void loop();

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace evenflow
