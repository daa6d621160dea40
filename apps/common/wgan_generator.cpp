#include "apps/common/wgan_generator.h"

#include <algorithm>

#include "evenflow/parallel/sync_batch_norm.h"

namespace evenflow::apps {

WganGenerator::WganGenerator(int64_t z_dim, int64_t width, const nn::ModuleOptions& o, bool channels_last)
    : width_(width) {
  const nn::ConvTranspose2dConfig up{.stride = 2, .padding = 1, .channels_last = channels_last};
  register_module("fc", std::make_shared<nn::Linear>(z_dim, 2 * width * 7 * 7, true, o));
  register_module("bn0", std::make_shared<parallel::SyncBatchNorm>(2 * width * 7 * 7, nn::BatchNormConfig{}, o));
  register_module("up1", std::make_shared<nn::ConvTranspose2d>(2 * width, width, 4, up, o));
  register_module("bn1", std::make_shared<parallel::SyncBatchNorm>(width, nn::BatchNormConfig{}, o));
  register_module(kImageLayer, std::make_shared<nn::ConvTranspose2d>(width, 1, 4, up, o));
}

Tensor WganGenerator::forward(const Tensor& z) {
  Tensor h = relu(child("bn0")->forward(child("fc")->forward(z)));
  h = reshape(h, {z.size(0), 2 * width_, 7, 7});
  h = relu(child("bn1")->forward(child("up1")->forward(h)));
  return tanh(child(kImageLayer)->forward(h));
}

void update_average(nn::Module& average, const nn::Module& model, double decay, int64_t step) {
  NoGradGuard no_grad;
  const double e = std::min(decay, (1.0 + static_cast<double>(step)) / (10.0 + static_cast<double>(step)));
  const std::vector<Tensor> avg = average.parameters(), now = model.parameters();
  for (size_t i = 0; i < avg.size(); ++i) avg[i].mul_(e).add_(now[i], 1.0 - e);
}

}  // namespace evenflow::apps
