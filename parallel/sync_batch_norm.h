/// @file
/// SyncBatchNorm: batch normalization whose batch statistics cover every device of a data-parallel
/// step, as if one device saw the whole batch. Sums and counts are combined with the differentiable
/// all_reduce (comm_ops.h), so the layer is differentiable to any order across devices: a gradient
/// penalty through it couples the devices exactly as BatchNorm couples the samples of one batch
/// (PyTorch's SyncBatchNorm has no double backward, pytorch#61222). Chunks may differ in size.
///
/// It synchronizes when called inside a task of a DeviceGroup run (DataParallelModel's forward and
/// map, DataParallelCriterion's losses), over the ranks of that run; elsewhere, and in eval mode, it
/// is BatchNorm. Same parameters, buffers and state-dict names as BatchNorm*d.
#pragma once

#include <memory>

#include "evenflow/layers/normalization.h"

namespace evenflow::parallel {

class SyncBatchNorm : public nn::Cloneable<SyncBatchNorm, nn::BatchNorm> {
 public:
  explicit SyncBatchNorm(int64_t num_features, const nn::BatchNormConfig& c = {}, const nn::ModuleOptions& o = {})
      : Cloneable("SyncBatchNorm", 2, -1, num_features, c, o) {}
  Tensor forward(const Tensor& x) override;
};

/// Replaces every BatchNorm1d/BatchNorm2d in `module` (itself included: the result) by a
/// SyncBatchNorm with the same configuration that shares its tensors, as torch's
/// convert_sync_batchnorm.
std::shared_ptr<nn::Module> convert_sync_batchnorm(std::shared_ptr<nn::Module> module);

}  // namespace evenflow::parallel
