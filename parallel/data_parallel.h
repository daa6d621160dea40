/// @file
/// Data parallelism: persistent replicas of a module, one per device of this process (and of every
/// other process of a job started by mpirun, Note [Processes] in process_group.h), each running its
/// forward pass and its own loss on its device's worker thread; only losses and gradients cross
/// devices, through differentiable comm ops (comm_ops.h).
///
/// Note [Data-parallel step]
///
///     DataParallelModel model(make_net(), parallel::devices("cpu:4"));
///     ReplicatedOptimizer<optim::Adam> opt(model, optim::AdamOptions{.lr = 1e-3});
///     DataParallelCriterion criterion(model, losses::CrossEntropyLoss{});
///     auto x = model.scatter(images);                  // chunks 3, 3, 2, 2 for a batch of 10
///     auto y = model.scatter(labels);
///     Tensor loss = criterion(model(x), y);            // the whole batch's loss, on device 0
///     opt.zero_grad();
///     loss.backward();                                 // every device at once; gradient buckets
///                                                      // all-reduced as soon as they are complete
///     opt.step();                                      // waits for the buckets; every replica steps
///
/// Exactness. The criterion adds every chunk's loss sum and weight before it divides (Note [Losses
/// across devices] in losses.h), so the loss is the whole batch's, and its gradients, summed over
/// replicas (the bucket all-reduce is a sum, in rank order, identical on every replica), are the
/// whole batch's. Every
/// replica then applies the same update to the same values with its own optimizer state, so replicas
/// stay bitwise identical without re-broadcasting weights (check_replicas() verifies it).
///
/// Buffers (batch-norm running statistics) follow DistributedDataParallel's rule: in training mode,
/// every forward starts by copying replica 0's buffers to the others, so after a step the buffers
/// are those replica 0 computed from its chunk. SyncBatchNorm computes statistics over all devices,
/// so its buffers are the whole batch's and equal everywhere.
#pragma once

#include <atomic>
#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "evenflow/engine/step_graph.h"
#include "evenflow/layers/module.h"
#include "evenflow/losses/losses.h"
#include "evenflow/optim/optimizer.h"
#include "evenflow/parallel/comm_ops.h"
#include "evenflow/parallel/device_group.h"

namespace evenflow::parallel {

class GradientSync;

/// Options of a DataParallelModel.
struct DataParallelOptions {
  /// Gradients are all-reduced in buckets of about this many bytes, in reverse registration order
  /// (roughly the order backward produces them).
  size_t bucket_bytes = size_t{25} << 20;
  /// Timeout of every collective of the group (Note [Collectives]).
  std::chrono::milliseconds collective_timeout = kDefaultCollectiveTimeout;
  /// The processes the model spans (Note [Processes] in process_group.h): by default the job's,
  /// so a program started by `mpirun -np P` trains one model over every device of the P processes;
  /// single_process() keeps it to this process's devices.
  std::shared_ptr<ProcessGroup> processes = parallel::processes();
};

/// Persistent replicas of a module, one per device of its DeviceGroup, whose gradients are
/// all-reduced in buckets during backward (Note [Data-parallel step]). Not copyable.
class DataParallelModel {
 public:
  /// Moves `module` to devices[0] (it is replica 0: save it, it has PyTorch's names) and clones it
  /// onto the other devices, once. Throws ef::Error for a null `module` or when `devices` is not a
  /// non-empty list of existing devices, each once.
  DataParallelModel(std::shared_ptr<nn::Module> module, std::vector<Device> devices,
                    const DataParallelOptions& options = {});
  ~DataParallelModel();
  DataParallelModel(const DataParallelModel&) = delete;
  DataParallelModel& operator=(const DataParallelModel&) = delete;

  DeviceGroup& group() { return *group_; }  ///< The group the replicas run on.
  /// The replicas' devices: replica r is on devices()[r].
  const std::vector<Device>& devices() const { return group_->devices(); }
  int size() const { return group_->size(); }  ///< The number of replicas (devices).
  /// Replica 0, the module passed to the constructor (on devices()[0]): the one to save and load.
  nn::Module& module() { return *replicas_[0]; }
  /// Replica `rank`, on devices()[rank]; throws std::out_of_range outside [0, size()).
  nn::Module& replica(int rank) { return *replicas_.at(static_cast<size_t>(rank)); }

