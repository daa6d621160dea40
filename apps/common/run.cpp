// The training run (see run.h).
#include "apps/common/run.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <deque>
#include <system_error>

#include "apps/common/progress.h"
#include "apps/common/step_buffers.h"
#include "evenflow/engine/step_graph.h"
#include "evenflow/io/file.h"
#include "evenflow/io/safetensors.h"
#include "evenflow/parallel/process_group.h"

namespace evenflow::apps {

namespace fs = std::filesystem;

void add_run_options(CLI::App& app, RunOptions& o, const std::string& seed_help) {
  app.add_option("--devices", o.devices,
                 "devices to train on, data-parallel: auto (every GPU, else " + o.cpu_fallback +
                     "), cpu (one CPU device), cpu:N (N CPU devices), cuda (every GPU), cuda:0,1 (those)");
  add_integer(app, "--seed", o.seed, seed_help, 0);
  app.add_option("--dtype", o.dtype, "float32 or float64");
  app.add_option("--precision", o.precision,
                 "fp32, or bf16: the model's convolutions and matrix products with bfloat16 operands and float32 "
                 "accumulation (but the layers that read or write the images, and a critic's score layer), "
                 "everything else (weights, optimizer, normalizations, losses) float32");
  app.add_option("--data", o.data, "FashionMNIST folder (IDX files, gzip or raw)");
  app.add_option("--out", o.out, "output folder");
  add_integer(app, "--workers", o.workers, "data loader threads", 0);
  add_integer(app, "--threads", o.threads,
              "intra-op threads per CPU device (0: the hardware threads shared among the CPU devices)", 0);
  // What to do with --out's earlier run, not a setting of the run: left out of config.toml (a resumed
  // run's, read back into a new folder, would find nothing to resume) and refused in a --config file.
  auto* resume =
      app.add_flag("--resume", o.resume, "continue from <out>/checkpoint.safetensors exactly")->configurable(false);
  app.add_flag("--overwrite", o.overwrite, "start afresh even where <out> holds an earlier run's checkpoint")
      ->excludes(resume)
      ->configurable(false);
  app.add_flag("--print-loss", o.print_loss, "print every step's loss at full precision");
  app.add_flag("--cudnn-benchmark", o.cudnn_benchmark,
               "on CUDA, time each convolution shape's cuDNN algorithms at its first call and keep the fastest "
               "(PyTorch's cudnn.benchmark; without it, cuDNN's heuristic choice, the same in every run)");
  app.add_flag("--cudnn-deterministic", o.cudnn_deterministic,
               "on CUDA, only cuDNN algorithms that repeat bit for bit (PyTorch's cudnn.deterministic): two runs with "
               "the same settings then give the same losses");
  app.add_flag("--cudnn-bf16-results", o.cudnn_bf16_results,
               "with --precision bf16 and --cudnn-benchmark, on CUDA: a convolution may round its result to bfloat16 "
               "(about 4e-3 relative, as autocast's do) where cuDNN's kernels for that time faster; without it a "
               "bfloat16 convolution's result is its float32 sum");
  app.add_flag("--cuda-graph", o.cuda_graph,
               "after two eager steps, record one whole training step (forward, loss and backward -- wgan_gp's: a "
               "generator step with its critic steps and their penalties' double backward --, the gradient sums over "
               "the devices, Adam) and replay it: on a GPU one CUDA graph "
               "launch a step; on CPU devices the recorded kernel calls (the same results: a check of the step, not a "
               "speed-up). A step that cannot be recorded runs eagerly, saying why");
}

void add_epoch_options(CLI::App& app, EpochOptions& o, const std::string& seed_help) {
  add_run_options(app, o, seed_help);
  add_integer(app, "--epochs", o.epochs, "epochs", 1);
  add_integer(app, "--batch-size", o.batch_size, "batch size", 1);
  add_number(app, "--lr", o.lr, "Adam learning rate", {.min = 0, .min_excluded = true});
  add_integer(app, "--steps", o.steps, "stop after this many steps in all (0: no limit)", 0);
  app.add_flag("--augment", o.augment,
               "augment the training images: a small random rotation and scaling, a random crop after padding and a "
               "horizontal flip, drawn per image from (seed, epoch, image), so the batches are the same on any "
               "devices, processes and loader workers");
  app.add_option("--ray", o.ray,
                 "make the training batches on the Ray cluster at this address (evenflow built with Ray): ip:port "
                 "as `ray start --head` prints it (127.0.0.1 or localhost for this machine's), or, given alone or "
                 "as auto, RAY_ADDRESS, else the cluster started last on this machine; --workers batches at a "
                 "time, the same batches as made here")
      ->expected(0, 1)
      ->default_str("auto");
}

std::vector<Device> run_devices(const RunOptions& o) {
  if (o.devices == "auto") return parallel::devices(cuda_device_count() > 0 ? "cuda" : o.cpu_fallback);
  return parallel::devices(o.devices);
}

DType compute_dtype(const RunOptions& o) {
  EF_CHECK(o.precision == "fp32" || o.precision == "bf16", "--precision must be fp32 or bf16, got \"", o.precision,
           "\"");
  EF_CHECK(o.precision == "fp32" || o.dtype == "float32",
           "--precision bf16 needs --dtype float32 (its master weights), "
           "got --dtype ",
           o.dtype);
  return o.precision == "bf16" ? kBFloat16 : kFloat32;
}

std::string describe_precision(const RunOptions& o) {
  return o.precision == "bf16" ? o.dtype + " weights, bfloat16 compute" : o.dtype;
}

void set_precision(nn::Module& net, DType compute, std::span<const char* const> float32_layers) {
  net.set_compute_dtype(compute);
  for (const char* layer : float32_layers) net.child(layer)->set_compute_dtype(kFloat32);
}

std::string metadata_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

namespace {

constexpr const char* kCheckpoint = "checkpoint.safetensors";
constexpr const char* kMetrics = "metrics.csv";

void prepare_output_folder(const fs::path& dir, bool resume, bool overwrite) {
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
  EF_CHECK(resume || overwrite || !fs::exists(dir / kCheckpoint, ec), "--out ", dir.string(), " already holds ",
           kCheckpoint,
           " from an earlier run: pass --resume to continue it, or --overwrite to start afresh and replace it");
}

void check_metadata(const std::string& path, const std::map<std::string, std::string>& written,
                    const std::map<std::string, std::string>& expected) {
  // Settings added after runs had been written, with the value those runs had.
  static const std::map<std::string, std::string> kBefore = {
      {"precision", "fp32"}, {"augment", "off"}, {"ema_decay", "0"}, {"lr_decay_steps", "0"}, {"model", "dcgan"}};
  for (const auto& [key, value] : expected) {
    const auto it = written.find(key);
    const auto before = kBefore.find(key);
    const std::string had = it != written.end() ? it->second : before != kBefore.end() ? before->second : "(none)";
    std::string option = "--" + key;  // the command-line option of a setting ("batch_size": --batch-size)
    std::replace(option.begin(), option.end(), '_', '-');
    EF_CHECK(had == value, "--resume: ", path, " was written with ", key, " ", had, ", this run has ", value,
             key == "app" ? "" : "; resume with the same " + option);
  }
}

}  // namespace

Run::Run(const RunOptions& options, fs::path out, std::vector<std::string> metric_columns,
         std::map<std::string, std::string> metadata)
    : options_(options),
      out_(std::move(out)),
      metadata_(std::move(metadata)),
      metrics_(std::move(metric_columns)),
      primary_(primary_process()) {
  EF_CHECK(!options_.cuda_graph || parallel::processes()->size() == 1,
           "--cuda-graph across processes: the processes' collectives run on the host, which a recorded step cannot "
           "hold; run one process");
  EF_CHECK(!options_.cudnn_bf16_results || (options_.precision == "bf16" && options_.cudnn_benchmark),
           "--cudnn-bf16-results needs --precision bf16 (it governs bfloat16 convolutions) and --cudnn-benchmark (the "
           "timed choice takes those kernels where they are faster), got --precision ",
           options_.precision, options_.cudnn_benchmark ? "" : " without --cudnn-benchmark");
  if (options_.cudnn_benchmark || options_.cudnn_deterministic) {
    CudaMath math = cuda_math();
    math.benchmark = math.benchmark || options_.cudnn_benchmark;
    math.deterministic = math.deterministic || options_.cudnn_deterministic;
    math.allow_bf16_conv_results = math.allow_bf16_conv_results || options_.cudnn_bf16_results;
    set_cuda_math(math);
  }
  if (!primary_) return;
  prepare_output_folder(out_, options_.resume, options_.overwrite);
  if (!options_.resume) {
    for (const auto& entry : fs::directory_iterator(out_))
      if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) fs::remove(entry.path());
  }
  events_ = std::make_unique<io::EventWriter>(out_);
  // The settings this run was started with, to read back with --config (a resume rewrites them).
  const std::string& settings = effective_settings();
  io::write_file_atomically(file("config.toml"), [&](io::OutputFile& f) { f.write(settings.data(), settings.size()); });
  events_->text("config", "```toml\n" + settings + "```", progress_.step);
}

