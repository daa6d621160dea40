#include "apps/common/augment.h"

namespace evenflow::apps {

Transforms fashion_augmentation() {
  return {std::make_shared<data::RandomAffine>(10.0, 0.0, 0.1), std::make_shared<data::RandomCrop>(28, 2),
          std::make_shared<data::RandomHorizontalFlip>()};
}

Transforms canvas_augmentation(int64_t canvas, int64_t background) {
  return {std::make_shared<data::RandomAffine>(10.0, 0.0, 0.1, background),
          std::make_shared<data::RandomCrop>(canvas, 4, background), std::make_shared<data::RandomHorizontalFlip>()};
}

}  // namespace evenflow::apps
