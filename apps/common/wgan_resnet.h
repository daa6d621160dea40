// The WGAN-GP paper's CIFAR-10 ResNet generator and critic (Gulrajani et al. 2017, the unconditional
// networks of its gan_cifar_resnet.py), for wgan_gp's larger model beside the DCGAN-style
// WganGenerator and WganCritic. Built from engine ops that have derivatives of every order, so the
// gradient penalty's double backward runs through the critic.
//
// Note [WGAN ResNet parameter names]
// The names are those PyTorch gives the same modules written plainly (a residual block registers
// bn1, conv1, bn2, conv2, shortcut in that order; the blocks sit in an nn.Sequential), so a
// checkpoint reads in Python. Width D, z_dim Z, image channels C; every convolution has a bias.
//   generator: fc.{weight [16D, Z], bias}
//              blocks.{0,1,2}.bn1.{weight, bias, running_mean, running_var, num_batches_tracked} [D]
//              blocks.{0,1,2}.conv1.{weight [D, D, 3, 3], bias}     (after 2x nearest upsampling)
//              blocks.{0,1,2}.bn2.*, blocks.{0,1,2}.conv2.{weight [D, D, 3, 3], bias}
//              blocks.{0,1,2}.shortcut.{weight [D, D, 1, 1], bias}  (after 2x nearest upsampling)
//              bn.* [D], conv.{weight [C, D, 3, 3], bias [C]}
//   critic:    blocks.0.conv1.{weight [D, C, 3, 3], bias}, blocks.0.conv2.{weight [D, D, 3, 3], bias}
//              blocks.0.shortcut.{weight [D, C, 1, 1], bias}           (the optimized first block)
//              blocks.1.conv1, blocks.1.conv2 [D, D, 3, 3], blocks.1.shortcut [D, D, 1, 1] (down)
//              blocks.{2,3}.conv1, blocks.{2,3}.conv2 [D, D, 3, 3]     (identity shortcuts)
//              fc.{weight [1, D], bias [1]}
// The parameters start as PyTorch's layers start (uniform ±1/√fan_in), not with the paper's He and
// Glorot initialisations.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "evenflow/layers/layers.h"

namespace evenflow::apps {

// Note [Resampling in the activations' layout]
// The blocks' 2x2 mean pooling and 2x nearest upsampling are reshapes, a mean and an expand on a
// view of x in its own memory order, [N, H, W, C] for a channels-last x: the result keeps x's layout
// (channels-last in, channels-last out) and no reorder is copied on either side of a convolution
// that runs channels-last. avg_pool2d and upsample_nearest2d compute the same values but give
// contiguous results (avg_pool2d reorders a channels-last input first). Every op used has
// derivatives of every order.

// The mean of each 2x2 window, stride 2: x [N, C, H, W] (H, W even, else ef::Error) ->
// [N, C, H/2, W/2], in x's layout (Note [Resampling in the activations' layout]).
Tensor mean_pool2x2(const Tensor& x);
// Nearest-neighbour 2x upsampling: x [N, C, H, W] -> [N, C, 2H, 2W], each pixel copied into a 2x2
// square, in x's layout (Note [Resampling in the activations' layout]).
Tensor upsample_nearest2x(const Tensor& x);

// Where a residual block changes the resolution: Down halves it after conv2 and after the shortcut's
// convolution (the paper's ConvMeanPool), Up doubles it before conv1 and before the shortcut's
// convolution (UpsampleConv), None keeps it.
enum class Resample { None, Down, Up };

// The paper's ResidualBlock: output = shortcut(x) + main(x) with
//   main:     [bn1] -> ReLU -> conv1 3x3 -> [bn2] -> ReLU -> conv2 3x3
//   Down:     conv1 in -> in, conv2 in -> out then 2x2 mean pooling; shortcut 1x1 then pooling
//   Up:       2x upsampling then conv1 in -> out, conv2 out -> out; shortcut upsampling then 1x1
//   None:     conv1 in -> out, conv2 out -> out; shortcut 1x1 when in != out, else the identity
// [N, in, H, W] -> [N, out, H', W']. batch_norm: bn1, bn2 are batch normalizations synchronized over
// the devices of a data-parallel step (parallel::SyncBatchNorm: BatchNorm2d on one device);
// without it there is none (the paper's critic). ef::Error for a channel count that is not positive.
class WganResidualBlock : public nn::Cloneable<WganResidualBlock> {
 public:
  // channels_last: the convolutions' activations channels-last (nn::Conv2dConfig::channels_last).
  WganResidualBlock(int64_t in_channels, int64_t out_channels, Resample resample, bool batch_norm,
                    const nn::ModuleOptions& o, bool channels_last = false);
  std::string name() const override { return "ResidualBlock"; }
  std::string extra_repr() const override;
  Tensor forward(const Tensor& x) override;

