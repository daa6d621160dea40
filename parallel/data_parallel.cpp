#include "evenflow/parallel/data_parallel.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "evenflow/parallel/gradient_sync_internal.h"
#include "evenflow/parallel/process_group_internal.h"

namespace evenflow::parallel {

namespace {

// The item counts (dim 0) of every process's local batch, in process order, for the per-device
// parts `parts` of this process's (one all_gather across processes; none in one process).
std::vector<int64_t> process_batch_sizes(DeviceGroup& group, const PerDevice<Tensor>& parts) {
  int64_t local = 0;
  for (const Tensor& t : parts) local += t.dim() >= 1 ? t.size(0) : 0;
  if (group.processes().size() == 1) return {local};
  const Tensor all = group.processes().all_gather(full({1}, static_cast<double>(local), {.dtype = kInt64}));
  const int64_t* v = all.data<int64_t>();
  return std::vector<int64_t>(v, v + all.numel());
}

// The rows of each rank's part (dim 0; none for a 0-d part) of a batch that is the rows `rows` of
// the job's whole batch, for the draws per sample (Note [Random numbers per sample] in
// engine/tensor.h).
std::vector<BatchRows> rows_within(const BatchRows& rows, const PerDevice<Tensor>& parts) {
  std::vector<BatchRows> out;
  int64_t start = rows.start;
  for (const Tensor& t : parts) {
    const int64_t count = t.dim() >= 1 ? t.size(0) : 0;
    out.push_back({.start = start, .count = count, .total = rows.total});
    start += count;
  }
  return out;
}

// The same where the rows are not given: this process's batch is its part of the job's, in process
// order, learned from every process's size (an all-gather).
std::vector<BatchRows> rows_of(DeviceGroup& group, const PerDevice<Tensor>& parts) {
  const std::vector<int64_t> sizes = process_batch_sizes(group, parts);
  BatchRows mine;
  for (size_t p = 0; p < sizes.size(); ++p) {
    if (static_cast<int>(p) < group.processes().rank()) mine.start += sizes[p];
    mine.total += sizes[p];
  }
  mine.count = sizes[static_cast<size_t>(group.processes().rank())];
  return rows_within(mine, parts);
}

// `batch` split along dim 0 over the first devices of `devices` (split_sizes), differentiably.
PerDevice<Tensor> split_over(const Tensor& batch, const std::vector<Device>& devices) {
  const std::vector<int64_t> sizes = split_sizes(batch.size(0), static_cast<int>(devices.size()));
  return parallel::scatter(
      batch, sizes, std::vector<Device>(devices.begin(), devices.begin() + static_cast<ptrdiff_t>(sizes.size())));
}

// `current` (the model's current batch) where `parts` have its row counts, else the parts' rows.
std::vector<BatchRows> rows_or_current(DeviceGroup& group, const std::vector<BatchRows>& current,
                                       const PerDevice<Tensor>& parts) {
  bool same = current.size() == parts.size();
  for (size_t r = 0; same && r < parts.size(); ++r) same = parts[r].dim() >= 1 && parts[r].size(0) == current[r].count;
  return same ? current : rows_of(group, parts);
}

void check_rows(const BatchRows& rows, int64_t batch, const char* what) {
  EF_CHECK(rows.count == batch && rows.start >= 0 && rows.start + rows.count <= rows.total,
           "DataParallelModel::scatter: ", what, " of ", batch, " rows given as rows ", rows.start, " to ",
           rows.start + rows.count, " of ", rows.total);
}

std::vector<Tensor> state_tensors(const nn::Module& m) {
  std::vector<Tensor> out = m.parameters();
  for (const Tensor& b : m.buffers()) out.push_back(b);
  return out;
}

// Process 0's values of `tensors` on every process (one broadcast each; none in one process).
void broadcast_from_first_process(DeviceGroup& group, const std::vector<Tensor>& tensors) {
  if (group.processes().size() == 1) return;
  NoGradGuard no_grad;
  for (const Tensor& t : tensors) {
    const Tensor host = host_copy(t);
    group.processes().broadcast(host, 0);
    t.copy_(host.to(t.device()));
  }
}

}  // namespace

DataParallelModel::DataParallelModel(std::shared_ptr<nn::Module> module, std::vector<Device> devices,
                                     const DataParallelOptions& options)
    : group_(std::make_unique<DeviceGroup>(std::move(devices), options.processes)) {
  EF_CHECK(module != nullptr, "DataParallelModel: no module given");
  group_->set_timeout(options.collective_timeout);
  module->to(group_->device(0));
  broadcast_from_first_process(*group_, state_tensors(*module));
  replicas_.push_back(std::move(module));
  for (int r = 1; r < group_->size(); ++r) {
    std::shared_ptr<nn::Module> copy = replicas_[0]->clone();
    copy->to(group_->device(r));
    replicas_.push_back(std::move(copy));
  }
  std::vector<std::vector<Tensor>> params;
  for (const auto& m : replicas_) params.push_back(m->parameters());
  std::vector<std::string> names;
  for (const auto& [name, p] : replicas_[0]->named_parameters()) names.push_back(name);
  if (!params[0].empty()) {
    sync_ = std::make_shared<GradientSync>(params, std::move(names), group_->comm(), options.bucket_bytes);
    const std::weak_ptr<GradientSync> weak = sync_;
    for (size_t r = 0; r < params.size(); ++r) {
      for (size_t j = 0; j < params[r].size(); ++j) {
        set_post_accumulate_hook(params[r][j], [weak, r, j](const Tensor&) {
          if (auto s = weak.lock()) s->on_ready(static_cast<int>(r), j);
        });
      }
    }
  }
}

DataParallelModel::~DataParallelModel() {
  for (const auto& m : replicas_)
    for (const Tensor& p : m->parameters()) set_post_accumulate_hook(p, nullptr);
}

PerDevice<Tensor> DataParallelModel::scatter(const Tensor& batch) {
  EF_CHECK(batch.defined() && batch.dim() >= 1, "DataParallelModel::scatter: needs a batch with a leading dim");
  PerDevice<Tensor> chunks = split_over(batch, devices());
  batch_rows_ = rows_of(*group_, chunks);
  return chunks;
}

PerDevice<Tensor> DataParallelModel::scatter(const Tensor& batch, const BatchRows& rows) {
  EF_CHECK(batch.defined() && batch.dim() >= 1, "DataParallelModel::scatter: needs a batch with a leading dim");
  check_rows(rows, batch.size(0), "a batch");
  PerDevice<Tensor> chunks = split_over(batch, devices());
  batch_rows_ = rows_within(rows, chunks);
  return chunks;
}

PerDevice<Tensor> DataParallelModel::scatter(const PerDevice<Tensor>& chunks, const BatchRows& rows) {
  scatter_checks(chunks);
  int64_t count = 0;
  for (const Tensor& x : chunks) count += x.size(0);
  check_rows(rows, count, "chunks");
  batch_rows_ = rows_within(rows, chunks);
  return chunks;
}

PerDevice<Tensor> DataParallelModel::scatter(const PerDevice<Tensor>& chunks) {
  scatter_checks(chunks);
  batch_rows_ = rows_of(*group_, chunks);
  return chunks;
}

void DataParallelModel::scatter_checks(const PerDevice<Tensor>& chunks) const {
  const int k = static_cast<int>(chunks.size());
  EF_CHECK(k >= 1 && k <= size(), "DataParallelModel::scatter: ", k, " chunks for ", size(), " devices");
  for (int r = 0; r < k; ++r) {
    const Tensor& x = chunks[static_cast<size_t>(r)];
    EF_CHECK(x.defined() && x.dim() >= 1, "DataParallelModel::scatter: chunk ", r, " is undefined or a scalar");
    EF_CHECK(x.device() == group_->device(r), "DataParallelModel::scatter: chunk ", r, " is on ", x.device().str(),
             ", but replica ", r, " is on ", group_->device(r).str());
  }
  // The rows the batch's draws per sample follow (Note [Random numbers per sample]) are scatter's.
  int64_t rows = 0;
  for (const Tensor& x : chunks) rows += x.size(0);
  const std::vector<int64_t> sizes = split_sizes(rows, group_->size());
  EF_CHECK(sizes.size() == chunks.size(), "DataParallelModel::scatter: ", k, " chunks of a batch of ", rows,
           " rows, which scatter splits into ", sizes.size());
  for (int r = 0; r < k; ++r) {
    EF_CHECK(chunks[static_cast<size_t>(r)].size(0) == sizes[static_cast<size_t>(r)],
             "DataParallelModel::scatter: ", "chunk ", r, " has ", chunks[static_cast<size_t>(r)].size(0),
             " rows, scatter gives it ", sizes[static_cast<size_t>(r)], " of a batch of ", rows);
  }
}

std::function<std::pair<int64_t, int64_t>(int64_t)> DataParallelModel::batch_part() const {
  if (group_->processes().size() == 1) return nullptr;
  const std::shared_ptr<ProcessGroup> job = group_->shared_processes();
  const int devices_per_process = group_->size();
  return [job, devices_per_process](int64_t rows) {
    const ProcessShare share = process_share(rows, devices_per_process, *job);
    return std::make_pair(share.start, share.count);
  };
}

BatchRows DataParallelModel::process_rows(int64_t rows) const {
  if (group_->processes().size() == 1) return {.start = 0, .count = rows, .total = rows};
  const ProcessShare share = process_share(rows, group_->size(), group_->processes());
  return {.start = share.start, .count = share.count, .total = rows};
}

Tensor DataParallelModel::process_part(const Tensor& whole) const {
  EF_CHECK(whole.defined() && whole.dim() >= 1, "DataParallelModel::process_part: needs a tensor with a leading dim");
  if (group_->processes().size() == 1) return whole;
  const BatchRows rows = process_rows(whole.size(0));
  return narrow(whole, 0, rows.start, rows.count);
}

PerDevice<Tensor> DataParallelModel::forward(const PerDevice<Tensor>& inputs) {
  const int k = static_cast<int>(inputs.size());
  EF_CHECK(k >= 1 && k <= size(), "DataParallelModel: ", k, " inputs for ", size(), " devices");
  for (int r = 0; r < k; ++r) {
    const Tensor& x = inputs[static_cast<size_t>(r)];
    EF_CHECK(x.defined(), "DataParallelModel: input ", r, " is undefined");
    EF_CHECK(x.device() == group_->device(r), "DataParallelModel: input ", r, " is on ", x.device().str(),
             ", but replica ", r, " is on ", group_->device(r).str(), " (use scatter)");
  }
  if (replicas_[0]->is_training()) {
    // Buffers follow replica 0 (the rule in data_parallel.h).
    NoGradGuard no_grad;
    const auto sources = replicas_[0]->buffers();
    for (size_t r = 1; r < replicas_.size(); ++r) {
      const auto targets = replicas_[r]->buffers();
      for (size_t i = 0; i < sources.size(); ++i) targets[i].copy_(sources[i].to(targets[i].device()));
    }
  }
  const std::vector<BatchRows> rows = rows_or_current(*group_, batch_rows_, inputs);
  batch_rows_ = rows;
  return map(k, [&](nn::Module& replica, int rank) {
    std::optional<BatchRowsGuard> guard;  // none for a 0-d or empty input: it holds no rows
    if (rows[static_cast<size_t>(rank)].count > 0) guard.emplace(rows[static_cast<size_t>(rank)]);
    return replica.forward(inputs[static_cast<size_t>(rank)]);
  });
}

PerDevice<Tensor> DataParallelModel::map(int active, const std::function<Tensor(nn::Module&, int)>& fn) {
  EF_CHECK(active >= 1 && active <= size(), "DataParallelModel::map: ", active, " active devices of ", size());
  PerDevice<Tensor> out(static_cast<size_t>(active));
  group_->share_first_generator(active);
  group_->run([&](int rank) { out[static_cast<size_t>(rank)] = fn(*replicas_[static_cast<size_t>(rank)], rank); },
              active);
  return out;
}

void DataParallelModel::train(bool on) {
  for (const auto& m : replicas_) m->train(on);
}

DataParallelModel::NoSync::NoSync(DataParallelModel& m) : model_(m) {
  if (model_.sync_) model_.sync_->pause(true);
}
DataParallelModel::NoSync::~NoSync() {
  if (model_.sync_) model_.sync_->pause(false);
}

void DataParallelModel::finish_gradient_sync() {
  if (sync_) sync_->finish();
}

void DataParallelModel::reset_gradient_sync() {
  if (sync_) sync_->reset();
}

void DataParallelModel::copy_primary_to_replicas() {
  broadcast_from_first_process(*group_, state_tensors(*replicas_[0]));
  const nn::NamedTensors state = replicas_[0]->state_dict();
  for (size_t r = 1; r < replicas_.size(); ++r) replicas_[r]->load_state_dict(state);
}

void DataParallelModel::check_replicas() const {
  const nn::NamedTensors reference = replicas_[0]->state_dict();
  if (group_->processes().size() > 1) {
    for (const auto& [name, t] : reference) {
      const Tensor mine = host_copy(t);
      const Tensor first = mine.clone();
      group_->processes().broadcast(first, 0);
      const Tensor a = first.to(kFloat64), b = mine.to(kFloat64);
      const double diff = a.numel() == 0 ? 0.0 : amax(abs(a - b)).item();
      EF_CHECK(diff == 0.0, "data parallel: process ", group_->processes().rank(),
               "'s replica 0 differs from process 0's in '", name, "' (largest difference ", diff, ")");
    }
  }
  for (size_t r = 1; r < replicas_.size(); ++r) {
    const nn::NamedTensors other = replicas_[r]->state_dict();
    for (size_t i = 0; i < reference.size(); ++i) {
      const Tensor a = reference[i].second.to(cpu()).to(kFloat64);
      const Tensor b = other[i].second.to(cpu()).to(kFloat64);
      const double diff = a.numel() == 0 ? 0.0 : amax(abs(a - b)).item();
      EF_CHECK(diff == 0.0, "data parallel: replica ", r, " on ", group_->device(static_cast<int>(r)).str(),
               " differs from replica 0 in '", reference[i].first, "' (largest difference ", diff, ")");
    }
  }
}

// --- DataParallelCriterion ---------------------------------------------------------------------------

DataParallelCriterion::DataParallelCriterion(DataParallelModel& model) : model_(model) {}

DataParallelCriterion::DataParallelCriterion(DataParallelModel& model, PartsLoss loss)
    : model_(model), loss_(std::move(loss)) {}

DataParallelCriterion::PartsLoss DataParallelCriterion::mean_over_samples(MeanLoss loss) {
  return [loss = std::move(loss)](const Tensor& output, const Tensor& target) {
    return parts_of_mean(loss(output, target), output.size(0));
  };
}

Tensor DataParallelCriterion::operator()(const PerDevice<Tensor>& outputs, const PerDevice<Tensor>& targets) const {
  EF_CHECK(loss_ != nullptr, "DataParallelCriterion: constructed without a loss; pass one, or a per-rank function");
  EF_CHECK(outputs.size() == targets.size(), "DataParallelCriterion: ", outputs.size(), " outputs but ", targets.size(),
           " targets");
  for (size_t r = 0; r < outputs.size(); ++r) {
    EF_CHECK(outputs[r].defined() && outputs[r].dim() >= 1, "DataParallelCriterion: output ", r,
             " is undefined or a scalar");
    EF_CHECK(targets[r].defined() && targets[r].device() == outputs[r].device(), "DataParallelCriterion: target ", r,
             " is not on output ", r, "'s device ", outputs[r].device().str());
  }
  const std::vector<BatchRows> rows = rows_or_current(model_.group(), model_.batch_rows(), outputs);
  return combine(
      rows, [&](int rank) { return loss_(outputs[static_cast<size_t>(rank)], targets[static_cast<size_t>(rank)]); });
}

Tensor DataParallelCriterion::operator()(const std::function<losses::LossParts(int rank)>& fn) const {
  return combine(current_rows(), fn);
}

Tensor DataParallelCriterion::operator()(const std::function<Tensor(int rank)>& fn) const {
  const std::vector<BatchRows> rows = current_rows();
  // One chunk in one process is the whole batch, whose mean is the loss: weighed as 1 (no kernels to
  // scale it by its count and back).
  const bool whole_batch = rows.size() == 1 && model_.group().processes().size() == 1;
  return combine(
      rows, [&](int rank) { return parts_of_mean(fn(rank), whole_batch ? 1 : rows[static_cast<size_t>(rank)].count); });
}

std::vector<BatchRows> DataParallelCriterion::current_rows() const {
  std::vector<BatchRows> rows = model_.batch_rows();
  EF_CHECK(!rows.empty(), "DataParallelCriterion: the model has no current batch: scatter one with model.scatter(x)");
  while (!rows.empty() && rows.back().count == 0) rows.pop_back();  // ranks the batch does not reach
  return rows;
}

losses::LossParts DataParallelCriterion::parts_of_mean(const Tensor& mean, int64_t samples) {
  EF_CHECK(mean.defined() && mean.numel() == 1, "DataParallelCriterion: a loss must be a one-element tensor, got ",
           mean.defined() ? shape_str(mean.shape()) : "undefined");
  const auto n = static_cast<double>(samples);
  return losses::LossParts(samples == 1 ? mean : mean * n, n);  // x·1 is x: no kernel
}

// Note [Combining losses across devices]
// Each rank returns its chunk's parts, term t as (sum_rt, weight_rt). Within the process the sums
// are added on devices[0] by the differentiable reduce_add and the weights (constants) beside them,
// on the host where every rank's weight is a host weight (a count: a mean over samples, a mean over
// every element); across processes both are summed again (Note [Loss across processes]). The loss
// is Σ_t S_t / W_t with S_t and W_t the job's sums: the whole batch's loss, whatever the split. A
// weight the host knows costs no kernel: on one device, where a WGAN-GP step has six losses, the
// device weights cost eight kernels a loss forward and three backward, about 7% of the recorded
// step (docs/benchmarks.md, "A recorded WGAN-GP step in fewer kernels").
Tensor DataParallelCriterion::combine(const std::vector<BatchRows>& rows,
                                      const std::function<losses::LossParts(int rank)>& fn) const {
  const int k = static_cast<int>(rows.size());
  EF_CHECK(k >= 1 && k <= model_.size(), "DataParallelCriterion: ", k, " chunks for ", model_.size(), " devices");
  DeviceGroup& group = model_.group();
  std::vector<losses::LossParts> parts(static_cast<size_t>(k));
  group.share_first_generator(k);
  group.run(
      [&](int rank) {
        const Device device = model_.devices()[static_cast<size_t>(rank)];
        losses::LossParts p;
        {
          std::optional<BatchRowsGuard> guard;  // none for a rank without rows of the batch
          if (rows[static_cast<size_t>(rank)].count > 0) guard.emplace(rows[static_cast<size_t>(rank)]);
          p = fn(rank);
        }
        EF_CHECK(!p.terms.empty(), "DataParallelCriterion: the loss on ", device.str(), " has no terms");
        for (const losses::LossParts::Term& t : p.terms) {
          EF_CHECK(t.sum.defined() && t.sum.numel() == 1 &&
                       (t.host_weight ? !t.weight.defined() : t.weight.defined() && t.weight.numel() == 1),
                   "DataParallelCriterion: the loss on ", device.str(), " is not a scalar");
          EF_CHECK(t.sum.device() == device, "DataParallelCriterion: the loss of rank ", rank, " is on ",
                   t.sum.device().str(), ", not on its device ", device.str());
        }
        parts[static_cast<size_t>(rank)] = std::move(p);
      },
      k);
  const size_t terms = parts[0].terms.size();
  for (int r = 1; r < k; ++r) {
    EF_CHECK(parts[static_cast<size_t>(r)].terms.size() == terms, "DataParallelCriterion: the loss on ",
             model_.devices()[static_cast<size_t>(r)].str(), " has ", parts[static_cast<size_t>(r)].terms.size(),
             " terms, on ", model_.devices()[0].str(), " ", terms);
  }
  const Device first = model_.devices()[0];
  const bool one_process = group.processes().size() == 1;
  // Each term's sums added on devices[0]; its weights on the host where every rank's is a host
  // weight (a count: no kernel to add or divide by), else as tensors beside the sums.
  losses::LossParts combined;
  combined.terms.resize(terms);
  for (size_t t = 0; t < terms; ++t) {
    std::vector<Tensor> sums;
    bool on_host = true;
    double host_total = 0;
    for (const losses::LossParts& p : parts) {
      sums.push_back(p.terms[t].sum);
      on_host = on_host && p.terms[t].host_weight.has_value();
      host_total += p.terms[t].host_weight.value_or(0.0);
    }
    combined.terms[t].sum = sums.size() == 1 ? sums[0] : reduce_add(sums, first);
    if (on_host) {
      combined.terms[t].host_weight = host_total;
      continue;
    }
    NoGradGuard no_grad;
    std::vector<Tensor> weights;
    for (const losses::LossParts& p : parts) {
      const losses::LossParts::Term& term = p.terms[t];
      weights.push_back(term.host_weight
                            ? full({}, *term.host_weight, {.dtype = term.sum.dtype(), .device = term.sum.device()})
                            : term.weight);
    }
    combined.terms[t].weight = weights.size() == 1 ? weights[0] : reduce_add(weights, first);
  }
  if (!one_process) {
    // The job's weights: one all_reduce of every term's (constants, exact in float64 for counts),
    // the device ones copied to the host first.
    NoGradGuard no_grad;
    std::vector<Tensor> device_weights;
    for (const losses::LossParts::Term& term : combined.terms)
      if (!term.host_weight) device_weights.push_back(to_dtype(term.weight, kFloat64));
    const std::vector<double> copied =
        device_weights.empty() ? std::vector<double>{} : host_copy(stack(device_weights, 0)).to_vector();
    std::vector<double> values;
    for (size_t t = 0, d = 0; t < terms; ++t)
      values.push_back(combined.terms[t].host_weight ? *combined.terms[t].host_weight : copied[d++]);
    const Tensor all = from_vector(values, {static_cast<int64_t>(terms)}, {.dtype = kFloat64});
    group.processes().all_reduce(all);
    const std::vector<double> summed = all.to_vector();
    for (size_t t = 0; t < terms; ++t) {
      if (combined.terms[t].host_weight)
        combined.terms[t].host_weight = summed[t];
      else
        combined.terms[t].weight = full({}, summed[t], {.dtype = combined.terms[t].sum.dtype(), .device = first});
    }
  }
  const Tensor local = combined.value();  // a term of weight 0 (its sum is 0) counts 0
  if (one_process) return local;
  // Note [Loss across processes]
  // Every process returns the whole job's loss, but differentiates only its own part: its
  // replicas' gradients, summed over every rank by the gradient sync, are then the whole batch's,
  // as in one process. (A differentiable all_reduce would hand each process the sum of every
  // process's seed, P times too much.) local - local.detach() is 0 with local's derivatives, to
  // any order; the job's loss is added as a constant.
  const Tensor job = host_copy(reshape(local.detach(), {1}));
  group.processes().all_reduce(job);
  return (local - local.detach()) + reshape(job.to(local.device()), local.shape());
}

Tensor DataParallelCriterion::gathered(const PerDevice<Tensor>& outputs, const PerDevice<Tensor>& targets) const {
  EF_CHECK(loss_ != nullptr, "DataParallelCriterion::gathered: constructed without a loss");
  EF_CHECK(!outputs.empty() && outputs.size() == targets.size(), "DataParallelCriterion::gathered: ", outputs.size(),
           " outputs and ", targets.size(), " targets");
  const Device first = model_.devices()[0];
  return loss_(gather(outputs, first), gather(targets, first)).value();
}

}  // namespace evenflow::parallel
