// The programs' Ray task library supplies their pipelines (data/ray/make_pipeline.h).
#include "apps/common/pipelines.h"
#include "data/ray/make_pipeline.h"

evenflow::data::Pipeline evenflow::data::make_ray_pipeline(const std::string& description) {
  return evenflow::apps::make_pipeline(description);
}
