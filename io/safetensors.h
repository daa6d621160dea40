/// @file
/// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors), which
/// PyTorch reads with safetensors.torch.load_file: an 8-byte little-endian header length, a JSON
/// header {"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {string: string}} padded
/// with spaces to 8 bytes, then the tensors' bytes, contiguous and little-endian, without gaps.
/// This layer works on named tensors; a Module's state_dict is adapted to it elsewhere. Saves are
/// atomic (Note [Atomic writes] in io/file.h); loads check every field and offset and name the
/// key or byte offset that is wrong, and refuse headers nested deeper than any safetensors header
/// (Note [Header nesting] in io/safetensors.cpp).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "evenflow/engine/device.h"
#include "evenflow/engine/tensor.h"

namespace evenflow::io {

/// Tensors with their names, in order (the same type as nn::NamedTensors, a state dict).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// The contents of a safetensors file, as load_safetensors returns them.
struct SafetensorsFile {
  NamedTensors tensors;                         ///< on cpu:0, in the order of their bytes in the file
  std::map<std::string, std::string> metadata;  ///< the header's "__metadata__" (empty if none)

  bool contains(const std::string& name) const;  ///< Whether a tensor is called `name`.
  /// The tensor called `name`; throws ef::Error naming it when the file has none.
  const Tensor& at(const std::string& name) const;
};

/// Writes float32, float64, bfloat16 and int64 tensors of any device and strides (copied to the host,
/// contiguous). Names must be unique, non-empty and not "__metadata__".
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});
/// Reads every tensor onto cpu:0; the caller moves them where they belong (or uses load_into).
SafetensorsFile load_safetensors(const std::string& path);
/// The same for the bytes of a whole file already in memory; `name` stands for the path in errors.
SafetensorsFile load_safetensors_bytes(std::string_view bytes, const std::string& name = "(bytes)");

/// What load_into found besides the tensors it copied.
struct LoadReport {
  std::vector<std::string> missing;     ///< targets the file has no tensor for
  std::vector<std::string> unexpected;  ///< tensors of the file no target asked for
};

/// Copies the file's values into existing tensors (on any device; parameters that require grad
/// included). A tensor whose shape or dtype differs from its target is always an error naming both;
/// missing and unexpected keys are errors when `strict`, else reported. Everything is checked
/// before anything is copied, so a failed load leaves every target as it was.
LoadReport load_into(const SafetensorsFile& file, const NamedTensors& targets, bool strict = true);

/// A device's generator state as an int64 tensor [2] = {seed, offset} (the bits of the unsigned
/// values), so it can be saved with the model; and back, checking the shape and dtype.
Tensor generator_state_to_tensor(const GeneratorState& state);
/// The inverse of generator_state_to_tensor: `t` must be a defined int64 tensor [2] (on any
/// device), else ef::Error.
GeneratorState generator_state_from_tensor(const Tensor& t);

}  // namespace evenflow::io