bool Run::resume(parallel::TrainingState& state, const std::string& unit, bool start_if_missing) {
  std::error_code ec;
  if (!options_.resume || (start_if_missing && !fs::exists(out_ / kCheckpoint, ec))) return false;
  const std::string path = file(kCheckpoint);
  EF_CHECK(fs::exists(path, ec), "--resume: --out ", out_.string(), " holds no ", kCheckpoint,
           " to continue (a run that saved none starts without --resume)");
  // The settings first: one that changes the state's parts (--ema-decay) is named, not a missing key.
  const io::SafetensorsFile checkpoint = io::load_safetensors(path);
  check_metadata(path, checkpoint.metadata, metadata_);
  const io::TrainingCheckpoint ck = state.load(checkpoint, path);
  progress_ = ck.progress;
  metrics_.read_up_to(file(kMetrics), progress_.step);
  if (events_) events_->restart(progress_.step + 1);  // the first step this run logs
  std::printf("resuming from %s at %s %" PRId64 "\n", path.c_str(), unit.c_str(), progress_.step);
  std::fflush(stdout);
  return true;
}

void Run::save(const parallel::TrainingState& state, const std::function<void()>& outputs) const {
  if (!primary_) return;
  metrics_.write(file(kMetrics));
  if (outputs) outputs();
  state.save(file(kCheckpoint), progress_, metadata_);
}

