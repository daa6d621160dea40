/// @file
/// Datasets: what a DataLoader reads examples from. A Dataset hands out one example by index or,
/// faster, a whole batch for a list of indices; TensorDataset holds every example in two host
/// tensors and gathers a batch's rows with one copy each. Datasets are read concurrently by the
/// loader's worker threads, so their const methods must be thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "evenflow/engine/tensor.h"

namespace evenflow::data {

struct Example {
  Tensor image = {};  ///< e.g. [C, H, W]
  Tensor label = {};  ///< e.g. a 0-d int64 class index
};

struct Batch {
  Tensor images = {};  ///< e.g. [N, C, H, W]
  Tensor labels = {};  ///< e.g. [N] int64
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
  /// The examples at `indices`, stacked along a new first dim. The default stacks get(i); datasets
  /// that can gather faster override it.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;
};

/// Examples stored as the rows of two tensors (images [N, ...], labels [N, ...]), kept on the host
/// and contiguous so that a batch is a copy of rows.
class TensorDataset : public Dataset {
 public:
  explicit TensorDataset(Batch all);

  int64_t size() const override;
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  /// Every example, as stored.
  const Batch& all() const { return all_; }

 private:
  void check_index(int64_t index) const;
  Batch all_;
};

}  // namespace evenflow::data
