// A replayed step's inputs on its devices: named fields, each split over the devices as
// DataParallelModel::scatter splits a batch, all of a device's in one buffer that one copy fills
// (Note [Step buffers]).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "evenflow/engine/tensor.h"
#include "evenflow/parallel/device_group.h"

namespace evenflow::apps {

// Note [Step buffers]
// A step that is recorded and replayed reads its inputs from the same memory every time (Note [A
// step that can be replayed] in engine/step_graph.h). A program draws and loads a step's inputs on
// the host -- real batches, noise, a penalty's interpolation weights, in the order the step uses
// them -- and load() copies them into one buffer per device, one copy each; the step reads each
// field's views, the chunks scatter would give the devices. So the step is the same work on the same
// memory whether it is replayed or run eagerly, and a device gets its inputs in one copy either way.
class StepBuffers {
 public:
  // A field: its name and the shape of one row (one sample).
  using Field = std::pair<std::string, Shape>;
  // `fields` of `rows` rows in all, over `devices` (the first split_sizes(rows, devices.size())
  // of them), of `dtype`. ef::Error for no fields, a name given twice, or no rows.
  StepBuffers(const std::vector<Device>& devices, int64_t rows, DType dtype, std::vector<Field> fields);

  // Field `name` on every device the rows reach: chunk r [rows_r, row shape...] on devices[r].
  // ef::Error for an unknown name.
  parallel::PerDevice<Tensor> operator[](const std::string& name) const;
  // Copies a step's inputs in: one host tensor per field, in the fields' order, [rows, row shape...],
  // of the buffers' dtype. ef::Error for a missing field or a wrong shape or dtype.
  void load(const std::vector<Tensor>& host) const;
  // The rows each device holds.
  const std::vector<int64_t>& rows() const { return rows_; }

 private:
  std::vector<Field> fields_;
  std::vector<int64_t> rows_;               // per device
  std::vector<Tensor> flat_;                // per device: every field's chunk, in order
  std::vector<std::vector<Tensor>> views_;  // [field][device]
  DType dtype_;
};

}  // namespace evenflow::apps