void Run::log(const std::vector<std::pair<std::string, double>>& values) {
  metrics_.append(values);
  if (!events_) return;
  const auto step = std::find_if(values.begin(), values.end(), [](const auto& v) { return v.first == "step"; });
  for (const auto& [name, value] : values)
    if (name != "step" && !std::isnan(value)) events_->scalar(name, value, static_cast<int64_t>(step->second));
  events_->flush();
}

void Run::scalar(const std::string& tag, double value, int64_t step) {
  if (!events_) return;
  events_->scalar(tag, value, step);
  events_->flush();
}

void Run::image(const std::string& tag, const RgbImage& image, int64_t step) {
  if (!events_) return;
  const std::vector<uint8_t> png = encode_png(image);
  events_->image(tag, std::string(png.begin(), png.end()), image.height, image.width, 3, step);
  events_->flush();
}

void Run::check_loss(double loss, int64_t step, const std::string& what, const std::string& label) const {
  EF_CHECK(std::isfinite(loss), "step ", step, ": the ", what, " is ",
           std::isnan(loss) ? "NaN"
           : loss > 0       ? "inf"
                            : "-inf",
           "; stopping (the last checkpoint saved is intact; a smaller --lr may help)");
  if (options_.print_loss) {
    std::printf("%s loss %.17g\n", label.c_str(), loss);
    std::fflush(stdout);  // line by line into a pipe too, for whoever follows the run
  }
}

// Note [Recorded epoch steps]
// The epoch loop runs every step one way, recorded or not: the batch is copied into buffers on the
// devices (StepBuffers: the chunks DataParallelModel::scatter would give them, Note [Step buffers])
// and the step reads it there, through a ReplayedStep that with --cuda-graph records the step after
// two eager ones and then replays it (Note [A step that can be replayed] in engine/step_graph.h).
// A batch of another shape -- an epoch's last, partial batch -- has its own buffers and recording,
// so the full batches' recording is not dropped and made again at every epoch's end. A step's loss
// is read on the host with read_later: at once on CPU devices, one step behind on a GPU, so that
// the host queues the next step before it waits for this one; every step is read before the
// epoch's statistics, so a loss that is not finite still stops the run before a save.
namespace {

Shape row_shape(const Tensor& batch) {
  const Shape& s = batch.shape();
  return Shape(s.begin() + 1, s.end());
}

// One shape of batch: its buffers on the devices and its (recorded) step.
class ShapedStep {
 public:
  ShapedStep(const std::vector<Device>& devices, const Tensor& images, const Tensor& labels, const Run::BatchStep& step,
             bool record)
      : images_(devices, images.size(0), images.dtype(), {{"images", row_shape(images)}}),
        labels_(devices, labels.size(0), labels.dtype(), {{"labels", row_shape(labels)}}),
        replayed_(devices, [this, &step] { loss_ = step(images_["images"], labels_["labels"], rows_); },
                  {.record = record, .warm_up = 2, .log = nullptr}) {}

