// Graphs built and differentiated on several threads at once (run under TSan in CI).
#include <doctest/doctest.h>

#include <cmath>
#include <future>
#include <thread>

#include "evenflow/engine/autograd.h"
#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/ops.h"

using namespace evenflow;

namespace {

// Runs `scenario` twice: as it comes -- in a CTest case's own process no CPU worker exists yet, so
// one-device backward passes run on their calling threads (Note [Backward on the calling thread]) --
// and again once a CPU device has a worker, when every pass runs on its device's worker.
template <typename Scenario>
void without_and_with_cpu_workers(Scenario scenario) {
  scenario();
  (void)context(Device("cpu:1")).worker();
  REQUIRE(cpu_workers_started());
  scenario();
}

}  // namespace

TEST_CASE("threads: four threads build and differentiate their own graphs concurrently") {
  without_and_with_cpu_workers([] {
    constexpr int kThreads = 4;
    std::vector<std::vector<double>> grads(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([t, &grads] {
        const Device d = cpu(t % 2);  // two threads per device: shared allocators and workers
        Tensor w = full({3, 3}, 0.1 * (t + 1), {.dtype = kFloat64, .device = d}).requires_grad_();
        Tensor x = ones({2, 3}, {.dtype = kFloat64, .device = d});
        for (int step = 0; step < 20; ++step) {
          Tensor loss = sum(square(tanh(matmul(x, w))));
          loss.backward();
        }
        grads[static_cast<size_t>(t)] = w.grad().to_vector();
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) {
      Tensor w = full({3, 3}, 0.1 * (t + 1), {.dtype = kFloat64}).requires_grad_();
      Tensor x = ones({2, 3}, {.dtype = kFloat64});
      for (int step = 0; step < 20; ++step) sum(square(tanh(matmul(x, w)))).backward();
      CHECK(grads[static_cast<size_t>(t)] == w.grad().to_vector());
    }
  });
}

TEST_CASE("threads: concurrent backward passes accumulate into one shared leaf") {
  without_and_with_cpu_workers([] {
    Tensor w = ones({4}, {.dtype = kFloat64}).requires_grad_();
    constexpr int kThreads = 4, kSteps = 10;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&w] {
        for (int s = 0; s < kSteps; ++s) sum(w * 2.0).backward();
      });
    }
    for (auto& th : threads) th.join();
    CHECK(w.grad().to_vector() == std::vector<double>(4, 2.0 * kThreads * kSteps));
  });
}

// Note [One OpenMP team per core]: once a CPU device has a worker, only workers run kernels on a
// team; other threads (the main thread preparing batches) run them on one thread.
TEST_CASE("once a CPU device has a worker, kernels off the workers run on one thread") {
  const int saved = num_threads();
  set_num_threads(2);
  Worker& worker = context(Device("cpu:1")).worker();
  CHECK(kernel_threads() == 1);
  std::promise<int> on_worker;
  worker.post([&] { on_worker.set_value(kernel_threads()); });
  CHECK(on_worker.get_future().get() == 2);
  set_num_threads(saved);
}

// Note [Backward on the calling thread] (autograd.cpp). Each CTest case runs in its own process, where
// no CPU worker exists yet; when the whole binary runs, earlier cases may have started some, and
// then the pass runs on the worker as before.
TEST_CASE("threads: a backward pass on one CPU device runs on the calling thread while no CPU device has a worker") {
  const bool no_workers_yet = !cpu_workers_started();
  const TensorOptions f64{.dtype = kFloat64};
  Tensor w = ones({3}, f64).requires_grad_();
  std::thread::id ran_on;
  set_post_accumulate_hook(w, [&](const Tensor&) { ran_on = std::this_thread::get_id(); });
  sum(tanh(w) * 2.0).backward();
  if (no_workers_yet) {
    CHECK(ran_on == std::this_thread::get_id());
    CHECK_FALSE(cpu_workers_started());
    CHECK(kernel_threads() == num_threads());  // the forward passes keep their team
  } else {
    CHECK(ran_on != std::this_thread::get_id());
  }
  const double d = 2.0 * (1.0 - std::tanh(1.0) * std::tanh(1.0));
  CHECK(w.grad().to_vector() == std::vector<double>(3, d));

  // A pass over two devices runs on their workers.
  Tensor v = ones({3}, f64).requires_grad_();
  std::thread::id v_ran_on;
  set_post_accumulate_hook(v, [&](const Tensor&) { v_ran_on = std::this_thread::get_id(); });
  sum(v.to(cpu(1)) * 3.0).backward();
  CHECK(v_ran_on != std::this_thread::get_id());
  CHECK(cpu_workers_started());
  CHECK(v.grad().to_vector() == std::vector<double>(3, 3.0));
}
