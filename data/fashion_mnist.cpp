// Loading FashionMNIST from its IDX files: finds the gzip or raw file of each part, checks the
// two parts agree, and scales the pixels to [0, 1].
#include "evenflow/data/fashion_mnist.h"

#include <filesystem>
#include <system_error>

#include "evenflow/data/idx.h"
#include "evenflow/engine/ops.h"

namespace evenflow::data {

namespace {

constexpr int64_t kSide = 28;
constexpr int64_t kClasses = 10;

// `<root>/<stem>.gz` or, failing that, `<root>/<stem>`.
std::string find_part(const std::string& root, const std::string& stem) {
  const std::filesystem::path dir(root);
  for (const std::string& name : {stem + ".gz", stem}) {
    std::error_code ec;  // a symlink loop or an unreadable folder: an error naming the path, not a throw
    const bool found = std::filesystem::is_regular_file(dir / name, ec);
    EF_CHECK(!ec || ec == std::errc::no_such_file_or_directory, "FashionMNIST: ", (dir / name).string(), ": ",
             ec.message());
    if (found) return (dir / name).string();
  }
  EF_ERROR("FashionMNIST: ", (dir / (stem + ".gz")).string(), " not found (nor its uncompressed ", stem,
           "); install it with: apt-get install dataset-fashion-mnist (files in ", kFashionMnistRoot,
           "), or pass the directory that holds the IDX files");
}

}  // namespace

Batch load_fashion_mnist(Split split, const std::string& root) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string images_path = find_part(root, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_part(root, prefix + "-labels-idx1-ubyte");

  Tensor images = read_idx(images_path, kFloat32);
  EF_CHECK(images.dim() == 3 && images.size(1) == kSide && images.size(2) == kSide, "FashionMNIST: ", images_path,
           " holds ", shape_str(images.shape()), ", expected [N, 28, 28] images");
  const Tensor labels = read_idx(labels_path);
  EF_CHECK(labels.dim() == 1 && labels.size(0) == images.size(0), "FashionMNIST: ", labels_path, " holds ",
           shape_str(labels.shape()), " labels for ", images.size(0), " images in ", images_path);
  const int64_t* l = labels.data<int64_t>();
  for (int64_t i = 0; i < labels.numel(); ++i)
    EF_CHECK(l[i] >= 0 && l[i] < kClasses, "FashionMNIST: ", labels_path, ": label ", i, " is ", l[i],
             ", expected 0 to 9");

  images.mul_(1.0 / 255.0);
  return {.images = images.view({images.size(0), 1, kSide, kSide}), .labels = labels};
}

const std::array<const char*, 10>& FashionMNIST::class_names() {
  static const std::array<const char*, 10> names{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

}  // namespace evenflow::data
