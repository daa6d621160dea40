// DataLoader: batches arrive in the sampler's order whatever the number of workers and their
// timing; drop_last, epochs, shards and device copies (CUDA where a GPU is visible); transforms draw the same numbers
// on any worker; the prefetch window is bounded; a worker's exception reaches the consumer as ef::Error; and destroying
// a loader mid-epoch joins its workers promptly. Test names contain "workers" so scripts/test.sh runs them under
// ThreadSanitizer too.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "evenflow/data/loader.h"
#include "evenflow/engine/ops.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::data;
using evenflow::testing::error_of;
using evenflow::testing::vals;

namespace {

// Example i: image full([1, 2, 2], i), label i. Uses Dataset's default get_batch (stacking get),
// optionally sleeping a different time per index so that workers finish out of order, and
// throwing for one index.
class IndexDataset final : public Dataset {
 public:
  explicit IndexDataset(int64_t n, int64_t fail_at = -1, int sleep_us = 0)
      : n_(n), fail_at_(fail_at), sleep_us_(sleep_us) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_ * ((i * 7) % 5)));
    EF_CHECK(i != fail_at_, "IndexDataset: example ", i, " is broken");
    return {.image = full({1, 2, 2}, static_cast<double>(i)), .label = from_int_vector({i}, {})};
  }

 private:
  int64_t n_ = 0, fail_at_ = -1;
  int sleep_us_ = 0;
};

// Counts the batches made.
class CountingDataset final : public Dataset {
 public:
  int64_t size() const override { return 100; }
  Example get(int64_t i) const override { return {.image = zeros({1}), .label = from_int_vector({i}, {})}; }
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    ++made;
    return Dataset::get_batch(indices);
  }
  mutable std::atomic<int> made{0};
};

