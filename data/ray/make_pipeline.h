// The one function a program's Ray task library supplies (ef_add_ray_driver in CMakeLists.txt): the
// pipeline a description names, e.g. apps/common/pipelines.h's. The description travels with each
// task; a worker builds its pipeline once and keeps it.
#pragma once

#include <string>

#include "evenflow/data/pipeline.h"

namespace evenflow::data {

// The pipeline `description` names; ef::Error for one it does not know.
Pipeline make_ray_pipeline(const std::string& description);

}  // namespace evenflow::data
