/// @file
/// Checkpoints of modules and of training runs, on top of io/safetensors.h.
///
/// A module file (save_module) holds the module's state dict under PyTorch's names and nothing
/// else, so `torch_module.load_state_dict(safetensors.torch.load_file(path), strict=True)` reads it
/// for the equivalent PyTorch module, and load_module reads what PyTorch saved with
/// `safetensors.torch.save_file(module.state_dict(), path)`.
///
/// Note [Training checkpoints]
/// A training checkpoint holds everything a run needs to continue exactly as if it had not stopped:
///
///     "model.<name>"         the model's state dict (parameters and buffers),
///     "optim.<name>"         the optimizer's exported state (Note [Optimizer state] in optim/optimizer.h),
///     "train.step", "train.epoch"   int64 0-d counters of the caller's loop,
///     "generator.<device>"   each given device's generator state (dropout masks, random inits),
/// and the metadata {"format": "evenflow.training_checkpoint", "version": "1"} plus the caller's
/// own entries. A failed load leaves the models, optimizers and generators as they were: the file,
/// the counters and the generator states are read and checked first; each model's and optimizer's
/// entries are checked before that part changes, and the parts already loaded get their previous
/// state back when a later one fails. Saves are atomic (Note
/// [Atomic writes] in io/file.h). Errors (missing key, wrong shape, corrupt file) come from
/// io/safetensors and name the key.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "evenflow/engine/device.h"
#include "evenflow/io/safetensors.h"
#include "evenflow/layers/module.h"
#include "evenflow/optim/optimizer.h"

namespace evenflow::io {

/// The module's state dict, under PyTorch's names, with optional metadata.
void save_module(const nn::Module& module, const std::string& path,
                 const std::map<std::string, std::string>& metadata = {});
/// Copies a module file's tensors into the module (see load_into for strict and the report).
LoadReport load_module(nn::Module& module, const std::string& path, bool strict = true);
/// ef::Error naming `source` (a file, an option) and the first parameter or buffer of `module`
/// that holds NaN or an infinity, with the element: weights a run could not use (a classifier whose
/// features would make every distance NaN).
void check_finite(const nn::Module& module, const std::string& source);

/// The loop counters a training checkpoint keeps.
struct TrainingProgress {
  int64_t step = 0;   ///< optimizer steps taken
  int64_t epoch = 0;  ///< the epoch the next step belongs to
};

/// What load_training_checkpoint read besides the tensors it restored.
struct TrainingCheckpoint {
  TrainingProgress progress = {};                    ///< "train.step" and "train.epoch"
  std::map<std::string, std::string> metadata = {};  ///< the file's metadata, "format" included
};

/// A model and its optimizer in a checkpoint of several (a GAN's generator and critic): their keys
/// are "<name>.model.*" and "<name>.optim.*" ("model.*" and "optim.*" for the name ""). A model
/// without an optimizer (e.g. an average of another's weights) has its model keys only.
struct CheckpointPart {
  std::string name;                       ///< the key prefix; unique among the parts ("" allowed)
  nn::Module* model = nullptr;            ///< required (not owned)
  optim::Optimizer* optimizer = nullptr;  ///< optional (not owned)
};

/// Note [Training checkpoints]. `generator_devices` lists the devices whose generator states are
/// saved (duplicates are saved once); metadata keys "format" and "version" are reserved.
void save_training_checkpoint(const std::string& path, const std::vector<CheckpointPart>& parts,
                              const TrainingProgress& progress, const std::vector<Device>& generator_devices = {},
                              const std::map<std::string, std::string>& metadata = {});
/// Restores every part (or, on a failure, none: Note [Training checkpoints]), the generators of `generator_devices`
/// (each must be in the file), and returns the counters and metadata. Each model's keys must match
/// the file's exactly; each optimizer's state is checked by Optimizer::load_state.
TrainingCheckpoint load_training_checkpoint(const std::string& path, const std::vector<CheckpointPart>& parts,
                                            const std::vector<Device>& generator_devices = {});
/// The same from a file already read (`path` names it in messages): for a caller that looks at its
/// metadata first.
TrainingCheckpoint load_training_checkpoint(const SafetensorsFile& file, const std::string& path,
                                            const std::vector<CheckpointPart>& parts,
                                            const std::vector<Device>& generator_devices = {});

/// @name One-model forms
/// The one-model forms: the part named "".
/// @{

/// save_training_checkpoint of the one part {"", model, optimizer}.
void save_training_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& optimizer,
                              const TrainingProgress& progress, const std::vector<Device>& generator_devices = {},
                              const std::map<std::string, std::string>& metadata = {});
/// load_training_checkpoint of the one part {"", model, optimizer}.
TrainingCheckpoint load_training_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& optimizer,
                                            const std::vector<Device>& generator_devices = {});
/// @}

}  // namespace evenflow::io
