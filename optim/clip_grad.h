/// @file
/// Gradient clipping, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include <vector>

#include "evenflow/engine/tensor.h"

namespace evenflow::optim {

/// The norm_type-norm of all the parameters' gradients together (as if concatenated; parameters
/// without a gradient are skipped, and the result is 0 when none has one). When it exceeds
/// max_norm, every gradient is scaled in place by max_norm / (norm + 1e-6). norm_type may be
/// infinity (the largest absolute value). Gradients may live on different devices.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

}  // namespace evenflow::optim
