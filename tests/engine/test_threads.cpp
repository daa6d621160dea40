// Graphs built and differentiated on several threads at once (run under TSan in CI).
#include <doctest/doctest.h>

#include <future>
#include <thread>

#include "engine/context.h"
#include "engine/ops.h"

using namespace evenflow;

TEST_CASE("threads: four threads build and differentiate their own graphs concurrently") {
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
}

TEST_CASE("threads: concurrent backward passes accumulate into one shared leaf") {
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
