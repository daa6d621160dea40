// The FashionMNIST benchmark CNN that apps/classify trains, shared with apps/wgan_gp, whose sample
// quality metric measures distances in this network's feature space (frechet.h).
#pragma once

#include <memory>

#include "evenflow/layers/layers.h"

namespace evenflow::apps {

// Conv2d(1,32,5,p2)-ReLU-MaxPool(2)-Conv2d(32,64,5,p2)-ReLU-MaxPool(2)-Flatten-Linear(3136,1024)-ReLU-
// Dropout(0.4)-Linear(1024,10): [N, 1, 28, 28] images in [0, 1] -> [N, 10] logits. PyTorch's
// nn.Sequential of the same layers has the same state-dict names.
std::shared_ptr<nn::Sequential> make_fashion_cnn(const nn::ModuleOptions& o = {});

// The penultimate layer's activations (after the 1024-unit ReLU) of a make_fashion_cnn network
// in eval mode: [N, 1024], without autograd.
Tensor fashion_cnn_features(nn::Sequential& net, const Tensor& images);

}  // namespace evenflow::apps
