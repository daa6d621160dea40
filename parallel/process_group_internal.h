// Between the parallel library's sources (process_group.cpp, mpi_process_group.cpp, built only with
// MPI, communicator.cpp, data_parallel.cpp): not installed API.
#pragma once

#include <memory>

#include "evenflow/parallel/process_group.h"

namespace evenflow::parallel {

// ef::Error, starting with `op`, unless x is a defined, contiguous CPU tensor of float32, float64 or int64.
void check_host_tensor(const char* op, const Tensor& x);

// dst[i] += src[i] for `n` host elements of float32, float64 or int64 (ef::Error for another dtype):
// the sums of the ring all-reduce and of a communicator of CPU devices.
void add_host(void* dst, const void* src, int64_t n, DType dtype);

// x's values in a new contiguous CPU tensor, of its own: what a ProcessGroup collective takes.
Tensor host_copy(const Tensor& x);

// The job's processes over MPI_COMM_WORLD, initializing MPI (mpi_process_group.cpp; without MPI,
// process_group.cpp's ef::Error).
std::shared_ptr<ProcessGroup> make_mpi_process_group();

}  // namespace evenflow::parallel
