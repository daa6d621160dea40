#include "apps/common/fashion_cnn.h"

namespace evenflow::apps {

std::shared_ptr<nn::Sequential> make_fashion_cnn(const nn::ModuleOptions& o) {
  return std::make_shared<nn::Sequential>(nn::Conv2d(1, 32, 5, {.padding = 2}, o), nn::ReLU(), nn::MaxPool2d(2),
                                          nn::Conv2d(32, 64, 5, {.padding = 2}, o), nn::ReLU(), nn::MaxPool2d(2),
                                          nn::Flatten(), nn::Linear(7 * 7 * 64, 1024, true, o), nn::ReLU(),
                                          nn::Dropout(0.4), nn::Linear(1024, 10, true, o));
}

Tensor fashion_cnn_features(nn::Sequential& net, const Tensor& images) {
  NoGradGuard no_grad;
  const bool was_training = net.is_training();
  net.eval();
  Tensor x = images;
  constexpr int kPenultimate = 8;  // the ReLU after Linear(3136, 1024)
  for (int i = 0; i <= kPenultimate; ++i) x = net.child(std::to_string(i))->forward(x);
  net.train(was_training);
  return x;
}

}  // namespace evenflow::apps
