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

/// One example: an image and its label.
struct Example {
  Tensor image = {};  ///< e.g. [C, H, W]
  Tensor label = {};  ///< e.g. a 0-d int64 class index
};

/// Examples stacked along a new first dim: one row of images and of labels per example.
/// A DataLoader also says where the batch is in its order; a Dataset leaves those fields as they are.
struct Batch {
  Tensor images = {};  ///< e.g. [N, C, H, W]
  Tensor labels = {};  ///< e.g. [N] int64
  int64_t epoch = 0;   ///< The loader's epoch it belongs to.
  int64_t index = 0;   ///< Its number in that epoch, from 0.
  /// The rows of the job's whole batch these are (over every process: a loader with
  /// DataLoaderOptions::batch_part reads one part), for DataParallelModel::scatter.
  BatchRows rows = {};
};

/// A source of examples, indexed 0 to size() - 1. The loader's worker threads call its const methods
/// concurrently.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;  ///< The number of examples.
  /// Example `index`, in [0, size()).
  virtual Example get(int64_t index) const = 0;
  /// The examples at `indices`, stacked along a new first dim. The default stacks get(i); datasets
  /// that can gather faster override it.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;
};

/// Examples stored as the rows of two tensors (images [N, ...], labels [N, ...]), kept on the host
/// and contiguous so that a batch is a copy of rows.
class TensorDataset : public Dataset {
 public:
  /// Keeps every example of `all`, detached, on cpu:0 and contiguous (copied if need be). Images
  /// and labels must be defined, with at least one dim and the same first size (ef::Error otherwise).
  explicit TensorDataset(Batch all);

  int64_t size() const override;  ///< The number of rows.
  /// Row `index` of the images and of the labels, as views of the stored tensors (no copy); an
  /// index out of range is an ef::Error.
  Example get(int64_t index) const override;
  /// The rows `indices`, copied into new tensors [indices.size(), ...]; an index out of range is an
  /// ef::Error.
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  /// Every example, as stored.
  const Batch& all() const { return all_; }

 private:
  void check_index(int64_t index) const;
  Batch all_;
};

}  // namespace evenflow::data
