// NCCL communicators: collectives between CUDA devices on distinct physical GPUs, one NCCL rank per
// device (nccl_communicator.cu, built only with CUDA and NCCL, where EF_NCCL is 1). Plain C++: no
// CUDA or NCCL headers here, so g++-compiled files (communicator.cpp) can include it.
#pragma once

#include <memory>
#include <vector>

#include "evenflow/parallel/communicator.h"

namespace evenflow::parallel {

// A Communicator over `devices`, which must all be CUDA devices on distinct physical GPUs (several
// logical devices sharing a GPU need LocalCommunicator), and over the other processes' GPUs when
// `processes` has several (one NCCL communicator over every GPU of every process; the unique id
// travels on `processes`). `parent`, optional, must be a communicator made here over a device list
// of this one process that starts with `devices`: the NCCL handles are then split from its own
// (ncclCommSplit) instead of made anew. Throws ef::Error otherwise, or when NCCL cannot create its
// communicators.
std::shared_ptr<Communicator> make_nccl_communicator(const std::vector<Device>& devices,
                                                     std::shared_ptr<ProcessGroup> processes = nullptr,
                                                     std::shared_ptr<Communicator> parent = nullptr);

}  // namespace evenflow::parallel
