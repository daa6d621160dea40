// Reading the reference values that scripts/make_layer_fixtures.py computed with PyTorch and
// stored as JSON under tests/fixtures/ (EF_FIXTURE_DIR): tensors are {"shape", "dtype", "data"}.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "evenflow/layers/module.h"
#include "tests/testing/json_file.h"

namespace evenflow::testing {

using Json = nlohmann::json;

inline Json load_fixture(const std::string& file) {
  return read_json_file(std::string(EF_FIXTURE_DIR) + "/" + file, "scripts/make_layer_fixtures.py");
}

inline Tensor tensor_from_json(const Json& j, const Device& device = cpu()) {
  const Shape shape = j.at("shape").get<Shape>();
  const std::string dtype = j.at("dtype").get<std::string>();
  if (dtype == "int64") return from_int_vector(j.at("data").get<std::vector<int64_t>>(), shape, device);
  EF_CHECK(dtype == "float32" || dtype == "float64", "fixture: unknown dtype ", dtype);
  return from_vector(j.at("data").get<std::vector<double>>(), shape,
                     {.dtype = dtype == "float32" ? kFloat32 : kFloat64, .device = device});
}

// [[name, tensor], ...] -> NamedTensors, order kept.
inline nn::NamedTensors named_from_json(const Json& j) {
  nn::NamedTensors out;
  for (const Json& pair : j) out.emplace_back(pair.at(0).get<std::string>(), tensor_from_json(pair.at(1)));
  return out;
}

}  // namespace evenflow::testing
