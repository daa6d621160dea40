// The segmentation set, model, losses, metrics and colours of apps/segment (see segmentation.h).
#include "apps/segment/segmentation.h"

#include <algorithm>

#include "evenflow/data/random_stream.h"
#include "evenflow/engine/error.h"
#include "evenflow/losses/losses.h"

namespace evenflow::segment {

namespace {
constexpr int64_t kGarment = 28;  // FashionMNIST images are 28x28
}  // namespace

// --- Canvases -----------------------------------------------------------------------------------

CanvasSet::CanvasSet(data::Batch garments, int64_t size, int64_t canvas, uint64_t seed, uint64_t stream)
    : size_(size), canvas_(canvas), seed_(seed), stream_(stream) {
  EF_CHECK(garments.images.defined() && garments.images.dim() == 4 && garments.images.size(0) > 0 &&
               garments.images.size(1) == 1 && garments.images.size(2) == kGarment &&
               garments.images.size(3) == kGarment,
           "CanvasSet: expected garments [N, 1, 28, 28], got ",
           garments.images.defined() ? shape_str(garments.images.shape()) : "undefined");
  EF_CHECK(
      garments.labels.defined() && garments.labels.dim() == 1 && garments.labels.size(0) == garments.images.size(0),
      "CanvasSet: expected one label per garment");
  EF_CHECK(size > 0, "CanvasSet: the number of canvases must be positive, got ", size);
  EF_CHECK(canvas >= kGarment, "CanvasSet: a canvas must hold a 28x28 garment, got size ", canvas);
  garments_.images = garments.images.to(cpu()).to(kFloat32).contiguous();
  garments_.labels = garments.labels.to(cpu()).to(kInt64).contiguous();
}

void CanvasSet::draw(int64_t index, float* image, int64_t* label) const {
  const int64_t c = canvas_;
  std::fill(image, image + c * c, 0.0f);
  std::fill(label, label + c * c, kBackground);
  data::RandomStream rng(seed_, {stream_, static_cast<uint64_t>(index)});
  const float* pixels = garments_.images.data<float>();
  const int64_t* classes = garments_.labels.data<int64_t>();
  const int64_t count = 2 + rng.below(3);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t g = rng.below(garments_.images.size(0));
    const int64_t y0 = rng.below(c - kGarment + 1), x0 = rng.below(c - kGarment + 1);
    const float* src = pixels + g * kGarment * kGarment;
    for (int64_t y = 0; y < kGarment; ++y) {
      for (int64_t x = 0; x < kGarment; ++x) {
        const float v = src[y * kGarment + x];
        if (v <= kDrawn) continue;
        image[(y0 + y) * c + x0 + x] = v;
        label[(y0 + y) * c + x0 + x] = classes[g];
      }
    }
  }
  // Boundaries are found on the finished labels, before any is marked, so both sides of an edge
  // between two garments are marked.
  const std::vector<int64_t> drawn(label, label + c * c);
  for (int64_t y = 0; y < c; ++y) {
    for (int64_t x = 0; x < c; ++x) {
      const int64_t l = drawn[static_cast<size_t>(y * c + x)];
      if (l == kBackground) continue;
      const bool edge = (y > 0 && drawn[static_cast<size_t>((y - 1) * c + x)] != l) ||
                        (y + 1 < c && drawn[static_cast<size_t>((y + 1) * c + x)] != l) ||
                        (x > 0 && drawn[static_cast<size_t>(y * c + x - 1)] != l) ||
                        (x + 1 < c && drawn[static_cast<size_t>(y * c + x + 1)] != l);
      if (edge) label[y * c + x] = kIgnore;
    }
  }
}

data::Example CanvasSet::get(int64_t index) const {
  EF_CHECK(index >= 0 && index < size_, "CanvasSet: index ", index, " out of range [0, ", size_, ")");
  data::Example e{.image = empty({1, canvas_, canvas_}), .label = empty({canvas_, canvas_}, {.dtype = kInt64})};
  draw(index, e.image.data<float>(), e.label.data<int64_t>());
  return e;
}

