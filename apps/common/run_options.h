// What the training programs (classify, segment, wgan_gp) share on the command line: the same
// options with the same names, meanings and checks, and the same exit rule (a bad argument, device,
// dataset or checkpoint is one line "<program>: error: ..." and exit 2).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "data/fashion_mnist.h"

namespace evenflow::apps {

struct RunOptions {
  std::string devices = "cpu";
  uint64_t seed = 0;
  std::string dtype = "float32";
  std::string data = data::kFashionMnistRoot;
  std::string out;
  int workers = 2;
  int threads = 0;  // 0: parallel::cpu_threads_per_device
  bool resume = false;
  bool print_loss = false;
};

// --devices, --seed (described by seed_help), --dtype, --data, --out, --workers, --threads,
// --resume, --print-loss.
void add_run_options(CLI::App& app, RunOptions& o, const std::string& seed_help);

// On --resume: ef::Error unless the checkpoint at `path` was written with every (key, value) of
// `expected` (the settings a resumed run must share with the run that wrote it).
void check_resume_metadata(const std::string& path, const std::map<std::string, std::string>& written,
                           const std::map<std::string, std::string>& expected);

// Parses the command line and calls run(); returns the exit status.
int run_program(CLI::App& app, int argc, char** argv, const char* program, const std::function<int()>& run);

}  // namespace evenflow::apps
