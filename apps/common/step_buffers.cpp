#include "apps/common/step_buffers.h"

#include <set>

#include "evenflow/engine/ops.h"
#include "evenflow/parallel/comm_ops.h"

namespace evenflow::apps {

namespace {
int64_t row_numel(const Shape& row) {
  int64_t n = 1;
  for (const int64_t d : row) n *= d;
  return n;
}
}  // namespace

StepBuffers::StepBuffers(const std::vector<Device>& devices, int64_t rows, DType dtype, std::vector<Field> fields)
    : fields_(std::move(fields)), rows_(parallel::split_sizes(rows, static_cast<int>(devices.size()))), dtype_(dtype) {
  EF_CHECK(!fields_.empty() && rows > 0, "StepBuffers: needs fields and rows, got ", fields_.size(), " fields of ",
           rows, " rows");
  std::set<std::string> names;
  for (const Field& f : fields_) EF_CHECK(names.insert(f.first).second, "StepBuffers: field '", f.first, "' twice");
  int64_t per_row = 0;
  for (const Field& f : fields_) per_row += row_numel(f.second);
  views_.resize(fields_.size());
  for (size_t r = 0; r < rows_.size(); ++r) {
    const int64_t m = rows_[r];
    flat_.push_back(zeros({m * per_row}, {.dtype = dtype, .device = devices[r]}));
    int64_t offset = 0;
    for (size_t i = 0; i < fields_.size(); ++i) {
      Shape shape = fields_[i].second;
      shape.insert(shape.begin(), m);
      const int64_t count = m * row_numel(fields_[i].second);
      views_[i].push_back(reshape(narrow(flat_[r], 0, offset, count), shape));
      offset += count;
    }
  }
}

parallel::PerDevice<Tensor> StepBuffers::operator[](const std::string& name) const {
  for (size_t i = 0; i < fields_.size(); ++i)
    if (fields_[i].first == name) return views_[i];
  EF_ERROR("StepBuffers: no field '", name, "'");
}

void StepBuffers::load(const std::vector<Tensor>& host) const {
  EF_CHECK(host.size() == fields_.size(), "StepBuffers::load: ", host.size(), " tensors for ", fields_.size(),
           " fields");
  int64_t rows = 0;
  for (const int64_t m : rows_) rows += m;
  std::vector<std::vector<Tensor>> pieces(rows_.size());  // per device, in buffer order
  for (size_t i = 0; i < fields_.size(); ++i) {
    Shape want = fields_[i].second;
    want.insert(want.begin(), rows);
    EF_CHECK(host[i].defined() && host[i].shape() == want && host[i].dtype() == dtype_, "StepBuffers::load: field '",
             fields_[i].first, "' is ", host[i].defined() ? host[i].str() : "undefined", ", expected ", shape_str(want),
             " ", dtype_name(dtype_));
    int64_t start = 0;
    for (size_t r = 0; r < rows_.size(); ++r) {
      pieces[r].push_back(flatten(narrow(host[i], 0, start, rows_[r])));
      start += rows_[r];
    }
  }
  for (size_t r = 0; r < rows_.size(); ++r) flat_[r].copy_(cat(pieces[r], 0));
}

}  // namespace evenflow::apps
