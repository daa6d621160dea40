// The ordering of Note [Work beside a recording] (engine/cuda/recording_gate.h), on threads alone so
// that it is tested where no GPU is: a recording begins only after the threads queuing work have
// queued it, threads arriving meanwhile wait for its end, a thread's nested Passes never wait, and
// both waits end in an ef::Error naming what waited rather than a hang.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "evenflow/engine/cuda/recording_gate.h"
#include "evenflow/engine/error.h"

using evenflow::cuda_backend::RecordingGate;
using namespace std::chrono_literals;

namespace {

auto named(const char* who) {
  return [who] { return std::string(who); };
}

// Waits (at most 10 s) for `flag`: the other thread reached its point.
void await(const std::atomic<bool>& flag) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!flag.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(100us);
  REQUIRE(flag.load());
}

}  // namespace

TEST_CASE("recording gate: a recording begins after the threads inside leave; threads arriving wait for its end") {
  RecordingGate gate;
  std::atomic<bool> inside{false}, leave{false}, closed{false}, through{false};
  std::thread loader([&] {
    {
      const RecordingGate::Pass pass = gate.enter(named("loader"), 10s);
      CHECK(pass.holds());
      inside = true;
      await(leave);
    }
  });
  await(inside);
  CHECK(gate.inside() == 1);
  std::thread recorder([&] {
    gate.close(named("recorder"), 10s);
    closed = true;
  });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(closed.load());  // the loader is still queuing its work
  leave = true;
  await(closed);
  loader.join();
  recorder.join();
  CHECK(gate.inside() == 0);
  CHECK(gate.closed());

  std::thread late([&] {
    const RecordingGate::Pass pass = gate.enter(named("late"), 10s);
    through = true;
  });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(through.load());  // the recording is being made
  gate.open();
  await(through);
  late.join();
  CHECK_FALSE(gate.closed());
  CHECK(gate.inside() == 0);
}

// The crash this gate prevents: a thread checked that nothing was recorded, then queued its copy
// into a recording that began in between. Here a stream is a flag, "queuing" reads it, and a
// recorder begins and ends recordings as fast as it can while four threads queue work.
TEST_CASE("recording gate: no thread's work is queued while a recording is made") {
  RecordingGate gate;
  std::atomic<bool> recording{false}, stop{false};
  std::atomic<int64_t> queued{0}, queued_into_recording{0}, recordings{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        const RecordingGate::Pass pass = gate.enter(named("worker"), 10s);
        if (recording.load()) ++queued_into_recording;
        ++queued;
      }
    });
  }
  const auto end = std::chrono::steady_clock::now() + 200ms;
  while (std::chrono::steady_clock::now() < end || recordings.load() < 100) {
    gate.close(named("recorder"), 10s);
    recording = true;
    std::this_thread::yield();
    recording = false;
    gate.open();
    ++recordings;
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  CHECK(queued_into_recording.load() == 0);
  CHECK(queued.load() > 0);
  CHECK(recordings.load() >= 100);
  CHECK(gate.inside() == 0);
}

TEST_CASE("recording gate: a thread inside passes again while a recording waits for it; Passes move") {
  RecordingGate gate;
  RecordingGate::Pass outer = gate.enter(named("outer"), 10s);
  std::atomic<bool> closed{false};
  std::thread recorder([&] {
    gate.close(named("recorder"), 10s);
    closed = true;
  });
  std::this_thread::sleep_for(20ms);
  {
    const RecordingGate::Pass nested = gate.enter(named("nested"), 10ms);  // closed or not: no wait
    CHECK(nested.holds());
    CHECK(gate.inside() == 1);  // one thread, however many Passes
  }
  CHECK_FALSE(closed.load());
  RecordingGate::Pass moved = std::move(outer);
  CHECK_FALSE(outer.holds());  // NOLINT(bugprone-use-after-move): what a move leaves is the point
  CHECK_FALSE(closed.load());
  moved = RecordingGate::Pass();  // the last Pass of the thread: the recording begins
  await(closed);
  recorder.join();
  gate.open();
  CHECK_FALSE(gate.closed());
}

TEST_CASE("recording gate: the waits end in an error naming what waited, and the gate is open after") {
  RecordingGate gate;
  gate.close(named("a recording"), 1s);
  CHECK_THROWS_WITH_AS([&] { const RecordingGate::Pass pass = gate.enter(named("cuda:0 (GPU 0)"), 30ms); }(),
                       doctest::Contains("cuda:0 (GPU 0): waited 30 ms for a step being recorded to end"),
                       evenflow::Error);
  CHECK(gate.inside() == 0);
  gate.close(named("a second recording"), 1s);  // recordings on two GPUs: open after both end
  gate.open();
  CHECK(gate.closed());
  gate.open();
  CHECK_FALSE(gate.closed());

  std::atomic<bool> inside{false}, leave{false};
  std::thread holder([&] {
    const RecordingGate::Pass pass = gate.enter(named("holder"), 1s);
    inside = true;
    await(leave);
  });
  await(inside);
  CHECK_THROWS_WITH_AS(gate.close(named("recording the step on cuda:0"), 30ms),
                       doctest::Contains("recording the step on cuda:0: waited 30 ms for other threads"),
                       evenflow::Error);
  CHECK_FALSE(gate.closed());
  leave = true;
  holder.join();
  const RecordingGate::Pass pass = gate.enter(named("after"), 10ms);
  CHECK(pass.holds());
}
