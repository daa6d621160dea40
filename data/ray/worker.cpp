// ef_ray_make_batch: the normal-ABI side of a Ray task (worker.h).
#include "data/ray/worker.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "data/ray/make_pipeline.h"
#include "evenflow/engine/device.h"

extern "C" int ef_ray_make_batch(const char* pipeline, size_t pipeline_size, const int64_t* indices, size_t count,
                                 uint64_t seed, uint64_t epoch, ef_ray_sink sink, void* context) {
  namespace data = evenflow::data;
  try {
    static std::mutex mu;
    static std::map<std::string, std::shared_ptr<const data::Pipeline>> built;
    const std::string description(pipeline, pipeline_size);
    std::shared_ptr<const data::Pipeline> p;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto& slot = built[description];
      if (!slot) {
        // A task has one CPU of the cluster (Ray's default), as a loader thread has one core.
        evenflow::set_num_threads(1);
        slot = std::make_shared<const data::Pipeline>(data::make_ray_pipeline(description));
      }
      p = slot;
    }
    const std::string bytes =
        data::encode_batch(data::make_batch(*p, std::vector<int64_t>(indices, indices + count), seed, epoch));
    sink(context, bytes.data(), bytes.size());
    return 0;
  } catch (const std::exception& e) {
    const std::string message = e.what();
    sink(context, message.data(), message.size());
  } catch (...) {
    static const char kUnknown[] = "unknown exception";
    sink(context, kUnknown, sizeof(kUnknown) - 1);
  }
  return 1;
}
