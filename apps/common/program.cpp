// The programs' top level (see program.h).
#include "apps/common/program.h"

#include <CLI/CLI.hpp>  // all of CLI11, for make_app (program.h)
#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

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

// A parse error's text, CLI11's words for a --config file's key or file put as ours.
std::string parse_error_text(const CLI::App& app, const CLI::ParseError& e, const std::string& program) {
  const std::string text = e.what();
  const bool config_error = dynamic_cast<const CLI::ConfigError*>(&e) != nullptr;
  const std::string file = "--config " + (app.get_config_ptr() ? app.get_config_ptr()->as<std::string>() : "");
  // An unknown key: "INI was not able to parse <key>"; a section [x] reaches here as "x.++", CLI11's
  // mark for opening it.
  const std::string unknown_key = "INI was not able to parse ";
  if (config_error && text.starts_with(unknown_key)) {
    const std::string key = text.substr(unknown_key.size());
    if (key.ends_with(".++"))
      return file + ": [" + key.substr(0, key.size() - 3) + "]: " + program +
             " reads its options as keys outside any section";
    return file + ": " + key + " is not an option of " + program;
  }
  const std::string not_configurable = ": This option is not allowed in a configuration file";
  if (config_error && text.ends_with(not_configurable)) {
    const std::string key = text.substr(0, text.size() - not_configurable.size());
    return file + ": " + key + " is not a setting of the run; give --" + key + " on the command line";
  }
  if (dynamic_cast<const CLI::FileError*>(&e) != nullptr) return "--config " + text;  // "<file> was not readable"
  return text;
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

namespace {

// --help's option column with each option's bounds and default in words: "--steps INT (>= 1,
// default 10000)" where CLI11 writes "--steps INT:>= 1=10000".
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string rest = CLI::Formatter::make_option_opts(opt);
    const std::string type = opt->get_type_name(), value = opt->get_default_str();
    const std::string cli11 = " " + type + (value.empty() ? "" : "=" + value);
    if (opt->get_type_size() == 0 || !opt->get_option_text().empty() || !rest.starts_with(cli11)) return rest;
    rest.erase(0, cli11.size());
    // The type, then its validators' descriptions, each after a ':'.
    const std::size_t colon = type.find(':');
    std::string notes = colon == std::string::npos ? "" : type.substr(colon + 1);
    for (char& c : notes)
      if (c == ':') c = ',';
    // An option whose value may be left out (--ray) takes its "default" when given alone; without
    // the option, it is off.
    const std::string label = opt->get_expected_min() == 0 ? "given alone: " : "default ";
    if (!value.empty()) notes += (notes.empty() ? "" : ", ") + label + value;
    return " " + type.substr(0, colon) + (notes.empty() ? "" : " (" + notes + ")") + rest;
  }
};

}  // namespace

std::unique_ptr<CLI::App> make_app(const std::string& description) {
  auto app = std::make_unique<CLI::App>(description);
  app->formatter(std::make_shared<HelpFormatter>());
  app->option_defaults()->always_capture_default();  // --help shows each option's default
  return app;
}

namespace {

// A bound as --help and the messages print it: the shortest text that reads back as it (0.99999,
// not 0.99999000000000005).
std::string bound_text(double v) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, v).ptr;
  return std::string(text, end);
}
template <class I>
std::string bound_text(I v) {
  return std::to_string(v);
}

// ">= 1", "in [1, 4096]", "> 0", "in [0, 1)": what a value must be, after "must be an integer ".
template <class T>
std::string bounds_text(T min, T max, bool min_excluded, bool max_excluded, bool min_is_lowest, bool max_is_largest) {
  if (min_is_lowest && max_is_largest) return "";
  if (max_is_largest) return (min_excluded ? "> " : ">= ") + bound_text(min);
  if (min_is_lowest) return (max_excluded ? "< " : "<= ") + bound_text(max);
  return std::string("in ") + (min_excluded ? "(" : "[") + bound_text(min) + ", " + bound_text(max) +
         (max_excluded ? ")" : "]");
}

// A number's text as std::from_chars reads it: spaces around it dropped (CLI11's conversions skip
// them: "--workers '0, 1'" reads " 1"), and a "+" before it, which from_chars does not take.
std::string_view number_text(std::string_view text) {
  const std::size_t first = text.find_first_not_of(" \t"), last = text.find_last_not_of(" \t");
  if (first == std::string_view::npos) return {};
  text = text.substr(first, last - first + 1);
  if (text.size() > 1 && text[0] == '+' && text[1] != '-') text.remove_prefix(1);
  return text;
}

}  // namespace

