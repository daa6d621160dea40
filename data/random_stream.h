/// @file
/// Random numbers for the data pipeline that do not depend on thread timing: a RandomStream is a
/// pure function of a seed and a stream path (e.g. {epoch} for a sampler, {epoch, sample} for the
/// transforms of one image: SampleStreams), drawn with Philox4x32-10 (engine/random_internal.h)
/// keyed by a hash of both. Whichever worker thread transforms an image, it draws the same numbers;
/// and, unlike std::shuffle or std::uniform_int_distribution, the results are the same with every
/// compiler.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace evenflow::data {

/// The numbers of one stream, drawn in order. Each thread uses its own RandomStream (drawing
/// advances it).
class RandomStream {
 public:
  /// The stream named by `seed` and the path `stream` (e.g. {epoch} or {epoch, batch}): equal
  /// arguments give equal numbers.
  RandomStream(uint64_t seed, std::initializer_list<uint64_t> stream);

  uint64_t next_u64();       ///< The next 64 random bits.
  double uniform();          ///< in [0, 1)
  int64_t below(int64_t n);  ///< in [0, n), n > 0; the bias of the modulo is below n / 2^64

 private:
  uint64_t key_ = 0;
  uint64_t counter_ = 0;
};

/// The random numbers of a batch's images, one RandomStream per image, named by (seed, epoch, the
/// image's index in the dataset): an image draws the same numbers whichever batch, worker thread,
/// process or device part of a batch it lands in, so a batch cut into parts (DataLoaderOptions::
/// batch_part) is transformed as the whole batch is. A DataLoader makes one per batch and hands it
/// to each transform in turn; a transform draws from image r's stream for image r, so later
/// transforms go on where earlier ones stopped. (An image the sampler gives twice in one epoch
/// draws the same numbers both times.)
class SampleStreams {
 public:
  /// The streams of the images `indices` (dataset indices, in batch order) in epoch `epoch`.
  SampleStreams(uint64_t seed, uint64_t epoch, const std::vector<int64_t>& indices);
  /// Image `row`'s stream (ef::Error outside [0, size())).
  RandomStream& operator[](int64_t row);
  int64_t size() const { return static_cast<int64_t>(streams_.size()); }  ///< The number of images.

 private:
  std::vector<RandomStream> streams_;
};

}  // namespace evenflow::data
