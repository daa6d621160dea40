// The per-device caching allocator: statistics, peaks, reuse, and the error a failed allocation
// raises (with the device's statistics in it).
#include <doctest/doctest.h>

#include "evenflow/engine/allocator.h"
#include "evenflow/engine/ops.h"

using namespace evenflow;

TEST_CASE("allocator: current and peak bytes per device, resettable, cached blocks reused") {
  const Device d = cpu(5);
  empty_cache(d);
  const MemoryStats start = memory_stats(d);
  {
    const Tensor a = zeros({1024, 256}, {.device = d});  // 1 MiB
    const MemoryStats s = memory_stats(d);
    CHECK(s.allocated - start.allocated >= size_t{1} << 20);
    CHECK(s.peak_allocated >= s.allocated);
  }
  const MemoryStats after = memory_stats(d);
  CHECK(after.allocated == start.allocated);
  CHECK(after.peak_allocated >= start.allocated + (size_t{1} << 20));
  CHECK(after.reserved >= size_t{1} << 20);  // cached, not returned
  reset_peak_memory(d);
  CHECK(memory_stats(d).peak_allocated == memory_stats(d).allocated);
  const uint64_t hits = memory_stats(d).num_cache_hits;
  { const Tensor b = zeros({1024, 256}, {.device = d}); }
  CHECK(memory_stats(d).num_cache_hits == hits + 1);
  // Another device's statistics are untouched.
  const MemoryStats other = memory_stats(cpu(6));
  CHECK(other.peak_allocated == 0);
  empty_cache(d);
  CHECK(memory_stats(d).reserved == memory_stats(d).allocated);
}

TEST_CASE("allocator: a failed allocation is an ef::Error with the device's statistics") {
  const Device d = cpu(7);
  set_memory_limit(d, size_t{4} << 20);
  const Tensor keep = zeros({1024, 512}, {.device = d});  // 2 MiB
  std::string message;
  try {
    zeros({1024, 1024}, {.device = d});  // 4 MiB more: over the limit
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("out of memory on cpu:7") == 0);
  CHECK(message.find("in use 2.0 MiB") != std::string::npos);
  CHECK(message.find("limit 4.0 MiB") != std::string::npos);
  set_memory_limit(d, 0);
  // An absurd request fails cleanly too.
  CHECK_THROWS_AS(empty({int64_t{1} << 50}, {.device = d}), Error);
  CHECK(zeros({4}, {.device = d}).numel() == 4);  // still usable
}

TEST_CASE("allocator: size classes bound the waste") {
  for (size_t n : {size_t{1}, size_t{513}, size_t{70000}, size_t{1} << 20, (size_t{1} << 20) + 1, size_t{3} << 28}) {
    const size_t r = CachingAllocator::round_size(n);
    CHECK(r >= n);
    CHECK(r <= n + n / 4 + 512);
  }
}
