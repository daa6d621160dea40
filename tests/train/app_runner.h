// What the end-to-end tests of the apps share: running a program and capturing its output, and a
// tiny synthetic FashionMNIST written as raw IDX files (so CI needs no dataset).
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/io/test_files.h"

namespace evenflow::testing {

struct AppResult {
  int rc = -1;
  std::string output;  // stdout and stderr
};

inline AppResult run_app(const std::string& binary, const std::string& args) {
  const std::string cmd = binary + " " + args + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  AppResult r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The output of a run that had to succeed: a run that exited with another code fails the test, its
// output the message.
inline const std::string& output_of(const AppResult& r) {
  REQUIRE_MESSAGE(r.rc == 0, r.output);
  return r.output;
}

// n images of 28x28 bytes (a fixed pseudo-random pattern) and labels 0..9, as the split `prefix`
// ("train" or "t10k") of a FashionMNIST folder.
inline void write_fashion_split(const TempDir& dir, const std::string& prefix, uint32_t n, uint32_t salt) {
  std::string pixels, labels;
  uint32_t x = 12345 + salt;
  for (uint32_t i = 0; i < n * 28 * 28; ++i) {
    x = x * 1103515245u + 12345u;
    pixels += static_cast<char>(x >> 24);
  }
  for (uint32_t i = 0; i < n; ++i) labels += static_cast<char>((i * 7 + salt) % 10);
  write_bytes(dir.file(prefix + "-images-idx3-ubyte"), idx_bytes(0x08, {n, 28, 28}, pixels));
  write_bytes(dir.file(prefix + "-labels-idx1-ubyte"), idx_bytes(0x08, {n}, labels));
}

// The lines "step N loss X" of an output, as (N, X) with X as printed.
inline std::vector<std::pair<int, std::string>> step_losses(const std::string& output) {
  std::vector<std::pair<int, std::string>> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    int step = 0;
    char value[64];
    if (std::sscanf(line.c_str(), "step %d loss %63s", &step, value) == 2) out.emplace_back(step, value);
  }
  return out;
}

// The lines "step ... loss X" of an output (wgan_gp's "step N critic loss X" too), as (the text
// before " loss ", X as a number).
inline std::vector<std::pair<std::string, double>> labelled_losses(const std::string& output) {
  std::vector<std::pair<std::string, double>> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(" loss ");
    if (line.rfind("step ", 0) == 0 && at != std::string::npos)
      out.emplace_back(line.substr(0, at), std::stod(line.substr(at + 6)));
  }
  return out;
}

// Checks the TensorBoard event files of run folder `dir` with TensorBoard's own reader
// (scripts/check_tensorboard.py: checksums, every metrics.csv value as a scalar -- only the steps of
// the `steps_only` columns --, `scalars` and `images`, comma-separated, present), where the build
// found its venv (scripts/setup.sh --tensorboard); says so and checks nothing otherwise.
inline void check_tensorboard(const std::string& dir, [[maybe_unused]] const std::string& scalars = "",
                              [[maybe_unused]] const std::string& images = "",
                              [[maybe_unused]] const std::string& steps_only = "") {
#ifdef EF_TENSORBOARD_CHECK
  const AppResult r = run_app(EF_TENSORBOARD_CHECK, dir + " --scalars '" + scalars + "' --images '" + images +
                                                        "' --steps-only '" + steps_only + "'");
  CHECK_MESSAGE(r.rc == 0, r.output);
#else
  MESSAGE("not checking the TensorBoard files of ", dir, ": configured without scripts/setup.sh --tensorboard");
#endif
}

// The devices a program said it trained on: its "training ... on DEVICES, ..." line's list
// ("cpu:0,cpu:1,cpu:2", "cpu:0,cpu:1 in each of 2 processes"), or "(no training line)". A test that
// compares N devices with one checks N were used, not only that both runs agree.
inline std::string trained_on(const std::string& output) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("training", 0) != 0) continue;
    const size_t on = line.find(" on ");
    if (on == std::string::npos) continue;
    const size_t start = on + 4;
    return line.substr(start, line.find(", ", start) - start);
  }
  return "(no training line)";
}

// "cpu:0,cpu:1,...,cpu:N-1": what trained_on gives for --devices cpu:N.
inline std::string cpu_devices(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i ? ",cpu:" : "cpu:") + std::to_string(i);
  return out;
}

inline std::string first_line(const std::string& path) {
  const std::string text = read_bytes(path);
  return text.substr(0, text.find('\n'));
}

}  // namespace evenflow::testing