std::vector<int64_t> labels_of(DataLoader& loader, std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<int64_t> out;
  for (Batch& b : loader) {
    const std::vector<int64_t> l = b.labels.to_int_vector();
    CHECK(vals(b.images.mean({1, 2, 3})) == std::vector<double>(l.begin(), l.end()));  // image i holds i
    out.insert(out.end(), l.begin(), l.end());
    if (batch_sizes) batch_sizes->push_back(static_cast<int64_t>(l.size()));
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// 20 images [1, 6, 6] of distinct values, labelled with their index.
std::shared_ptr<TensorDataset> numbered_images() {
  std::vector<double> v(20 * 36);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return std::make_shared<TensorDataset>(
      Batch{.images = from_vector(v, {20, 1, 6, 6}), .labels = arange(0, 20, 1, {.dtype = kInt64})});
}

std::vector<std::shared_ptr<const Transform>> crop_and_flip() {
  return {std::make_shared<RandomCrop>(4, 1), std::make_shared<RandomHorizontalFlip>(0.5)};
}

}  // namespace

TEST_CASE("DataLoader workers: batches follow the sampler's order for 0, 1 and 3 workers") {
  const auto dataset = std::make_shared<IndexDataset>(37, -1, 200);
  const std::vector<int64_t> order = RandomSampler(37, 11).indices(0);
  for (int workers : {0, 1, 3}) {
    CAPTURE(workers);
    DataLoader loader(dataset, {.batch_size = 5, .shuffle = true, .seed = 11, .num_workers = workers});
    CHECK(loader.num_batches() == 8);
    std::vector<int64_t> sizes;
    CHECK(labels_of(loader, &sizes) == order);
    CHECK(sizes == std::vector<int64_t>{5, 5, 5, 5, 5, 5, 5, 2});
  }
  DataLoader sequential(dataset, {.batch_size = 10, .num_workers = 2});
  CHECK(labels_of(sequential) == SequentialSampler(37).indices(0));
}

TEST_CASE("DataLoader workers: drop_last, epochs and shards") {
  const auto dataset = std::make_shared<IndexDataset>(37);
  DataLoader loader(dataset, {.batch_size = 5, .shuffle = true, .seed = 3, .drop_last = true, .num_workers = 2});
  CHECK(loader.num_batches() == 7);
  std::vector<int64_t> sizes;
  const std::vector<int64_t> e0 = labels_of(loader, &sizes);
  CHECK(sizes == std::vector<int64_t>(7, 5));
  const std::vector<int64_t> order0 = RandomSampler(37, 3).indices(0);
  CHECK(e0 == std::vector<int64_t>(order0.begin(), order0.begin() + 35));
  // Each iteration runs the next epoch; epoch(e) goes back.
  CHECK(loader.position() == LoaderPosition{.epoch = 1, .batch = 0});
  const std::vector<int64_t> order1 = RandomSampler(37, 3).indices(1);
  CHECK(labels_of(loader) == std::vector<int64_t>(order1.begin(), order1.begin() + 35));
  CHECK(labels_of(loader.epoch(0)) == e0);

  // Two shards of one order, read by two loaders, split it between them.
  const auto order = std::make_shared<RandomSampler>(37, 5);
  std::vector<int64_t> both;
  for (int64_t s = 0; s < 2; ++s) {
    DataLoader shard(dataset,
                     {.batch_size = 4, .num_workers = 1, .sampler = std::make_shared<ShardSampler>(order, 2, s)});
    const std::vector<int64_t> part = labels_of(shard);
    CHECK(part == ShardSampler(order, 2, s).indices(0));
    both.insert(both.end(), part.begin(), part.end());
  }
  CHECK(both == order->indices(0));
}

TEST_CASE("DataLoader workers: batches are copied to the target device") {
  std::vector<Device> devices{Device("cpu:3")};
  if (evenflow::cuda_device_count() > 0) devices.push_back(cuda(0));  // the CPU case runs anyway
  for (const Device& d : devices) {
    CAPTURE(d.str());
    DataLoader loader(std::make_shared<IndexDataset>(6), {.batch_size = 4, .num_workers = 2, .device = d});
    std::vector<int64_t> labels;
    for (Batch& b : loader) {
      CHECK(b.images.device() == d);
      CHECK(b.labels.device() == d);
      const std::vector<int64_t> l = b.labels.to_int_vector();
      CHECK(vals(b.images.mean({1, 2, 3})) == std::vector<double>(l.begin(), l.end()));
      labels.insert(labels.end(), l.begin(), l.end());
    }
    CHECK(labels == SequentialSampler(6).indices(0));
  }
}

TEST_CASE("DataLoader workers: transforms give the same batches whatever the workers") {
  const auto dataset = numbered_images();
  const std::vector<std::shared_ptr<const Transform>> augment = crop_and_flip();
  const auto run = [&](int workers, uint64_t seed) {
    DataLoader loader(dataset,
                      {.batch_size = 6, .shuffle = true, .seed = seed, .num_workers = workers, .transforms = augment});
    std::vector<double> all;
    for (Batch& b : loader) {
      CHECK(b.images.shape() == Shape{b.labels.size(0), 1, 4, 4});
      const std::vector<double> x = vals(b.images);
      all.insert(all.end(), x.begin(), x.end());
    }
    return all;
  };
  const std::vector<double> reference = run(0, 1);
  CHECK(run(1, 1) == reference);
  CHECK(run(3, 1) == reference);
  CHECK(run(3, 2) != reference);
}

// Random transforms draw per image (SampleStreams): an image is augmented the same in a batch of
// 6 or of 5, and the parts of a batch that P processes read (batch_part), put together, are the
// whole batch, augmentation included.
TEST_CASE("DataLoader: random transforms draw per image, so batch sizes and batch parts agree") {
  const auto dataset = numbered_images();
  const std::vector<std::shared_ptr<const Transform>> augment = crop_and_flip();
  // Every image of epoch 1, in order, each as its dataset index's row.
  const auto images_by_index = [&](int64_t batch_size, int workers,
                                   std::function<std::pair<int64_t, int64_t>(int64_t)> part) {
    DataLoader loader(dataset, {.batch_size = batch_size,
                                .shuffle = true,
                                .seed = 5,
                                .num_workers = workers,
                                .transforms = augment,
                                .batch_part = std::move(part)});
    std::vector<std::vector<double>> by_index(20);
    for (Batch& b : loader.epoch(1)) {
      const std::vector<int64_t> labels = b.labels.to_int_vector();
      for (size_t r = 0; r < labels.size(); ++r)
        by_index[static_cast<size_t>(labels[r])] = vals(b.images.select(0, static_cast<int64_t>(r)));
    }
    return by_index;
  };
  const auto reference = images_by_index(6, 0, nullptr);
  CHECK(images_by_index(5, 0, nullptr) == reference);
  CHECK(images_by_index(20, 2, nullptr) == reference);
  // Three processes' parts of each batch of 6 (rows 0-1, 2-3, 4-5; of the last batch of 2, rows 0,
  // 0 and 1), gathered by index.
  std::vector<std::vector<double>> gathered(20);
  for (int64_t p = 0; p < 3; ++p) {
    const auto part = images_by_index(6, 1, [p](int64_t rows) {
      const int64_t first = std::min(p * rows / 3, rows - 1);
      return std::pair<int64_t, int64_t>{first, std::max<int64_t>(1, (p + 1) * rows / 3 - first)};
    });
    for (size_t i = 0; i < 20; ++i)
      if (!part[i].empty()) gathered[i] = part[i];
  }
  CHECK(gathered == reference);
}

// Note [Resuming a loader]: after(k) continues where k batches of whole epochs end, bitwise (random
// transforms included), never making the batches before; batches say where they are and which rows
// of the job's batch they hold.
TEST_CASE("DataLoader workers: after(k) continues an unbroken run, and batches say where they are") {
  const auto dataset = numbered_images();  // 20 images, batches of 6: 4 a epoch, the last of 2
  const std::vector<std::shared_ptr<const Transform>> augment = crop_and_flip();
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    DataLoader loader(dataset,
                      {.batch_size = 6, .shuffle = true, .seed = 7, .num_workers = workers, .transforms = augment});
    REQUIRE(loader.num_batches() == 4);
    // Four epochs without a stop: each batch's images and where the loader says it is.
    std::vector<std::vector<double>> unbroken;
    for (int64_t e = 0; e < 4; ++e) {
      int64_t index = 0;
      for (Batch& b : loader) {
        CHECK(b.epoch == e);
        CHECK(b.index == index++);
        const int64_t rows = b.index < 3 ? 6 : 2;
        CHECK(b.rows.start == 0);
        CHECK(b.rows.count == rows);
        CHECK(b.rows.total == rows);
        unbroken.push_back(vals(b.images));
      }
      CHECK(loader.position() == LoaderPosition{.epoch = e + 1, .batch = 0});
    }
    for (int64_t k : {0, 1, 3, 4, 6, 11}) {
      CAPTURE(k);
      loader.after(k);
      CHECK(loader.position() == LoaderPosition{.epoch = k / 4, .batch = k % 4});
      int64_t i = k;
      for (Batch& b : loader) {  // the rest of k's epoch
        CHECK(b.epoch == i / 4);
        CHECK(b.index == i % 4);
        CHECK(vals(b.images) == unbroken[static_cast<size_t>(i)]);
        ++i;
        CHECK(loader.position() == LoaderPosition{.epoch = i / 4, .batch = i % 4});
      }
      CHECK(i == (k / 4 + 1) * 4);
      for (Batch& b : loader) {  // and the next epoch, whole
        CHECK(vals(b.images) == unbroken[static_cast<size_t>(i++)]);
        if (b.index == 1) break;  // a stop mid-epoch: the position is the batch after
      }
      CHECK(loader.position() == LoaderPosition{.epoch = k / 4 + 1, .batch = 2});
    }
    // epoch(e) ends the iteration in progress and starts e at its first batch.
    Batch& first = *loader.after(5).begin();
    CHECK(first.index == 1);
    CHECK(loader.epoch(2).position() == LoaderPosition{.epoch = 2, .batch = 0});
  }

  // The batches before the position are never made.
  const auto counting = std::make_shared<CountingDataset>();
  DataLoader counted(counting, {.batch_size = 10, .num_workers = 0});
  int64_t seen = 0;
  for (Batch& b : counted.after(27)) {
    CHECK(b.index == 7 + seen++);
    CHECK(b.epoch == 2);
  }
  CHECK(seen == 3);
  CHECK(counting->made.load() == 3);

  // A batch part: the rows of the job's batch this loader reads.
  DataLoader part(dataset, {.batch_size = 6, .batch_part = [](int64_t rows) {
                              return std::pair<int64_t, int64_t>{rows / 2, rows - rows / 2};
                            }});
  std::vector<BatchRows> rows;
  for (Batch& b : part) {
    CHECK(b.labels.size(0) == b.rows.count);
    rows.push_back(b.rows);
  }
  REQUIRE(rows.size() == 4);
  CHECK((rows[0].start == 3 && rows[0].count == 3 && rows[0].total == 6));
  CHECK((rows[3].start == 1 && rows[3].count == 1 && rows[3].total == 2));

  CHECK(error_of([&] { counted.after(-1); }).find("negative number of batches") != std::string::npos);
  DataLoader empty(std::make_shared<IndexDataset>(3), {.batch_size = 5, .drop_last = true});
  CHECK(error_of([&] { empty.after(0); }).find("no batches (3 examples, batch_size 5, drop_last)") !=
        std::string::npos);
}

