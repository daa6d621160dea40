#include "apps/common/wgan_resnet.h"

#include "evenflow/parallel/sync_batch_norm.h"

namespace evenflow::apps {

namespace {

void check_resample_input(const char* op, const Tensor& x) {
  EF_CHECK(x.defined() && x.dim() == 4, op, ": input must be 4-D [N, C, H, W], got ",
           x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
}

std::shared_ptr<nn::Conv2d> conv(int64_t in, int64_t out, int64_t kernel, const nn::ModuleOptions& o,
                                 bool channels_last) {
  return std::make_shared<nn::Conv2d>(in, out, kernel,
                                      nn::Conv2dConfig{.padding = kernel / 2, .channels_last = channels_last}, o);
}

const char* resample_name(Resample r) {
  switch (r) {
    case Resample::Down:
      return "down";
    case Resample::Up:
      return "up";
    case Resample::None:
      break;
  }
  return "none";
}

}  // namespace

Tensor mean_pool2x2(const Tensor& x) {
  check_resample_input("mean_pool2x2", x);
  EF_CHECK(x.size(2) % 2 == 0 && x.size(3) % 2 == 0, "mean_pool2x2: H and W must be even, got ", shape_str(x.shape()));
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2) / 2, w = x.size(3) / 2;
  if (x.is_channels_last() && !x.is_contiguous()) {
    // [N, H, W, C] in memory: split H and W into (H/2, 2) and (W/2, 2), views of that memory.
    const Tensor windows = reshape(permute(x, {0, 2, 3, 1}), {n, h, 2, w, 2, c});
    return permute(mean(windows, {2, 4}), {0, 3, 1, 2});
  }
  return mean(reshape(x, {n, c, h, 2, w, 2}), {3, 5});
}

Tensor upsample_nearest2x(const Tensor& x) {
  check_resample_input("upsample_nearest2x", x);
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  if (x.is_channels_last() && !x.is_contiguous()) {
    const Tensor pixels = reshape(permute(x, {0, 2, 3, 1}), {n, h, 1, w, 1, c});
    const Tensor squares = reshape(expand(pixels, {n, h, 2, w, 2, c}), {n, 2 * h, 2 * w, c});
    return permute(squares, {0, 3, 1, 2});
  }
  return reshape(expand(reshape(x, {n, c, h, 1, w, 1}), {n, c, h, 2, w, 2}), {n, c, 2 * h, 2 * w});
}

WganResidualBlock::WganResidualBlock(int64_t in_channels, int64_t out_channels, Resample resample, bool batch_norm,
                                     const nn::ModuleOptions& o, bool channels_last)
    : in_(in_channels), out_(out_channels), resample_(resample), batch_norm_(batch_norm) {
  EF_CHECK(in_channels > 0 && out_channels > 0, "ResidualBlock: channel counts must be positive, got ", in_channels,
           " and ", out_channels);
  auto norm = [&](int64_t channels) {
    return std::make_shared<parallel::SyncBatchNorm>(channels, nn::BatchNormConfig{}, o);
  };
  // Down keeps the input's channels through conv1 and changes them in conv2; Up and None in conv1.
  const int64_t middle = resample == Resample::Down ? in_channels : out_channels;
  if (batch_norm) register_module("bn1", norm(in_channels));
  register_module("conv1", conv(in_channels, middle, 3, o, channels_last));
  if (batch_norm) register_module("bn2", norm(middle));
  register_module("conv2", conv(middle, out_channels, 3, o, channels_last));
  if (resample != Resample::None || in_channels != out_channels) {
    register_module("shortcut", conv(in_channels, out_channels, 1, o, channels_last));
  }
}

std::string WganResidualBlock::extra_repr() const {
  return std::to_string(in_) + ", " + std::to_string(out_) + ", resample=" + resample_name(resample_);
}

Tensor WganResidualBlock::forward(const Tensor& x) {
  Tensor shortcut = x;
  if (resample_ == Resample::Up) {
    shortcut = child("shortcut")->forward(upsample_nearest2x(x));
  } else if (resample_ == Resample::Down) {
    shortcut = mean_pool2x2(child("shortcut")->forward(x));
  } else if (in_ != out_) {
    shortcut = child("shortcut")->forward(x);
  }
  Tensor h = relu(batch_norm_ ? child("bn1")->forward(x) : x);
  if (resample_ == Resample::Up) h = upsample_nearest2x(h);
  h = child("conv1")->forward(h);
  h = relu(batch_norm_ ? child("bn2")->forward(h) : h);
  h = child("conv2")->forward(h);
  if (resample_ == Resample::Down) h = mean_pool2x2(h);
  // The main path first: an elementwise result takes its first operand's layout (Note
  // [Channels-last] in engine/ops.h), and the identity shortcut is the block's input, which may not
  // be channels-last.
  return h + shortcut;
}

WganOptimizedBlock::WganOptimizedBlock(int64_t in_channels, int64_t out_channels, const nn::ModuleOptions& o,
                                       bool channels_last) {
  EF_CHECK(in_channels > 0 && out_channels > 0, "OptimizedBlock: channel counts must be positive, got ", in_channels,
           " and ", out_channels);
  register_module("conv1", conv(in_channels, out_channels, 3, o, channels_last));
  register_module("conv2", conv(out_channels, out_channels, 3, o, channels_last));
  register_module("shortcut", conv(in_channels, out_channels, 1, o, channels_last));
}

Tensor WganOptimizedBlock::forward(const Tensor& x) {
  const Tensor shortcut = child("shortcut")->forward(mean_pool2x2(x));
  const Tensor h = mean_pool2x2(child("conv2")->forward(relu(child("conv1")->forward(x))));
  return h + shortcut;
}

WganResnetGenerator::WganResnetGenerator(int64_t z_dim, int64_t width, const nn::ModuleOptions& o, bool channels_last,
                                         int64_t image_channels)
    : width_(width) {
  EF_CHECK(z_dim > 0 && width > 0 && image_channels > 0,
           "ResnetGenerator: z_dim, width and image_channels must be positive, got ", z_dim, ", ", width, ", ",
           image_channels);
  register_module("fc", std::make_shared<nn::Linear>(z_dim, 4 * 4 * width, true, o));
  auto blocks = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 3; ++i) {
    blocks->push_back(std::make_shared<WganResidualBlock>(width, width, Resample::Up, true, o, channels_last));
  }
  register_module("blocks", blocks);
  register_module("bn", std::make_shared<parallel::SyncBatchNorm>(width, nn::BatchNormConfig{}, o));
  register_module(kImageLayer, conv(width, image_channels, 3, o, channels_last));
}

