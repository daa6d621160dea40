/// @file
/// Normalization layers, as torch.nn: BatchNorm1d / BatchNorm2d (batch statistics in training,
/// running statistics in eval), LayerNorm and GroupNorm. All are built from engine ops (the
/// engine's batch_norm and layer_norm are composites), so they are differentiable twice.
#pragma once

#include <optional>

#include "evenflow/layers/module.h"

namespace evenflow::nn {

/// GroupNorm's computation: x [N, C, ...] normalized over each group of C / num_groups channels and
/// the spatial dims (biased variance), then scaled and shifted per channel by weight / bias [C]
/// (both optional). A composite of reshape, mean and var, so twice differentiable.
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);

struct BatchNormConfig {
  double eps = 1e-5;
  /// Weight of the new batch in the running statistics; nullopt: a cumulative average
  /// (1 / num_batches_tracked), as momentum=None in PyTorch.
  std::optional<double> momentum = 0.1;
  bool affine = true;               ///< learnable weight (1) and bias (0)
  bool track_running_stats = true;  ///< buffers running_mean (0), running_var (1), num_batches_tracked (int64 0)
};

/// What BatchNorm1d and BatchNorm2d share; they differ in the input dims they accept.
class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return name_; }
  std::string extra_repr() const override;

  int64_t num_features() const { return num_features_; }
  const BatchNormConfig& config() const { return config_; }

 protected:
  BatchNorm(const char* name, int64_t min_dim, int64_t max_dim, int64_t num_features, const BatchNormConfig& c,
            const ModuleOptions& o);

 private:
  const char* name_;
  int64_t min_dim_, max_dim_;
  int64_t num_features_;
  BatchNormConfig config_;
};

/// Input [N, C] or [N, C, L].
class BatchNorm1d : public Cloneable<BatchNorm1d, BatchNorm> {
 public:
  explicit BatchNorm1d(int64_t num_features, const BatchNormConfig& c = {}, const ModuleOptions& o = {})
      : Cloneable("BatchNorm1d", 2, 3, num_features, c, o) {}
};

/// Input [N, C, H, W].
class BatchNorm2d : public Cloneable<BatchNorm2d, BatchNorm> {
 public:
  explicit BatchNorm2d(int64_t num_features, const BatchNormConfig& c = {}, const ModuleOptions& o = {})
      : Cloneable("BatchNorm2d", 4, 4, num_features, c, o) {}
};

struct LayerNormConfig {
  double eps = 1e-5;
  bool elementwise_affine = true;  ///< learnable weight (1) and bias (0) of normalized_shape
};

/// Normalizes over the last normalized_shape.size() dims.
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  explicit LayerNorm(Shape normalized_shape, const LayerNormConfig& c = {}, const ModuleOptions& o = {});

  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "LayerNorm"; }
  std::string extra_repr() const override;

  const Shape& normalized_shape() const { return normalized_shape_; }
  const LayerNormConfig& config() const { return config_; }

 private:
  Shape normalized_shape_;
  LayerNormConfig config_;
};

struct GroupNormConfig {
  double eps = 1e-5;
  bool affine = true;  ///< learnable weight (1) and bias (0) per channel
};

class GroupNorm : public Cloneable<GroupNorm> {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, const GroupNormConfig& c = {}, const ModuleOptions& o = {});

  Tensor forward(const Tensor& x) override;  ///< x [N, C, ...]
  std::string name() const override { return "GroupNorm"; }
  std::string extra_repr() const override;

  int64_t num_groups() const { return groups_; }
  int64_t num_channels() const { return channels_; }
  const GroupNormConfig& config() const { return config_; }

 private:
  int64_t groups_, channels_;
  GroupNormConfig config_;
};

}  // namespace evenflow::nn
