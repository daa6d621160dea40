// apps/wgan_gp's critic, shared with apps/bench_processes (which all-reduces its gradients).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "evenflow/layers/layers.h"

namespace evenflow::apps {

// DCGAN-style critic: Conv(4, stride 2) 28 -> 14 -> 7 with LeakyReLU(0.2), the chosen
// normalization after the second convolution ("layernorm", "syncbn" or "none"; ef::Error for
// another), and a linear output: [N, 1, 28, 28] -> [N].
class WganCritic : public nn::Cloneable<WganCritic> {
 public:
  // channels_last: the convolutions' activations channels-last (nn::Conv2dConfig::channels_last).
  WganCritic(int64_t width, const std::string& norm, const nn::ModuleOptions& o, bool channels_last = false);
  // The convolution that reads the images, and the score layer (one output per image): they stay
  // float32 under --precision bf16 (run.h's set_precision).
  static constexpr const char* kImageLayer = "conv1";
  static constexpr std::array<const char*, 2> kFloat32Layers = {kImageLayer, "fc"};
  std::string name() const override { return "Critic"; }
  Tensor forward(const Tensor& x) override;
};

}  // namespace evenflow::apps
