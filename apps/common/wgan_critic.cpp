#include "apps/common/wgan_critic.h"

#include "evenflow/parallel/sync_batch_norm.h"

namespace evenflow::apps {

WganCritic::WganCritic(int64_t width, const std::string& norm, const nn::ModuleOptions& o, bool channels_last) {
  const nn::Conv2dConfig conv{.stride = 2, .padding = 1, .channels_last = channels_last};
  register_module(kImageLayer, std::make_shared<nn::Conv2d>(1, width, 4, conv, o));
  register_module("conv2", std::make_shared<nn::Conv2d>(width, 2 * width, 4, conv, o));
  if (norm == "layernorm") {
    register_module("norm", std::make_shared<nn::LayerNorm>(Shape{2 * width, 7, 7}, nn::LayerNormConfig{}, o));
  } else if (norm == "syncbn") {
    register_module("norm", std::make_shared<parallel::SyncBatchNorm>(2 * width, nn::BatchNormConfig{}, o));
  } else {
    EF_CHECK(norm == "none", "critic normalization '", norm, "' is not one of layernorm, syncbn, none");
    register_module("norm", std::make_shared<nn::Identity>());
  }
  register_module("fc", std::make_shared<nn::Linear>(2 * width * 7 * 7, 1, true, o));
}

Tensor WganCritic::forward(const Tensor& x) {
  Tensor h = leaky_relu(child(kImageLayer)->forward(x), 0.2);
  h = child("conv2")->forward(h);
  h = child("norm")->forward(h);
  h = leaky_relu(h, 0.2);
  if (!h.is_channels_last()) return reshape(child("fc")->forward(flatten(h, 1)), {x.size(0)});
  // Channels-last: flattening h would copy it into C, H, W order (and its gradient back), twice the
  // activations per pass; the features in memory order (H, W, C: a view) meet fc's weight put in
  // that order instead (a copy of the weight, 3136 values). The same products, summed in another
  // order.
  auto& fc = dynamic_cast<nn::Linear&>(*child("fc"));
  const int64_t c = h.size(1), height = h.size(2), width = h.size(3);
  const Tensor features = reshape(permute(h, {0, 2, 3, 1}), {x.size(0), -1});
  const Tensor weight =
      reshape(permute(reshape(fc.weight(), {-1, c, height, width}), {0, 2, 3, 1}), {-1, features.size(1)});
  return reshape(linear(features, weight, fc.bias(), {.compute = fc.compute_dtype()}), {x.size(0)});
}

}  // namespace evenflow::apps
