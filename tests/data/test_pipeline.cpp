// make_batch is what the DataLoader makes; encode_batch / decode_batch carry a batch between
// processes bit for bit and refuse what is not one (truncated, damaged, a text in its place); and
// RayBatches refuses, naming what is wrong, a missing driver or address, or a driver that ends or
// never says it is ready, within its timeout. (The Ray cluster itself: tests/data/test_ray.cpp.)
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "evenflow/data/loader.h"
#include "evenflow/data/pipeline.h"
#include "evenflow/data/ray_batches.h"
#include "evenflow/engine/ops.h"
#include "tests/io/test_files.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::data;
using evenflow::testing::error_of;
using evenflow::testing::TempDir;

namespace {

// 40 images [1, 6, 6] of distinct values, labels 0..39.
Pipeline flipped_pipeline() {
  std::vector<double> pixels(40 * 36);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<double>(i) * 0.25;
  std::vector<int64_t> labels(40);
  for (int64_t i = 0; i < 40; ++i) labels[static_cast<size_t>(i)] = i;
  Batch all{.images = from_vector(pixels, {40, 1, 6, 6}, {.dtype = kFloat32}), .labels = from_int_vector(labels, {40})};
  return Pipeline{std::make_shared<TensorDataset>(all),
                  {std::make_shared<RandomCrop>(6, 1), std::make_shared<RandomHorizontalFlip>()}};
}

std::string executable(const TempDir& dir, const std::string& name, const std::string& script) {
  const std::string path = dir.file(name);
  std::ofstream(path) << "#!/bin/sh\n" << script << "\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

}  // namespace

TEST_CASE("pipeline: make_batch is the DataLoader's batch, and encoded batches decode to the same bits") {
  const Pipeline p = flipped_pipeline();
  DataLoader loader(p.dataset, {.batch_size = 7, .shuffle = true, .seed = 5, .transforms = p.transforms});
  const std::vector<int64_t> order = RandomSampler(40, 5).indices(2);
  loader.epoch(2);
  int64_t k = 0;
  for (Batch& b : loader) {
    const auto first = order.begin() + k * 7;
    const std::vector<int64_t> indices(first, first + std::min<int64_t>(7, 40 - k * 7));
    const Batch made = make_batch(p, indices, 5, 2);
    CHECK(made.images.to_vector() == b.images.to_vector());
    CHECK(made.labels.to_int_vector() == b.labels.to_int_vector());
    const Batch back = decode_batch(encode_batch(made), "batch");
    CHECK(back.images.dtype() == kFloat32);
    CHECK(back.images.shape() == made.images.shape());
    CHECK(back.images.to_vector() == made.images.to_vector());
    CHECK(back.labels.dtype() == kInt64);
    CHECK(back.labels.to_int_vector() == made.labels.to_int_vector());
    ++k;
  }
  CHECK(k == 6);
}

TEST_CASE("pipeline: decode_batch refuses damaged, truncated and foreign bytes, naming the batch") {
  const std::string bytes = encode_batch(make_batch(flipped_pipeline(), {3, 1, 4}, 1, 0));
  std::string damaged = bytes;
  damaged[damaged.size() / 2] ^= 1;
  CHECK(error_of([&] { decode_batch(damaged, "batch 9"); }).find("batch 9: the batch's checksum does not match") !=
        std::string::npos);
  CHECK(error_of([&] { decode_batch(bytes.substr(0, 20), "batch 9"); }).find("batch 9") != std::string::npos);
  CHECK(error_of([&] { decode_batch("", "batch 9"); }).find("not an encoded batch") != std::string::npos);
  // Ray hands some failures over as the result itself: the message shows it.
  CHECK(error_of([&] {
          decode_batch("The raylet died unexpectedly", "batch 9");
        }).find("\"The raylet died unexpectedly\"") != std::string::npos);
  // Or as a message in binary framing (msgpack): the text in it.
  CHECK(error_of([&] {
          decode_batch(std::string("\x92\x01\xda\x00\x1aWorker exited unexpectedly\x00\xc3", 33), "batch 9");
        }).find("\"Worker exited unexpectedly\"") != std::string::npos);
  CHECK(error_of([&] { encode_batch(Batch{}); }).find("undefined") != std::string::npos);
}

TEST_CASE("pipeline: RayBatches names a missing driver or address, and a driver that fails or hangs") {
  TempDir dir;
  CHECK(error_of([&] {
          RayBatches({.address = "10.0.0.1:6379", .pipeline = "x", .driver = dir.file("nowhere")});
        }).find(dir.file("nowhere") + " is missing") != std::string::npos);
  const std::string quits = executable(dir, "quits", "echo 'cannot load libef_ray_tasks.so' >&2; exit 127");
  CHECK(error_of([&] {
          RayBatches({.address = "6379", .pipeline = "x", .driver = quits});
        }).find("'6379' is not an address ip:port") != std::string::npos);
  const std::string message =
      error_of([&] { RayBatches({.address = "10.0.0.1:6379", .pipeline = "x", .driver = quits}); });
  CHECK(message.find("10.0.0.1:6379") != std::string::npos);
  CHECK(message.find("exit status 127") != std::string::npos);
  CHECK(message.find("cannot load libef_ray_tasks.so") != std::string::npos);
  // A driver that never answers: refused after connect_timeout_s, not waited on forever.
  const std::string hangs = executable(dir, "hangs", "exec sleep 600");
  const auto start = std::chrono::steady_clock::now();
  const std::string timeout = error_of(
      [&] { RayBatches({.address = "10.0.0.1:6379", .pipeline = "x", .driver = hangs, .connect_timeout_s = 0.5}); });
  CHECK(timeout.find("no Ray cluster answered at 10.0.0.1:6379 within 0.5 s") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

// --ray auto and --ray 127.0.0.1:PORT (Note: Ray's C++ client must dial the address the node
// registered under, which `ray start --head` writes to /tmp/ray/ray_current_cluster).
TEST_CASE("pipeline: a Ray address from RAY_ADDRESS, the cluster file, or the local node's for 127.0.0.1") {
  TempDir dir;
  const std::string cluster = dir.file("ray_current_cluster");
  const char* saved = std::getenv("RAY_ADDRESS");
  const std::string saved_value = saved ? saved : "";
  ::unsetenv("RAY_ADDRESS");
  // Nothing to go on: an error saying what to do.
  CHECK(error_of([&] { resolve_ray_address("auto", cluster); }).find("ray start --head") != std::string::npos);
  CHECK(error_of([&] { resolve_ray_address("", cluster); }).find("RAY_ADDRESS is not set") != std::string::npos);
  std::ofstream(cluster) << "10.1.2.3:6379\n";
  CHECK(resolve_ray_address("auto", cluster) == "10.1.2.3:6379");
  // The local node by its loopback name: the registered address when the port is the cluster's.
  CHECK(resolve_ray_address("127.0.0.1:6379", cluster) == "10.1.2.3:6379");
  CHECK(resolve_ray_address("localhost:6379", cluster) == "10.1.2.3:6379");
  CHECK(resolve_ray_address("127.0.0.1:6380", cluster) == "127.0.0.1:6380");
  CHECK(resolve_ray_address("10.9.9.9:6379", cluster) == "10.9.9.9:6379");
  ::setenv("RAY_ADDRESS", "10.4.5.6:7000", 1);
  CHECK(resolve_ray_address("auto", cluster) == "10.4.5.6:7000");
  ::setenv("RAY_ADDRESS", "ray://10.4.5.6:10001", 1);
  CHECK(error_of([&] { resolve_ray_address("auto", cluster); }).find("Ray Client address") != std::string::npos);
  CHECK(error_of([&] { resolve_ray_address("10.1.2.3", cluster); }).find("not an address ip:port") !=
        std::string::npos);
  CHECK(error_of([&] { resolve_ray_address("10.1.2.3:63a9", cluster); }).find("not an address ip:port") !=
        std::string::npos);
  if (saved) {
    ::setenv("RAY_ADDRESS", saved_value.c_str(), 1);
  } else {
    ::unsetenv("RAY_ADDRESS");
  }
}
