// Batch transforms: exact results for Normalize and Pad, and for the random ones that every image
// is a crop (or mirror) of its input, that the choices follow each image's stream (SampleStreams)
// and not the batch around it, and that p = 0 / 1 and full-size crops are identities; RandomAffine's
// map against an analytic reference (a similarity about the centre within the drawn ranges), and
// its label maps at the nearest source pixel.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>

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

// The map RandomAffine applied to image i, read back from images whose channels are their own row
// and column (bilinear sampling reproduces a linear function exactly where all four pixels it
// blends are inside) and a channel of ones (1 exactly there): each output pixel's source position.
struct SourceMap {
  std::vector<std::array<double, 4>> points;  // (y, x, source row, source column), interior pixels
};

// Least squares for v ≈ a0 + a1·y + a2·x over the points, v = source row (k = 2) or column (k = 3).
std::array<double, 3> fit_plane(const SourceMap& m, int k) {
  double ata[3][3] = {}, atb[3] = {};
  for (const auto& p : m.points) {
    const double row[3] = {1, p[0], p[1]};
    for (int r = 0; r < 3; ++r) {
      atb[r] += row[r] * p[k];
      for (int c = 0; c < 3; ++c) ata[r][c] += row[r] * row[c];
    }
  }
  // Cramer's rule on the 3x3 normal equations.
  const auto det = [](const double m3[3][3]) {
    return m3[0][0] * (m3[1][1] * m3[2][2] - m3[1][2] * m3[2][1]) -
           m3[0][1] * (m3[1][0] * m3[2][2] - m3[1][2] * m3[2][0]) +
           m3[0][2] * (m3[1][0] * m3[2][1] - m3[1][1] * m3[2][0]);
  };
  const double d = det(ata);
  std::array<double, 3> out{};
  for (int col = 0; col < 3; ++col) {
    double m3[3][3];
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c) m3[r][c] = c == col ? atb[r] : ata[r][c];
    out[static_cast<size_t>(col)] = det(m3) / d;
  }
  return out;
}

TEST_CASE("RandomAffine: each image's map is a rotation, scaling and shift about its centre within the ranges") {
  // An analytic point map, independent of how the transform computes it: channels y, x and 1.
  const int64_t n = 24, h = 21, w = 25;
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
          v.push_back(k == 0 ? static_cast<double>(y) : k == 1 ? static_cast<double>(x) : 1.0);
  std::vector<int64_t> ids;  // label map: each pixel's own number y·w + x
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < h * w; ++p) ids.push_back(p);
  const Batch b{.images = from_vector(v, {n, 3, h, w}, {.dtype = kFloat64}), .labels = from_int_vector(ids, {n, h, w})};
  const double degrees = 40, translate = 0.1, scale = 0.25;
  SampleStreams streams = streams_of(n);
  const Batch out = RandomAffine(degrees, translate, scale, -1)(b, streams);
  const std::vector<double> image = vals(out.images);
  const std::vector<int64_t> label = out.labels.to_int_vector();
  const double cy = (h - 1) / 2.0, cx = (w - 1) / 2.0;
  std::vector<double> angles;
  for (int64_t i = 0; i < n; ++i) {
    CAPTURE(i);
    const auto at = [&](int64_t k, int64_t y, int64_t x) {
      return image[static_cast<size_t>(((i * 3 + k) * h + y) * w + x)];
    };
    SourceMap m;
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        if (std::abs(at(2, y, x) - 1) < 1e-12) m.points.push_back({double(y), double(x), at(0, y, x), at(1, y, x)});
    REQUIRE(m.points.size() > static_cast<size_t>(h * w / 3));
    // The source position is an affine function of the output position, on every interior pixel.
    const auto row = fit_plane(m, 2), col = fit_plane(m, 3);
    for (const auto& p : m.points) {
      CHECK(std::abs(row[0] + row[1] * p[0] + row[2] * p[1] - p[2]) < 1e-9);
      CHECK(std::abs(col[0] + col[1] * p[0] + col[2] * p[1] - p[3]) < 1e-9);
    }
    // Its linear part is (1/s)·R(-θ): a rotation and a uniform scale, no shear, no mirror.
    CHECK(row[1] == doctest::Approx(col[2]).epsilon(1e-9));
    CHECK(row[2] == doctest::Approx(-col[1]).epsilon(1e-9));
    const double inverse_scale = std::hypot(row[1], col[1]);
    const double s = 1 / inverse_scale, theta = std::atan2(col[1], row[1]) * 180 / std::numbers::pi;
    CHECK(s >= 1 - scale - 1e-12);
    CHECK(s <= 1 + scale + 1e-12);
    CHECK(std::abs(theta) <= degrees + 1e-9);
    angles.push_back(theta);
    // The output point the centre goes to is the centre shifted by at most translate x the size.
    // Solve row(p) = cy, col(p) = cx for p = (py, px).
    const double det = row[1] * col[2] - row[2] * col[1];
    const double py = ((cy - row[0]) * col[2] - row[2] * (cx - col[0])) / det;
    const double px = (row[1] * (cx - col[0]) - (cy - row[0]) * col[1]) / det;
    CHECK(std::abs(py - cy) <= translate * h + 1e-9);
    CHECK(std::abs(px - cx) <= translate * w + 1e-9);
    // Labels: the nearest source pixel's number, or the fill where the source is off the map.
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) {
        const double sy = row[0] + row[1] * y + row[2] * x, sx = col[0] + col[1] * y + col[2] * x;
        const double ry = std::round(sy), rx = std::round(sx);
        // Halfway cases could round either way after rounding errors in the transform: skip them.
        if (std::abs(std::abs(sy - std::floor(sy)) - 0.5) < 1e-9 ||
            std::abs(std::abs(sx - std::floor(sx)) - 0.5) < 1e-9)
          continue;
        const bool inside = ry >= 0 && ry < h && rx >= 0 && rx < w;
        CHECK(label[static_cast<size_t>((i * h + y) * w + x)] == (inside ? int64_t(ry) * w + int64_t(rx) : -1));
      }
    }
  }
  // The draws spread over the range: not all small, not all alike.
  const auto [lo, hi] = std::minmax_element(angles.begin(), angles.end());
  CHECK(*hi - *lo > degrees / 2);
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