template <class I>
CLI::Validator integer_check(I min, I max) {
  // An unsigned option's messages say ">= 0" all the same.
  const std::string bounds =
      bounds_text(min, max, false, false, std::is_signed_v<I> && min == std::numeric_limits<I>::lowest(),
                  max == std::numeric_limits<I>::max());
  // A value past the type's range is refused with the range written out (">= 1" would not say why).
  const std::string range = bounds_text(min, max, false, false, false, false);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        // Decimal digits with a sign, handed on as the value's own digits: CLI11 converts with strtoll
        // in base 0, which reads "010" as 8.
        std::string_view digits = number_text(text);
        // "-0" is 0 for an unsigned type too (from_chars takes no "-" there).
        if (std::is_unsigned_v<I> && digits.size() > 1 && digits[0] == '-' &&
            digits.find_first_not_of('0', 1) == std::string_view::npos)
          digits.remove_prefix(1);
        I v{};
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
        const bool whole = !digits.empty() && end == digits.data() + digits.size();
        if (whole && ec == std::errc() && v >= min && v <= max) {
          text = std::to_string(v);
          return "";
        }
        const bool past_type = whole && ec == std::errc::result_out_of_range;
        const std::string& wanted = past_type ? range : bounds;
        return "must be an integer" + (wanted.empty() ? "" : " " + wanted) + ", got \"" + text + "\"";
      },
      bounds);
}

template CLI::Validator integer_check(int min, int max);
template CLI::Validator integer_check(int64_t min, int64_t max);
template CLI::Validator integer_check(uint64_t min, uint64_t max);

CLI::Option* add_number(CLI::App& app, const std::string& name, double& value, const std::string& help,
                        NumberBounds b) {
  const std::string bounds =
      bounds_text(b.min, b.max, b.min_excluded, b.max_excluded, std::isinf(b.min), std::isinf(b.max));
  CLI::Validator check(
      [=](std::string& text) -> std::string {
        // Decimal, handed on as read (strtod, CLI11's conversion, reads it the same way); NaN and the
        // infinities parse, and are refused as not finite.
        const std::string_view digits = number_text(text);
        double v = 0;
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
        const bool whole = !digits.empty() && end == digits.data() + digits.size();
        const bool inside = (b.min_excluded ? v > b.min : v >= b.min) && (b.max_excluded ? v < b.max : v <= b.max);
        if (whole && ec == std::errc() && std::isfinite(v) && inside) {
          text = digits;
          return "";
        }
        const std::string past = whole && ec == std::errc::result_out_of_range ? " (past a double's range)" : "";
        return "must be a finite number" + (bounds.empty() ? "" : " " + bounds) + ", got \"" + text + "\"" + past;
      },
      bounds);
  return app.add_option(name, value, help)->transform(check);
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
  // A key of the --config file that names no option is refused: a misspelt setting would otherwise
  // be dropped without a word, and the run made with its default.
  app.allow_config_extras(CLI::config_extras_mode::error);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "%s: error: %s\n(%s --help lists the options)\n", program,
                 one_line(parse_error_text(app, e, program)).c_str(), program);
    return 2;
  }
  // Every option's effective value as its default, so that the TOML has each option's value,
  // given or not (config_to_str writes a default only where it was captured). Left out where not
  // given: a flag or an optional-value option (--ray), which CLI11 would write as `false`, read back
  // as given (--resume and --overwrite would then exclude each other); an option that excludes one
  // that was given (segment's --loss beside --compare), whose default would read back as given; and
  // one that states no default (wgan_gp's --width and --norm, the model's), so that the file read
  // back with another --model takes that model's.
  for (CLI::Option* opt : app.get_options()) {
    if (!opt->get_configurable()) continue;
    const bool no_default = opt->get_default_str().empty();
    opt->capture_default_str();
    const bool excluded =
        std::ranges::any_of(opt->get_excludes(), [](const CLI::Option* other) { return other->count() > 0; });
    if (opt->count() == 0 && (opt->get_expected_min() == 0 || excluded || no_default)) opt->configurable(false);
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
