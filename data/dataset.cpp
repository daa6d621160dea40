// Dataset's default batching and TensorDataset's row gather. The gather copies rows with memcpy
// rather than with index_select, which is faster for a batch and also handles int64 labels (the
// engine's index_select takes float tensors only).
#include "evenflow/data/dataset.h"

#include <algorithm>
#include <cstring>

#include "evenflow/engine/ops.h"

namespace evenflow::data {

namespace {

// The rows `indices` of a contiguous host tensor, as a new tensor [indices.size(), ...].
Tensor gather_rows(const Tensor& all, const std::vector<int64_t>& indices) {
  Shape shape = all.shape();
  shape[0] = static_cast<int64_t>(indices.size());
  Tensor out = empty(shape, {.dtype = all.dtype(), .device = all.device()});
  const size_t row_bytes =
      static_cast<size_t>(all.numel() / std::max<int64_t>(all.size(0), 1)) * dtype_size(all.dtype());
  const char* src = static_cast<const char*>(all.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (size_t i = 0; i < indices.size(); ++i)
    std::memcpy(dst + i * row_bytes, src + static_cast<size_t>(indices[i]) * row_bytes, row_bytes);
  return out;
}

}  // namespace

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  EF_CHECK(!indices.empty(), "Dataset::get_batch: no indices given");
  std::vector<Tensor> images, labels;
  images.reserve(indices.size());
  labels.reserve(indices.size());
  for (int64_t i : indices) {
    Example e = get(i);
    images.push_back(std::move(e.image));
    labels.push_back(std::move(e.label));
  }
  return {.images = stack(images, 0), .labels = stack(labels, 0)};
}

TensorDataset::TensorDataset(Batch all) {
  EF_CHECK(all.images.defined() && all.labels.defined(), "TensorDataset: images and labels must be defined");
  EF_CHECK(all.images.dim() >= 1 && all.labels.dim() >= 1, "TensorDataset: images ", all.images.str(), " and labels ",
           all.labels.str(), " need a first dim that counts examples");
  EF_CHECK(all.images.size(0) == all.labels.size(0), "TensorDataset: ", all.images.size(0), " images but ",
           all.labels.size(0), " labels");
  for (Tensor* t : {&all.images, &all.labels}) *t = t->detach().to(cpu()).contiguous();
  all_ = std::move(all);
}

int64_t TensorDataset::size() const {
  return all_.images.size(0);
}

void TensorDataset::check_index(int64_t index) const {
  EF_CHECK(index >= 0 && index < size(), "TensorDataset: index ", index, " is out of range for ", size(), " examples");
}

Example TensorDataset::get(int64_t index) const {
  check_index(index);
  return {.image = all_.images.select(0, index), .label = all_.labels.select(0, index)};
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  for (int64_t i : indices) check_index(i);
  return {.images = gather_rows(all_.images, indices), .labels = gather_rows(all_.labels, indices)};
}

}  // namespace evenflow::data