 private:
  int64_t in_, out_;
  Resample resample_;
  bool batch_norm_;
};

// The critic's first block (the paper's OptimizedResBlockDisc1), on the images themselves:
// shortcut = 1x1 conv of the 2x2-mean-pooled x (MeanPoolConv), main = conv1 3x3 -> ReLU -> conv2 3x3
// then 2x2 mean pooling (ConvMeanPool); [N, in, H, W] -> [N, out, H/2, W/2].
class WganOptimizedBlock : public nn::Cloneable<WganOptimizedBlock> {
 public:
  WganOptimizedBlock(int64_t in_channels, int64_t out_channels, const nn::ModuleOptions& o, bool channels_last = false);
  std::string name() const override { return "OptimizedBlock"; }
  Tensor forward(const Tensor& x) override;
};

// The generator: z [N, z_dim] -> Linear -> [N, D, 4, 4] -> 3 Up blocks (8, 16, 32) -> batch
// normalization -> ReLU -> conv 3x3 -> tanh: [N, image_channels, 32, 32] in [-1, 1]. Batch
// normalizations synchronized over the devices (parallel::SyncBatchNorm), as WganGenerator's.
// Parameter names: Note [WGAN ResNet parameter names].
class WganResnetGenerator : public nn::Cloneable<WganResnetGenerator> {
 public:
  // width: D (the paper's 128). channels_last: the convolutions' activations channels-last
  // (nn::Conv2dConfig::channels_last; batch normalization, ReLU and the resampling keep it).
  // ef::Error for a z_dim, width or image_channels that is not positive.
  WganResnetGenerator(int64_t z_dim, int64_t width, const nn::ModuleOptions& o, bool channels_last = false,
                      int64_t image_channels = 3);
  // The convolution that writes the images: it stays float32 under --precision bf16 (run.h's
  // set_precision), as WganGenerator::kImageLayer.
  static constexpr const char* kImageLayer = "conv";
  static constexpr std::array<const char*, 1> kFloat32Layers = {kImageLayer};
  std::string name() const override { return "ResnetGenerator"; }
  Tensor forward(const Tensor& z) override;

 private:
  int64_t width_;
};

// The critic: x [N, image_channels, H, W] (H and W multiples of 4; 32x32 in the paper) -> optimized
// block (H/2) -> Down block (H/4) -> two None blocks -> ReLU -> mean over H and W -> Linear(D, 1):
// [N], as WganCritic. No normalization (the paper's NORMALIZATION_D = False), so the samples of a
// batch are independent, as a gradient penalty needs. Parameter names: Note [WGAN ResNet parameter
// names].
class WganResnetCritic : public nn::Cloneable<WganResnetCritic> {
 public:
  // width: D (the paper's 128). channels_last: the convolutions' activations channels-last
  // (nn::Conv2dConfig::channels_last). ef::Error for a width or image_channels that is not positive.
  WganResnetCritic(int64_t width, const nn::ModuleOptions& o, bool channels_last = false, int64_t image_channels = 3);
  // What stays float32 under --precision bf16 (run.h's set_precision), as WganCritic's: the two
  // convolutions that read the images (the first block's conv1, and its shortcut, which reads them
  // mean-pooled) and the score layer. The first block's conv2 reads activations and computes in
  // bfloat16.
  static constexpr std::array<const char*, 3> kFloat32Layers = {"blocks.0.conv1", "blocks.0.shortcut", "fc"};
  std::string name() const override { return "ResnetCritic"; }
  Tensor forward(const Tensor& x) override;
};

}  // namespace evenflow::apps
