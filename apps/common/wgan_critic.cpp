#include "apps/common/wgan_critic.h"

#include "evenflow/parallel/sync_batch_norm.h"

namespace evenflow::apps {

WganCritic::WganCritic(int64_t width, const std::string& norm, const nn::ModuleOptions& o) {
  register_module("conv1", std::make_shared<nn::Conv2d>(1, width, 4, nn::Conv2dConfig{.stride = 2, .padding = 1}, o));
  register_module("conv2",
                  std::make_shared<nn::Conv2d>(width, 2 * width, 4, nn::Conv2dConfig{.stride = 2, .padding = 1}, o));
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
  Tensor h = leaky_relu(child("conv1")->forward(x), 0.2);
  h = child("conv2")->forward(h);
  h = child("norm")->forward(h);
  h = flatten(leaky_relu(h, 0.2), 1);
  return reshape(child("fc")->forward(h), {x.size(0)});
}

}  // namespace evenflow::apps