Tensor WganResnetGenerator::forward(const Tensor& z) {
  Tensor h = reshape(child("fc")->forward(z), {z.size(0), width_, 4, 4});
  h = child("blocks")->forward(h);
  h = relu(child("bn")->forward(h));
  return tanh(child(kImageLayer)->forward(h));
}

WganResnetCritic::WganResnetCritic(int64_t width, const nn::ModuleOptions& o, bool channels_last,
                                   int64_t image_channels) {
  EF_CHECK(width > 0 && image_channels > 0, "ResnetCritic: width and image_channels must be positive, got ", width,
           ", ", image_channels);
  auto blocks = std::make_shared<nn::Sequential>();
  blocks->push_back(std::make_shared<WganOptimizedBlock>(image_channels, width, o, channels_last));
  blocks->push_back(std::make_shared<WganResidualBlock>(width, width, Resample::Down, false, o, channels_last));
  for (int i = 0; i < 2; ++i) {
    blocks->push_back(std::make_shared<WganResidualBlock>(width, width, Resample::None, false, o, channels_last));
  }
  register_module("blocks", blocks);
  register_module("fc", std::make_shared<nn::Linear>(width, 1, true, o));
}

Tensor WganResnetCritic::forward(const Tensor& x) {
  EF_CHECK(x.defined() && x.dim() == 4 && x.size(2) % 4 == 0 && x.size(3) % 4 == 0,
           "ResnetCritic: input must be [N, C, H, W] with H and W multiples of 4, got ",
           x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  const Tensor features = mean(relu(child("blocks")->forward(x)), {2, 3});  // [N, D]
  return reshape(child("fc")->forward(features), {x.size(0)});
}

}  // namespace evenflow::apps
