#include "evenflow/engine/allocator.h"

#include <iomanip>
#include <sstream>

#include "evenflow/engine/backend.h"
#include "evenflow/engine/capture_internal.h"
#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/error.h"

namespace evenflow {

namespace {
std::string human_bytes(size_t n) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  if (n >= (size_t{1} << 30))
    os << static_cast<double>(n) / (1 << 30) << " GiB";
  else if (n >= (size_t{1} << 20))
    os << static_cast<double>(n) / (1 << 20) << " MiB";
  else if (n >= 1024)
    os << static_cast<double>(n) / 1024 << " KiB";
  else
    os << n << " B";
  return os.str();
}
}  // namespace

// Size classes: multiples of 512 B up to 64 KiB, then four classes per power of two, so a reused
// block wastes at most a quarter of its size.
size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes <= 512) return 512;
  if (nbytes <= 65536) return (nbytes + 511) / 512 * 512;
  size_t pow2 = 65536;
  while (pow2 * 2 < nbytes) pow2 *= 2;
  const size_t step = pow2 / 4;
  return (nbytes + step - 1) / step * step;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  empty_cache_locked();
}

void* CachingAllocator::allocate(size_t nbytes, size_t* block_bytes) {
  // Byte offsets are int64 (Note [Checked sizes] in tensor.cpp), and round_size would overflow
  // size_t near its top.
  EF_CHECK(nbytes <= kMaxBytes, "out of memory on ", device_.str(), ": ", nbytes,
           " bytes requested, more than int64 can hold");
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.num_allocs;
  void* ptr = nullptr;
  // Only the step's own allocations (Note [The step's threads] in capture_internal.h).
  Pool* pool = active_pool_ != 0 && detail::step_thread().in_step ? &pools_.at(active_pool_) : nullptr;
  std::multimap<size_t, void*>& cache = pool ? pool->free_blocks : free_blocks_;
  if (auto it = cache.find(size); it != cache.end()) {
    ptr = it->second;
    cache.erase(it);
    ++stats_.num_cache_hits;
  } else {
    const bool over_limit = stats_.limit != 0 && stats_.reserved + size > stats_.limit;
    if (!over_limit) ptr = backend_.raw_alloc(size);
    // Retry once with the cache given back -- but not while a step is recorded anywhere: a CUDA
    // device may not free memory then (a capture refuses cudaFree).
    if (ptr == nullptr && !free_blocks_.empty() && detail::g_recording.load(std::memory_order_acquire) == 0) {
      empty_cache_locked();
      if (stats_.limit == 0 || stats_.reserved + size <= stats_.limit) ptr = backend_.raw_alloc(size);
    }
    if (ptr == nullptr) {
      EF_ERROR("out of memory on ", device_.str(), ": could not allocate ", human_bytes(size), " (", size,
               " bytes); in use ", human_bytes(stats_.allocated), ", reserved ", human_bytes(stats_.reserved),
               ", peak in use ", human_bytes(stats_.peak_allocated),
               stats_.limit != 0 ? ", limit " + human_bytes(stats_.limit) : std::string());
    }
    ++stats_.num_device_allocs;
    stats_.reserved += size;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    if (pool) {
      owner_.emplace(ptr, active_pool_);
      pool->reserved += size;
      ++pool->device_allocs;
    }
  }
  stats_.allocated += size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  *block_bytes = size;
  return ptr;
}

void CachingAllocator::release(void* ptr, size_t block_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.allocated -= block_bytes;
  if (!owner_.empty()) {
    if (auto it = owner_.find(ptr); it != owner_.end()) {
      pools_.at(it->second).free_blocks.emplace(block_bytes, ptr);
      return;
    }
  }
  free_blocks_.emplace(block_bytes, ptr);
}

uint64_t CachingAllocator::new_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_pool_++;
  pools_.emplace(id, Pool{});
  return id;
}

void CachingAllocator::use_pool(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mu_);
  EF_CHECK(pool == 0 || active_pool_ == 0 || active_pool_ == pool, "allocator of ", device_.str(),
           ": a recorded step's pool is in use already (one step is recorded at a time on a device)");
  EF_ASSERT(pool == 0 || pools_.count(pool), "use_pool: no pool ", pool);
  active_pool_ = pool;
}

void CachingAllocator::retire_pool(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(pool);
  if (it == pools_.end()) return;
  if (active_pool_ == pool) active_pool_ = 0;
  free_blocks_.merge(it->second.free_blocks);
  std::erase_if(owner_, [pool](const auto& entry) { return entry.second == pool; });
  pools_.erase(it);
}

std::pair<size_t, uint64_t> CachingAllocator::pool_usage(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(pool);
  if (it == pools_.end()) return {0, 0};
  return {it->second.reserved, it->second.device_allocs};
}

void CachingAllocator::empty_cache_locked() {
  for (auto& [size, ptr] : free_blocks_) {
    backend_.raw_free(ptr);
    stats_.reserved -= size;
  }
  free_blocks_.clear();
}

MemoryStats CachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  empty_cache_locked();
}

void CachingAllocator::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.limit = bytes;
}

MemoryStats memory_stats(const Device& d) {
  return context(d).allocator().stats();
}
void reset_peak_memory(const Device& d) {
  context(d).allocator().reset_peak();
}
void empty_cache(const Device& d) {
  synchronize(d);
  context(d).allocator().empty_cache();
}
void set_memory_limit(const Device& d, size_t bytes) {
  context(d).allocator().set_limit(bytes);
}

}  // namespace evenflow
