/// @file
/// Samplers: the order in which a DataLoader visits a dataset, one list of indices per epoch.
/// Orders are pure functions of (seed, epoch), so a run is reproducible and every data-parallel
/// shard computes the same permutation before taking its part of it (ShardSampler).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace evenflow::data {

/// The indices a DataLoader visits in each epoch, in order.
class Sampler {
 public:
  virtual ~Sampler() = default;
  /// Indices per epoch.
  virtual int64_t size() const = 0;
  /// The indices of epoch `epoch`, in the order to visit them.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
};

/// 0, 1, ..., n-1 every epoch.
class SequentialSampler final : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);  ///< n >= 0 (ef::Error otherwise).
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_ = 0;
};

/// A permutation of 0..n-1 drawn for each epoch: Fisher-Yates with RandomStream(seed, {epoch}),
/// the same on every machine and compiler for the same (seed, epoch).
class RandomSampler final : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);  ///< n >= 0 (ef::Error otherwise).
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_ = 0;
  uint64_t seed_ = 0;
};

/// @name Note [Shards]
/// ShardSampler takes shard `shard` of `num_shards` of another sampler's indices, for data-parallel
/// training where each replica reads its own part. All shards use the same base sampler (same seed),
/// so for every epoch they split the same order; with the Uneven or Drop remainder they are disjoint,
/// and together they cover it (Uneven) or all but the last n % num_shards indices (Drop).
///   layout Contiguous: shard s takes one block of consecutive positions, in shard order;
///   layout Strided:    shard s takes positions s, s + num_shards, s + 2·num_shards, ...
///   remainder Uneven:  n % num_shards shards (the first ones) get one index more than the others;
///   remainder Pad:     the order is extended cyclically from its start to a multiple of num_shards,
///                      so every shard has ceil(n / num_shards) (PyTorch's DistributedSampler);
///   remainder Drop:    the last n % num_shards positions are dropped, every shard has floor(n / num_shards).
/// @{

/// Which positions of the base order each shard takes: Contiguous or Strided (Note [Shards]).
enum class ShardLayout : uint8_t { Contiguous, Strided };
/// What happens to the n % num_shards indices that do not divide evenly: Uneven, Pad or Drop
/// (Note [Shards]).
enum class ShardRemainder : uint8_t { Uneven, Pad, Drop };
/// @}

/// How a ShardSampler splits its base sampler's order.
struct ShardOptions {
  ShardLayout layout = ShardLayout::Contiguous;       ///< Which positions each shard takes.
  ShardRemainder remainder = ShardRemainder::Uneven;  ///< What happens to the indices left over.
};

/// Shard `shard` of `num_shards` of another sampler's indices, for data-parallel training where
/// each replica reads its own part (Note [Shards] in sampler.h).
class ShardSampler final : public Sampler {
 public:
  /// Takes shard `shard` (0 to num_shards - 1) of `base`'s order, split as `options` says.
  /// ef::Error when base is null, num_shards is below 1 or shard is out of range.
  ShardSampler(std::shared_ptr<const Sampler> base, int64_t num_shards, int64_t shard, ShardOptions options = {});
  int64_t size() const override;
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t total() const;  ///< positions after padding or dropping, a multiple of num_shards_ unless Uneven

  std::shared_ptr<const Sampler> base_;
  int64_t num_shards_ = 1;
  int64_t shard_ = 0;
  ShardOptions options_;
};

}  // namespace evenflow::data
