// A training run, as the programs (classify, segment, wgan_gp) share it: the same options with the
// same names, meanings and checks; one component that owns the run's folder and state -- the
// refuse / --resume / --overwrite policy, the metrics log and its TensorBoard events, the checkpoint
// of the whole training state and the resume from it, the progress in the program's unit, the loss
// checks -- and the epoch loop of the programs that train by epochs. A program keeps only its
// model, loss and schedule.
//
// Note [Save order]
//  - a run never replaces another run's checkpoint unless told to (--overwrite), or continues it
//    (--resume), and finds out at once when its --out cannot be written;
//  - each save writes metrics.csv and the other outputs before the checkpoint, and a resume keeps
//    the metrics rows up to the checkpoint's step, so a run killed between the two resumes with
//    the history that matches its checkpoint (both or neither);
//  - a loss that stops being finite stops the run with an error naming the step, before a save, so
//    the last checkpoint is the last good one.
#pragma once

#include <CLI/App.hpp>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "apps/common/image.h"
#include "apps/common/metrics.h"
#include "apps/common/program.h"
#include "evenflow/data/fashion_mnist.h"
#include "evenflow/data/loader.h"
#include "evenflow/io/checkpoint.h"
#include "evenflow/io/event_file.h"
#include "evenflow/parallel/device_group.h"
#include "evenflow/parallel/training_state.h"

namespace evenflow::apps {

struct RunOptions {
  std::string devices = "auto";      // run_devices: every GPU, else cpu_fallback
  std::string cpu_fallback = "cpu";  // what --devices auto trains on without a GPU (not an option)
  uint64_t seed = 0;
  std::string dtype = "float32";
  std::string precision = "fp32";  // fp32, or bf16: products and convolutions in bfloat16
  std::string data = data::kFashionMnistRoot;
  std::string out;
  int workers = 2;
  int threads = 0;  // 0: parallel::cpu_threads_per_device
  bool resume = false;
  bool overwrite = false;
  bool print_loss = false;
  bool cudnn_benchmark = false;      // CudaMath::benchmark, set by Run
  bool cudnn_deterministic = false;  // CudaMath::deterministic, set by Run
  bool cudnn_bf16_results = false;   // CudaMath::allow_bf16_conv_results, set by Run
  bool cuda_graph = false;           // the training step recorded and replayed (ReplayedStep)
};

// --devices, --seed (described by seed_help), --dtype, --precision, --data, --out, --workers,
// --threads, --resume, --overwrite, --print-loss, --cudnn-benchmark, --cudnn-deterministic,
// --cudnn-bf16-results, --cuda-graph.
void add_run_options(CLI::App& app, RunOptions& o, const std::string& seed_help);

// The devices --devices names: "auto" is every GPU (`cuda`) where one is visible, else
// o.cpu_fallback; anything else as parallel::devices reads it (ef::Error naming what is wrong).
std::vector<Device> run_devices(const RunOptions& o);

// The dtype the model's products and convolutions compute in for --precision (Note [bfloat16
// compute] in engine/ops.h), checked against --dtype: ef::Error unless fp32, or bf16 with float32.
DType compute_dtype(const RunOptions& o);

// "float32", "float64", or "float32 weights, bfloat16 compute": what the programs print at the start.
std::string describe_precision(const RunOptions& o);

// Sets a network's compute dtype for --precision (Module::set_compute_dtype), then each of
// `float32_layers` (dotted child names) back to float32. Those are the layers where bfloat16 gains
// nothing:
// - the convolution that reads the one-channel images (or, in wgan_gp's generators, the one that
//   writes them): a small part of the work (wgan_gp's critic: 6% of its convolutions' FLOPs), one
//   channel is too few for oneDNN's bfloat16 kernels, slower there than its float32 ones, and where
//   they do not run, the op rounds the operands for the float32 kernels, passes that only cost (the
//   wgan_gp step was a little faster with the generator's last layer float32; docs/benchmarks.md,
//   "oneDNN convolution dispatch" and "The program's host work"); while rounding the images is the
//   largest single source of error in a gradient penalty: the wgan_gp critic's penalty gradients
//   moved from 1.11e-2 to 8.9e-3 relative error against float64 at worst (scripts/bench_penalty.sh,
//   Intel Sapphire Rapids);
// - a critic's score layer, the product with one output per image: 2 FLOPs per feature, fewer than
//   rounding its operands takes (no backend runs a one-column product in bfloat16 itself, so each of
//   its passes rounded two operands: 94 of the 845 kernel calls of wgan_gp's bfloat16 step, each a
//   node of its CUDA graph; docs/benchmarks.md, "A critic's score layer in float32 under bfloat16").
void set_precision(nn::Module& net, DType compute, std::span<const char* const> float32_layers);

// What the programs that train by epochs (classify, segment) add: --epochs, --batch-size, --lr
// (Adam's) and --steps (a stop after that many steps in all, 0: none). Each program sets its defaults.
struct EpochOptions : RunOptions {
  int64_t epochs = 10;
  int64_t batch_size = 100;
  double lr = 1e-3;
  int64_t steps = 0;
  bool augment = false;  // the program's random augmentation of the training images
  std::string ray;       // a Ray cluster's address: the training batches are made there
};
// add_run_options, and the six options of EpochOptions.
void add_epoch_options(CLI::App& app, EpochOptions& o, const std::string& seed_help);

// A number as checkpoint metadata: exactly (%.17g), so two settings that differ never compare equal.
std::string metadata_number(double v);

class Run {
 public:
  // A run in folder `out` (the options' --out, or a --compare loss's folder in it) that logs
  // `metric_columns` and saves `metadata` (the settings a resumed run must share, "app" among them:
  // a resume with another value is refused, naming the option). Process 0 makes the folder ready:
  // creates it, proves it writable, removes temporaries of killed saves, and refuses (ef::Error
  // naming --resume and --overwrite) when it holds a checkpoint the run neither resumes nor
  // overwrites.
  Run(const RunOptions& options, std::filesystem::path out, std::vector<std::string> metric_columns,
      std::map<std::string, std::string> metadata);

