#include "apps/common/run_options.h"

#include <cstdio>

#include "engine/error.h"

namespace evenflow::apps {

void add_run_options(CLI::App& app, RunOptions& o, const std::string& seed_help) {
  app.add_option("--devices", o.devices,
                 "devices to train on, data-parallel: cpu (one CPU device), cpu:N (N CPU devices), cuda (every "
                 "GPU), cuda:0,1 (those)");
  app.add_option("--seed", o.seed, seed_help);
  app.add_option("--dtype", o.dtype, "float32 or float64");
  app.add_option("--data", o.data, "FashionMNIST folder (IDX files, gzip or raw)");
  app.add_option("--out", o.out, "output folder");
  app.add_option("--workers", o.workers, "data loader threads")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", o.threads,
                 "intra-op threads per CPU device (0: the hardware threads shared among the CPU devices)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--resume", o.resume, "continue from <out>/checkpoint.safetensors exactly");
  app.add_flag("--print-loss", o.print_loss, "print every step's loss at full precision");
}

void check_resume_metadata(const std::string& path, const std::map<std::string, std::string>& written,
                           const std::map<std::string, std::string>& expected) {
  for (const auto& [key, value] : expected) {
    const auto it = written.find(key);
    EF_CHECK(it != written.end() && it->second == value, "--resume: ", path, " was written with ", key, " ",
             it == written.end() ? "(none)" : it->second, ", this run has ", value);
  }
}

int run_program(CLI::App& app, int argc, char** argv, const char* program, const std::function<int()>& run) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return run();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 2;
  }
}

}  // namespace evenflow::apps
