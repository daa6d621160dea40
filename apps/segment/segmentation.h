// The pieces of apps/segment that its test uses too: the segmentation set built from FashionMNIST
// garments (Note [Segmentation canvases]), the encoder-decoder, the --loss specs and their
// data-parallel form (Note [Segmentation losses on devices]), mIoU and pixel accuracy, and the
// colours of the prediction images.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/image.h"
#include "evenflow/data/dataset.h"
#include "evenflow/layers/layers.h"
#include "evenflow/losses/losses.h"

namespace evenflow::segment {

inline constexpr int64_t kClasses = 11;     // the 10 FashionMNIST classes, then background
inline constexpr int64_t kBackground = 10;  // the label of pixels no garment covers
inline constexpr int64_t kIgnore = 255;     // boundary pixels: no loss, not scored
inline constexpr double kDrawn = 0.1;       // a garment covers the pixels brighter than this

// Note [Segmentation canvases]
// Canvas i of a set is a pure function of (seed, stream, i), drawn with a RandomStream, so it is
// the same whichever loader worker makes it and however many there are. It is a canvas x canvas
// black image onto which 2 to 4 garments (28x28, picked uniformly from the source split) are
// pasted at uniform positions, in order. A garment covers its pixels brighter than kDrawn; where
// it covers, the later garment wins both the input (its intensity) and the label (its class), so
// the input shows exactly the covered pixels and nothing of what a later garment hides. Uncovered
// pixels are 0 and kBackground. A covered pixel with a 4-neighbour of another label is a boundary:
// kIgnore, because where two labels touch the exact edge is a guess no loss should fight over.
class CanvasSet final : public data::Dataset {
 public:
  // garments: images [N, 1, 28, 28] in [0, 1] and labels [N] (load_fashion_mnist); the training
  // and held-out sets use different splits and different `stream`s.
  CanvasSet(data::Batch garments, int64_t size, int64_t canvas, uint64_t seed, uint64_t stream);

  int64_t size() const override { return size_; }
  int64_t canvas() const { return canvas_; }
  // image float32 [1, canvas, canvas], label int64 [canvas, canvas].
  data::Example get(int64_t index) const override;
  data::Batch get_batch(const std::vector<int64_t>& indices) const override;

 private:
  void draw(int64_t index, float* image, int64_t* label) const;

  data::Batch garments_;
  int64_t size_, canvas_;
  uint64_t seed_, stream_;
};

// conv-bn-relu x2 (16) -> maxpool -> conv-bn-relu x2 (32) -> maxpool -> conv-bn-relu (64) ->
// bilinear x2 -> conv-bn-relu (32) -> bilinear x2 -> conv 1x1 (kClasses): [N, 1, H, W] -> logits
// [N, kClasses, H, W], H and W multiples of 4. No dropout: nothing random after initialisation.
std::shared_ptr<nn::Sequential> make_model(const nn::ModuleOptions& o);

// The losses --loss names, in --compare's order, and the sums --compare adds.
const std::vector<std::string>& loss_names();
const std::vector<std::string>& compare_specs();
// The terms of a spec ("ce+dice" -> {"ce", "dice"}); ef::Error naming an unknown term.
std::vector<std::string> loss_terms(const std::string& spec);

// The loss of spec (its terms added with weight 1) on logits [n, kClasses, H, W] and an int64 target
// [n, H, W] with kIgnore, as parts (Note [Losses across devices] in losses/losses.h): a chunk's
// parts, added over the chunks by DataParallelCriterion, give the loss of the whole batch, each
// term divided by its own weight (valid pixels for ce and focal, images for dice, lovasz, ohem).
losses::LossParts segmentation_loss(const std::string& spec, const Tensor& logits, const Tensor& target);

// A confusion matrix over kClasses, accumulated batch by batch; kIgnore pixels are left out.
class Confusion {
 public:
  // predictions and target: int64 [N, H, W] (any device).
  void add(const Tensor& predictions, const Tensor& target);
  // Mean over classes of TP / (TP + FP + FN), skipping classes absent from both predictions and
  // targets; 0 before any pixel.
  double miou() const;
  // Correct pixels over scored pixels; 0 before any pixel.
  double pixel_accuracy() const;

 private:
  std::array<int64_t, kClasses * kClasses> counts_{};  // counts_[target * kClasses + prediction]
};

// A fixed colour per label: the 10 classes, background (black) and kIgnore (white).
apps::Rgb label_color(int64_t label);
// Labels int64 [N, H, W] as RGB images float [N, 3, H, W] in [0, 1] (for apps::image_grid).
Tensor colorize(const Tensor& labels);

}  // namespace evenflow::segment
