#include "apps/common/run_options.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <system_error>

#include "evenflow/io/file.h"

namespace evenflow::apps {

void add_run_options(CLI::App& app, RunOptions& o, const std::string& seed_help) {
  app.add_option("--devices", o.devices,
                 "devices to train on, data-parallel: cpu (one CPU device), cpu:N (N CPU devices), cuda (every "
                 "GPU), cuda:0,1 (those)");
  app.add_option("--seed", o.seed, seed_help)->check(CLI::NonNegativeNumber);
  app.add_option("--dtype", o.dtype, "float32 or float64");
  app.add_option("--data", o.data, "FashionMNIST folder (IDX files, gzip or raw)");
  app.add_option("--out", o.out, "output folder");
  app.add_option("--workers", o.workers, "data loader threads")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", o.threads,
                 "intra-op threads per CPU device (0: the hardware threads shared among the CPU devices)")
      ->check(CLI::NonNegativeNumber);
  auto* resume = app.add_flag("--resume", o.resume, "continue from <out>/checkpoint.safetensors exactly");
  app.add_flag("--overwrite", o.overwrite, "start afresh even where <out> holds an earlier run's checkpoint")
      ->excludes(resume);
  app.add_flag("--print-loss", o.print_loss, "print every step's loss at full precision");
}

std::string metadata_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void check_resume_metadata(const std::string& path, const std::map<std::string, std::string>& written,
                           const std::map<std::string, std::string>& expected) {
  for (const auto& [key, value] : expected) {
    const auto it = written.find(key);
    std::string option = "--" + key;  // the command-line option of a setting ("batch_size": --batch-size)
    std::replace(option.begin(), option.end(), '_', '-');
    EF_CHECK(it != written.end() && it->second == value, "--resume: ", path, " was written with ", key, " ",
             it == written.end() ? "(none)" : it->second, ", this run has ", value,
             key == "app" ? "" : "; resume with the same " + option);
  }
}

void prepare_output_folder(const std::filesystem::path& dir, const std::filesystem::path& checkpoint, bool resume,
                           bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code ec;
  EF_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "--out ", dir.string(), " is a file, not a folder");
  fs::create_directories(dir, ec);
  EF_CHECK(!ec, "--out ", dir.string(), ": cannot create the folder: ", ec.message());
  const fs::path probe = dir / ".write_test";
  try {
    io::write_file_atomically(probe.string(), [](io::OutputFile& f) { f.write("ok\n", 3); });
  } catch (const Error& e) {
    EF_ERROR("--out ", dir.string(), " cannot hold the run's files: ", e.what());
  }
  fs::remove(probe, ec);
  io::remove_stale_temporaries(dir.string());
  EF_CHECK(resume || overwrite || !fs::exists(checkpoint, ec), "--out ", dir.string(), " already holds ",
           checkpoint.filename().string(),
           " from an earlier run: pass --resume to continue it, or --overwrite to start afresh and replace it");
}

void check_finite_loss(double loss, int64_t step, const char* what) {
  EF_CHECK(std::isfinite(loss), "step ", step, ": the ", what, " is ",
           std::isnan(loss) ? "NaN"
           : loss > 0       ? "inf"
                            : "-inf",
           "; stopping (the last checkpoint saved is intact; a smaller --lr may help)");
}

}  // namespace evenflow::apps
