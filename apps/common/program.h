// The top level every program shares: parse the command line, run, and turn whatever is thrown
// into one line "<program>: error: <cause>" and an exit status -- 2 for bad input (an argument,
// device, dataset, checkpoint or output folder that cannot be used), 1 for a failure while running
// (a non-finite loss, a full disk) -- never a signal or a C++ runtime abort.
//
// Under mpirun or srun (Note [Processes] in parallel/process_group.h) every process runs the
// program; process 0 alone prints to stdout and writes the outputs (primary_process()), each reads
// its part of every batch (DataParallelModel::batch_part), and an error on one process is named on every
// other one before the job ends.
#pragma once

#include <CLI/App.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "evenflow/engine/device.h"

namespace evenflow::apps {

// A program's command line, `description` the first line of its --help. Made in program.cpp, the one
// file that includes all of CLI11 (its help formatter and its config-file reader): <CLI/CLI.hpp>
// cost each file that included it 11.4 s of compiling under CI's AddressSanitizer flags, <CLI/App.hpp>
// 4.9 (docs/contributing.md, "What CI runs"). A file that constructs a CLI::App itself needs
// <CLI/CLI.hpp>, whose definitions the App's constructor uses.
std::unique_ptr<CLI::App> make_app(const std::string& description);

// Parses the command line and calls run(); returns the exit status (run()'s, or 2 / 1 as above).
// Exceptions before setup_done() count as bad input, after it as failures while running.
int run_program(CLI::App& app, int argc, char** argv, const char* program, const std::function<int()>& run);

// What --version prints (every program has it, run_program adds it): the program, evenflow's
// version and commit, the CPU kernels chosen, whether CUDA (its architectures), NCCL, MPI and Ray
// were built in, and the GPUs visible.
std::string version_text(const std::string& program);

// The program's effective settings, every option with its value (given on the command line, read
// from --config FILE, or the default) as TOML that --config reads back: what Run writes as
// <out>/config.toml and into TensorBoard. Set by run_program once the command line is parsed.
const std::string& effective_settings();

// Called by a program once its input is checked and loaded, just before it starts working.
void setup_done();

// Whether this process prints and writes the outputs: process 0 of the job (the only one when it
// was not started by mpirun or srun).
bool primary_process();

// The devices a program trains on, for its first line: "cpu:0,cpu:1", and under mpirun
// "cpu:0,cpu:1 in each of 2 processes".
std::string describe_devices(const std::vector<Device>& devices);

// Options whose values are numbers within bounds, refused with a message that names the bounds:
// "--epochs: must be an integer >= 1, got 1.5". CLI11's own checks printed "Value 0 not in range
// 0.000000 to 1797693134862315708145...", NaN passed its range checks (NaN compares false), and an
// integer past int64 was saturated instead of refused.
//
// An integer option (or a list of them, std::vector<T>): decimal digits with an optional sign,
// within [min, max] (max: T's largest).
template <class T>
struct IntegerOf {
  using type = T;
};
template <class T>
struct IntegerOf<std::vector<T>> {
  using type = T;
};
template <class V, class T = typename IntegerOf<V>::type>
CLI::Option* add_integer(CLI::App& app, const std::string& name, V& value, const std::string& help,
                         std::type_identity_t<T> min, std::type_identity_t<T> max = std::numeric_limits<T>::max());

// A floating-point option: finite, and within `bounds`.
struct NumberBounds {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_excluded = false;  // (min, ... instead of [min, ...
  bool max_excluded = false;
};
CLI::Option* add_number(CLI::App& app, const std::string& name, double& value, const std::string& help,
                        NumberBounds bounds);

// The check behind add_integer, a CLI11 transform (it hands CLI11 the value's decimal digits):
// defined for int, int64_t and uint64_t.
template <class T>
CLI::Validator integer_check(T min, T max);

template <class V, class T>
CLI::Option* add_integer(CLI::App& app, const std::string& name, V& value, const std::string& help,
                         std::type_identity_t<T> min, std::type_identity_t<T> max) {
  return app.add_option(name, value, help)->transform(integer_check<T>(min, max));
}

}  // namespace evenflow::apps
