// RandomStream: the stream path is folded into a Philox key with SplitMix64's finalizer (Steele
// et al., 2014), and each draw takes the next Philox counter.
#include "evenflow/data/random_stream.h"

#include "evenflow/engine/error.h"
#include "evenflow/engine/random_internal.h"

namespace evenflow::data {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

RandomStream::RandomStream(uint64_t seed, std::initializer_list<uint64_t> stream) : key_(splitmix64(seed)) {
  for (uint64_t s : stream) key_ = splitmix64(key_ ^ s);
}

uint64_t RandomStream::next_u64() {
  const random::Philox4 r = random::philox(key_, counter_++);
  return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
}

double RandomStream::uniform() {
  return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);  // 53 bits / 2^53
}

int64_t RandomStream::below(int64_t n) {
  EF_CHECK(n > 0, "RandomStream::below: n must be positive, got ", n);
  return static_cast<int64_t>(next_u64() % static_cast<uint64_t>(n));
}

SampleStreams::SampleStreams(uint64_t seed, uint64_t epoch, const std::vector<int64_t>& indices) {
  streams_.reserve(indices.size());
  for (int64_t i : indices)
    streams_.emplace_back(seed, std::initializer_list<uint64_t>{epoch, static_cast<uint64_t>(i)});
}

RandomStream& SampleStreams::operator[](int64_t row) {
  EF_CHECK(row >= 0 && row < size(), "SampleStreams: image ", row, " of a batch of ", size());
  return streams_[static_cast<size_t>(row)];
}

}  // namespace evenflow::data