  bool primary() const { return primary_; }  // process 0: prints and writes (program.h)
  std::string file(const std::string& name) const { return (out_ / name).string(); }
  const std::filesystem::path& folder() const { return out_; }
  const MetricsLog& metrics() const { return metrics_; }
  io::TrainingProgress& progress() { return progress_; }

  // A row of metrics.csv (MetricsLog::append), and on process 0 each of its values but the step as
  // a TensorBoard scalar of that name at the row's step (values not measured, NaN, are left out).
  // The event file is flushed, so `tensorboard --logdir` shows the row at once.
  void log(const std::vector<std::pair<std::string, double>>& values);
  // A TensorBoard scalar that is not a metrics.csv column (e.g. the learning rate); process 0.
  void scalar(const std::string& tag, double value, int64_t step);
  // A TensorBoard image (e.g. the samples, the predictions); process 0.
  void image(const std::string& tag, const RgbImage& image, int64_t step);

  // With --resume, continues from the folder's checkpoint: `state` and the progress from it, the
  // metrics up to its step, and a line saying where ("resuming from ... at <unit> <step>"). A
  // missing checkpoint is an error unless `start_if_missing` (--compare reaching a loss it had not
  // started). Returns whether it resumed.
  bool resume(parallel::TrainingState& state, const std::string& unit, bool start_if_missing = false);
  // Note [Save order], on process 0: metrics.csv, then `outputs` (module files, plots), then the
  // checkpoint of `state` at progress().
  void save(const parallel::TrainingState& state, const std::function<void()>& outputs) const;

  // A loss read on the host at `step`: ef::Error unless finite (naming the step and `what`), and
  // with --print-loss the line "<label> loss <x>" at full precision.
  void check_loss(double loss, int64_t step, const std::string& what, const std::string& label) const;

  // One training step of the epoch loop: trains on a batch given as chunks on the devices -- images
  // (in the loop's dtype) and labels, chunk r on devices[r], split as DataParallelModel::scatter
  // splits a batch; `rows` are the batch's rows in the job's (Batch::rows, for scatter(chunks, rows))
  // -- and returns its loss, on the first device. It may be recorded and replayed (Note [Recorded
  // epoch steps] in run.cpp): no host reads, no host counters passed by value.
  using BatchStep = std::function<Tensor(const parallel::PerDevice<Tensor>& images,
                                         const parallel::PerDevice<Tensor>& labels, const BatchRows& rows)>;

  // The epoch loop (classify, segment): from where the run stands (progress()), every batch of
  // `loader`'s epochs up to `o.epochs`, stopping after `o.steps` in all (0: no limit), each copied to
  // `devices` (images as `dtype`) and trained on by `step`, recorded and replayed with --cuda-graph;
  // the losses are read on the host (Note [Recorded epoch steps]). `end_of_epoch` gets the epoch's
  // statistics (also at a stop mid-epoch) and logs, prints and saves.
  struct EpochStats {
    double mean_loss = 0;  // over the steps run in this call
    int64_t steps = 0;
    double seconds = 0;       // training time (evaluation excluded)
    double images_per_s = 0;  // training images (every process's) per second
    double epochs_done = 0;   // fractional when stopped mid-epoch
  };
  void train_epochs(data::DataLoader& loader, const EpochOptions& o, const std::vector<Device>& devices, DType dtype,
                    const BatchStep& step, const std::function<void(const EpochStats&)>& end_of_epoch);

 private:
  RunOptions options_;
  std::filesystem::path out_;
  std::map<std::string, std::string> metadata_;
  MetricsLog metrics_;
  io::TrainingProgress progress_;
  bool primary_;
  // Process 0's TensorBoard events, in <out>: a run that starts afresh removes the event files of the
  // run it replaces; a resumed one adds a file that starts with a restart at its step.
  std::unique_ptr<io::EventWriter> events_;
};

}  // namespace evenflow::apps
