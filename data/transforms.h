/// @file
/// Batch transforms for images [N, C, H, W] (float32 or float64): normalization, padding and
/// the usual augmentations. A DataLoader applies them, in order, to each batch on the worker
/// that made it; image r of a batch draws its random choices from its own stream (SampleStreams:
/// seed, epoch, the image's dataset index), so an augmented image is the same whatever the number
/// of workers and their timing, the batch it is in, and the part of the batch a process reads.
#pragma once

#include <vector>

#include "evenflow/data/dataset.h"
#include "evenflow/data/random_stream.h"

namespace evenflow::data {

/// A batch transform. One object serves every worker thread of a DataLoader, concurrently.
class Transform {
 public:
  virtual ~Transform() = default;
  /// Transforms a batch, image r drawing any random numbers it needs from `streams[r]` (ef::Error
  /// when a random transform is given streams for another number of images).
  virtual Batch operator()(Batch batch, SampleStreams& streams) const = 0;
};

/// (x - mean[c]) / std[c] per channel; one value applies to every channel.
class Normalize final : public Transform {
 public:
  /// As many means as standard deviations, at least one, every standard deviation positive
  /// (ef::Error otherwise). Applied to images with another number of channels (when there are
  /// several), it throws ef::Error.
  Normalize(std::vector<double> mean, std::vector<double> std);
  Batch operator()(Batch batch, SampleStreams& streams) const override;

 private:
  std::vector<double> mean_, std_;
};

// Note [Label maps]
// The geometric transforms (Pad, RandomCrop, RandomHorizontalFlip, RandomAffine) move a batch's label
// map with its image: when labels are [N, H, W] with the images' H and W (segmentation), each map
// gets its image's draw, read at the nearest pixel, and positions that come from outside the
// image take `label_fill`. Class labels [N] pass through. Labels of any other shape are an
// ef::Error.

/// Pads height and width by `padding` on each side with `value` (label maps with `label_fill`, Note
/// [Label maps]).
class Pad final : public Transform {
 public:
  /// padding >= 0 (ef::Error otherwise).
  explicit Pad(int64_t padding, double value = 0.0, int64_t label_fill = 0);
  Batch operator()(Batch batch, SampleStreams& streams) const override;

 private:
  int64_t padding_ = 0;
  double value_ = 0.0;
  int64_t label_fill_ = 0;
};

/// Pads by `padding` (zeros; label maps by `label_fill`), then cuts a size x size window at a
/// random position per image.
class RandomCrop final : public Transform {
 public:
  /// size > 0 and padding >= 0 (ef::Error otherwise). Applied to images smaller than the crop after
  /// padding, it throws ef::Error.
  explicit RandomCrop(int64_t size, int64_t padding = 0, int64_t label_fill = 0);
  Batch operator()(Batch batch, SampleStreams& streams) const override;

 private:
  int64_t size_ = 0;
  int64_t padding_ = 0;
  int64_t label_fill_ = 0;
};

/// Mirrors each image (and its label map) left-right with probability p.
class RandomHorizontalFlip final : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);  ///< p in [0, 1] (ef::Error otherwise).
  Batch operator()(Batch batch, SampleStreams& streams) const override;

 private:
  double p_ = 0.5;
};

/// Rotates, scales and shifts each image about its centre by its own draw: an angle uniform in
/// [-degrees, degrees], a scale in [1 - scale, 1 + scale], a shift of up to translate x the width
/// (and x the height) each way. Images are sampled bilinearly with zeros outside (on the CPU; the
/// result goes back to the images' device); label maps at the nearest pixel, `label_fill` outside.
class RandomAffine final : public Transform {
 public:
  /// degrees in [0, 180], translate in [0, 1], scale in [0, 1) (ef::Error otherwise).
  explicit RandomAffine(double degrees, double translate = 0, double scale = 0, int64_t label_fill = 0);
  Batch operator()(Batch batch, SampleStreams& streams) const override;

 private:
  double degrees_ = 0, translate_ = 0, scale_ = 0;
  int64_t label_fill_ = 0;
};

}  // namespace evenflow::data
