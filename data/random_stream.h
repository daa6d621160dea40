/// @file
/// Random numbers for the data pipeline that do not depend on thread timing: a RandomStream is a
/// pure function of a seed and a stream path (e.g. {epoch} for a sampler, {epoch, batch} for the
/// transforms of one batch), drawn with Philox4x32-10 (engine/random.h) keyed by a hash of both.
/// Whichever worker thread runs batch k of epoch e, it draws the same numbers; and, unlike
/// std::shuffle or std::uniform_int_distribution, the results are the same with every compiler.
#pragma once

#include <cstdint>
#include <initializer_list>

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

}  // namespace evenflow::data
