// The bookkeeping of Note [Index checks] (engine/cuda/deferred_errors.h), on plain host memory
// standing in for the mapped flags, so that it is tested where no GPU is: a bad index is reported
// once, at the synchronization after its kernel; a synchronization that starts while another thread
// is queueing an indexing kernel waits for it and does not miss its flag; a full ring drains first.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "evenflow/engine/cuda/deferred_errors.h"

using evenflow::cuda_backend::DeferredErrors;

namespace {

struct FakeDevice {
  std::vector<int64_t> flags = std::vector<int64_t>(DeferredErrors::kSlots * 2, 0);
  DeferredErrors errors{[this] { return std::pair<int64_t*, int64_t*>{flags.data(), flags.data()}; }};
};

std::function<std::string(int64_t)> named(const std::string& op) {
  return [op](int64_t bad) { return op + ": index " + std::to_string(bad); };
}

// What a kernel does on a bad index.
void flag_bad_index(int64_t* flag, int64_t index) {
  flag[1] = index;
  flag[0] = 1;
}

}  // namespace

TEST_CASE("deferred errors: the first bad index before a synchronization is reported there, once") {
  FakeDevice d;
  {
    const auto slot = d.errors.reserve(named("gather"), [] {});
  }
  {
    const auto slot = d.errors.reserve(named("index_select"), [] {});
    flag_bad_index(slot.device_flag(), 7);
  }
  {
    const auto slot = d.errors.reserve(named("scatter_add"), [] {});
    flag_bad_index(slot.device_flag(), 9);
  }
  CHECK(d.errors.take_errors(d.errors.mark(), " (here)") == "index_select: index 7 (here)");
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "");
  // A collective's error comes first, and once.
  d.errors.report("nccl: all_reduce timed out");
  d.errors.report("a second report is dropped");
  {
    flag_bad_index(d.errors.reserve(named("gather"), [] {}).device_flag(), 3);
  }
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "nccl: all_reduce timed out");
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "");
}

TEST_CASE("deferred errors: a synchronization waits for a kernel being queued on another thread") {
  FakeDevice d;
  std::atomic<bool> reserved{false};
  std::thread launcher([&] {
    const auto slot = d.errors.reserve(named("gather"), [] {});
    reserved = true;
    // The launch is slow (another thread holds the GPU's driver lock, say); the kernel then finds a
    // bad index.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    flag_bad_index(slot.device_flag(), 12);
  });
  while (!reserved) std::this_thread::yield();
  // Before the fix, mark() counted the reserved flag at once, the synchronization read it before its
  // kernel ran, found it clear and dropped it: the error was lost.
  const uint64_t mark = d.errors.mark();
  CHECK(d.errors.take_errors(mark, "") == "gather: index 12");
  launcher.join();
}

TEST_CASE("deferred errors: a full ring drains before the next kernel, and a reused flag starts clear") {
  FakeDevice d;
  int drains = 0;
  const auto drain = [&] {
    ++drains;
    CHECK(d.errors.take_errors(d.errors.mark(), "") == "index_add: index 5");
  };
  for (uint64_t i = 0; i < DeferredErrors::kSlots; ++i) {
    const auto slot = d.errors.reserve(named(i == 3 ? "index_add" : "gather"), drain);
    if (i == 3) flag_bad_index(slot.device_flag(), 5);
  }
  CHECK(drains == 0);
  {
    const auto slot = d.errors.reserve(named("gather"), drain);
    CHECK(drains == 1);
    CHECK(slot.device_flag() == d.flags.data());  // slot 0 again
  }
  // Slot 3's flag is set still (taken, not cleared by the device); its next kernel starts clear.
  for (int i = 0; i < 3; ++i) (void)d.errors.reserve(named("gather"), drain);
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "");
}
