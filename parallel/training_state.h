/// @file
/// The whole state of a data-parallel training run, saved and loaded in one call.
///
/// Note [Training state]
/// A run continues exactly, at any device or process count, from: each model's replica 0 (every
/// replica is identical to it) and its optimizer's state (every replica's is equal), the loop
/// counters (step and epoch: the data position, since the loader orders each epoch by its seed
/// and the epoch alone), and the generators the run draws from -- each model's first device's (every
/// rank starts each task from it: DeviceGroup::share_first_generator) and cpu:0's (draws made on the
/// host). The file is a training checkpoint (Note [Training checkpoints] in io/checkpoint.h), written
/// atomically by process 0 alone and read by every process; a load sets every replica and every
/// replica's optimizer, or, when the file does not fit, changes nothing.
///
///     parallel::TrainingState state({{"critic", critic, critic_opt}, {"gen", gen, gen_opt}});
///     state.save(path, {.step = step, .epoch = epoch}, {{"lr", "1e-4"}});
///     io::TrainingCheckpoint ck = state.load(path);   // ck.progress: where to continue
#pragma once

#include <map>
#include <string>
#include <vector>

#include "evenflow/io/checkpoint.h"
#include "evenflow/parallel/data_parallel.h"

namespace evenflow::parallel {

/// Note [Training state]. Holds references to its models and optimizers, which must outlive it.
class TrainingState {
 public:
  /// A model and its optimizer, under a name (the checkpoint's key prefix; "" for a run of one).
  struct Part {
    std::string name;                    ///< unique among the parts
    DataParallelModel& model;            ///< its replicas are loaded, replica 0 is saved
    ReplicatedOptimizerBase& optimizer;  ///< every replica's state is loaded, replica 0's saved
  };
  /// A module saved and loaded as it is, beside the parts: not replicated and not optimized, e.g.
  /// an exponential moving average of a model's weights.
  struct Extra {
    std::string name;    ///< unique among the parts and extras
    nn::Module& module;  ///< loaded and saved (its keys: "<name>.model.*")
  };
  /// ef::Error for no parts or a name given twice.
  explicit TrainingState(std::vector<Part> parts, std::vector<Extra> extras = {});

  /// Writes the state with `progress` and `metadata` (what a resume must agree with) to `path`,
  /// atomically, from process 0 of the models' job (the other processes return at once).
  void save(const std::string& path, const io::TrainingProgress& progress,
            const std::map<std::string, std::string>& metadata = {}) const;
  /// Restores every model's replicas, every optimizer's replicas and the generators from `path`,
  /// on every process, and returns the counters and metadata; on any error (a missing or corrupt
  /// file, another architecture, a state no optimizer could have written) an ef::Error naming the
  /// file, and nothing changed.
  io::TrainingCheckpoint load(const std::string& path);
  /// The same from the file at `path`, already read.
  io::TrainingCheckpoint load(const io::SafetensorsFile& file, const std::string& path);

  /// The devices whose generators are saved: each model's first device, and cpu:0.
  std::vector<Device> generator_devices() const;

 private:
  std::vector<io::CheckpointPart> checkpoint_parts() const;
  std::vector<Part> parts_;
  std::vector<Extra> extras_;
};

}  // namespace evenflow::parallel