TEST_CASE("DataLoader workers: the prefetch window is bounded") {
  const auto dataset = std::make_shared<CountingDataset>();
  DataLoader loader(dataset, {.batch_size = 10, .num_workers = 2, .prefetch_per_worker = 1});
  auto it = loader.begin();  // batch 0 taken: the workers may make batches 1 and 2, no more
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(dataset->made.load() <= 3);
  int64_t batches = 1;
  for (++it; it != loader.end(); ++it) ++batches;
  CHECK(batches == 10);
  CHECK(dataset->made.load() == 10);
}

TEST_CASE("DataLoader workers: an exception in a worker reaches the consumer as ef::Error") {
  const auto dataset = std::make_shared<IndexDataset>(40, 13, 100);
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    DataLoader loader(dataset, {.batch_size = 5, .num_workers = workers});
    std::vector<int64_t> seen;
    const std::string e = error_of([&] {
      for (Batch& b : loader) {
        const std::vector<int64_t> l = b.labels.to_int_vector();
        seen.insert(seen.end(), l.begin(), l.end());
      }
    });
    INFO(e);
    CHECK(e.find("DataLoader: batch 2 of epoch 0 failed") != std::string::npos);
    CHECK(e.find("IndexDataset: example 13 is broken") != std::string::npos);
    CHECK((workers == 0) == (e.find("on worker") == std::string::npos));
    CHECK(seen == SequentialSampler(10).indices(0));  // batches 0 and 1 arrived first
    // The loader can start again after an error.
    CHECK(loader.begin() != loader.end());
  }
  CHECK_THROWS_AS(DataLoader(dataset, {.batch_size = 0}), Error);
  CHECK(error_of([&] {
          DataLoader(dataset, {.shuffle = true, .sampler = std::make_shared<SequentialSampler>(40)});
        }).find("either a sampler or shuffle") != std::string::npos);
  CHECK(error_of([&] { DataLoader(dataset, {.device = Device("cpu:99")}); }).find("cpu:99") != std::string::npos);
}

TEST_CASE("DataLoader workers: destroying a loader mid-epoch joins its workers promptly") {
  const auto slow = std::make_shared<IndexDataset>(400, -1, 5000);  // up to 20 ms per example
  const auto start = std::chrono::steady_clock::now();
  {
    DataLoader loader(slow, {.batch_size = 4, .num_workers = 3});
    for (Batch& b : loader) {
      CHECK(b.labels.size(0) == 4);
      break;
    }
  }
  {
    DataLoader loader(slow, {.batch_size = 4, .num_workers = 3});
    loader.begin();
    loader.begin();  // restarts: the first epoch's workers are stopped and joined
  }
  { DataLoader never_iterated(slow, {.batch_size = 4, .num_workers = 3}); }
  // Each stop waits at most for the batches in hand (4 examples, at most 80 ms): far from 400 examples.
  CHECK(seconds_since(start) < 3.0);
}
