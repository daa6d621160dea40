// Module and training checkpoints (see checkpoint.h, Note [Training checkpoints]).
#include "io/checkpoint.h"

#include <set>
#include <utility>

#include "engine/error.h"

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
  return t.to_int_vector()[0];
}

}  // namespace

void save_module(const nn::Module& module, const std::string& path,
                 const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, module.state_dict(), metadata);
}

LoadReport load_module(nn::Module& module, const std::string& path, bool strict) {
  return load_into(load_safetensors(path), module.state_dict(), strict);
}

void save_training_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& optimizer,
                              const TrainingProgress& progress, const std::vector<Device>& generator_devices,
                              const std::map<std::string, std::string>& metadata) {
  EF_CHECK(!metadata.count("format") && !metadata.count("version"), "save_training_checkpoint: ", path,
           ": the metadata keys \"format\" and \"version\" are reserved");
  NamedTensors tensors = prefixed(kModelPrefix, model.state_dict());
  for (auto& entry : prefixed(kOptimPrefix, optimizer.state())) tensors.push_back(std::move(entry));
  tensors.emplace_back(kStepKey, from_int_vector({progress.step}, {}));
  tensors.emplace_back(kEpochKey, from_int_vector({progress.epoch}, {}));
  for (const Device& d : unique_devices(generator_devices))
    tensors.emplace_back(kGeneratorPrefix + d.str(), generator_state_to_tensor(generator_state(d)));
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = kFormat;
  meta["version"] = kVersion;
  save_safetensors(path, tensors, meta);
}

TrainingCheckpoint load_training_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& optimizer,
                                            const std::vector<Device>& generator_devices) {
  const SafetensorsFile file = load_safetensors(path);
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
  SafetensorsFile model_part;
  model_part.tensors = with_prefix(file, kModelPrefix, false);

  // ... then change: the model first (load_into checks every key, shape and dtype before copying,
  // so a different architecture fails here naming the key), then the optimizer (load_state checks
  // before replacing; on failure the model's previous values are put back), then the generators.
  NamedTensors previous_model;
  for (const auto& [name, t] : model.state_dict()) previous_model.emplace_back(name, t.clone());
  load_into(model_part, prefixed(kModelPrefix, model.state_dict()), true);
  try {
    optimizer.load_state(with_prefix(file, kOptimPrefix, true));
  } catch (...) {
    model.load_state_dict(previous_model);
    throw;
  }
  for (const auto& [d, state] : generators) set_generator_state(d, state);
  return out;
}

}  // namespace evenflow::io
