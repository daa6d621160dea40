#include "evenflow/parallel/sync_batch_norm.h"

#include "evenflow/parallel/comm_ops.h"
#include "evenflow/parallel/device_group.h"

namespace evenflow::parallel {

// Note [SyncBatchNorm statistics]
// One collective a layer a forward, as PyTorch's SyncBatchNorm gathers its per-device statistics:
// each rank computes its count n_r, mean m_r and centred sum of squares M2_r = Σ (x - m_r)² over
// its own values (two passes, exact), writes [n_r, m_r, M2_r] into row r of an otherwise zero
// [ranks, 1 + 2C] tensor, and one differentiable all_reduce gives every rank every row. The rows
// combine as in Chan et al.'s parallel variance:
//   n = Σ n_r,   mean = Σ n_r m_r / n,   var = (Σ M2_r + Σ n_r (m_r - mean)²) / n   (biased),
// which is as exact as one device's two-pass variance (a one-pass Σx² - n·mean² would cancel
// catastrophically in float32 when |mean| >> std). Every step is a differentiable op, so gradients
// reach every rank's input through the statistics, to any order, and every rank's backward takes
// part in the same (all_reduce) collective. The counts are constants; the host reads the total only
// when this rank has at most one value (to refuse a batch of one over all devices), and the step
// count only for a cumulative average (momentum unset): no host synchronization otherwise. The
// running statistics get the same values on every rank (unbiased variance with n, as BatchNorm over
// the whole batch would), so the buffers stay equal across replicas.
Tensor SyncBatchNorm::forward(const Tensor& x) {
  const RankContext* where = current_rank();
  if (where == nullptr || where->comm->size() == 1 || !is_training()) return BatchNorm::forward(x);
  nn::util::check_input_dims("SyncBatchNorm", x, 2);
  const int64_t c = num_features();
  EF_CHECK(x.size(1) == c, "SyncBatchNorm: input has ", x.size(1), " channels, expected ", c, " (input shape ",
           shape_str(x.shape()), ")");
  check_input_matches_params(x);
  const auto& comm = where->comm;
  const int rank = comm->first_rank() + where->rank, ranks = comm->size();  // global: over every process

  Shape dims{0}, stat_shape(static_cast<size_t>(x.dim()), 1);
  stat_shape[1] = c;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  const int64_t local_count = x.numel() / c;
  const double n_r = static_cast<double>(local_count);
  const Tensor local_mean = local_count > 0 ? mul_scalar(sum(x, dims), 1.0 / n_r) : zeros({c}, {x.dtype(), x.device()});
  const Tensor local_m2 = sum(square(x - reshape(local_mean, stat_shape)), dims);
  const Tensor row = cat({full({1}, n_r, {.dtype = x.dtype(), .device = x.device()}), local_mean, local_m2}, 0);
  const Tensor rows =
      all_reduce(comm, where->rank, pad(unsqueeze(row, 0), {0, 0, rank, ranks - 1 - rank}));  // [ranks, 1 + 2C]
  const Tensor counts = narrow(rows, 1, 0, 1);                                                // [ranks, 1]
  const Tensor means = narrow(rows, 1, 1, c), m2s = narrow(rows, 1, 1 + c, c);                // [ranks, C]
  const Tensor count = sum(counts);                                                           // n, 0-d
  if (local_count <= 1) {
    const double total = count.item();
    EF_CHECK(total > 1, "SyncBatchNorm: expected more than 1 value per channel over all devices when training, got ",
             total);
  }
  const Tensor mu = sum(counts * means, {0}) / count;
  const Tensor v = (sum(m2s, {0}) + sum(counts * square(means - unsqueeze(mu, 0)), {0})) / count;
  const Tensor centered = x - reshape(mu, stat_shape);

  const nn::BatchNormConfig& cfg = config();
  if (cfg.track_running_stats) {
    NoGradGuard no_grad;
    const Tensor& batches = buffer("num_batches_tracked");
    batches.add_(1.0);
    const double momentum = cfg.momentum ? *cfg.momentum : 1.0 / batches.item();
    const Tensor& running_mean = buffer("running_mean");
    const Tensor& running_var = buffer("running_var");
    running_mean.mul_(1.0 - momentum);
    running_mean.add_(mu.detach(), momentum);
    running_var.mul_(1.0 - momentum);
    running_var.add_(v.detach() * count / (count - 1.0), momentum);
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
