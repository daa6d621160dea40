/// @file
/// FashionMNIST (Xiao et al., 2017): 28x28 grey images of clothing in 10 classes, 60000 for
/// training and 10000 for testing, as IDX files. Debian's package dataset-fashion-mnist installs
/// them, gzip-compressed, under /usr/share/datasets/fashion-mnist; uncompressed copies are read too.
#pragma once

#include <array>
#include <string>

#include "evenflow/data/dataset.h"

namespace evenflow::data {

/// Where Debian's package dataset-fashion-mnist installs the files.
inline constexpr const char* kFashionMnistRoot = "/usr/share/datasets/fashion-mnist";

/// Which part of the dataset: Train (60000 examples) or Test (10000).
enum class Split : uint8_t { Train, Test };

/// The whole split: images float32 [N, 1, 28, 28] in [0, 1], labels int64 [N] in [0, 9]. Reads
/// `<root>/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`; a missing file is an ef::Error
/// naming the path and saying how to install the dataset.
Batch load_fashion_mnist(Split split, const std::string& root = kFashionMnistRoot);

/// FashionMNIST as a TensorDataset: load_fashion_mnist()'s images and labels, on cpu:0.
class FashionMNIST final : public TensorDataset {
 public:
  /// Loads `split` from the IDX files under `root`, as load_fashion_mnist (ef::Error when a file is
  /// missing or malformed).
  explicit FashionMNIST(Split split, const std::string& root = kFashionMnistRoot)
      : TensorDataset(load_fashion_mnist(split, root)) {}

  /// Label i's name: "T-shirt/top", "Trouser", ..., "Ankle boot".
  static const std::array<const char*, 10>& class_names();
};

}  // namespace evenflow::data