  // Trains on a batch (images in the step's dtype) and returns its loss: the same tensor after every
  // replay, with the new value.
  const Tensor& operator()(const Tensor& images, const Tensor& labels, const BatchRows& rows) {
    images_.load({images});
    labels_.load({labels});
    rows_ = rows;  // the same for every batch of one shape in one process, the only case recorded
    replayed_();
    return loss_;
  }

 private:
  StepBuffers images_, labels_;
  BatchRows rows_;
  Tensor loss_;
  ReplayedStep replayed_;
};

}  // namespace

void Run::train_epochs(data::DataLoader& loader, const EpochOptions& o, const std::vector<Device>& devices, DType dtype,
                       const BatchStep& step, const std::function<void(const EpochStats&)>& end_of_epoch) {
  using Clock = std::chrono::steady_clock;
  const int64_t per_epoch = loader.num_batches();
  std::map<std::string, std::unique_ptr<ShapedStep>> steps;  // by the batch's shapes
  // The steps queued and not yet read (Note [Recorded epoch steps]).
  struct Queued {
    HostValues loss;
    int64_t batch;   // the batch's index in its epoch
    int64_t images;  // the job's batch, over every process
  };
  std::deque<Queued> queued;
  const size_t behind = devices[0].is_cuda() ? 1 : 0;
  ProgressBar bar;
  bool stop = o.steps > 0 && progress_.step >= o.steps;
  while (!stop && progress_.epoch < o.epochs) {
    loader.after(progress_.step);  // one batch a step (Note [Resuming a loader] in data/loader.h)
    const data::LoaderPosition start = loader.position();
    bar.start("epoch " + std::to_string(start.epoch + 1) + "/" + std::to_string(o.epochs), per_epoch, start.batch + 1);
    double loss_sum = 0, seconds = 0;
    int64_t steps_read = 0, images = 0;
    auto t0 = Clock::now();
    const auto read_oldest = [&] {
      Queued q = std::move(queued.front());
      queued.pop_front();
      const double l = q.loss.get().at(0);
      ++progress_.step;
      check_loss(l, progress_.step, "training loss", "step " + std::to_string(progress_.step));
      ++steps_read;
      loss_sum += l;
      images += q.images;
      const auto t1 = Clock::now();
      seconds += std::chrono::duration<double>(t1 - t0).count();
      t0 = t1;
      bar.update(q.batch + 1, l, static_cast<double>(images) / seconds);
    };
    int64_t queued_steps = progress_.step;
    for (data::Batch& b : loader) {
      const Tensor batch = b.images.to(dtype);
      std::unique_ptr<ShapedStep>& s = steps[shape_str(batch.shape()) + " " + shape_str(b.labels.shape())];
      if (!s) s = std::make_unique<ShapedStep>(devices, batch, b.labels, step, o.cuda_graph);
      queued.push_back({read_later((*s)(batch, b.labels, b.rows)), b.index, b.rows.total});
      while (queued.size() > behind) read_oldest();
      if (o.steps > 0 && ++queued_steps >= o.steps) {
        stop = true;
        break;
      }
    }
    while (!queued.empty()) read_oldest();
    bar.finish();
    progress_.epoch = loader.position().epoch;  // the next one once this epoch's last batch is done
    end_of_epoch({.mean_loss = steps_read > 0 ? loss_sum / static_cast<double>(steps_read) : 0.0,
                  .steps = steps_read,
                  .seconds = seconds,
                  .images_per_s = seconds > 0 ? static_cast<double>(images) / seconds : 0.0,
                  .epochs_done = static_cast<double>(progress_.step) / static_cast<double>(per_epoch)});
  }
}

}  // namespace evenflow::apps
