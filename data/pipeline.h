/// @file
/// A data pipeline as a value: a dataset and the transforms its batches go through. make_batch is
/// what a DataLoader does for one batch; the same call on another machine (a Ray worker, RayBatches
/// in ray_batches.h) gives the same bits, because each image draws from its own stream (seed,
/// epoch, dataset index: SampleStreams). encode_batch and decode_batch carry a batch between
/// processes, checked end to end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "evenflow/data/dataset.h"
#include "evenflow/data/transforms.h"

namespace evenflow::data {

/// A dataset and the transforms applied, in order, to each of its batches.
struct Pipeline {
  std::shared_ptr<const Dataset> dataset = nullptr;               ///< where the examples come from
  std::vector<std::shared_ptr<const Transform>> transforms = {};  ///< applied in order to each batch
};

/// The examples at `indices` (dataset indices, in batch order), transformed with their images'
/// streams of epoch `epoch` (SampleStreams(seed, epoch, indices)). ef::Error when the pipeline has
/// no dataset, or from the dataset or a transform.
Batch make_batch(const Pipeline& pipeline, const std::vector<int64_t>& indices, uint64_t seed, uint64_t epoch);

/// A host batch as bytes: a magic number, each tensor's dtype, shape and contiguous elements, and a
/// CRC-32 of everything before it. ef::Error when a tensor is undefined.
std::string encode_batch(const Batch& batch);

/// The batch encode_batch wrote (tensors on the host). ef::Error naming `what` (e.g. "batch 3 from the
/// Ray cluster at 10.0.0.1:6379") when the bytes are not one: a wrong magic number or checksum, a
/// size that does not add up; the message quotes the first bytes when they read as text (Ray hands a
/// failure's description to the caller in place of a result).
Batch decode_batch(std::string_view bytes, const std::string& what);

}  // namespace evenflow::data
