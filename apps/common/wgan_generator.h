// apps/wgan_gp's generator, shared with apps/bench_engine (which times the whole training step).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "evenflow/layers/layers.h"

namespace evenflow::apps {

// DCGAN-style generator for 28x28: z -> Linear -> [2w, 7, 7] -> ConvTranspose (14x14) -> ConvTranspose
// (28x28) -> tanh, with batch normalization (synchronized over the devices) and ReLU between:
// [N, z_dim] -> [N, 1, 28, 28].
class WganGenerator : public nn::Cloneable<WganGenerator> {
 public:
  // channels_last: the transposed convolutions' activations channels-last
  // (nn::ConvTranspose2dConfig::channels_last; the batch normalization between them keeps it).
  WganGenerator(int64_t z_dim, int64_t width, const nn::ModuleOptions& o, bool channels_last = false);
  // The transposed convolution that writes the images: it stays float32 under --precision bf16
  // (run.h's set_precision), as the critic's layer that reads them does.
  static constexpr const char* kImageLayer = "up2";
  static constexpr std::array<const char*, 1> kFloat32Layers = {kImageLayer};
  std::string name() const override { return "Generator"; }
  Tensor forward(const Tensor& z) override;

 private:
  int64_t width_;
};

// Note [Generator average]
// With --ema-decay d > 0 the samples, the Fréchet distance and generator.safetensors come from an
// exponential moving average of the generator's weights, as GAN practice does (Karras et al. 2018,
// Yazıcı et al. 2019): after every generator step avg = e·avg + (1 - e)·w, with e = min(d, (1 +
// t) / (10 + t)) at step t so that the average soon forgets its random start. Its batch-norm
// running statistics are its own: recomputed before each sample, distance and save from 2048
// noise vectors of its own stream (update_batchnorm_statistics, as torch.optim.swa_utils.update_bn),
// since the trained generator's statistics belong to other weights. It is part of the checkpoint
// ("gen_average"), and every process keeps the same copy on its first device. Measured at 2000
// steps and 5 critic steps with the trained generator's statistics copied in, the average sampled
// worse (Fréchet distance 145.6 against 124.5 with d = 0.999): the distance still falls fast there,
// and the average lags.
// update_average: avg = e·avg + (1 - e)·w over the parameters, e = min(decay, (1 + step) / (10 + step)).
void update_average(nn::Module& average, const nn::Module& model, double decay, int64_t step);

}  // namespace evenflow::apps
