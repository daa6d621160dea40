// Sequential, random and sharded index orders (see sampler.h and Note [Shards]).
#include "evenflow/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "evenflow/data/random_stream.h"
#include "evenflow/engine/error.h"

namespace evenflow::data {

namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

void check_epoch(const char* sampler, int64_t epoch) {
  EF_CHECK(epoch >= 0, sampler, ": epoch must be non-negative, got ", epoch);
}

}  // namespace

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  EF_CHECK(n >= 0, "SequentialSampler: size must be non-negative, got ", n);
}

std::vector<int64_t> SequentialSampler::indices(int64_t epoch) const {
  check_epoch("SequentialSampler", epoch);
  return iota(n_);
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  EF_CHECK(n >= 0, "RandomSampler: size must be non-negative, got ", n);
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  check_epoch("RandomSampler", epoch);
  std::vector<int64_t> v = iota(n_);
  RandomStream rng(seed_, {static_cast<uint64_t>(epoch)});
  for (int64_t i = n_ - 1; i > 0; --i) std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(rng.below(i + 1))]);
  return v;
}

ShardSampler::ShardSampler(std::shared_ptr<const Sampler> base, int64_t num_shards, int64_t shard, ShardOptions options)
    : base_(std::move(base)), num_shards_(num_shards), shard_(shard), options_(options) {
  EF_CHECK(base_ != nullptr, "ShardSampler: no base sampler given");
  EF_CHECK(num_shards >= 1, "ShardSampler: num_shards must be at least 1, got ", num_shards);
  EF_CHECK(shard >= 0 && shard < num_shards, "ShardSampler: shard ", shard, " is out of range for ", num_shards,
           " shards");
}

int64_t ShardSampler::total() const {
  const int64_t n = base_->size();
  switch (options_.remainder) {
    case ShardRemainder::Uneven:
      return n;
    case ShardRemainder::Pad:
      return (n + num_shards_ - 1) / num_shards_ * num_shards_;
    case ShardRemainder::Drop:
      return n / num_shards_ * num_shards_;
  }
  EF_ASSERT(false, "unknown ShardRemainder");
}

int64_t ShardSampler::size() const {
  const int64_t t = total();
  return t / num_shards_ + (shard_ < t % num_shards_ ? 1 : 0);
}

std::vector<int64_t> ShardSampler::indices(int64_t epoch) const {
  const std::vector<int64_t> order = base_->indices(epoch);
  const int64_t n = static_cast<int64_t>(order.size());
  EF_CHECK(n == base_->size(), "ShardSampler: the base sampler gave ", n, " indices but says its size is ",
           base_->size());
  const int64_t t = total(), count = size();
  // Position p of the padded or truncated order; padding repeats the order from its start.
  const auto at = [&](int64_t p) { return order[static_cast<size_t>(p % n)]; };
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count));
  if (options_.layout == ShardLayout::Contiguous) {
    const int64_t start = shard_ * (t / num_shards_) + std::min(shard_, t % num_shards_);
    for (int64_t i = 0; i < count; ++i) out.push_back(at(start + i));
  } else {
    for (int64_t i = 0; i < count; ++i) out.push_back(at(shard_ + i * num_shards_));
  }
  return out;
}

}  // namespace evenflow::data
