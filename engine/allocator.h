/// @file
/// Per-device caching allocator. Freed blocks are kept in size-class bins and reused, so a training
/// step allocates from the device only on its first iteration (on CUDA, plain cudaMalloc blocks,
/// never managed memory). Every allocator counts the bytes in use and reserved, with peaks that can
/// be reset: this is how memory balance across devices is measured, on CPU and GPU alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "evenflow/engine/device.h"

namespace evenflow {

class Backend;

/// A device allocator's counters. Bytes are counted in blocks, whose sizes are requests rounded up
/// to a size class (CachingAllocator::round_size).
struct MemoryStats {
  size_t allocated = 0;            ///< bytes in blocks handed out now
  size_t peak_allocated = 0;       ///< highest `allocated` since the last reset_peak_memory
  size_t reserved = 0;             ///< allocated + cached, as obtained from the device
  size_t peak_reserved = 0;        ///< highest `reserved` since the last reset_peak_memory
  size_t limit = 0;                ///< reserved may not exceed this (0: no limit)
  uint64_t num_allocs = 0;         ///< allocate() calls
  uint64_t num_cache_hits = 0;     ///< allocate() calls served by a cached block
  uint64_t num_device_allocs = 0;  ///< blocks obtained from the device
};

/// The caching allocator of one device; each device has one, reached through the functions below.
/// Thread-safe: every method takes the allocator's lock.
class CachingAllocator {
 public:
  /// An allocator for `device` that obtains its blocks from `backend` (raw_alloc, raw_free).
  CachingAllocator(Device device, Backend& backend) : device_(device), backend_(backend) {}
  ~CachingAllocator();  ///< Returns the cached blocks to the device.
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// The largest request: tensors address their bytes with int64 offsets.
  static constexpr size_t kMaxBytes = static_cast<size_t>(INT64_MAX);

  /// Returns a block of at least nbytes (its size in *block_bytes). Throws ef::Error when nbytes
  /// exceeds kMaxBytes and, with the device's statistics, when the device has no memory left or the
  /// limit would be exceeded.
  void* allocate(size_t nbytes, size_t* block_bytes);
  /// Takes back a block from allocate(), with the size it gave, into the cache. The block returns
  /// to the device only with empty_cache(), or when an allocation fails without the cache.
  void release(void* ptr, size_t block_bytes);

  MemoryStats stats();  ///< A copy of the counters.
  void reset_peak();    ///< Sets the peaks to the current values.
  void empty_cache();   ///< Returns the cached blocks to the device.
  /// Caps `reserved` at `bytes` (0 removes the cap); what is reserved already is not freed.
  void set_limit(size_t bytes);

  /// The size class of a request of at most kMaxBytes.
  static size_t round_size(size_t nbytes);

  /// @name Private pools
  /// Note [Private pools]
  /// A recorded step (StepGraph, engine/step_graph.h) replays its kernels on the addresses it was
  /// recorded with, so no tensor outside the step may be handed those blocks between replays. While
  /// a pool is in use (use_pool), every allocation on the device comes from it, and a block of the
  /// pool goes back to it when released, whoever releases it; other allocations never see its
  /// blocks. retire_pool, once the pool's step can no longer run, gives its blocks to the cache.
  /// @{
  uint64_t new_pool();  ///< A new, empty private pool's id (never 0).
  /// Allocations come from `pool` until use_pool(0) (the shared cache). ef::Error while another
  /// pool is in use.
  void use_pool(uint64_t pool);
  /// Moves the pool's cached blocks to the shared cache; its blocks in use go there when released.
  void retire_pool(uint64_t pool);
  /// Bytes the pool holds (in use and cached), and the blocks it obtained from the device.
  std::pair<size_t, uint64_t> pool_usage(uint64_t pool);
  /// @}

 private:
  struct Pool {
    std::multimap<size_t, void*> free_blocks;
    size_t reserved = 0;
    uint64_t device_allocs = 0;
  };
  void empty_cache_locked();

  Device device_;
  Backend& backend_;
  std::mutex mu_;
  std::multimap<size_t, void*> free_blocks_;  // the shared cache
  MemoryStats stats_;
  std::map<uint64_t, Pool> pools_;             // private pools by id
  std::unordered_map<void*, uint64_t> owner_;  // the blocks of private pools
  uint64_t active_pool_ = 0;                   // 0: the shared cache
  uint64_t next_pool_ = 1;
};

/// Statistics of a device's allocator (see MemoryStats).
MemoryStats memory_stats(const Device& d);
/// Sets a device's peak counters to the current values (see MemoryStats).
void reset_peak_memory(const Device& d);
/// Returns cached blocks to the device, after waiting for its queued work (synchronize).
void empty_cache(const Device& d);
/// Caps a device's reserved bytes (0 removes the cap): for tests and for sharing a GPU.
void set_memory_limit(const Device& d, size_t bytes);

}  // namespace evenflow
