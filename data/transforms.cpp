// The batch transforms, written with engine ops on the batch's device. Random choices are drawn
// per image from the image's own stream (one draw, or two for a crop), so they depend only on the
// image's SampleStreams entry, never on the batch around it.
#include "evenflow/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "evenflow/engine/autograd.h"
#include "evenflow/engine/ops.h"

namespace evenflow::data {

namespace {

void check_images(const char* transform, const Tensor& images) {
  EF_CHECK(images.defined() && images.dim() == 4 && is_floating(images.dtype()), transform,
           ": expected float images [N, C, H, W], got ",
           images.defined() ? images.str() : std::string("an undefined tensor"));
}

void check_streams(const char* transform, const Tensor& images, const SampleStreams& streams) {
  EF_CHECK(streams.size() == images.size(0), transform, ": ", images.size(0), " images but random streams for ",
           streams.size());
}

// Whether the batch's labels are label maps that move with the images (Note [Label maps]).
bool has_label_maps(const char* transform, const Batch& b) {
  if (!b.labels.defined() || b.labels.dim() == 1) return false;
  EF_CHECK(b.labels.dim() == 3 && b.labels.dtype() == kInt64 && b.labels.size(0) == b.images.size(0) &&
               b.labels.size(1) == b.images.size(2) && b.labels.size(2) == b.images.size(3),
           transform, ": labels ", b.labels.str(), " are neither class labels [N] nor int64 label maps [N, H, W] of ",
           "the images ", b.images.str());
  return true;
}

// Label maps [n, out_h, out_w] on the labels' device: position (i, y, x) takes the label at
// source(i, y, x) = {row, column} of map i, or `fill` where that is outside the map.
template <typename Source>
Tensor remap_labels(const Tensor& labels, int64_t out_h, int64_t out_w, int64_t fill, Source source) {
  const int64_t n = labels.size(0), h = labels.size(1), w = labels.size(2);
  const std::vector<int64_t> in = labels.to_int_vector();
  std::vector<int64_t> out(static_cast<size_t>(n * out_h * out_w), fill);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t y = 0; y < out_h; ++y) {
      for (int64_t x = 0; x < out_w; ++x) {
        const auto [sy, sx] = source(i, y, x);
        if (sy >= 0 && sy < h && sx >= 0 && sx < w)
          out[static_cast<size_t>((i * out_h + y) * out_w + x)] = in[static_cast<size_t>((i * h + sy) * w + sx)];
      }
    }
  }
  return from_int_vector(out, {n, out_h, out_w}, labels.device());
}

Tensor pad_hw(const Tensor& images, int64_t padding, double value) {
  return padding == 0 ? images : pad(images, {padding, padding, padding, padding}, value);
}

}  // namespace

Normalize::Normalize(std::vector<double> mean, std::vector<double> std) : mean_(std::move(mean)), std_(std::move(std)) {
  EF_CHECK(!mean_.empty() && mean_.size() == std_.size(), "Normalize: ", mean_.size(), " means and ", std_.size(),
           " standard deviations (expected the same number, at least one)");
  for (double s : std_) EF_CHECK(s > 0, "Normalize: standard deviations must be positive, got ", s);
}

Batch Normalize::operator()(Batch batch, SampleStreams& /*streams*/) const {
  check_images("Normalize", batch.images);
  const int64_t channels = batch.images.size(1);
  const int64_t n = static_cast<int64_t>(mean_.size());
  EF_CHECK(n == 1 || n == channels, "Normalize: ", n, " means for images with ", channels, " channels");
  const TensorOptions opts{.dtype = batch.images.dtype(), .device = batch.images.device()};
  NoGradGuard no_grad;
  batch.images = (batch.images - from_vector(mean_, {1, n, 1, 1}, opts)) / from_vector(std_, {1, n, 1, 1}, opts);
  return batch;
}

Pad::Pad(int64_t padding, double value, int64_t label_fill)
    : padding_(padding), value_(value), label_fill_(label_fill) {
  EF_CHECK(padding >= 0, "Pad: padding must be non-negative, got ", padding);
}

