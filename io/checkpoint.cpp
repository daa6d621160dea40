// Module and training checkpoints (see checkpoint.h, Note [Training checkpoints]).
#include "evenflow/io/checkpoint.h"

#include <cmath>
#include <set>
#include <utility>

#include "evenflow/engine/error.h"

namespace evenflow::io {

namespace {

const std::string kFormat = "evenflow.training_checkpoint";
const std::string kVersion = "1";
const std::string kModelPrefix = "model.";
const std::string kOptimPrefix = "optim.";
const std::string kGeneratorPrefix = "generator.";
const std::string kStepKey = "train.step";
const std::string kEpochKey = "train.epoch";

NamedTensors prefixed(const std::string& prefix, const NamedTensors& tensors) {
  NamedTensors out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) out.emplace_back(prefix + name, t);
  return out;
}

// The file's tensors whose names start with `prefix`, with (strip) or without the prefix removed.
NamedTensors with_prefix(const SafetensorsFile& file, const std::string& prefix, bool strip) {
  NamedTensors out;
  for (const auto& [name, t] : file.tensors)
    if (name.starts_with(prefix)) out.emplace_back(strip ? name.substr(prefix.size()) : name, t);
  return out;
}

// The devices in order of first appearance, each once.
std::vector<Device> unique_devices(const std::vector<Device>& devices) {
  std::vector<Device> out;
  std::set<Device> seen;
  for (const Device& d : devices)
    if (seen.insert(d).second) out.push_back(d);
  return out;
}

int64_t read_counter(const SafetensorsFile& file, const std::string& path, const std::string& key) {
  const Tensor& t = file.at(key);
  EF_CHECK(t.dtype() == kInt64 && t.numel() == 1, "load_training_checkpoint: ", path, ": \"", key,
           "\" must be one int64 value, got ", shape_str(t.shape()), " ", dtype_name(t.dtype()));
  const int64_t value = t.to_int_vector()[0];
  EF_CHECK(value >= 0, "load_training_checkpoint: ", path, ": \"", key, "\" must be a count (>= 0), got ", value);
  return value;
}

}  // namespace

void save_module(const nn::Module& module, const std::string& path,
                 const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, module.state_dict(), metadata);
}

LoadReport load_module(nn::Module& module, const std::string& path, bool strict) {
  return load_into(load_safetensors(path), module.state_dict(), strict);
}

void check_finite(const nn::Module& module, const std::string& source) {
  for (const auto& [name, t] : module.state_dict()) {
    if (!is_floating(t.dtype())) continue;
    const std::vector<double> v = t.to_vector();
    for (size_t i = 0; i < v.size(); ++i)
      EF_CHECK(std::isfinite(v[i]), source, ": '", name, "' holds ", v[i], " at element ", i);
  }
}

namespace {

std::string part_prefix(const CheckpointPart& part, const std::string& kind) {
  return part.name.empty() ? kind : part.name + "." + kind;
}

void check_parts(const char* api, const std::string& path, const std::vector<CheckpointPart>& parts) {
  EF_CHECK(!parts.empty(), api, ": ", path, ": no model given");
  std::set<std::string> names;
  for (const CheckpointPart& part : parts) {
    EF_CHECK(part.model != nullptr, api, ": ", path, ": part \"", part.name, "\" has no model");
    EF_CHECK(names.insert(part.name).second, api, ": ", path, ": part \"", part.name, "\" is given twice");
  }
}

}  // namespace

void save_training_checkpoint(const std::string& path, const std::vector<CheckpointPart>& parts,
                              const TrainingProgress& progress, const std::vector<Device>& generator_devices,
                              const std::map<std::string, std::string>& metadata) {
  check_parts("save_training_checkpoint", path, parts);
  EF_CHECK(!metadata.count("format") && !metadata.count("version"), "save_training_checkpoint: ", path,
           ": the metadata keys \"format\" and \"version\" are reserved");
  NamedTensors tensors;
  for (const CheckpointPart& part : parts) {
    for (auto& entry : prefixed(part_prefix(part, kModelPrefix), part.model->state_dict()))
      tensors.push_back(std::move(entry));
    if (part.optimizer == nullptr) continue;
    for (auto& entry : prefixed(part_prefix(part, kOptimPrefix), part.optimizer->state()))
      tensors.push_back(std::move(entry));
  }
  tensors.emplace_back(kStepKey, from_int_vector({progress.step}, {}));
  tensors.emplace_back(kEpochKey, from_int_vector({progress.epoch}, {}));
  for (const Device& d : unique_devices(generator_devices))
    tensors.emplace_back(kGeneratorPrefix + d.str(), generator_state_to_tensor(generator_state(d)));
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = kFormat;
  meta["version"] = kVersion;
  save_safetensors(path, tensors, meta);
}

