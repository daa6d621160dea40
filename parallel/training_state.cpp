// TrainingState (see training_state.h): the checkpoint of io/checkpoint.h over every part's replica 0,
// then the replicas brought level with it.
#include "evenflow/parallel/training_state.h"

#include <set>

namespace evenflow::parallel {

TrainingState::TrainingState(std::vector<Part> parts, std::vector<Extra> extras)
    : parts_(std::move(parts)), extras_(std::move(extras)) {
  EF_CHECK(!parts_.empty(), "TrainingState: no model given");
  std::set<std::string> names;
  for (const Part& p : parts_)
    EF_CHECK(names.insert(p.name).second, "TrainingState: part \"", p.name, "\" given twice");
  for (const Extra& x : extras_)
    EF_CHECK(names.insert(x.name).second, "TrainingState: part \"", x.name, "\" given twice");
}

std::vector<Device> TrainingState::generator_devices() const {
  std::vector<Device> out;
  for (const Part& p : parts_) out.push_back(p.model.devices()[0]);
  out.push_back(cpu());
  return out;  // duplicates are saved once (io/checkpoint.h)
}

std::vector<io::CheckpointPart> TrainingState::checkpoint_parts() const {
  std::vector<io::CheckpointPart> out;
  for (const Part& p : parts_) out.push_back({p.name, &p.model.module(), &p.optimizer.primary_optimizer()});
  for (const Extra& x : extras_) out.push_back({x.name, &x.module, nullptr});
  return out;
}

void TrainingState::save(const std::string& path, const io::TrainingProgress& progress,
                         const std::map<std::string, std::string>& metadata) const {
  if (parts_[0].model.group().processes().rank() != 0) return;
  io::save_training_checkpoint(path, checkpoint_parts(), progress, generator_devices(), metadata);
}

io::TrainingCheckpoint TrainingState::load(const std::string& path) {
  return load(io::load_safetensors(path), path);
}

io::TrainingCheckpoint TrainingState::load(const io::SafetensorsFile& file, const std::string& path) {
  io::TrainingCheckpoint ck = io::load_training_checkpoint(file, path, checkpoint_parts(), generator_devices());
  for (Part& p : parts_) {
    p.model.copy_primary_to_replicas();
    p.optimizer.load_state(p.optimizer.primary_optimizer().state());
  }
  return ck;
}

}  // namespace evenflow::parallel
