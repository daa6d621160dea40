#include "parallel/sync_batch_norm.h"

#include "parallel/comm_ops.h"
#include "parallel/device_group.h"

namespace evenflow::parallel {

// Note [SyncBatchNorm statistics]
// With n = the count over all ranks, mean = all_reduce(Σ x) / n and var = all_reduce(Σ (x - mean)²) / n
// (biased, as BatchNorm normalizes with); both sums are differentiable all_reduces, so gradients
// reach every rank's input through the statistics, and every rank's backward node takes part in the
// same collectives. The running statistics get the same values on every rank (unbiased variance
// with n, as BatchNorm over the whole batch would), so the buffers stay equal across replicas.
Tensor SyncBatchNorm::forward(const Tensor& x) {
  const RankContext* where = current_rank();
  if (where == nullptr || where->comm->size() == 1 || !is_training()) return BatchNorm::forward(x);
  nn::util::check_input_dims("SyncBatchNorm", x, 2);
  const int64_t c = num_features();
  EF_CHECK(x.size(1) == c, "SyncBatchNorm: input has ", x.size(1), " channels, expected ", c, " (input shape ",
           shape_str(x.shape()), ")");
  check_input_matches_params(x);
  const auto& comm = where->comm;
  const int rank = where->rank;

  Shape dims{0}, stat_shape(static_cast<size_t>(x.dim()), 1);
  stat_shape[1] = c;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  const double local_count = static_cast<double>(x.numel() / c);
  double count = 0;
  {
    NoGradGuard no_grad;
    count = comm->all_reduce(rank, full({}, local_count, {.dtype = kFloat64, .device = x.device()})).item();
  }
  EF_CHECK(count > 1, "SyncBatchNorm: expected more than 1 value per channel over all devices when training, got ",
           count);
  const Tensor mu = mul_scalar(all_reduce(comm, rank, sum(x, dims)), 1.0 / count);
  const Tensor centered = x - reshape(mu, stat_shape);
  const Tensor v = mul_scalar(all_reduce(comm, rank, sum(square(centered), dims)), 1.0 / count);

  const nn::BatchNormConfig& cfg = config();
  if (cfg.track_running_stats) {
    NoGradGuard no_grad;
    const Tensor& batches = buffer("num_batches_tracked");
    batches.add_(ones_like(batches));
    const double momentum = cfg.momentum ? *cfg.momentum : 1.0 / batches.item();
    const Tensor& running_mean = buffer("running_mean");
    const Tensor& running_var = buffer("running_var");
    running_mean.mul_(1.0 - momentum);
    running_mean.add_(mu.detach(), momentum);
    running_var.mul_(1.0 - momentum);
    running_var.add_(v.detach(), momentum * count / (count - 1));
  }
  Tensor y = centered * reshape(rsqrt(add_scalar(v, cfg.eps)), stat_shape);
  if (const Tensor w = optional_param("weight"); w.defined()) y = y * reshape(w, stat_shape);
  if (const Tensor b = optional_param("bias"); b.defined()) y = y + reshape(b, stat_shape);
  return y;
}

std::shared_ptr<nn::Module> convert_sync_batchnorm(std::shared_ptr<nn::Module> module) {
  EF_CHECK(module != nullptr, "convert_sync_batchnorm: no module given");
  auto convert = [](nn::Module& m) -> std::shared_ptr<nn::Module> {
    auto* bn = dynamic_cast<nn::BatchNorm*>(&m);
    if (bn == nullptr || dynamic_cast<SyncBatchNorm*>(&m) != nullptr) return nullptr;
    const Tensor any = bn->state_dict().empty() ? Tensor() : bn->state_dict().front().second;
    nn::ModuleOptions options;
    if (any.defined()) options = {.dtype = any.dtype(), .device = any.device()};
    auto sync = std::make_shared<SyncBatchNorm>(bn->num_features(), bn->config(), options);
    for (const auto& [name, t] : bn->named_parameters()) sync->assign(name, bn->tensor(name));
    for (const auto& [name, t] : bn->named_buffers()) sync->assign(name, bn->tensor(name));
    sync->train(bn->is_training());
    return sync;
  };
  if (auto whole = convert(*module)) return whole;
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> replacements;
  for (const auto& [name, m] : module->named_modules()) {
    if (name.empty()) continue;
    if (auto sync = convert(*m)) replacements.emplace_back(name, std::move(sync));
  }
  for (auto& [name, sync] : replacements) module->replace_child(name, std::move(sync));
  return module;
}

}  // namespace evenflow::parallel
