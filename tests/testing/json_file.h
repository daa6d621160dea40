// A JSON file read into nlohmann::json, parsed here once: the parser is most of the code
// nlohmann::json::parse instantiates, and each test file that called it compiled it again (a quarter
// of tests/layers/test_module.cpp's compile time under AddressSanitizer; docs/contributing.md,
// "What CI runs").
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace evenflow::testing {

// The JSON in the file at `path`; ef::Error naming the file, with `regenerate` (what writes it)
// when it cannot be opened.
nlohmann::json read_json_file(const std::string& path, const std::string& regenerate);

}  // namespace evenflow::testing
