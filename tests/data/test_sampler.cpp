// Samplers and RandomStream: orders are pure functions of (seed, epoch) with golden values, and
// shards of every layout and remainder policy have the sizes Note [Shards] promises and cover the
// order as it says.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "evenflow/data/random_stream.h"
#include "evenflow/data/sampler.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::data;
using evenflow::testing::error_of;

namespace {

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

}  // namespace

TEST_CASE("RandomStream: reproducible, in range, independent streams") {
  RandomStream a(7, {1, 2}), b(7, {1, 2}), c(7, {1, 3}), d(8, {1, 2});
  const uint64_t first = a.next_u64();
  CHECK(first == b.next_u64());
  CHECK(first != c.next_u64());
  CHECK(first != d.next_u64());
  RandomStream r(1, {});
  std::set<int64_t> seen;
  for (int i = 0; i < 2000; ++i) {
    const double u = r.uniform();
    CHECK((u >= 0.0 && u < 1.0));
    const int64_t k = r.below(5);
    CHECK((k >= 0 && k < 5));
    seen.insert(k);
  }
  CHECK(seen.size() == 5);
  CHECK(error_of([&] { r.below(0); }).find("n must be positive") != std::string::npos);
}

TEST_CASE("SequentialSampler and RandomSampler orders") {
  CHECK(SequentialSampler(4).indices(3) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(SequentialSampler(0).indices(0).empty());

  const RandomSampler s(10, 42);
  const std::vector<int64_t> e0 = s.indices(0);
  CHECK(sorted(e0) == iota(10));
  CHECK(s.indices(0) == e0);
  CHECK(RandomSampler(10, 42).indices(0) == e0);  // a new sampler, same seed: same order
  CHECK(s.indices(1) != e0);
  CHECK(RandomSampler(10, 43).indices(0) != e0);
  // Golden, also computed by an independent Python model of SplitMix64 + Philox4x32-10 + Fisher-Yates.
  // A change here changes every training run's data order: update it only on purpose.
  CHECK(e0 == std::vector<int64_t>{1, 8, 5, 6, 0, 2, 3, 9, 7, 4});
  CHECK(sorted(RandomSampler(1000, 5).indices(7)) == iota(1000));
  CHECK(RandomSampler(1, 5).indices(0) == std::vector<int64_t>{0});
  CHECK(error_of([] { RandomSampler(-1, 0); }).find("non-negative") != std::string::npos);
  CHECK(error_of([&] { s.indices(-1); }).find("epoch must be non-negative") != std::string::npos);
}

TEST_CASE("ShardSampler: contiguous and strided shards, uneven, padded and dropped remainders") {
  const auto base = std::make_shared<SequentialSampler>(10);
  const auto shard = [&](int64_t s, ShardLayout layout, ShardRemainder rem) {
    const ShardSampler sampler(base, 4, s, {.layout = layout, .remainder = rem});
    const std::vector<int64_t> v = sampler.indices(0);
    CHECK(static_cast<int64_t>(v.size()) == sampler.size());
    return v;
  };
  using L = ShardLayout;
  using R = ShardRemainder;
  CHECK(shard(0, L::Contiguous, R::Uneven) == std::vector<int64_t>{0, 1, 2});
  CHECK(shard(1, L::Contiguous, R::Uneven) == std::vector<int64_t>{3, 4, 5});
  CHECK(shard(2, L::Contiguous, R::Uneven) == std::vector<int64_t>{6, 7});
  CHECK(shard(3, L::Contiguous, R::Uneven) == std::vector<int64_t>{8, 9});
  CHECK(shard(0, L::Strided, R::Uneven) == std::vector<int64_t>{0, 4, 8});
  CHECK(shard(1, L::Strided, R::Uneven) == std::vector<int64_t>{1, 5, 9});
  CHECK(shard(3, L::Strided, R::Uneven) == std::vector<int64_t>{3, 7});
  CHECK(shard(3, L::Contiguous, R::Pad) == std::vector<int64_t>{9, 0, 1});
  CHECK(shard(2, L::Strided, R::Pad) == std::vector<int64_t>{2, 6, 0});
  CHECK(shard(3, L::Strided, R::Pad) == std::vector<int64_t>{3, 7, 1});
  CHECK(shard(3, L::Contiguous, R::Drop) == std::vector<int64_t>{6, 7});
  CHECK(shard(1, L::Strided, R::Drop) == std::vector<int64_t>{1, 5});

  // Over many sizes: Uneven partitions the order, Drop partitions all but its tail, Pad covers it
  // with equal shards; shards of one epoch of a RandomSampler split the same permutation.
  for (int64_t n : {0, 1, 3, 7, 12, 13}) {
    for (int64_t shards : {1, 2, 5}) {
      for (L layout : {L::Contiguous, L::Strided}) {
        CAPTURE(n);
        CAPTURE(shards);
        const auto random = std::make_shared<RandomSampler>(n, 9);
        std::vector<int64_t> uneven, dropped, padded;
        for (int64_t s = 0; s < shards; ++s) {
          const auto take = [&](R rem, std::vector<int64_t>& into) {
            const std::vector<int64_t> v =
                ShardSampler(random, shards, s, {.layout = layout, .remainder = rem}).indices(3);
            into.insert(into.end(), v.begin(), v.end());
            return static_cast<int64_t>(v.size());
          };
          const int64_t u = take(R::Uneven, uneven);
          CHECK((u == n / shards || u == n / shards + 1));
          CHECK(take(R::Drop, dropped) == n / shards);
          CHECK(take(R::Pad, padded) == (n + shards - 1) / shards);
        }
        CHECK(sorted(uneven) == iota(n));
        CHECK(std::set<int64_t>(dropped.begin(), dropped.end()).size() == dropped.size());
        CHECK(std::set<int64_t>(padded.begin(), padded.end()) == std::set<int64_t>(uneven.begin(), uneven.end()));
      }
    }
  }
  CHECK(error_of([&] { ShardSampler(base, 3, 3); }).find("shard 3 is out of range for 3 shards") != std::string::npos);
  CHECK(error_of([&] { ShardSampler(base, 0, 0); }).find("num_shards must be at least 1") != std::string::npos);
}