data::Batch CanvasSet::get_batch(const std::vector<int64_t>& indices) const {
  EF_CHECK(!indices.empty(), "CanvasSet::get_batch: no indices given");
  const auto n = static_cast<int64_t>(indices.size());
  data::Batch b{.images = empty({n, 1, canvas_, canvas_}), .labels = empty({n, canvas_, canvas_}, {.dtype = kInt64})};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t index = indices[static_cast<size_t>(i)];
    EF_CHECK(index >= 0 && index < size_, "CanvasSet: index ", index, " out of range [0, ", size_, ")");
    draw(index, b.images.data<float>() + i * canvas_ * canvas_, b.labels.data<int64_t>() + i * canvas_ * canvas_);
  }
  return b;
}

// --- Model --------------------------------------------------------------------------------------

std::shared_ptr<nn::Sequential> make_model(const nn::ModuleOptions& o) {
  auto model = std::make_shared<nn::Sequential>();
  // Batch norm's shift makes a convolution's bias redundant.
  const auto conv_bn_relu = [&](int64_t in, int64_t out) {
    model->push_back(nn::Conv2d(in, out, 3, {.padding = 1, .bias = false}, o));
    model->push_back(nn::BatchNorm2d(out, {}, o));
    model->push_back(nn::ReLU());
  };
  const nn::UpsampleConfig up{.scale_factor = nn::Scale2(2.0), .mode = nn::UpsampleMode::Bilinear};
  conv_bn_relu(1, 16);
  conv_bn_relu(16, 16);
  model->push_back(nn::MaxPool2d(2));
  conv_bn_relu(16, 32);
  conv_bn_relu(32, 32);
  model->push_back(nn::MaxPool2d(2));
  conv_bn_relu(32, 64);
  model->push_back(nn::Upsample(up));
  conv_bn_relu(64, 32);
  model->push_back(nn::Upsample(up));
  model->push_back(nn::Conv2d(32, kClasses, 1, {}, o));
  return model;
}

// --- Losses -------------------------------------------------------------------------------------

const std::vector<std::string>& loss_names() {
  static const std::vector<std::string> names{"ce", "focal", "dice", "lovasz", "ohem"};
  return names;
}

const std::vector<std::string>& compare_specs() {
  static const std::vector<std::string> specs = [] {
    std::vector<std::string> s = loss_names();
    s.emplace_back("ce+dice");
    return s;
  }();
  return specs;
}

std::vector<std::string> loss_terms(const std::string& spec) {
  std::vector<std::string> terms;
  size_t start = 0;
  while (true) {
    const size_t end = spec.find('+', start);
    const std::string term = spec.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (std::find(loss_names().begin(), loss_names().end(), term) == loss_names().end()) {
      std::string known;
      for (const std::string& n : loss_names()) known += (known.empty() ? "" : ", ") + n;
      EF_ERROR("--loss: unknown loss \"", term, "\" in \"", spec, "\" (known: ", known, ", or sums such as ce+dice)");
    }
    terms.push_back(term);
    if (end == std::string::npos) return terms;
    start = end + 1;
  }
}

losses::LossParts segmentation_loss(const std::string& spec, const Tensor& logits, const Tensor& target) {
  EF_CHECK(logits.dim() == 4 && logits.size(1) == kClasses && target.dim() == 3 && target.size(0) == logits.size(0),
           "segmentation_loss: expected logits [n, ", kClasses, ", H, W] and target [n, H, W], got ",
           shape_str(logits.shape()), " and ", shape_str(target.shape()));
  losses::LossParts total;
  for (const std::string& term : loss_terms(spec)) {
    losses::LossParts l;
    if (term == "ce") {
      l = losses::CrossEntropyLoss{{.ignore_index = kIgnore}}.parts(logits, target);
    } else if (term == "focal") {
      l = losses::FocalLoss{{.ignore_index = kIgnore}}.parts(logits, target);
    } else if (term == "dice") {
      l = losses::DiceLoss{{.ignore_index = kIgnore}}.parts(logits, target);
    } else if (term == "lovasz") {
      l = losses::LovaszSoftmaxLoss{{.ignore_index = kIgnore}}.parts(logits, target);
    } else {
      l = losses::OhemCrossEntropyLoss{{.ignore_index = kIgnore}}.parts(logits, target);
    }
    total = total + l;
  }
  return total;
}

