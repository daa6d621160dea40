/// @file
/// Differentiable communication between devices. Each op records one autograd node whose backward
/// is the paired comm op, itself recorded, so gradients through them can be differentiated again
/// (to any order), and nothing is detached on the way:
///
///     broadcast   <-> reduce_add      (copies of x on every device / the sum of one tensor per device)
///     scatter     <-> gather          (chunks of a batch on the devices / the chunks concatenated)
///     all_reduce  <-> all_reduce      (every rank gets the sum; each rank calls it, Note [Collectives])
/// broadcast, reduce_add, scatter and gather are called from one thread and move data with device
/// copies; all_reduce is called by every rank of a communicator from its own thread.
#pragma once

#include <memory>
#include <vector>

#include "evenflow/engine/ops.h"
#include "evenflow/parallel/communicator.h"

namespace evenflow::parallel {

/// x copied to each of `devices` (a new tensor even on x's own device). Backward: reduce_add of the
/// gradients onto x's device.
std::vector<Tensor> broadcast(const Tensor& x, const std::vector<Device>& devices);

/// The sum of xs (one per device, equal shapes and dtypes), added in order on `device`. Backward:
/// broadcast of the gradient to the inputs' devices.
Tensor reduce_add(const std::vector<Tensor>& xs, const Device& device);

/// x split along `dim` into chunks of `sizes` (summing to x.size(dim), each > 0), chunk i copied to
/// devices[i]. Backward: gather of the gradients onto x's device.
std::vector<Tensor> scatter(const Tensor& x, const std::vector<int64_t>& sizes, const std::vector<Device>& devices,
                            int64_t dim = 0);

/// xs (on any devices) concatenated along `dim` on `device`. Backward: scatter of the gradient back.
Tensor gather(const std::vector<Tensor>& xs, const Device& device, int64_t dim = 0);

/// This rank's result of a sum over all ranks of `comm`; every rank calls it with its own x, from its
/// own thread. Backward: all_reduce of the gradients (the same collective, in backward: every rank's
/// node runs it, so a backward or grad() pass must run on every rank too).
Tensor all_reduce(const std::shared_ptr<Communicator>& comm, int rank, const Tensor& x);

/// How a batch of `batch` items is split over `devices` devices: min(batch, devices) chunks, sizes
/// differing by at most one, larger first (10 over 4: 3, 3, 2, 2; 2 over 4: 1, 1).
std::vector<int64_t> split_sizes(int64_t batch, int devices);

}  // namespace evenflow::parallel
