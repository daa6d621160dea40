// Batch transforms: exact results for Normalize and Pad, and for the random ones that every image
// is a crop (or mirror) of its input, that the choices follow each image's stream (SampleStreams)
// and not the batch around it, and that p = 0 / 1 and full-size crops are identities.
#include <doctest/doctest.h>

#include "evenflow/data/transforms.h"
#include "evenflow/engine/ops.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::data;
using evenflow::testing::error_of;
using evenflow::testing::vals;

namespace {

// [n, c, h, w] with distinct values: image i, channel k, pixel (y, x) holds i·1000 + k·100 + y·10 + x.
Tensor numbered(int64_t n, int64_t c, int64_t h, int64_t w) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) v.push_back(static_cast<double>(i * 1000 + k * 100 + y * 10 + x));
  return from_vector(v, {n, c, h, w});
}

Batch batch_of(const Tensor& images) {
  return {.images = images, .labels = zeros({images.size(0)}, {.dtype = kInt64})};
}

// The streams of images first, first + 1, ..., first + n - 1 in `epoch`, seed 3.
SampleStreams streams_of(int64_t n, uint64_t epoch = 0, int64_t first = 0) {
  std::vector<int64_t> indices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = first + i;
  return SampleStreams(3, epoch, indices);
}

}  // namespace

TEST_CASE("Normalize and Pad") {
  SampleStreams rng = streams_of(1);
  const Batch b = batch_of(numbered(1, 2, 1, 2));  // channel 0: 0, 1; channel 1: 100, 101
  CHECK(vals(Normalize({1, 100}, {2, 4})(b, rng).images) == std::vector<double>{-0.5, 0, 0, 0.25});
  CHECK(vals(Normalize({1}, {2})(b, rng).images) == std::vector<double>{-0.5, 0, 49.5, 50});
  CHECK(error_of([&] {
          Normalize({1, 2, 3}, {1, 1, 1})(b, rng);
        }).find("3 means for images with 2 channels") != std::string::npos);
  CHECK(error_of([] { Normalize({0}, {0}); }).find("must be positive") != std::string::npos);

  const Tensor padded = Pad(1, -1)(b, rng).images;
  CHECK(padded.shape() == Shape{1, 2, 3, 4});
  CHECK(vals(padded.select(1, 0)) == std::vector<double>{-1, -1, -1, -1, -1, 0, 1, -1, -1, -1, -1, -1});
  CHECK(error_of([&] {
          Pad(1)(batch_of(zeros({2, 3})), rng);
        }).find("expected float images [N, C, H, W]") != std::string::npos);
}

TEST_CASE("RandomCrop: each image is a window of its padded input, chosen by the image's stream") {
  const Tensor x = numbered(16, 2, 5, 6);
  const Batch b = batch_of(x);
  SampleStreams r1 = streams_of(16), r2 = streams_of(16), r3 = streams_of(16, 1);
  const Tensor c1 = RandomCrop(3)(b, r1).images;
  CHECK(c1.shape() == Shape{16, 2, 3, 3});
  CHECK(vals(c1) == vals(RandomCrop(3)(b, r2).images));
  CHECK(vals(c1) != vals(RandomCrop(3)(b, r3).images));  // another epoch
  for (int64_t i = 0; i < 16; ++i) {
    // The window's top-left value says where it was cut: i·1000 + y·10 + x.
    const double corner = c1.select(0, i).select(0, 0).select(0, 0).select(0, 0).item() - static_cast<double>(i) * 1000;
    const int64_t top = static_cast<int64_t>(corner) / 10, left = static_cast<int64_t>(corner) % 10;
    CHECK((top >= 0 && top <= 2 && left >= 0 && left <= 3));
    CHECK(vals(c1.select(0, i)) == vals(x.select(0, i).narrow(1, top, 3).narrow(2, left, 3)));
  }
  // Images 5..11 alone, with their own streams, are cut as in the whole batch.
  SampleStreams part = streams_of(7, 0, 5);
  CHECK(vals(RandomCrop(3)(batch_of(x.narrow(0, 5, 7)), part).images) == vals(c1.narrow(0, 5, 7)));
  SampleStreams r4 = streams_of(16);
  CHECK(vals(RandomCrop(5, 0)(batch_of(x.narrow(3, 0, 5)), r4).images) == vals(x.narrow(3, 0, 5)));
  // With padding the windows may take zeros from the border; the size is kept.
  const Tensor padded = RandomCrop(5, 2)(b, r4).images;
  CHECK(padded.shape() == Shape{16, 2, 5, 5});
  CHECK(error_of([&] { RandomCrop(7)(b, r4); }).find("a 7x7 crop does not fit images of 5x6") != std::string::npos);
  SampleStreams too_few = streams_of(15);
  CHECK(error_of([&] { RandomCrop(3)(b, too_few); }).find("16 images but random streams for 15") != std::string::npos);
}

TEST_CASE("RandomHorizontalFlip: mirrors the images their streams pick") {
  const Tensor x = numbered(32, 1, 2, 3);
  const Batch b = batch_of(x);
  SampleStreams none = streams_of(32), all = streams_of(32), half = streams_of(32), again = streams_of(32);
  CHECK(vals(RandomHorizontalFlip(0)(b, none).images) == vals(x));
  const Tensor mirrored = RandomHorizontalFlip(1)(b, all).images;
  CHECK(vals(mirrored.select(0, 1)) == std::vector<double>{1002, 1001, 1000, 1012, 1011, 1010});
  const Tensor h = RandomHorizontalFlip(0.5)(b, half).images;
  CHECK(vals(h) == vals(RandomHorizontalFlip(0.5)(b, again).images));
  int flipped = 0;
  for (int64_t i = 0; i < 32; ++i) {
    const bool same = vals(h.select(0, i)) == vals(x.select(0, i));
    const bool mirror = vals(h.select(0, i)) == vals(mirrored.select(0, i));
    CHECK(same != mirror);
    flipped += mirror ? 1 : 0;
  }
  CHECK((flipped > 4 && flipped < 28));
  SampleStreams part = streams_of(10, 0, 20);
  CHECK(vals(RandomHorizontalFlip(0.5)(batch_of(x.narrow(0, 20, 10)), part).images) == vals(h.narrow(0, 20, 10)));
  SampleStreams too_many = streams_of(33);
  CHECK(error_of([&] { RandomHorizontalFlip(0.5)(b, too_many); }).find("32 images but random streams for 33") !=
        std::string::npos);
  CHECK(error_of([] { RandomHorizontalFlip(1.5); }).find("p must be in [0, 1]") != std::string::npos);
}