  /// A batch split along dim 0 over the devices (split_sizes), differentiably (comm_ops scatter).
  /// It becomes the model's current batch (batch_rows): in a job of several processes, each
  /// process's batch is its part of the job's, in process order, learned with an all-gather of the
  /// parts' sizes; the form with the rows needs none. Throws ef::Error for an undefined or 0-d
  /// `batch`, or one with no items.
  PerDevice<Tensor> scatter(const Tensor& batch);
  /// The same for a batch that is the rows `rows` of the job's whole batch: a loader's
  /// Batch::rows, or process_rows(n) for a batch every process cut from the same n rows. No
  /// collective. Throws ef::Error also when rows.count is not the batch's dim 0 or the rows are not
  /// within rows.total.
  PerDevice<Tensor> scatter(const Tensor& batch, const BatchRows& rows);
  /// A batch already split over the devices (chunk r on devices()[r], split_sizes' chunks: what a
  /// replayed step's input buffers hold, Note [A step that can be replayed] in engine/step_graph.h)
  /// becomes the current batch as it is, and is returned. Throws ef::Error unless there are 1 to
  /// size() chunks, each with a leading dim, on its device.
  PerDevice<Tensor> scatter(const PerDevice<Tensor>& chunks);
  /// The same for chunks that together are the rows `rows` of the job's whole batch (no collective).
  PerDevice<Tensor> scatter(const PerDevice<Tensor>& chunks, const BatchRows& rows);
  /// This process's part of every global batch of the job, for DataLoaderOptions::batch_part:
  /// the rows process_share gives it (so that scatter of the part gives each device the chunk one
  /// process with every device would); nullptr in a one-process job (the whole batch).
  std::function<std::pair<int64_t, int64_t>(int64_t rows)> batch_part() const;
  /// The rows of a job's whole batch of `rows` rows that this process holds (batch_part's; all of
  /// them in a one-process job). ef::Error as process_share's.
  BatchRows process_rows(int64_t rows) const;
  /// This process's rows (process_rows) of a tensor every process holds whole, such as noise every
  /// process draws for the whole batch from the same generator, so that each sample sees the
  /// numbers it would in one process. `whole` itself in a one-process job.
  Tensor process_part(const Tensor& whole) const;
  /// The current batch: which rows of the job's whole batch (over every process) each rank holds,
  /// as the last scatter (or forward) split it; empty before the first. What the per-rank forms of
  /// DataParallelCriterion weigh and draw per sample by.
  const std::vector<BatchRows>& batch_rows() const { return batch_rows_; }
  /// Each active device's replica on its input, concurrently; outputs stay on their devices. In
  /// training mode it first copies replica 0's buffers to the others (see the file's notes).
  /// Inputs with the current batch's row counts hold its rows; others become the current batch as
  /// scatter's (an all-gather across processes, so every process calls alike). Throws
  /// ef::Error unless there are 1 to size() inputs, input r defined and on devices()[r] (scatter
  /// makes them so), or when a replica throws (naming its device).
  PerDevice<Tensor> forward(const PerDevice<Tensor>& inputs);
  /// forward(inputs).
  PerDevice<Tensor> operator()(const PerDevice<Tensor>& inputs) { return forward(inputs); }
  /// Any per-device computation: fn(replica, rank) on ranks 0..active-1, concurrently, each on its
  /// device's worker; results stay on their devices. Throws ef::Error unless `active` is in
  /// [1, size()], or when fn throws on some rank (naming its device).
  PerDevice<Tensor> map(int active, const std::function<Tensor(nn::Module& replica, int rank)>& fn);

  /// Training or evaluation mode, on every replica.
  void train(bool on = true);
  void eval() { train(false); }  ///< train(false).

  /// While the returned guard lives, backward() accumulates gradients without all-reducing them
  /// (gradient accumulation); the first backward after it ends synchronizes the sum.
  class NoSync {
   public:
    /// Pauses `m`'s gradient synchronization until destroyed (guards nest).
    explicit NoSync(DataParallelModel& m);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DataParallelModel& model_;
  };
  NoSync no_sync() { return NoSync(*this); }  ///< A NoSync guard for this model.