// --- Metrics ------------------------------------------------------------------------------------

void Confusion::add(const Tensor& predictions, const Tensor& target) {
  EF_CHECK(predictions.shape() == target.shape(), "Confusion::add: predictions ", shape_str(predictions.shape()),
           " and target ", shape_str(target.shape()), " differ");
  const std::vector<int64_t> p = predictions.to_int_vector(), t = target.to_int_vector();
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == kIgnore) continue;
    EF_CHECK(t[i] >= 0 && t[i] < kClasses && p[i] >= 0 && p[i] < kClasses, "Confusion::add: label ", t[i],
             " or prediction ", p[i], " outside [0, ", kClasses, ")");
    ++counts_[static_cast<size_t>(t[i] * kClasses + p[i])];
  }
}

double Confusion::miou() const {
  double sum = 0;
  int present = 0;
  for (int64_t c = 0; c < kClasses; ++c) {
    int64_t predicted = 0, actual = 0;
    for (int64_t k = 0; k < kClasses; ++k) {
      predicted += counts_[static_cast<size_t>(k * kClasses + c)];
      actual += counts_[static_cast<size_t>(c * kClasses + k)];
    }
    const int64_t tp = counts_[static_cast<size_t>(c * kClasses + c)];
    const int64_t uni = predicted + actual - tp;
    if (uni == 0) continue;
    sum += static_cast<double>(tp) / static_cast<double>(uni);
    ++present;
  }
  return present > 0 ? sum / present : 0.0;
}

double Confusion::pixel_accuracy() const {
  int64_t correct = 0, all = 0;
  for (int64_t t = 0; t < kClasses; ++t) {
    for (int64_t p = 0; p < kClasses; ++p) all += counts_[static_cast<size_t>(t * kClasses + p)];
    correct += counts_[static_cast<size_t>(t * kClasses + t)];
  }
  return all > 0 ? static_cast<double>(correct) / static_cast<double>(all) : 0.0;
}

// --- Colours ------------------------------------------------------------------------------------

apps::Rgb label_color(int64_t label) {
  // matplotlib's tab10, in class order.
  static constexpr std::array<apps::Rgb, 10> kClassColors{{{31, 119, 180},
                                                           {255, 127, 14},
                                                           {44, 160, 44},
                                                           {214, 39, 40},
                                                           {148, 103, 189},
                                                           {140, 86, 75},
                                                           {227, 119, 194},
                                                           {127, 127, 127},
                                                           {188, 189, 34},
                                                           {23, 190, 207}}};
  if (label >= 0 && label < kBackground) return kClassColors[static_cast<size_t>(label)];
  if (label == kBackground) return {0, 0, 0};
  EF_CHECK(label == kIgnore, "label_color: no colour for label ", label);
  return {255, 255, 255};
}

Tensor colorize(const Tensor& labels) {
  EF_CHECK(labels.dim() == 3, "colorize: expected labels [N, H, W], got ", shape_str(labels.shape()));
  const int64_t n = labels.size(0), plane = labels.size(1) * labels.size(2);
  const std::vector<int64_t> l = labels.to_int_vector();
  std::vector<double> rgb(static_cast<size_t>(n * 3 * plane));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < plane; ++p) {
      const apps::Rgb c = label_color(l[static_cast<size_t>(i * plane + p)]);
      rgb[static_cast<size_t>((i * 3 + 0) * plane + p)] = c.r / 255.0;
      rgb[static_cast<size_t>((i * 3 + 1) * plane + p)] = c.g / 255.0;
      rgb[static_cast<size_t>((i * 3 + 2) * plane + p)] = c.b / 255.0;
    }
  }
  return from_vector(rgb, {n, 3, labels.size(1), labels.size(2)});
}

}  // namespace evenflow::segment
