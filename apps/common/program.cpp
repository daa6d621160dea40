// The programs' top level (see program.h).
#include "apps/common/program.h"

#include <CLI/CLI.hpp>  // all of CLI11, for make_app (program.h)
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "ef_commit.h"  // EF_COMMIT, written at build time (cmake/commit.cmake)
#include "evenflow/parallel/process_group.h"

namespace evenflow::apps {

namespace {

std::atomic<bool> g_setup_done{false};
std::string g_settings;  // effective_settings(), written once, before run() starts

// One line: a message from the system or a library may hold line breaks.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

const std::string& effective_settings() {
  return g_settings;
}

void setup_done() {
  g_setup_done = true;
}

bool primary_process() {
  return parallel::processes()->rank() == 0;
}

std::string describe_devices(const std::vector<Device>& devices) {
  std::string names;
  for (const Device& d : devices) names += (names.empty() ? "" : ",") + d.str();
  const int processes = parallel::processes()->size();
  if (processes > 1) names += " in each of " + std::to_string(processes) + " processes";
  return names;
}

std::unique_ptr<CLI::App> make_app(const std::string& description) {
  return std::make_unique<CLI::App>(description);
}

CLI::Validator finite() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        std::size_t used = 0;
        double v = 0;
        try {
          v = std::stod(value, &used);
        } catch (const std::exception&) {
          return "not a number: " + value;
        }
        if (used != value.size() || !std::isfinite(v)) return "not a finite number: " + value;
        return "";
      },
      "FINITE");
}

std::string version_text(const std::string& program) {
  // A native build's kernels were compiled with this file's -march: its macros say how wide.
#if defined(__AVX512F__)
  const char* native_width = "AVX-512";
#elif defined(__AVX2__)
  const char* native_width = "AVX2";
#else
  const char* native_width = "x86-64";
#endif
  const std::string isa = cpu_kernels_isa();
  std::string text = program + " (evenflow " + EF_VERSION + ", commit " + EF_COMMIT + ")\n";
  text += "CPU kernels: " +
          (isa == "native" ? std::string("native, ") + native_width + " (built for the building machine's CPU)"
                           : isa + " (the widest this CPU runs of baseline, avx2 and avx512)") +
          (EF_ONEDNN_BUILT ? "; oneDNN" : "; without oneDNN") + "\n";
  const std::string cuda = EF_CUDA_BUILT;
  if (cuda.empty()) {
    text += "CUDA: not built\n";
  } else {
    const int gpus = cuda_device_count();
    text +=
        "CUDA: " + cuda + (EF_NCCL_BUILT ? ", NCCL" : ", without NCCL") + "; " +
        (gpus > 0 ? std::to_string(gpus) + " GPU(s) visible" : "no GPU visible (" + cuda_unavailable_reason() + ")") +
        "\n";
  }
  text += std::string("processes: ") +
          (parallel::multi_process_support() ? "MPI (mpirun, srun)" : "one (built without MPI)") + "\n";
  text += std::string("Ray: ") + (EF_RAY_BUILT ? "built in (--ray)" : "not built");
  return text;
}

int run_program(CLI::App& app, int argc, char** argv, const char* program, const std::function<int()>& run) {
  app.set_version_flag(
      "--version", [program] { return version_text(program); },
      "print the version, the commit and what this build runs on, and exit");
  app.set_config("--config", "",
                 "read options from this TOML file (name = value, the long options' names; the command line "
                 "wins): e.g. the config.toml a run wrote into its --out");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Every option's effective value as its default, so that the TOML has each option's value,
  // given or not (config_to_str writes a default only where it was captured). A flag or an
  // optional-value option (--ray) that was not given is left out: CLI11 would write it as `false`,
  // which reads back as given (--resume and --overwrite would then exclude each other).
  for (CLI::Option* opt : app.get_options()) {
    if (!opt->get_configurable()) continue;
    opt->capture_default_str();
    if (opt->get_expected_min() == 0 && opt->count() == 0) opt->configurable(false);
  }
  g_settings = app.config_to_str(true, false);
  std::string cause;
  const parallel::ProcessGroup* job = nullptr;
  try {
    job = parallel::processes().get();
    // One process prints: the others' output would repeat it, interleaved.
    if (job->rank() > 0 && std::freopen("/dev/null", "w", stdout) == nullptr) {
      std::fprintf(stderr, "%s: warning: process %d could not silence its output\n", program, job->rank());
    }
    return run();
  } catch (const std::bad_alloc&) {
    cause = "out of memory (a size too large for this machine?)";
  } catch (const std::exception& e) {
    cause = e.what();
  } catch (...) {
    cause = "unknown exception";
  }
  if (job != nullptr && job->size() > 1) {
    std::fprintf(stderr, "%s: error: process %d of %d: %s\n", program, job->rank(), job->size(),
                 one_line(cause).c_str());
    std::fflush(stderr);
    // The others hear why at once ("process r of P failed: ..."), instead of at the collective timeout.
    parallel::processes()->fail(one_line(cause));
    return g_setup_done ? 1 : 2;
  }
  std::fprintf(stderr, "%s: error: %s\n", program, one_line(cause).c_str());
  return g_setup_done ? 1 : 2;
}

}  // namespace evenflow::apps
