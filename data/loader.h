/// @file
/// DataLoader: batches of a Dataset in a sampler's order, made by worker threads ahead of the
/// consumer (Note [Loader workers] in loader.cpp), transformed, and copied to a target device.
/// The batches and their order are a function of (seed, epoch) only: the number of workers and
/// their timing change how fast batches come, never which.
///
///   DataLoader loader(std::make_shared<FashionMNIST>(Split::Train),
///                     {.batch_size = 64, .shuffle = true, .seed = 1, .num_workers = 2});
///   for (int64_t e = 0; e < epochs; ++e)
///     for (Batch& b : loader.epoch(e)) train_step(b.images, b.labels);
///
/// A resumed run continues with `loader.after(batches consumed)` (Note [Resuming a loader]).
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "evenflow/data/dataset.h"
#include "evenflow/data/pipeline.h"
#include "evenflow/data/ray_batches.h"
#include "evenflow/data/sampler.h"
#include "evenflow/data/transforms.h"
#include "evenflow/engine/device.h"

namespace evenflow::data {

/// How a DataLoader orders, batches, transforms and places the examples.
struct DataLoaderOptions {
  int64_t batch_size = 1;       ///< examples per batch (at least 1)
  bool shuffle = false;         ///< RandomSampler(seed) instead of SequentialSampler
  uint64_t seed = 0;            ///< the shuffle and the transforms' random numbers
  bool drop_last = false;       ///< drop a last batch smaller than batch_size
  int num_workers = 0;          ///< 0: batches are made on the consumer's thread, when asked for
  int prefetch_per_worker = 2;  ///< batches made ahead of the consumer: num_workers · prefetch_per_worker
  std::optional<Device> device = std::nullopt;                    ///< copy batches there (.to) on the worker
  std::shared_ptr<const Sampler> sampler = nullptr;               ///< overrides shuffle, e.g. a ShardSampler
  std::vector<std::shared_ptr<const Transform>> transforms = {};  ///< applied in order to each batch
  /// Data parallelism over processes: given a batch's row count, the rows [first, first + count) of
  /// it this loader reads (parallel::process_share's); every process cuts the same batches from the
  /// same order and reads only its part, transformed as in the whole batch (random transforms draw
  /// per image: SampleStreams). Unset: whole batches.
  std::function<std::pair<int64_t, int64_t>(int64_t batch_rows)> batch_part = nullptr;
  /// Preprocessing on a Ray cluster: each worker thread asks `ray` for its batch (the dataset's
  /// indices go out, the finished batch comes back) instead of making it here, so num_workers is the
  /// number of batches the cluster makes at once. `ray`'s pipeline must be this dataset with the
  /// transforms; `transforms` stays empty (they run on the cluster).
  std::shared_ptr<const RayBatches> ray = nullptr;
};

/// Where a DataLoader is in its order: batch `batch` of epoch `epoch`.
struct LoaderPosition {
  int64_t epoch = 0;                                       ///< from 0
  int64_t batch = 0;                                       ///< in [0, num_batches())
  bool operator==(const LoaderPosition&) const = default;  ///< Same epoch and batch.
};

/// The batches of a Dataset, one epoch per iteration (see the file's description). One thread
/// iterates it.
///
/// Note [Resuming a loader]
/// A run that stops after consuming k batches (a training run's k optimizer steps, or k / c for c
/// batches a step) continues with `loader.after(k)`: the next iteration starts at batch k mod B of
/// epoch k / B (B = num_batches()), and the batches before it are never made. Batches are a function
/// of (seed, epoch, index) only (the images' random transforms draw from per-sample streams), so the
/// resumed run's batches are bitwise those of the run that did not stop:
///
///     for (Batch& b : loader.after(progress.step)) { train_step(b); ++progress.step; ... }
///     state.save(path, {.step = progress.step, .epoch = loader.position().epoch});
class DataLoader {
 public:
  /// A loader over `dataset`. ef::Error when the dataset is null, batch_size or prefetch_per_worker
  /// is below 1, num_workers is negative, both a sampler and shuffle are given, a transform is null,
  /// the device does not exist, or `ray` is given with transforms or without workers.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  ~DataLoader();  ///< stops and joins the workers, mid-epoch included
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Sets the next iteration to run epoch `e` from its first batch (each iteration then runs the
  /// epoch after; a new loader starts at epoch 0), ending an iteration in progress. Returns *this,
  /// so `for (Batch& b : loader.epoch(e))` reads naturally. ef::Error for a negative `e`.
  DataLoader& epoch(int64_t e);
  /// Sets the next iteration to continue after `batches` batches of whole epochs taken in order
  /// (Note [Resuming a loader]): epoch batches / num_batches(), from batch batches % num_batches(),
  /// ending an iteration in progress. Returns *this. ef::Error for a negative count or a loader
  /// with no batches.
  DataLoader& after(int64_t batches);
  /// The position of the batch after the last one handed out (the next epoch's first after an
  /// epoch's last), or, before an iteration starts, where it will start.
  LoaderPosition position() const;
  /// Batches per epoch: the sampler's size divided by batch_size, rounded up (down with drop_last).
  int64_t num_batches() const;
  const DataLoaderOptions& options() const { return options_; }  ///< The options it was made with.

  class Iterator;
  /// Starts the next epoch (stopping one in progress: one iteration at a time) and waits for its
  /// first batch. An exception from the dataset or a transform, on any worker, reaches the consumer
  /// as an ef::Error naming the batch when the consumer gets to that batch.
  Iterator begin();
  std::default_sentinel_t end() const { return {}; }  ///< What an Iterator equals past the last batch.

 private:
  struct Run;  ///< one epoch: its batches, workers and queue (loader.cpp)

  Pipeline pipeline_;  ///< the dataset and options_.transforms: what make_batch takes
  DataLoaderOptions options_;
  std::shared_ptr<const Sampler> sampler_;
  LoaderPosition next_start_ = {};  // where begin() starts
  std::unique_ptr<Run> run_;
};

/// An input iterator over the batches of one epoch, made by DataLoader::begin(). It is valid until
/// the loader starts another iteration or is destroyed.
class DataLoader::Iterator {
 public:
  using iterator_category = std::input_iterator_tag;  ///< A single pass.
  using value_type = Batch;                           ///< A batch.
  using difference_type = std::ptrdiff_t;             ///< Required of iterators; unused.
  using pointer = Batch*;                             ///< What operator->() returns.
  using reference = Batch&;                           ///< What operator*() returns.

  Iterator() = default;  ///< An iterator past the end.
  /// An iterator over `run`, the epoch in progress (DataLoader::begin() makes it).
  explicit Iterator(Run* run) : run_(run) {}
  /// The current batch, which the consumer may move from (ef::Error past the end).
  Batch& operator*() const;
  Batch* operator->() const { return &**this; }  ///< The current batch's address.
  Iterator& operator++();                        ///< blocks until the next batch is ready
  void operator++(int) { ++*this; }              ///< As prefix ++ (returns nothing).
  /// Whether the epoch is over: every batch was consumed (true for a default-constructed iterator).
  bool operator==(std::default_sentinel_t) const;

 private:
  Run* run_ = nullptr;
};

}  // namespace evenflow::data
