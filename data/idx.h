/// @file
/// The IDX format of MNIST and FashionMNIST (http://yann.lecun.com/exdb/mnist/): a magic of four
/// bytes {0, 0, type, ndims}, ndims big-endian uint32 sizes, then the values big-endian and
/// row-major. Files may be gzip-compressed (zlib tells by their first bytes) or raw.
#pragma once

#include <optional>
#include <string>

#include "evenflow/engine/tensor.h"

namespace evenflow::data {

/// Reads an IDX file onto cpu:0. The values are converted to `dtype`, by default int64 for the
/// integer types (0x08 ubyte, 0x09 byte, 0x0B short, 0x0C int), float32 for 0x0D and float64 for
/// 0x0E. Checks the magic, the type byte, the number of dims (1 to 8), that the dims can be
/// addressed, and that the data is exactly as long as the dims say. Float data converted to int64
/// is truncated toward zero, and a value int64 cannot hold (NaN, infinite, 2^63 or more in
/// magnitude) is an error. Every failure is an ef::Error naming the file and what was wrong.
Tensor read_idx(const std::string& path, std::optional<DType> dtype = std::nullopt);

}  // namespace evenflow::data
