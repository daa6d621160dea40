// apps/wgan_gp's generator, shared with apps/bench_engine (which times the whole training step).
#pragma once

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
  // (set_precision), as the critic's layer that reads them does.
  static constexpr const char* kImageLayer = "up2";
  std::string name() const override { return "Generator"; }
  Tensor forward(const Tensor& z) override;

 private:
  int64_t width_;
};

}  // namespace evenflow::apps
