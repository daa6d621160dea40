/// @file
/// Normalization layers, as torch.nn: BatchNorm1d / BatchNorm2d (batch statistics in training,
/// running statistics in eval), LayerNorm and GroupNorm. All are built from engine ops (the
/// engine's batch_norm and layer_norm are composites), so they are differentiable twice.
#pragma once

#include <functional>
#include <optional>

#include "evenflow/layers/module.h"

namespace evenflow::nn {

/// GroupNorm's computation: x [N, C, ...] normalized over each group of C / num_groups channels and
/// the spatial dims (biased variance), then scaled and shifted per channel by weight / bias [C]
/// (both optional). A composite of reshape, mean and var, so twice differentiable.
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);

/// BatchNorm1d / BatchNorm2d settings, with torch.nn.BatchNorm2d's defaults.
struct BatchNormConfig {
  double eps = 1e-5;  ///< added to the variance before its square root; non-negative
  /// Weight of the new batch in the running statistics; nullopt: a cumulative average
  /// (1 / num_batches_tracked), as momentum=None in PyTorch. A value must be in [0, 1].
  std::optional<double> momentum = 0.1;
  bool affine = true;               ///< learnable weight (1) and bias (0)
  bool track_running_stats = true;  ///< buffers running_mean (0), running_var (1), num_batches_tracked (int64 0)
};

/// What BatchNorm1d and BatchNorm2d share; they differ in the input dims they accept.
///
/// forward(x), x [N, C, ...] with C = num_features (float32 or float64, the parameters' dtype and
/// device, else ef::Error): in training, each channel is normalized with the batch's mean and
/// biased variance over N and the spatial dims (more than one value per channel is needed), then
/// scaled by weight and shifted by bias; with track_running_stats it also increments
/// num_batches_tracked and updates running_mean and running_var (unbiased variance) in place. In
/// eval it normalizes with the running statistics, or with the batch's when none are tracked.
/// Differentiable twice with respect to x, weight and bias (the running statistics take no
/// gradient).
class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return name_; }
  std::string extra_repr() const override;

  int64_t num_features() const { return num_features_; }     ///< C, the channels of the input
  const BatchNormConfig& config() const { return config_; }  ///< the settings it was built with
  /// Running statistics back to mean 0, variance 1 and no batches tracked (torch's
  /// reset_running_stats); nothing without track_running_stats.
  void reset_running_stats();
  /// Replaces the momentum (nullopt: a cumulative average); ef::Error outside [0, 1].
  void set_momentum(std::optional<double> momentum);

 protected:
  /// `name`: the class name it reports; the input must have min_dim to max_dim dims. Creates the
  /// parameters and buffers of BatchNormConfig on `o`'s dtype and device (num_batches_tracked is
  /// int64). Throws ef::Error when num_features is not positive, eps is negative or momentum is
  /// outside [0, 1].
  BatchNorm(const char* name, int64_t min_dim, int64_t max_dim, int64_t num_features, const BatchNormConfig& c,
            const ModuleOptions& o);

 private:
  const char* name_;
  int64_t min_dim_, max_dim_;
  int64_t num_features_;
  BatchNormConfig config_;
};

/// Recomputes the running statistics of every BatchNorm in `model` as the plain average over the
/// batches `forward_batches` runs through it, in training mode (torch.optim.swa_utils.update_bn):
/// for weights never trained with statistics of their own, such as an average of other weights.
/// Each BatchNorm's momentum and the model's training mode are restored after, also on an error.
void update_batchnorm_statistics(Module& model, const std::function<void()>& forward_batches);

/// Input [N, C] or [N, C, L].
class BatchNorm1d : public Cloneable<BatchNorm1d, BatchNorm> {
 public:
  /// `num_features`: C, positive. Throws ef::Error on a bad num_features, eps or momentum.
  explicit BatchNorm1d(int64_t num_features, const BatchNormConfig& c = {}, const ModuleOptions& o = {})
      : Cloneable("BatchNorm1d", 2, 3, num_features, c, o) {}
};

/// Input [N, C, H, W].
class BatchNorm2d : public Cloneable<BatchNorm2d, BatchNorm> {
 public:
  /// `num_features`: C, positive. Throws ef::Error on a bad num_features, eps or momentum.
  explicit BatchNorm2d(int64_t num_features, const BatchNormConfig& c = {}, const ModuleOptions& o = {})
      : Cloneable("BatchNorm2d", 4, 4, num_features, c, o) {}
};

/// LayerNorm settings, with torch.nn.LayerNorm's defaults.
struct LayerNormConfig {
  double eps = 1e-5;               ///< added to the variance before its square root; non-negative
  bool elementwise_affine = true;  ///< learnable weight (1) and bias (0) of normalized_shape
};

/// Normalizes over the last normalized_shape.size() dims.
/// As torch.nn.LayerNorm: x (float32 or float64, the parameters' dtype and device) must end with
/// normalized_shape, else ef::Error; each such slice is normalized with its mean and biased
/// variance, then multiplied by weight and shifted by bias elementwise. Differentiable twice.
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  /// `normalized_shape`: the trailing dims to normalize over, non-empty with positive sizes; with
  /// elementwise_affine, weight and bias have this shape. Throws ef::Error on a bad
  /// normalized_shape or a negative eps.
  explicit LayerNorm(Shape normalized_shape, const LayerNormConfig& c = {}, const ModuleOptions& o = {});

  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "LayerNorm"; }
  std::string extra_repr() const override;

  const Shape& normalized_shape() const { return normalized_shape_; }  ///< the trailing dims normalized
  const LayerNormConfig& config() const { return config_; }            ///< the settings it was built with

 private:
  Shape normalized_shape_;
  LayerNormConfig config_;
};

/// GroupNorm settings, with torch.nn.GroupNorm's defaults.
struct GroupNormConfig {
  double eps = 1e-5;   ///< added to the variance before its square root; non-negative
  bool affine = true;  ///< learnable weight (1) and bias (0) per channel
};

/// group_norm() as a layer, as torch.nn.GroupNorm: x [N, C, ...] with C = num_channels and the
/// parameters' dtype and device (else ef::Error). Differentiable twice.
class GroupNorm : public Cloneable<GroupNorm> {
 public:
  /// `num_groups` divides `num_channels`, both positive; with c.affine, weight and bias are
  /// [num_channels]. Throws ef::Error on bad sizes or a negative eps.
  GroupNorm(int64_t num_groups, int64_t num_channels, const GroupNormConfig& c = {}, const ModuleOptions& o = {});

  Tensor forward(const Tensor& x) override;  ///< x [N, C, ...]
  std::string name() const override { return "GroupNorm"; }
  std::string extra_repr() const override;

  int64_t num_groups() const { return groups_; }             ///< the number of channel groups
  int64_t num_channels() const { return channels_; }         ///< C, the channels of the input
  const GroupNormConfig& config() const { return config_; }  ///< the settings it was built with

 private:
  int64_t groups_, channels_;
  GroupNormConfig config_;
};

}  // namespace evenflow::nn
