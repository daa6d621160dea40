// The Ray task that makes a batch, as the driver submits it and a worker runs it (task.cpp). Both
// are compiled with Ray's libstdc++ string ABI (_GLIBCXX_USE_CXX11_ABI=0), like every file that
// includes this one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace evenflow::data::ray_task {

// The examples `indices` of the pipeline `pipeline` describes, transformed for (seed, epoch), as
// encode_batch's bytes. Throws std::runtime_error with the reason when that fails.
std::string MakeBatch(std::string pipeline, std::vector<int64_t> indices, uint64_t seed, uint64_t epoch);

// The file this task library was loaded from: workers load it from the same folder.
std::string TaskLibrary();

}  // namespace evenflow::data::ray_task
