// What a Ray worker runs for a task, behind a C boundary: the task (task.cpp) is compiled with Ray's
// old libstdc++ string ABI and the pipeline code with the normal one, so only bytes, sizes and a
// callback cross between them.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// Receives bytes the callee owns: copy them before returning.
typedef void (*ef_ray_sink)(void* context, const char* bytes, size_t size);

// Builds the pipeline `pipeline` describes (once per process; make_ray_pipeline in make_pipeline.h),
// makes the batch of `indices` for (seed, epoch) and hands encode_batch's bytes to `sink`: returns 0.
// On failure hands the message to `sink` and returns 1.
int ef_ray_make_batch(const char* pipeline, size_t pipeline_size, const int64_t* indices, size_t count, uint64_t seed,
                      uint64_t epoch, ef_ray_sink sink, void* context);
}