TrainingCheckpoint load_training_checkpoint(const std::string& path, const std::vector<CheckpointPart>& parts,
                                            const std::vector<Device>& generator_devices) {
  check_parts("load_training_checkpoint", path, parts);
  return load_training_checkpoint(load_safetensors(path), path, parts, generator_devices);
}

TrainingCheckpoint load_training_checkpoint(const SafetensorsFile& file, const std::string& path,
                                            const std::vector<CheckpointPart>& parts,
                                            const std::vector<Device>& generator_devices) {
  check_parts("load_training_checkpoint", path, parts);
  const auto format = file.metadata.find("format");
  EF_CHECK(format != file.metadata.end() && format->second == kFormat, "load_training_checkpoint: ", path,
           " is not a training checkpoint (its metadata has no \"format\": \"", kFormat, "\")");
  const auto version = file.metadata.find("version");
  EF_CHECK(version != file.metadata.end() && version->second == kVersion, "load_training_checkpoint: ", path,
           ": unsupported version \"", version == file.metadata.end() ? "" : version->second, "\", expected \"",
           kVersion, "\"");

  // Read and check everything first (file.at names a missing key) ...
  TrainingCheckpoint out;
  out.progress.step = read_counter(file, path, kStepKey);
  out.progress.epoch = read_counter(file, path, kEpochKey);
  out.metadata = file.metadata;
  std::vector<std::pair<Device, GeneratorState>> generators;
  for (const Device& d : unique_devices(generator_devices))
    generators.emplace_back(d, generator_state_from_tensor(file.at(kGeneratorPrefix + d.str())));

  // ... then change, part by part: the model (load_into checks every key, shape and dtype before
  // copying, so a different architecture fails here naming the key), then its optimizer (load_state
  // checks before replacing). On a failure every part changed so far, model and optimizer, gets its
  // previous state back, so a failed load changes nothing; the generators are set last.
  std::vector<NamedTensors> previous_models(parts.size()), previous_optimizers(parts.size());
  const auto copy_of = [](const NamedTensors& tensors) {
    NamedTensors copy;
    for (const auto& [name, t] : tensors) copy.emplace_back(name, t.clone());
    return copy;
  };
  for (size_t i = 0; i < parts.size(); ++i) {
    previous_models[i] = copy_of(parts[i].model->state_dict());
    if (parts[i].optimizer != nullptr) previous_optimizers[i] = copy_of(parts[i].optimizer->state());
  }
  const auto restore = [&](size_t changed_parts) {
    for (size_t i = 0; i < changed_parts; ++i) {
      parts[i].model->load_state_dict(previous_models[i]);
      if (parts[i].optimizer != nullptr) parts[i].optimizer->load_state(previous_optimizers[i]);
    }
  };
  size_t changed = 0;
  try {
    for (const CheckpointPart& part : parts) {
      const std::string model_prefix = part_prefix(part, kModelPrefix);
      SafetensorsFile model_part;
      model_part.tensors = with_prefix(file, model_prefix, false);
      ++changed;
      load_into(model_part, prefixed(model_prefix, part.model->state_dict()), true);
      if (part.optimizer != nullptr)
        part.optimizer->load_state(with_prefix(file, part_prefix(part, kOptimPrefix), true));
    }
  } catch (const Error& e) {
    restore(changed);
    // The model's and optimizer's checks name the key; the file is named here.
    throw Error(detail::str_cat("load_training_checkpoint: ", path, ": ", e.what()));
  } catch (...) {
    restore(changed);
    throw;
  }
  for (const auto& [d, state] : generators) set_generator_state(d, state);
  return out;
}

void save_training_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& optimizer,
                              const TrainingProgress& progress, const std::vector<Device>& generator_devices,
                              const std::map<std::string, std::string>& metadata) {
  // The part only reads the model and optimizer when saving.
  save_training_checkpoint(path, {{"", const_cast<nn::Module*>(&model), const_cast<optim::Optimizer*>(&optimizer)}},
                           progress, generator_devices, metadata);
}

TrainingCheckpoint load_training_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& optimizer,
                                            const std::vector<Device>& generator_devices) {
  return load_training_checkpoint(path, {{"", &model, &optimizer}}, generator_devices);
}

}  // namespace evenflow::io