  /// Waits for the bucket all-reduces started during backward and reduces the buckets still
  /// incomplete (parameters some replica did not use, idle devices). backward() calls it when its
  /// pass ends, so gradients are synchronized when it returns (Note [Gradient buckets]); calling
  /// it again does nothing.
  void finish_gradient_sync();
  /// Forgets which gradients were synchronized (ReplicatedOptimizer::zero_grad calls it).
  void reset_gradient_sync();

  /// Copies replica 0's parameters and buffers into the other replicas (after loading a checkpoint
  /// into module(); training keeps replicas identical by itself).
  void copy_primary_to_replicas();

  /// ef::Error naming the first parameter or buffer (and device) where a replica differs from
  /// replica 0, with the largest difference.
  void check_replicas() const;

 private:
  // ef::Error unless `chunks` are 1 to size() chunks, each with a leading dim, on its device, and
  // split_sizes' chunks of their rows.
  void scatter_checks(const PerDevice<Tensor>& chunks) const;

  std::unique_ptr<DeviceGroup> group_;
  std::vector<std::shared_ptr<nn::Module>> replicas_;
  std::shared_ptr<GradientSync> sync_;
  std::vector<BatchRows> batch_rows_;
};

/// A loss computed on every device of a DataParallelModel, each on its own chunk, and combined into
/// one differentiable scalar on devices[0]: the whole batch's loss (Note [Data-parallel step]).
/// Exact by default: a loss given as parts (a loss object of losses.h, or a function returning
/// losses::LossParts) has its sums and weights added over every chunk of every device and process
/// before one division (Note [Losses across devices] in losses.h). A loss that returns a plain tensor
/// is a mean over its chunk's samples, said so with mean_over_samples (or by the per-rank form),
/// and weighted by the chunk's share of the batch: exact for such means (the Wasserstein losses, the
/// gradient penalties, a mean over images). Holds a reference to the model, which must outlive it.
class DataParallelCriterion {
 public:
  /// A loss of one chunk as parts: (output, target) on the chunk's device.
  using PartsLoss = std::function<losses::LossParts(const Tensor& output, const Tensor& target)>;
  /// A loss of one chunk that is a mean over its samples: a one-element tensor on the chunk's device.
  using MeanLoss = std::function<Tensor(const Tensor& output, const Tensor& target)>;
  /// `loss` as parts: its value times the chunk's samples (dim 0 of the output), over that count.
  /// Exact for a mean over samples; a mean over anything else (pixels with some ignored, class
  /// weights) is the loss object's parts, which is why a plain tensor loss is not taken implicitly.
  static PartsLoss mean_over_samples(MeanLoss loss);

  /// Runs on `model`'s devices and group (so SyncBatchNorm layers called inside a loss synchronize
  /// across the devices too), with no (output, target) loss: use the per-rank forms.
  explicit DataParallelCriterion(DataParallelModel& model);
  /// With a loss given as parts.
  DataParallelCriterion(DataParallelModel& model, PartsLoss loss);
  /// With a loss object of losses.h (CrossEntropyLoss{...}, FocalLoss{...}, ...): its parts.
  template <typename L>
  requires requires(const L& l, const Tensor& x) {
    { l.parts(x, x) } -> std::same_as<losses::LossParts>;
  }
  DataParallelCriterion(DataParallelModel& model, L loss)
      : DataParallelCriterion(
            model, PartsLoss([loss](const Tensor& out, const Tensor& target) { return loss.parts(out, target); })) {}

  /// The loss on each (outputs[i], targets[i]), concurrently on the devices, combined. Throws
  /// ef::Error when constructed without a loss, for unequal numbers of outputs and targets, an
  /// undefined or 0-d output, or a target not on its output's device.
  Tensor operator()(const PerDevice<Tensor>& outputs, const PerDevice<Tensor>& targets) const;
  /// Any per-device loss as parts: fn(rank) on every rank the model's current batch reaches (its
  /// last scatter: DataParallelModel::batch_rows), each on its device's worker, where it may run
  /// the model's replica(rank) and call grad(..., create_graph=true) (a gradient penalty); random
  /// draws per sample see the rank's rows of the batch. Throws ef::Error before any scatter, when
  /// the ranks' parts have different numbers of terms or are not on their ranks' devices; an
  /// exception thrown by fn is rethrown as ef::Error naming the device.
  Tensor operator()(const std::function<losses::LossParts(int rank)>& fn) const;
  /// The same for a loss that is a mean over the rank's chunk of the current batch (a one-element
  /// tensor on the rank's device), weighted by the chunk's share of the batch.
  Tensor operator()(const std::function<Tensor(int rank)>& fn) const;
  /// The torch DataParallel pattern, for comparison only: outputs and targets gathered on
  /// devices[0] and the loss computed there, once, on the whole batch. Throws ef::Error when
  /// constructed without a loss or for no outputs or unequal numbers of outputs and targets.
  Tensor gathered(const PerDevice<Tensor>& outputs, const PerDevice<Tensor>& targets) const;

