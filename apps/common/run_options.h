// What the training programs (classify, segment, wgan_gp) share: the same options with the same
// names, meanings and checks, the exit rule (program.h), and one set of rules for their output
// folder, resuming and losses:
//  - a run never replaces another run's checkpoint unless told to (--overwrite), or continues it
//    (--resume), and finds out at once when its --out cannot be written;
//  - each save writes metrics.csv (and the other outputs) before the checkpoint, and a resume keeps
//    the metrics rows up to the checkpoint's step, so a run killed between the two resumes with
//    the history that matches its checkpoint (both or neither);
//  - a loss that stops being finite stops the run with an error naming the step, before a save, so
//    the last checkpoint is the last good one.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "apps/common/program.h"
#include "evenflow/data/fashion_mnist.h"
#include "evenflow/engine/error.h"

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
  bool overwrite = false;
  bool print_loss = false;
};

// --devices, --seed (described by seed_help), --dtype, --data, --out, --workers, --threads,
// --resume, --overwrite, --print-loss.
void add_run_options(CLI::App& app, RunOptions& o, const std::string& seed_help);

// A number as checkpoint metadata: exactly (%.17g), so two settings that differ never compare equal.
std::string metadata_number(double v);

// On --resume: ef::Error unless the checkpoint at `path` was written with every (key, value) of
// `expected` (the settings a resumed run must share with the run that wrote it).
void check_resume_metadata(const std::string& path, const std::map<std::string, std::string>& written,
                           const std::map<std::string, std::string>& expected);

// Makes `dir` ready for a run's outputs: creates it, proves it writable (a folder that cannot hold
// a checkpoint is found before any work), removes temporaries that killed saves left there, and
// refuses (ef::Error naming --resume and --overwrite) when it already holds `checkpoint` and the
// run neither resumes nor overwrites.
void prepare_output_folder(const std::filesystem::path& dir, const std::filesystem::path& checkpoint, bool resume,
                           bool overwrite);

// ef::Error naming `what` and the step when `loss` is NaN or infinite.
void check_finite_loss(double loss, int64_t step, const char* what);

// On --resume, the metrics rows (each with a `step`) that belong to a checkpoint at `step`: a save
// writes the metrics first, so rows past the checkpoint come from a run killed before its
// checkpoint was written and are dropped; a history that does not reach the checkpoint's step is an
// ef::Error naming `csv_path`.
template <typename Row>
std::vector<Row> rows_up_to_checkpoint(std::vector<Row> rows, int64_t step, const std::string& csv_path) {
  std::erase_if(rows, [&](const Row& r) { return r.step > step; });
  EF_CHECK(step == 0 || (!rows.empty() && rows.back().step == step), "--resume: ", csv_path, " has no row for step ",
           step, ", the checkpoint's step (its last row is at step ",
           rows.empty() ? int64_t{0} : static_cast<int64_t>(rows.back().step), ")");
  return rows;
}

}  // namespace evenflow::apps
