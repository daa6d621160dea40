// Normalization layers (see normalization.h): argument checks, PyTorch's running-statistics
// bookkeeping for BatchNorm, and group_norm as a composite of engine ops.
#include "evenflow/layers/normalization.h"

namespace evenflow::nn {

namespace {

void check_eps(const char* layer, double eps) {
  EF_CHECK(eps >= 0, layer, ": eps must be non-negative, got ", eps);
}

}  // namespace

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias, double eps) {
  EF_CHECK(x.defined() && x.dim() >= 2, "group_norm: expected an input [N, C, ...], got ",
           x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  const int64_t n = x.size(0), c = x.size(1);
  EF_CHECK(num_groups > 0 && c % num_groups == 0, "group_norm: ", c, " channels cannot be split into ", num_groups,
           " groups");
  for (const Tensor* t : {&weight, &bias})
    EF_CHECK(!t->defined() || t->shape() == Shape{c}, "group_norm: weight and bias must have shape [", c, "], got ",
             shape_str(t->shape()));
  // [N, G, C/G·spatial]: each row is one group of one sample.
  const Tensor grouped = reshape(x, {n, num_groups, -1});
  const Tensor mu = mean(grouped, {2}, true);
  const Tensor v = var(grouped, {2}, /*unbiased=*/false, /*keepdim=*/true);
  Tensor y = reshape((grouped - mu) * rsqrt(v + eps), x.shape());
  Shape channel_shape(static_cast<size_t>(x.dim()), 1);
  channel_shape[1] = c;
  if (weight.defined()) y = y * reshape(weight, channel_shape);
  if (bias.defined()) y = y + reshape(bias, channel_shape);
  return y;
}

// --- BatchNorm ------------------------------------------------------------------------------------------

BatchNorm::BatchNorm(const char* name, int64_t min_dim, int64_t max_dim, int64_t num_features, const BatchNormConfig& c,
                     const ModuleOptions& o)
    : name_(name), min_dim_(min_dim), max_dim_(max_dim), num_features_(num_features), config_(c) {
  util::check_positive(name, "num_features", num_features);
  check_eps(name, c.eps);
  EF_CHECK(!c.momentum || (*c.momentum >= 0 && *c.momentum <= 1), name, ": momentum must be in [0, 1], got ",
           c.momentum.value_or(0));
  const TensorOptions t = o.tensor_options();
  if (c.affine) {
    register_parameter("weight", ones({num_features}, t));
    register_parameter("bias", zeros({num_features}, t));
  }
  if (c.track_running_stats) {
    register_buffer("running_mean", zeros({num_features}, t));
    register_buffer("running_var", ones({num_features}, t));
    register_buffer("num_batches_tracked", zeros({}, {.dtype = kInt64, .device = o.device}));
  }
}

Tensor BatchNorm::forward(const Tensor& x) {
  util::check_input_dims(name_, x, min_dim_, max_dim_);
  EF_CHECK(x.size(1) == num_features_, name_, ": input has ", x.size(1), " channels, expected ", num_features_,
           " (input shape ", shape_str(x.shape()), ")");
  check_input_matches_params(x);
  // As PyTorch's _BatchNorm.forward: training updates the running statistics (when tracked) with
  // weight momentum, or 1 / num_batches_tracked for a cumulative average; eval normalizes with
  // them, or with the batch's statistics when none are tracked.
  const bool track = config_.track_running_stats;
  double factor = config_.momentum.value_or(0.0);
  if (is_training() && track) {
    const Tensor& count = buffer("num_batches_tracked");
    count.add_(1.0);  // on its device, one kernel (an int64 buffer: no gradient to guard)
    if (!config_.momentum) factor = 1.0 / count.item();
  }
  const Tensor running_mean = track ? buffer("running_mean") : Tensor();
  const Tensor running_var = track ? buffer("running_var") : Tensor();
  return batch_norm(x, optional_param("weight"), optional_param("bias"), running_mean, running_var,
                    is_training() || !track, factor, config_.eps);
}

void BatchNorm::reset_running_stats() {
  if (!config_.track_running_stats) return;
  NoGradGuard no_grad;
  buffer("running_mean").fill_(0.0);
  buffer("running_var").fill_(1.0);
  buffer("num_batches_tracked").fill_(0.0);
}

void BatchNorm::set_momentum(std::optional<double> momentum) {
  EF_CHECK(!momentum || (*momentum >= 0 && *momentum <= 1), name_, ": momentum must be in [0, 1], got ",
           momentum.value_or(0));
  config_.momentum = momentum;
}

void update_batchnorm_statistics(Module& model, const std::function<void()>& forward_batches) {
  struct Saved {
    BatchNorm* norm;
    std::optional<double> momentum;
  };
  std::vector<Saved> saved;
  for (const auto& [name, m] : model.named_modules())
    if (auto* bn = dynamic_cast<BatchNorm*>(m); bn != nullptr && bn->config().track_running_stats)
      saved.push_back({bn, bn->config().momentum});
  const bool was_training = model.is_training();
  const auto restore = [&] {
    for (const Saved& s : saved) s.norm->set_momentum(s.momentum);
    model.train(was_training);
  };
  for (const Saved& s : saved) {
    s.norm->reset_running_stats();
    s.norm->set_momentum(std::nullopt);
  }
  model.train(true);
  try {
    forward_batches();
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

std::string BatchNorm::extra_repr() const {
  return evenflow::detail::str_cat(num_features_, ", eps=", util::py_float(config_.eps),
                                   ", momentum=", config_.momentum ? util::py_float(*config_.momentum) : "None",
                                   ", affine=", util::py_bool(config_.affine),
                                   ", track_running_stats=", util::py_bool(config_.track_running_stats));
}

// --- LayerNorm ------------------------------------------------------------------------------------------

LayerNorm::LayerNorm(Shape normalized_shape, const LayerNormConfig& c, const ModuleOptions& o)
    : normalized_shape_(std::move(normalized_shape)), config_(c) {
  EF_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape must not be empty");
  for (int64_t s : normalized_shape_)
    EF_CHECK(s > 0, "LayerNorm: normalized_shape must be positive, got ", shape_str(normalized_shape_));
  check_eps("LayerNorm", c.eps);
  if (c.elementwise_affine) {
    const TensorOptions t = o.tensor_options();
    register_parameter("weight", ones(normalized_shape_, t));
    register_parameter("bias", zeros(normalized_shape_, t));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  const int64_t k = static_cast<int64_t>(normalized_shape_.size());
  util::check_input_dims("LayerNorm", x, k);
  EF_CHECK(Shape(x.shape().end() - k, x.shape().end()) == normalized_shape_, "LayerNorm: input shape ",
           shape_str(x.shape()), " does not end with normalized_shape ", shape_str(normalized_shape_));
  check_input_matches_params(x);
  return layer_norm(x, normalized_shape_, optional_param("weight"), optional_param("bias"), config_.eps);
}

std::string LayerNorm::extra_repr() const {
  return evenflow::detail::str_cat(util::py_tuple(normalized_shape_), ", eps=", util::py_float(config_.eps),
                                   ", elementwise_affine=", util::py_bool(config_.elementwise_affine));
}

// --- GroupNorm ------------------------------------------------------------------------------------------

GroupNorm::GroupNorm(int64_t num_groups, int64_t num_channels, const GroupNormConfig& c, const ModuleOptions& o)
    : groups_(num_groups), channels_(num_channels), config_(c) {
  util::check_positive("GroupNorm", "num_groups", num_groups);
  util::check_positive("GroupNorm", "num_channels", num_channels);
  EF_CHECK(num_channels % num_groups == 0, "GroupNorm: num_channels ", num_channels, " is not divisible by num_groups ",
           num_groups);
  check_eps("GroupNorm", c.eps);
  if (c.affine) {
    const TensorOptions t = o.tensor_options();
    register_parameter("weight", ones({num_channels}, t));
    register_parameter("bias", zeros({num_channels}, t));
  }
}

Tensor GroupNorm::forward(const Tensor& x) {
  util::check_input_dims("GroupNorm", x, 2);
  EF_CHECK(x.size(1) == channels_, "GroupNorm: input has ", x.size(1), " channels, expected ", channels_,
           " (input shape ", shape_str(x.shape()), ")");
  check_input_matches_params(x);
  return group_norm(x, groups_, optional_param("weight"), optional_param("bias"), config_.eps);
}

std::string GroupNorm::extra_repr() const {
  return evenflow::detail::str_cat(groups_, ", ", channels_, ", eps=", util::py_float(config_.eps),
                                   ", affine=", util::py_bool(config_.affine));
}

}  // namespace evenflow::nn
