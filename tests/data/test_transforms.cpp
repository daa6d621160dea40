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

namespace {

// A batch whose images are their label maps as floats: label (i, y, x) = 1 + (y / 8 + x / 8 + i) % 5
// on [n, 1, h, w] images, so a transform that moves a map with its image keeps them equal.
Batch labelled(int64_t n, int64_t h, int64_t w) {
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) labels.push_back(1 + (y / 8 + x / 8 + i) % 5);
  const Tensor maps = from_int_vector(labels, {n, h, w});
  return {.images = reshape(maps.to(kFloat64), {n, 1, h, w}), .labels = maps};
}

std::vector<double> label_vals(const Batch& b) {
  return vals(reshape(b.labels.to(kFloat64), {b.labels.size(0), 1, b.labels.size(1), b.labels.size(2)}));
}

}  // namespace

TEST_CASE("RandomAffine: identity settings change nothing; images move by their own draws") {
  const Tensor x = numbered(6, 2, 7, 9);
  SampleStreams s1 = streams_of(6);
  const Batch same = RandomAffine(0, 0, 0)(batch_of(x), s1);
  CHECK(vals(same.images) == vals(x));
  // A 180-degree range at full scale moves every image, and each as in a batch of its own.
  SampleStreams s2 = streams_of(6), s3 = streams_of(2, 0, 3);
  const Tensor moved = RandomAffine(180, 0.2, 0.3)(batch_of(x), s2).images;
  CHECK(moved.shape() == x.shape());
  for (int64_t i = 0; i < 6; ++i) CHECK(vals(moved.select(0, i)) != vals(x.select(0, i)));
  CHECK(vals(RandomAffine(180, 0.2, 0.3)(batch_of(x.narrow(0, 3, 2)), s3).images) == vals(moved.narrow(0, 3, 2)));
  CHECK(error_of([] { RandomAffine(190); }).find("degrees in [0, 180]") != std::string::npos);
  CHECK(error_of([] { RandomAffine(10, 0, 1); }).find("scale in [0, 1)") != std::string::npos);
}

TEST_CASE("geometric transforms move a label map with its image (Note [Label maps])") {
  const Batch b = labelled(8, 24, 32);
  SampleStreams s1 = streams_of(8), s2 = streams_of(8), s3 = streams_of(8);
  // Crop (the padding is label 0 in both) and flip: the images stay their label maps exactly.
  const Batch cropped = RandomCrop(20, 3, 0)(b, s1);
  CHECK(cropped.labels.shape() == Shape{8, 20, 20});
  CHECK(vals(cropped.images) == label_vals(cropped));
  const Batch padded = Pad(2, 0.0, 0)(b, s2);
  CHECK(padded.labels.shape() == Shape{8, 28, 36});
  CHECK(vals(padded.images) == label_vals(padded));
  const Batch flipped = RandomHorizontalFlip(0.5)(b, s2);
  CHECK(vals(flipped.images) == label_vals(flipped));
  CHECK(vals(flipped.images) != vals(b.images));
  // Rotation and scaling: bilinear images against nearest-pixel labels agree wherever the four
  // pixels an image value blends carry one label, so on most pixels; filled positions take -1.
  const Batch turned = RandomAffine(30, 0.1, 0.2, -1)(b, s3);
  const std::vector<double> image = vals(turned.images), label = label_vals(turned);
  int64_t agree = 0, filled = 0, moved = 0;
  const std::vector<double> before = vals(b.images);
  for (size_t i = 0; i < image.size(); ++i) {
    if (label[i] == -1) {
      ++filled;
      continue;
    }
    agree += std::abs(image[i] - label[i]) < 1e-9 ? 1 : 0;
    moved += label[i] != before[i] ? 1 : 0;
  }
  const auto total = static_cast<int64_t>(image.size());
  MESSAGE("rotated: " << agree << " of " << total - filled << " labelled pixels agree, " << moved << " moved");
  CHECK(agree > (total - filled) * 7 / 10);  // 78% here; labels that stayed put: 40%
  CHECK(moved > total / 10);
  CHECK(filled > 0);
  // Class labels [N] pass through; labels of another shape are refused.
  SampleStreams s4 = streams_of(8);
  Batch bad = b;
  bad.labels = b.labels.narrow(2, 0, 31);
  CHECK(error_of([&] { RandomCrop(10)(bad, s4); }).find("neither class labels [N] nor int64 label maps") !=
        std::string::npos);
}
