// The programs' --augment pipelines (README, "Augmentation"), shared with apps/bench_loader so that
// the benchmark measures what the programs run. Every draw is per image (data::SampleStreams).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "evenflow/data/transforms.h"

namespace evenflow::apps {

using Transforms = std::vector<std::shared_ptr<const data::Transform>>;

// classify's, for 28x28 FashionMNIST images: a rotation of up to 10 degrees and a scaling of up to
// 10%, a 28x28 crop of the image padded by 2, a horizontal flip.
Transforms fashion_augmentation();

// segment's, for canvas x canvas images and their label maps: the same rotation and scaling, a crop
// of the canvas padded by 4, a flip; the label maps follow, `background` where the canvas ends.
Transforms canvas_augmentation(int64_t canvas, int64_t background);

}  // namespace evenflow::apps
