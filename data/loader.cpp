// DataLoader: one Run per epoch holds the epoch's order, the worker threads and the slots they
// fill (Note [Loader workers]).
#include "evenflow/data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "evenflow/data/pipeline.h"
#include "evenflow/engine/error.h"

namespace evenflow::data {

namespace {

int64_t batch_count(int64_t examples, const DataLoaderOptions& o) {
  return o.drop_last ? examples / o.batch_size : (examples + o.batch_size - 1) / o.batch_size;
}

}  // namespace

// Note [Loader workers]
// An epoch's batches are numbered 0..B-1; batch k holds positions [k·batch_size, (k+1)·batch_size)
// of the sampler's order. An iteration starts at batch s (0, or where DataLoader::after puts it):
// claimed = consumed = s, so the batches before s are never made. Workers claim the lowest
// unclaimed number under the lock, but only while it is below `consumed + capacity` (capacity =
// num_workers · prefetch_per_worker), so at most `capacity` batches are being made or waiting at
// any time. A worker makes its batch without the
// lock (make_batch: get_batch and the transforms with the images' SampleStreams, or a Ray task
// doing the same on a cluster; then the copy to the device) and
// stores it, or the message of the exception it threw, in slot k % capacity of a ring: a claimed
// batch is less than `capacity` ahead of the consumer, so its slot is always free. The consumer
// takes batch `consumed` from its slot, waiting until it is filled, so batches arrive in sampler
// order whatever the workers' timing. Stopping (the loader's end, a new epoch, an error handed to
// the consumer) sets `stop` and joins: a worker finishes the batch in hand, sees `stop` and
// returns, so nothing waits forever.
struct DataLoader::Run {
  struct Slot {
    bool ready = false;
    Batch batch = {};
    std::optional<std::string> error = std::nullopt;  // what making the batch threw
    int worker = -1;                                  // -1: the consumer's thread
  };

  Run(const DataLoader& l, LoaderPosition start);
  ~Run() { stop_workers(); }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  Slot make(int64_t k, int worker) const;
  void work(int worker);
  void advance();
  void stop_workers();
  size_t slot_of(int64_t k) const { return static_cast<size_t>(k % capacity); }

  const DataLoader& loader;
  const int64_t epoch;
  const std::vector<int64_t> order;
  const int64_t num_batches;
  const int64_t capacity;

  std::mutex mu;
  std::condition_variable work_cv, ready_cv;
  std::vector<Slot> slots;    // batch k in slots[k % capacity]: at most `capacity` are unconsumed
  int64_t claimed, consumed;  // from the position it starts at: the batches before are never made
  bool stop = false;
  std::vector<std::thread> threads;

  Batch current;       // the batch the consumer's iterator points at
  int64_t next_batch;  // the batch after `current` (the consumer's; `consumed` also counts a failed one)
  bool done = false;
};

DataLoader::Run::Run(const DataLoader& l, LoaderPosition start)
    : loader(l),
      epoch(start.epoch),
      order(l.sampler_->indices(start.epoch)),
      num_batches(batch_count(static_cast<int64_t>(order.size()), l.options_)),
      capacity(static_cast<int64_t>(l.options_.num_workers) * l.options_.prefetch_per_worker),
      slots(static_cast<size_t>(capacity)),
      claimed(start.batch),
      consumed(start.batch),
      next_batch(start.batch) {
  try {
    for (int w = 0; w < l.options_.num_workers; ++w) threads.emplace_back([this, w] { work(w); });
  } catch (...) {
    stop_workers();
    throw;
  }
}

DataLoader::Run::Slot DataLoader::Run::make(int64_t k, int worker) const {
  Slot s;
  s.worker = worker;
  try {
    const DataLoaderOptions& o = loader.options_;
    size_t begin = static_cast<size_t>(k * o.batch_size);
    size_t end = std::min(order.size(), begin + static_cast<size_t>(o.batch_size));
    const auto whole = static_cast<int64_t>(end - begin);
    BatchRows rows{.start = 0, .count = whole, .total = whole};
    if (o.batch_part) {
      const auto [first, count] = o.batch_part(static_cast<int64_t>(end - begin));
      EF_CHECK(first >= 0 && count >= 1 && first + count <= static_cast<int64_t>(end - begin),
               "DataLoader: batch_part ", "gave rows ", first, " to ", first + count, " of a batch of ", end - begin);
      begin += static_cast<size_t>(first);
      end = begin + static_cast<size_t>(count);
      rows = {.start = first, .count = count, .total = whole};
    }
    const std::vector<int64_t> indices(order.begin() + static_cast<std::ptrdiff_t>(begin),
                                       order.begin() + static_cast<std::ptrdiff_t>(end));
    Batch b = o.ray ? o.ray->make(indices, o.seed, static_cast<uint64_t>(epoch))
                    : make_batch(loader.pipeline_, indices, o.seed, static_cast<uint64_t>(epoch));
    if (o.device) {
      // On a CUDA device the copy goes through page-locked staging memory and is asynchronous on
      // the device's stream (Note [Host-to-device copies] in cuda_backend.cu): the worker does not
      // wait for the step the consumer queued, and the batch is ready when the stream reaches it.
      b.images = b.images.to(*o.device);
      b.labels = b.labels.to(*o.device);
    }
    b.epoch = epoch;
    b.index = k;
    b.rows = rows;
    s.batch = std::move(b);
  } catch (const std::exception& e) {
    s.error = e.what();
  } catch (...) {
    s.error = "unknown exception";
  }
  return s;
}

void DataLoader::Run::work(int worker) {
  for (;;) {
    int64_t k = 0;
    {
      std::unique_lock<std::mutex> lock(mu);
      work_cv.wait(lock, [&] { return stop || claimed >= num_batches || claimed < consumed + capacity; });
      if (stop || claimed >= num_batches) return;
      k = claimed++;
    }
    Slot s = make(k, worker);
    {
      std::lock_guard<std::mutex> lock(mu);
      s.ready = true;
      slots[slot_of(k)] = std::move(s);
    }
    ready_cv.notify_one();
  }
}

void DataLoader::Run::advance() {
  current = Batch{};  // drop the previous batch before waiting for the next one
  if (consumed >= num_batches) {
    done = true;
    return;
  }
  const int64_t k = consumed;
  Slot s;
  if (threads.empty()) {
    s = make(k, -1);
    ++consumed;
  } else {
    {
      std::unique_lock<std::mutex> lock(mu);
      ready_cv.wait(lock, [&] { return slots[slot_of(k)].ready; });
      s = std::exchange(slots[slot_of(k)], Slot{});
      ++consumed;
    }
    work_cv.notify_one();
  }
  if (s.error) {
    done = true;
    stop_workers();
    EF_ERROR("DataLoader: batch ", k, " of epoch ", epoch, " failed",
             s.worker >= 0 ? " on worker " + std::to_string(s.worker) : std::string(), ": ", *s.error);
  }
  current = std::move(s.batch);
  next_batch = k + 1;
}

void DataLoader::Run::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  work_cv.notify_all();
  for (std::thread& t : threads)
    if (t.joinable()) t.join();
}

