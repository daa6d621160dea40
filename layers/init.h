/// @file
/// Parameter initialisation, as torch.nn.init: the default schemes of Linear and the convolutions
/// (kaiming_uniform_ with a = √5, which is uniform(±1/√fan_in)), drawing from the tensor's device
/// generator (ef::manual_seed), so a seeded model starts the same on any device.
#pragma once

#include <cstdint>

#include "evenflow/engine/tensor.h"

namespace evenflow::nn::init {

/// fan_in of a weight, as PyTorch's _calculate_fan_in_and_fan_out: size(1) × the receptive field
/// (the product of the dims after the first two). Needs at least 2 dims.
int64_t fan_in(const Shape& weight_shape);

/// Fills t with values drawn uniformly from [low, high) (in place, no autograd).
void uniform_(const Tensor& t, double low, double high);

/// PyTorch's default for Linear / Conv weights and biases: uniform(±1/√fan_in), 0 when fan_in is 0.
void default_uniform_(const Tensor& t, int64_t fan_in);

}  // namespace evenflow::nn::init
