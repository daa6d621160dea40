// The programs' training pipelines (docs/data.md, "Augmentation" and "Preprocessing on a Ray cluster"),
// described as text: the programs build their local pipeline from the description, and a Ray worker
// builds the same one from the same text (data::RayBatches), so there is one way to make them.
// apps/bench_loader measures them. Every random draw is per image (data::SampleStreams).
#pragma once

#include <cstdint>
#include <string>

#include "evenflow/data/pipeline.h"
#include "evenflow/data/ray_batches.h"

namespace evenflow::apps {

// classify's: FashionMNIST's training split in `data`; with augment, a rotation of up to 10 degrees
// and a scaling of up to 10%, a 28x28 crop of the image padded by 2, a horizontal flip.
std::string classify_pipeline(const std::string& data, bool augment);

// segment's: `size` canvas x canvas canvases of the training split's garments (segment::CanvasSet,
// stream 0 of `seed`); with augment, the same rotation and scaling, a crop of the canvas padded by
// 4, a flip, the label maps following with the background class where the canvas ends.
std::string segment_pipeline(const std::string& data, int64_t size, int64_t canvas, uint64_t seed, bool augment);

// The pipeline a description above names. ef::Error for a malformed description or what the
// dataset's constructor refuses (a missing folder: the path is in the message).
data::Pipeline make_pipeline(const std::string& description);

// --ray: a connection to the cluster at `address` that makes the batches of `description`, or null
// when the address is empty (batches made here). Says so on stdout once connected.
std::shared_ptr<const data::RayBatches> connect_ray(const std::string& address, const std::string& description);

}  // namespace evenflow::apps