Batch Pad::operator()(Batch batch, SampleStreams& /*streams*/) const {
  check_images("Pad", batch.images);
  const bool maps = has_label_maps("Pad", batch);
  NoGradGuard no_grad;
  batch.images = pad_hw(batch.images, padding_, value_);
  if (maps) {
    batch.labels = remap_labels(batch.labels, batch.images.size(2), batch.images.size(3), label_fill_,
                                [this](int64_t, int64_t y, int64_t x) {
                                  return std::pair<int64_t, int64_t>{y - padding_, x - padding_};
                                });
  }
  return batch;
}

RandomCrop::RandomCrop(int64_t size, int64_t padding, int64_t label_fill)
    : size_(size), padding_(padding), label_fill_(label_fill) {
  EF_CHECK(size > 0 && padding >= 0, "RandomCrop: size must be positive and padding non-negative, got size ", size,
           ", padding ", padding);
}

Batch RandomCrop::operator()(Batch batch, SampleStreams& streams) const {
  check_images("RandomCrop", batch.images);
  check_streams("RandomCrop", batch.images, streams);
  const bool maps = has_label_maps("RandomCrop", batch);
  NoGradGuard no_grad;
  const Tensor padded = pad_hw(batch.images, padding_, 0.0);
  const int64_t h = padded.size(2), w = padded.size(3);
  EF_CHECK(size_ <= h && size_ <= w, "RandomCrop: a ", size_, "x", size_, " crop does not fit images of ", h, "x", w,
           " (after padding by ", padding_, ")");
  std::vector<Tensor> crops;
  std::vector<std::pair<int64_t, int64_t>> corners;  // top, left in the padded image
  crops.reserve(static_cast<size_t>(padded.size(0)));
  for (int64_t i = 0; i < padded.size(0); ++i) {
    RandomStream& rng = streams[i];
    const int64_t top = rng.below(h - size_ + 1), left = rng.below(w - size_ + 1);
    crops.push_back(padded.select(0, i).narrow(1, top, size_).narrow(2, left, size_));
    corners.emplace_back(top, left);
  }
  if (!crops.empty()) batch.images = stack(crops, 0);
  if (maps) {
    batch.labels = remap_labels(batch.labels, size_, size_, label_fill_, [&](int64_t i, int64_t y, int64_t x) {
      const auto [top, left] = corners[static_cast<size_t>(i)];
      return std::pair<int64_t, int64_t>{y + top - padding_, x + left - padding_};
    });
  }
  return batch;
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  EF_CHECK(p >= 0 && p <= 1, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

Batch RandomHorizontalFlip::operator()(Batch batch, SampleStreams& streams) const {
  check_images("RandomHorizontalFlip", batch.images);
  check_streams("RandomHorizontalFlip", batch.images, streams);
  const bool maps = has_label_maps("RandomHorizontalFlip", batch);
  const Tensor& x = batch.images;
  std::vector<double> flip(static_cast<size_t>(x.size(0)));
  for (size_t i = 0; i < flip.size(); ++i) flip[i] = streams[static_cast<int64_t>(i)].uniform() < p_ ? 1.0 : 0.0;
  if (std::find(flip.begin(), flip.end(), 1.0) == flip.end()) return batch;
  NoGradGuard no_grad;
  const int64_t w = x.size(3);
  std::vector<int64_t> reversed(static_cast<size_t>(w));
  for (int64_t j = 0; j < w; ++j) reversed[static_cast<size_t>(j)] = w - 1 - j;
  const Tensor mirrored = index_select(x, 3, from_int_vector(reversed, {w}, x.device()));
  const Tensor mask = from_vector(flip, {x.size(0), 1, 1, 1}, {.dtype = x.dtype(), .device = x.device()});
  batch.images = where(mask, mirrored, x);
  if (maps) {
    batch.labels = remap_labels(batch.labels, x.size(2), w, 0, [&](int64_t i, int64_t y, int64_t col) {
      return std::pair<int64_t, int64_t>{y, flip[static_cast<size_t>(i)] != 0 ? w - 1 - col : col};
    });
  }
  return batch;
}

RandomAffine::RandomAffine(double degrees, double translate, double scale, int64_t label_fill)
    : degrees_(degrees), translate_(translate), scale_(scale), label_fill_(label_fill) {
  EF_CHECK(degrees >= 0 && degrees <= 180 && translate >= 0 && translate <= 1 && scale >= 0 && scale < 1,
           "RandomAffine: expected degrees in [0, 180], translate in [0, 1] and scale in [0, 1), got degrees ", degrees,
           ", translate ", translate, ", scale ", scale);
}

// Each image draws four numbers in order (angle, scale, vertical and horizontal shift), also those
// its settings leave unused, so that the transforms after it draw the same whatever the settings.
// Output pixel p comes from input position q = R(-angle) (p - c - t) / s + c about the centre c;
// the arithmetic is in double, so the images are the same bits on every machine with the same libm.
Batch RandomAffine::operator()(Batch batch, SampleStreams& streams) const {
  check_images("RandomAffine", batch.images);
  check_streams("RandomAffine", batch.images, streams);
  const bool maps = has_label_maps("RandomAffine", batch);
  const Tensor& x = batch.images;
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  // Each image's draw, as the terms of its inverse map.
  struct Inverse {
    double cos_s, sin_s, ty, tx;  // cos(angle) / s, sin(angle) / s, the shift
  };
  std::vector<Inverse> inverse(static_cast<size_t>(n));
  const auto symmetric = [](RandomStream& rng, double limit) { return (2 * rng.uniform() - 1) * limit; };
  for (int64_t i = 0; i < n; ++i) {
    RandomStream& rng = streams[i];
    const double angle = symmetric(rng, degrees_) * std::numbers::pi / 180;
    const double s = 1 + symmetric(rng, scale_);
    const double ty = symmetric(rng, translate_) * static_cast<double>(h);
    const double tx = symmetric(rng, translate_) * static_cast<double>(w);
    inverse[static_cast<size_t>(i)] = {std::cos(angle) / s, std::sin(angle) / s, ty, tx};
  }
  // The input position {row, column} output pixel (y, col) of image i comes from.
  const double cy = static_cast<double>(h - 1) / 2, cx = static_cast<double>(w - 1) / 2;
  const auto source = [&](int64_t i, int64_t y, int64_t col) {
    const Inverse& m = inverse[static_cast<size_t>(i)];
    const double dy = static_cast<double>(y) - cy - m.ty, dx = static_cast<double>(col) - cx - m.tx;
    return std::pair<double, double>{-m.sin_s * dx + m.cos_s * dy + cy, m.cos_s * dx + m.sin_s * dy + cx};
  };
  const std::vector<double> in = x.to_vector();
  std::vector<double> out(in.size(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t col = 0; col < w; ++col) {
        const auto [sy, sx] = source(i, y, col);
        const double fy = std::floor(sy), fx = std::floor(sx);
        const double ay = sy - fy, ax = sx - fx;
        const auto y0 = static_cast<int64_t>(fy), x0 = static_cast<int64_t>(fx);
        for (int64_t k = 0; k < c; ++k) {
          const size_t plane = static_cast<size_t>((i * c + k) * h * w);
          double v = 0;
          for (int64_t oy = 0; oy < 2; ++oy) {
            for (int64_t ox = 0; ox < 2; ++ox) {
              const int64_t py = y0 + oy, px = x0 + ox;
              if (py < 0 || py >= h || px < 0 || px >= w) continue;  // zeros outside
              const double weight = (oy != 0 ? ay : 1 - ay) * (ox != 0 ? ax : 1 - ax);
              if (weight != 0) v += weight * in[plane + static_cast<size_t>(py * w + px)];
            }
          }
          out[plane + static_cast<size_t>(y * w + col)] = v;
        }
      }
    }
  }
  batch.images = from_vector(out, x.shape(), {.dtype = x.dtype(), .device = x.device()});
  if (maps) {
    batch.labels = remap_labels(batch.labels, h, w, label_fill_, [&](int64_t i, int64_t y, int64_t col) {
      const auto [sy, sx] = source(i, y, col);
      // Far outside, a position may not fit int64_t: any value past the map's edge is as good.
      const auto nearest = [](double v, int64_t size) {
        return v > -1 && v < static_cast<double>(size) ? static_cast<int64_t>(std::lround(v)) : int64_t{-1};
      };
      return std::pair<int64_t, int64_t>{nearest(sy, h), nearest(sx, w)};
    });
  }
  return batch;
}

}  // namespace evenflow::data