// --- DataLoader --------------------------------------------------------------------------------------

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : pipeline_{std::move(dataset), options.transforms}, options_(std::move(options)) {
  EF_CHECK(pipeline_.dataset != nullptr, "DataLoader: no dataset given");
  EF_CHECK(options_.batch_size >= 1, "DataLoader: batch_size must be at least 1, got ", options_.batch_size);
  EF_CHECK(options_.num_workers >= 0, "DataLoader: num_workers must be non-negative, got ", options_.num_workers);
  EF_CHECK(options_.prefetch_per_worker >= 1, "DataLoader: prefetch_per_worker must be at least 1, got ",
           options_.prefetch_per_worker);
  EF_CHECK(!(options_.sampler && options_.shuffle),
           "DataLoader: give either a sampler or shuffle = true, not both (the sampler decides the order)");
  for (const auto& t : options_.transforms) {
    EF_CHECK(t != nullptr, "DataLoader: a transform is null");
  }
  if (options_.device) check_device(*options_.device);
  EF_CHECK(
      !options_.ray || options_.transforms.empty(),
      "DataLoader: with a Ray cluster making the batches, the transforms belong to its pipeline, not to the loader");
  EF_CHECK(!options_.ray || options_.num_workers >= 1,
           "DataLoader: with a Ray cluster making the batches, num_workers (the batches it makes at once) must be at "
           "least 1");
  if (options_.sampler) {
    sampler_ = options_.sampler;
  } else if (options_.shuffle) {
    sampler_ = std::make_shared<RandomSampler>(pipeline_.dataset->size(), options_.seed);
  } else {
    sampler_ = std::make_shared<SequentialSampler>(pipeline_.dataset->size());
  }
}

DataLoader::~DataLoader() = default;

DataLoader& DataLoader::epoch(int64_t e) {
  EF_CHECK(e >= 0, "DataLoader: epoch must be non-negative, got ", e);
  run_.reset();
  next_start_ = {.epoch = e, .batch = 0};
  return *this;
}

DataLoader& DataLoader::after(int64_t batches) {
  EF_CHECK(batches >= 0, "DataLoader::after: a negative number of batches, ", batches);
  const int64_t per_epoch = num_batches();
  EF_CHECK(per_epoch > 0, "DataLoader::after: the loader has no batches (", sampler_->size(), " examples, batch_size ",
           options_.batch_size, options_.drop_last ? ", drop_last" : "", ")");
  run_.reset();
  next_start_ = {.epoch = batches / per_epoch, .batch = batches % per_epoch};
  return *this;
}

LoaderPosition DataLoader::position() const {
  if (!run_) return next_start_;
  if (run_->next_batch >= run_->num_batches) return {.epoch = run_->epoch + 1, .batch = 0};
  return {.epoch = run_->epoch, .batch = run_->next_batch};
}

int64_t DataLoader::num_batches() const {
  return batch_count(sampler_->size(), options_);
}

DataLoader::Iterator DataLoader::begin() {
  run_.reset();
  run_ = std::make_unique<Run>(*this, next_start_);
  next_start_ = {.epoch = next_start_.epoch + 1, .batch = 0};
  run_->advance();
  return Iterator(run_.get());
}

Batch& DataLoader::Iterator::operator*() const {
  EF_CHECK(run_ != nullptr && !run_->done, "DataLoader: dereferencing an iterator that is past the end");
  return run_->current;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  EF_CHECK(run_ != nullptr && !run_->done, "DataLoader: advancing an iterator that is past the end");
  run_->advance();
  return *this;
}

bool DataLoader::Iterator::operator==(std::default_sentinel_t) const {
  return run_ == nullptr || run_->done;
}

}  // namespace evenflow::data
