// The batch transforms, written with engine ops on the batch's device. Random choices are drawn
// per image from the image's own stream (one draw, or two for a crop), so they depend only on the
// image's SampleStreams entry, never on the batch around it.
#include "evenflow/data/transforms.h"

#include <algorithm>

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

Pad::Pad(int64_t padding, double value) : padding_(padding), value_(value) {
  EF_CHECK(padding >= 0, "Pad: padding must be non-negative, got ", padding);
}

Batch Pad::operator()(Batch batch, SampleStreams& /*streams*/) const {
  check_images("Pad", batch.images);
  NoGradGuard no_grad;
  batch.images = pad_hw(batch.images, padding_, value_);
  return batch;
}

RandomCrop::RandomCrop(int64_t size, int64_t padding) : size_(size), padding_(padding) {
  EF_CHECK(size > 0 && padding >= 0, "RandomCrop: size must be positive and padding non-negative, got size ", size,
           ", padding ", padding);
}

Batch RandomCrop::operator()(Batch batch, SampleStreams& streams) const {
  check_images("RandomCrop", batch.images);
  check_streams("RandomCrop", batch.images, streams);
  NoGradGuard no_grad;
  const Tensor padded = pad_hw(batch.images, padding_, 0.0);
  const int64_t h = padded.size(2), w = padded.size(3);
  EF_CHECK(size_ <= h && size_ <= w, "RandomCrop: a ", size_, "x", size_, " crop does not fit images of ", h, "x", w,
           " (after padding by ", padding_, ")");
  std::vector<Tensor> crops;
  crops.reserve(static_cast<size_t>(padded.size(0)));
  for (int64_t i = 0; i < padded.size(0); ++i) {
    RandomStream& rng = streams[i];
    const int64_t top = rng.below(h - size_ + 1), left = rng.below(w - size_ + 1);
    crops.push_back(padded.select(0, i).narrow(1, top, size_).narrow(2, left, size_));
  }
  if (!crops.empty()) batch.images = stack(crops, 0);
  return batch;
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  EF_CHECK(p >= 0 && p <= 1, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

Batch RandomHorizontalFlip::operator()(Batch batch, SampleStreams& streams) const {
  check_images("RandomHorizontalFlip", batch.images);
  check_streams("RandomHorizontalFlip", batch.images, streams);
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
  return batch;
}

}  // namespace evenflow::data
