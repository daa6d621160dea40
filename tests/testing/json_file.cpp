#include "tests/testing/json_file.h"

#include <fstream>

#include "evenflow/engine/error.h"

namespace evenflow::testing {

nlohmann::json read_json_file(const std::string& path, const std::string& regenerate) {
  std::ifstream in(path);
  EF_CHECK(in.good(), "cannot open fixture ", path, " (regenerate with ", regenerate, ")");
  return nlohmann::json::parse(in);
}

}  // namespace evenflow::testing
