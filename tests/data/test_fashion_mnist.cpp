// FashionMNIST: the real dataset where Debian's dataset-fashion-mnist is installed (sizes, first
// labels and pixels as the files hold them), a small uncompressed copy written here, the error for
// a missing directory, and a loader throughput measurement that runs only when asked
// (test_data --no-skip -tc='*throughput*').
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>

#include "evenflow/data/fashion_mnist.h"
#include "evenflow/data/loader.h"
#include "evenflow/engine/ops.h"
#include "tests/io/test_files.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::data;
using evenflow::testing::error_of;
using evenflow::testing::idx_bytes;
using evenflow::testing::TempDir;
using evenflow::testing::vals;
using evenflow::testing::write_bytes;

namespace {

bool have_dataset() {
  if (std::filesystem::exists(std::string(kFashionMnistRoot) + "/t10k-labels-idx1-ubyte.gz")) return true;
  EF_SKIP_TEST("FashionMNIST is not installed in " << kFashionMnistRoot << " (apt-get install dataset-fashion-mnist)");
  return false;
}

}  // namespace

TEST_CASE("FashionMNIST: the installed dataset") {
  if (!have_dataset()) return;
  const FashionMNIST test(Split::Test);
  CHECK(test.size() == 10000);
  CHECK(test.all().images.shape() == Shape{10000, 1, 28, 28});
  CHECK(test.all().images.dtype() == kFloat32);
  CHECK(test.all().labels.dtype() == kInt64);
  CHECK(test.all().labels.narrow(0, 0, 10).to_int_vector() == std::vector<int64_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
  CHECK(test.get(0).image.sum().item() == doctest::Approx(33456.0 / 255.0).epsilon(1e-6));
  CHECK(test.all().images.to_vector().size() == 7840000);

  const Batch train = load_fashion_mnist(Split::Train);
  CHECK(train.images.shape() == Shape{60000, 1, 28, 28});
  CHECK(train.labels.narrow(0, 0, 10).to_int_vector() == std::vector<int64_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  CHECK(train.images.select(0, 0).sum().item() == doctest::Approx(76247.0 / 255.0).epsilon(1e-6));
  const std::vector<double> first = vals(train.images.narrow(0, 0, 100));
  CHECK(*std::min_element(first.begin(), first.end()) == 0.0);
  CHECK(*std::max_element(first.begin(), first.end()) == 1.0);
  CHECK(std::string(FashionMNIST::class_names()[9]) == "Ankle boot");
}

TEST_CASE("FashionMNIST: uncompressed files in another directory, and their checks") {
  TempDir dir;
  std::string pixels(3 * 28 * 28, '\0');
  pixels[0] = '\xff';
  pixels[28 * 28 + 1] = '\x33';
  write_bytes(dir.file("t10k-images-idx3-ubyte"), idx_bytes(0x08, {3, 28, 28}, pixels));
  write_bytes(dir.file("t10k-labels-idx1-ubyte"), idx_bytes(0x08, {3}, std::string{'\x04', '\x00', '\x09'}));
  const FashionMNIST small(Split::Test, dir.path().string());
  CHECK(small.size() == 3);
  CHECK(small.get(0).image.shape() == Shape{1, 28, 28});
  CHECK(small.get(0).image.sum().item() == 1.0);
  CHECK(small.get(1).image.sum().item() == doctest::Approx(0x33 / 255.0));
  CHECK(small.get_batch({2, 0}).labels.to_int_vector() == std::vector<int64_t>{9, 4});

  write_bytes(dir.file("t10k-labels-idx1-ubyte"), idx_bytes(0x08, {2}, std::string{'\x04', '\x00'}));
  CHECK(error_of([&] { FashionMNIST(Split::Test, dir.path().string()); }).find("[2] labels for 3 images") !=
        std::string::npos);
  write_bytes(dir.file("t10k-labels-idx1-ubyte"), idx_bytes(0x08, {3}, std::string{'\x04', '\x00', '\x0a'}));
  CHECK(error_of([&] { FashionMNIST(Split::Test, dir.path().string()); }).find("label 2 is 10, expected 0 to 9") !=
        std::string::npos);
}

TEST_CASE("FashionMNIST: a missing directory says how to install the dataset") {
  const std::string e = error_of([] { FashionMNIST(Split::Train, "/nonexistent/fashion"); });
  INFO(e);
  CHECK(e.find("/nonexistent/fashion/train-images-idx3-ubyte.gz not found") != std::string::npos);
  CHECK(e.find("install it with: apt-get install dataset-fashion-mnist") != std::string::npos);
}

TEST_CASE("FashionMNIST: loader throughput, batches of 100 (run with --no-skip)" * doctest::skip()) {
  if (!have_dataset()) return;
  const auto train = std::make_shared<FashionMNIST>(Split::Train);
  const auto images_per_second = [](DataLoader& loader) {
    const auto start = std::chrono::steady_clock::now();
    int64_t images = 0;
    for (Batch& b : loader) images += b.images.size(0);
    return static_cast<double>(images) /
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::vector<std::shared_ptr<const Transform>> augment{
      std::make_shared<RandomCrop>(28, 2), std::make_shared<RandomHorizontalFlip>(),
      std::make_shared<Normalize>(std::vector<double>{0.286}, std::vector<double>{0.353})};
  for (int workers : {0, 2}) {
    DataLoader plain(train, {.batch_size = 100, .shuffle = true, .seed = 1, .num_workers = workers});
    for (int epoch = 0; epoch < 3; ++epoch)  // the first epoch also warms the allocator up
      MESSAGE("FashionMNIST train, batch 100, " << workers << " workers, epoch " << epoch << ": "
                                                << images_per_second(plain) << " images/s");
    DataLoader augmented(
        train, {.batch_size = 100, .shuffle = true, .seed = 1, .num_workers = workers, .transforms = augment});
    MESSAGE("  with RandomCrop(28, 2) + RandomHorizontalFlip + Normalize: " << images_per_second(augmented)
                                                                            << " images/s");
  }
}
