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

/// Batch normalization over every device of a data-parallel step (see the file's notes). Input
/// [N, C, ...] with at least 2 dims; chunks may differ in N. In training mode inside a group run
/// over several ranks, every rank must call it (it runs one all_reduce per call, in forward and
/// in backward), and it throws ef::Error when a channel has at most 1 value over all devices.
class SyncBatchNorm : public nn::Cloneable<SyncBatchNorm, nn::BatchNorm> {
 public:
  /// A layer over `num_features` channels; `c` and `o` as for BatchNorm1d/BatchNorm2d. Throws
  /// ef::Error for a non-positive num_features, a negative eps or a momentum outside [0, 1].
  explicit SyncBatchNorm(int64_t num_features, const nn::BatchNormConfig& c = {}, const nn::ModuleOptions& o = {})
      : Cloneable("SyncBatchNorm", 2, -1, num_features, c, o) {}
  /// In training mode inside a group run over more than one rank: `x` normalized with the batch
  /// statistics of every rank's input, the running statistics updated with them (equally on every
  /// rank). Otherwise BatchNorm's forward.
  Tensor forward(const Tensor& x) override;
};

/// Replaces every BatchNorm1d/BatchNorm2d in `module` (itself included: the result) by a
/// SyncBatchNorm with the same configuration that shares its tensors, as torch's
/// convert_sync_batchnorm.
std::shared_ptr<nn::Module> convert_sync_batchnorm(std::shared_ptr<nn::Module> module);

}  // namespace evenflow::parallel