 private:
  // The model's current batch, without the ranks it does not reach.
  std::vector<BatchRows> current_rows() const;
  // A mean over `samples` samples as parts: (mean·samples, samples), the weight a host weight.
  static losses::LossParts parts_of_mean(const Tensor& mean, int64_t samples);
  // fn's parts on ranks 0..rows.size()-1, each with its rows, combined (Note [Combining losses
  // across devices] in data_parallel.cpp).
  Tensor combine(const std::vector<BatchRows>& rows, const std::function<losses::LossParts(int rank)>& fn) const;

  DataParallelModel& model_;
  PartsLoss loss_;
};

/// What TrainingState needs of a ReplicatedOptimizer, whatever its optimizer type.
class ReplicatedOptimizerBase {
 public:
  virtual ~ReplicatedOptimizerBase() = default;
  /// Replica 0's optimizer, whose state is every replica's.
  virtual optim::Optimizer& primary_optimizer() = 0;
  /// Every replica's state from one exported state (Note [Optimizer state]).
  virtual void load_state(const nn::NamedTensors& state) = 0;
};

/// One optimizer per replica, each on its own device with its own state, stepping concurrently on
/// the devices' workers after the gradient sync. Configure replica 0's optimizer (a schedule sets
/// its learning rate); step() gives the others the same learning rate.
template <typename Opt>
class ReplicatedOptimizer : public ReplicatedOptimizerBase {
 public:
  /// One `Opt(model.replica(r).parameters(), options)` per replica r. Keeps a reference to `model`,
  /// which must outlive the optimizer.
  template <typename Options>
  ReplicatedOptimizer(DataParallelModel& model, const Options& options) : model_(model) {
    for (int r = 0; r < model.size(); ++r)
      replicas_.push_back(std::make_unique<Opt>(model.replica(r).parameters(), options));
  }

  /// Replica `rank`'s optimizer; throws std::out_of_range outside [0, model.size()).
  Opt& replica(int rank) { return *replicas_.at(static_cast<size_t>(rank)); }
  /// Replica 0's optimizer: configure this one (its learning rate is copied to the others at each
  /// step), and save its state().
  Opt& primary() { return *replicas_[0]; }
  /// primary(), as an optim::Optimizer.
  optim::Optimizer& primary_optimizer() override { return *replicas_[0]; }

  /// Every replica's state from one exported state (Note [Optimizer state]).
  void load_state(const nn::NamedTensors& state) override {
    for (auto& o : replicas_) o->load_state(state);
  }

  /// Forgets which gradients were synchronized (DataParallelModel::reset_gradient_sync), then
  /// clears every replica's gradients: set to none (default) or zeroed in place.
  void zero_grad(bool set_to_none = true) {
    model_.reset_gradient_sync();
    for (auto& o : replicas_) o->zero_grad(set_to_none);
  }
  /// Waits for the gradient sync (DataParallelModel::finish_gradient_sync), gives every replica
  /// primary()'s learning rate, steps every replica concurrently on its device's worker, then
  /// forgets which gradients were synchronized.
  void step() {
    model_.finish_gradient_sync();
    model_.group().run([&](int rank) {
      Opt& replica = *replicas_[static_cast<size_t>(rank)];
      // At each replay of a recorded step too: the learning rate is set between steps.
      if (rank > 0)
        each_step(model_.devices()[static_cast<size_t>(rank)],
                  [&replica, &first = *replicas_[0]] { replica.set_lr(first.lr()); });
      replica.step();
    });
    model_.reset_gradient_sync();
  }

 private:
  DataParallelModel& model_;
  std::vector<std::unique_ptr<Opt>> replicas_;
};

}  // namespace evenflow::parallel
