// The bookkeeping of Note [Index checks] (engine/cuda/deferred_errors.h), on plain host memory
// standing in for the mapped flags, so that it is tested where no GPU is: a bad index is reported
// once, at the synchronization after its kernel; a synchronization that starts while another thread
// is queueing an indexing kernel waits for it and does not miss its flag; a full ring drains first;
// a recorded step's checks keep flags of their own.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "evenflow/engine/cuda/deferred_errors.h"

using evenflow::cuda_backend::DeferredErrors;

namespace {

struct FakeDevice {
  std::vector<int64_t> flags = std::vector<int64_t>((DeferredErrors::kSlots + DeferredErrors::kRecordedSlots) * 2, 0);
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

// Note [Index checks in a recorded step]: a recording's checks keep their flags for its life (a
// replay writes the flag it was recorded with); every synchronization reads them, reports a set one
// once and clears it, so the next replay's bad index is reported again; a recording's flags are
// freed with it, and a device runs out of them with an error, not a shared flag.
TEST_CASE("deferred errors: a recorded step's checks keep their flags across replays and are freed with it") {
  FakeDevice d;
  const uint64_t first = 5, second = 6;
  int64_t* targets = d.errors.reserve_recorded(first, named("cross_entropy")).device_flag();
  int64_t* gather = d.errors.reserve_recorded(second, named("gather")).device_flag();
  CHECK(targets != gather);
  CHECK(targets >= d.flags.data() + 2 * DeferredErrors::kSlots);  // outside the ring
  CHECK(d.errors.recorded_in_use() == 2);
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "");
  // Replay 1 meets class 11; the synchronization after it reports it, once.
  flag_bad_index(targets, 11);
  CHECK(d.errors.take_errors(d.errors.mark(), " (here)") == "cross_entropy: index 11 in a replayed step (here)");
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "");
  // Replay 2 meets class -3: reported again, since the flag was cleared.
  flag_bad_index(targets, -3);
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "cross_entropy: index -3 in a replayed step");
  // An eager kernel's bad index, queued before a replay's, is the one reported; the replay's flag is
  // cleared with it (one error a synchronization, as among the ring's flags), not reported later.
  flag_bad_index(d.errors.reserve(named("index_add"), [] {}).device_flag(), 4);
  flag_bad_index(targets, 6);
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "index_add: index 4");
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "");
  // One bad target sets several flags (its check, the gather and the scatter_add that use it): one
  // synchronization reports the first and clears them all, as it does the ring's.
  flag_bad_index(targets, 5);
  flag_bad_index(gather, 5);
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "cross_entropy: index 5 in a replayed step");
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "");
  // Freed with its recording: the other recording's flag stays, and a freed flag is not read.
  d.errors.release_recorded(first);
  CHECK(d.errors.recorded_in_use() == 1);
  flag_bad_index(targets, 99);
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "");
  flag_bad_index(gather, 8);
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "gather: index 8 in a replayed step");
  // A reused flag starts clear.
  CHECK(d.errors.reserve_recorded(first, named("index_select")).device_flag() == targets);
  CHECK(d.errors.take_errors(d.errors.mark(), "") == "");
  d.errors.release_recorded(first);
  d.errors.release_recorded(second);
  // Every flag held: the next check of a recording is refused, naming why.
  for (uint64_t i = 0; i < DeferredErrors::kRecordedSlots; ++i) (void)d.errors.reserve_recorded(first, named("gather"));
  std::string error;
  try {
    (void)d.errors.reserve_recorded(second, named("gather"));
  } catch (const evenflow::Error& e) {
    error = e.what();
  }
  CHECK(error.find("hold all 256 flags") != std::string::npos);
  d.errors.release_recorded(first);
  CHECK(d.errors.recorded_in_use() == 0);
}
