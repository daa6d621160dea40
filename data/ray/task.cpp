// The Ray task (task.h), registered with Ray. Compiled with Ray's string ABI: it reaches the
// pipeline code only through ef_ray_make_batch's C boundary (worker.h).
#include "data/ray/task.h"

#include <dlfcn.h>
#include <ray/api.h>

#include <stdexcept>

#include "data/ray/worker.h"

namespace evenflow::data::ray_task {

namespace {

void append(void* context, const char* bytes, size_t size) {
  static_cast<std::string*>(context)->append(bytes, size);
}

}  // namespace

std::string MakeBatch(std::string pipeline, std::vector<int64_t> indices, uint64_t seed, uint64_t epoch) {
  std::string out;
  if (ef_ray_make_batch(pipeline.data(), pipeline.size(), indices.data(), indices.size(), seed, epoch, &append, &out) !=
      0)
    throw std::runtime_error(out);
  return out;
}

std::string TaskLibrary() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&append), &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

// In a namespace of its own: RAY_REMOTE names a variable after its line (ray-cpp.md, pitfall 3).
namespace {
RAY_REMOTE(MakeBatch);
}

}  // namespace evenflow::data::ray_task
