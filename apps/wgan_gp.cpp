// wgan_gp: a Wasserstein GAN with a gradient penalty on FashionMNIST, data-parallel over the
// devices found. Each device computes its own critic outputs and its own penalty (a double
// backward through its replica); only the chunk-weighted losses and the gradients cross devices
// (Note [Data-parallel step] in parallel/data_parallel.h). Defaults are the WGAN-GP paper's (λ = 10,
// Adam with betas (0, 0.9), batch 64) but for 2 critic steps per generator step instead of 5, a
// learning rate of 2e-4 instead of 1e-4, and 10,000 generator steps: at equal compute they reach a
// far lower Fréchet distance (docs/wgan_gp.md, "Sample quality"); --critic-steps 5 --lr 1e-4 is the paper's.
//
// Every random number (noise, interpolation weights) is drawn on the host for the whole batch and
// then split over the devices, so N devices compute what one device computes on the whole batch
// (tests/train/test_wgan_gp_app.cpp checks it), and --resume continues exactly.
//
// In --out: samples/step_<k>.png (a grid from a fixed noise batch every --sample-every steps),
// metrics.csv and curves.png, checkpoint.safetensors (generator, critic, both optimizers, step,
// generator states), generator.safetensors and critic.safetensors (PyTorch names). Sample quality:
// the Fréchet distance between generated and test images in the feature space of the classifier
// apps/classify trains (--classifier), every --fid-every steps and at the end, next to the same
// distance for real held-out images (the floor); and at the end of the run the fixed evaluation
// (Note [Final evaluation]), written to evaluation.json.
#include <CLI/App.hpp>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "apps/common/fashion_cnn.h"
#include "apps/common/frechet.h"
#include "apps/common/image.h"
#include "apps/common/plot.h"
#include "apps/common/program.h"
#include "apps/common/progress.h"
#include "apps/common/run.h"
#include "apps/common/step_buffers.h"
#include "apps/common/wgan_critic.h"
#include "apps/common/wgan_generator.h"
#include "apps/common/wgan_resnet.h"
#include "evenflow/data/dataset.h"
#include "evenflow/data/fashion_mnist.h"
#include "evenflow/data/loader.h"
#include "evenflow/engine/device.h"
#include "evenflow/engine/step_graph.h"
#include "evenflow/io/checkpoint.h"
#include "evenflow/io/file.h"
#include "evenflow/losses/losses.h"
#include "evenflow/optim/lr_scheduler.h"
#include "evenflow/parallel/data_parallel.h"
#include "evenflow/parallel/sync_batch_norm.h"
#include "evenflow/parallel/training_state.h"

namespace ef = evenflow;
namespace nn = evenflow::nn;
namespace par = evenflow::parallel;
namespace fs = std::filesystem;
using ef::Tensor;

namespace {

struct Args : ef::apps::RunOptions {
  Args() {
    cpu_fallback = "cpu:2";  // data-parallel from the first run
    out = "runs/wgan_gp";
  }
  int64_t steps = 10000;  // generator steps
  int64_t batch_size = 64;
  int64_t critic_steps = 2;  // the paper's 5 reach the same distance per step at 2.3x the compute
  double lambda = 10.0;
  double lr = 2e-4, beta1 = 0.0, beta2 = 0.9;  // the paper's 1e-4 ends the default run at 38 instead of 23
  int64_t lr_decay_steps = 0;                  // Note [Learning-rate decay]
  std::string model = "dcgan";                 // Note [Models]
  std::string norm;                            // the model's: layernorm (dcgan), none (resnet)
  std::string penalty = "wgan-gp";
  std::string layout = "channels-last";  // Note [Channels-last] in engine/ops.h
  int64_t width = 0;                     // the model's: 32 (dcgan), 128 (resnet)
  int64_t z_dim = 128;
  int64_t sample_every = 100;
  int64_t fid_every = 1000;
  int64_t fid_samples = 2000;
  int64_t final_fid_samples = 10000;  // Note [Final evaluation]
  double ema_decay = 0;               // off: it sampled worse at 2000 steps of 5 critic steps (docs/wgan_gp.md)
  std::string classifier = kDefaultClassifier;
  static constexpr const char* kDefaultClassifier = "runs/classify/model.safetensors";
};

// The standard deviation (unbiased) of every value of a batch of `batch` images of which this
// process of `job` holds `part`. Two passes, as var's.
double batch_std(const Tensor& part, int64_t batch, par::ProcessGroup& job) {
  const Tensor x = ef::flatten(part).to(ef::kFloat64);
  const double count = static_cast<double>(batch) * static_cast<double>(x.numel() / part.size(0));
  const double mean = job.sum(ef::sum(x).item()) / count;
  const double squares = job.sum(ef::sum(ef::square(ef::add_scalar(x, -mean))).item());
  return std::sqrt(squares / (count - 1));
}

// The penalty of one device's chunk (a mean over its samples, so chunk weighting is exact).
// DRAGAN's perturbation scale is the whole batch's standard deviation, so every device gets it.
Tensor penalty(const Args& a, nn::Module& critic, const Tensor& real, const Tensor& fake, const Tensor& eps,
               const Tensor& noise, double real_std) {
  const ef::losses::Critic d = [&critic](const Tensor& x) { return critic(x); };
  if (a.penalty == "wgan-gp") return ef::losses::wgan_gp_penalty(d, real, fake, {.lambda = a.lambda, .eps = eps});
  if (a.penalty == "dragan")
    return ef::losses::dragan_penalty(d, real, {.lambda = a.lambda, .noise = noise, .real_std = real_std});
  return ef::losses::r1_penalty(d, real, {.gamma = a.lambda});
}

// The columns of metrics.csv: one row a generator step; the Frechet distance and its floor only
// where measured (empty cells otherwise).
const std::vector<std::string> kColumns = {"step",    "critic_loss",   "generator_loss", "wasserstein",
                                           "frechet", "frechet_floor", "seconds",        "images_per_s"};

void write_curves(const std::string& path, const ef::apps::MetricsLog& log, const std::string& title) {
  ef::apps::Series critic{.label = "critic loss", .color = {200, 40, 40}};
  ef::apps::Series wasserstein{.label = "wasserstein estimate", .color = {30, 80, 200}};
  ef::apps::Series frechet{.label = "frechet distance / 10", .color = {20, 150, 60}};
  for (size_t i = 0; i < log.size(); ++i) {
    const double step = log.at(i, "step");
    if (!std::isnan(log.at(i, "critic_loss"))) {
      critic.x.push_back(step);
      critic.y.push_back(log.at(i, "critic_loss"));
      wasserstein.x.push_back(step);
      wasserstein.y.push_back(log.at(i, "wasserstein"));
    }
    if (!std::isnan(log.at(i, "frechet"))) {
      frechet.x.push_back(step);
      frechet.y.push_back(log.at(i, "frechet") / 10.0);
    }
  }
  ef::apps::write_line_plot_png(path, {.title = title,
                                       .x_label = "generator step",
                                       .y_label = "loss / distance",
                                       .series = {critic, wasserstein, frechet}});
}

// Note [Learning-rate decay]
// --lr-decay-steps N > 0 lowers both learning rates linearly from --lr at the first generator step
// to 0 at step N (torch's LinearLR with end_factor 0; the WGAN-GP paper's CIFAR-10 code decays so
// over its run), the same for every critic step of a generator step. The rate is a function of the
// step and N only, and N is part of the checkpoint's settings, so a resumed run continues the
// schedule exactly, whatever --steps it is given (up to N: past it the rates would be 0).

std::map<std::string, std::string> run_metadata(const Args& a) {
  return {{"app", "wgan_gp"},
          {"batch_size", std::to_string(a.batch_size)},
          {"critic_steps", std::to_string(a.critic_steps)},
          {"beta1", ef::apps::metadata_number(a.beta1)},
          {"beta2", ef::apps::metadata_number(a.beta2)},
          {"dtype", a.dtype},
          {"precision", a.precision},
          {"lambda", ef::apps::metadata_number(a.lambda)},
          {"lr", ef::apps::metadata_number(a.lr)},
          {"lr_decay_steps", std::to_string(a.lr_decay_steps)},
          {"model", a.model},
          {"norm", a.norm},
          {"penalty", a.penalty},
          {"seed", std::to_string(a.seed)},
          {"width", std::to_string(a.width)},
          {"ema_decay", ef::apps::metadata_number(a.ema_decay)},
          {"z_dim", std::to_string(a.z_dim)}};
}

// Note [Final evaluation]
// The figure a run is judged by, and docs/wgan_gp.md's: the Fréchet distance of --final-fid-samples
// (10,000) generated images against the whole test set, with its floor from as many real training
// images, computed once after the last step. The periodic distance (--fid-samples, 2000) is cheaper
// and biased upwards by its smaller count; comparing runs by it alone would reward nothing but the
// count. The noise is the run's own (seeded by --seed through its own stream, so the training draws
// are untouched) and the same for every run with that seed, device count and resume history, so
// two runs differ only by their generators. A run resumed after its last step evaluates again and
// writes the same numbers. With --ema-decay the trained generator is measured too, from the same
// noise ("frechet_trained_generator"), so one run shows what the average bought.
// What `draw` draws from the host generator seeded with --seed xor `stream`, the host generator's
// state restored after: the training draws stay the same whether or not these are made.
Tensor drawn_apart(const Args& a, uint64_t stream, const std::function<Tensor()>& draw) {
  const ef::Device host = ef::cpu();
  const ef::GeneratorState training = ef::generator_state(host);
  ef::manual_seed(host, a.seed ^ stream);
  Tensor drawn = draw();
  ef::set_generator_state(host, training);
  return drawn;
}
// `count` noise vectors of their own stream (drawn_apart).
Tensor own_noise(const Args& a, int64_t count, uint64_t stream, ef::DType dtype) {
  return drawn_apart(a, stream, [&] { return ef::randn({count, a.z_dim}, {.dtype = dtype}); });
}

// Sets the critic's parameters frozen (set(false)) while it lives, trainable again after.
class FrozenCritic {
 public:
  explicit FrozenCritic(std::function<void(bool)> set) : set_(std::move(set)) { set_(false); }
  ~FrozenCritic() { set_(true); }
  FrozenCritic(const FrozenCritic&) = delete;
  FrozenCritic& operator=(const FrozenCritic&) = delete;

 private:
  std::function<void(bool)> set_;
};

constexpr uint64_t kFinalNoiseStream = 0x9e3779b97f4a7c15ULL;         // Note [Final evaluation]
constexpr uint64_t kAverageStatisticsStream = 0x6a09e667f3bcc909ULL;  // Note [Generator average]
constexpr uint64_t kSyntheticImagesStream = 0xbb67ae8584caa73bULL;    // Note [Models]

int run(const Args& a) {
  // --- Setup: every failure here is a bad argument or a missing file (exit 2) ----------------------
  EF_CHECK(a.final_fid_samples != 1, "--final-fid-samples 1: a distance needs at least 2 images (0: none)");
  const std::vector<ef::Device> devices = ef::apps::run_devices(a);
  EF_CHECK(a.dtype == "float32" || a.dtype == "float64", "--dtype must be float32 or float64, got \"", a.dtype, "\"");
  EF_CHECK(a.norm == "none" || a.norm == "layernorm" || a.norm == "syncbn",
           "--norm must be none, layernorm or syncbn, got \"", a.norm, "\"");
  const bool resnet = a.model == "resnet";
  EF_CHECK(!resnet || a.norm == "none", "--model resnet: its critic has no normalization (the paper's), so --norm ",
           "must be none, got \"", a.norm, "\"");
  EF_CHECK(!resnet || a.classifier == Args::kDefaultClassifier,
           "--classifier with --model resnet: the ResNet trains on synthetic images, which have no Frechet distance");
  EF_CHECK(a.penalty == "wgan-gp" || a.penalty == "dragan" || a.penalty == "r1",
           "--penalty must be wgan-gp, dragan or r1, got \"", a.penalty, "\"");
  EF_CHECK(a.lr_decay_steps == 0 || a.steps <= a.lr_decay_steps, "--steps ", a.steps, " beyond --lr-decay-steps ",
           a.lr_decay_steps, ": the learning rates are 0 from that step on");
  EF_CHECK(!a.cuda_graph || a.penalty != "dragan",
           "--cuda-graph with --penalty dragan: its perturbation scale is the batch's standard deviation, computed on "
           "the host each step, which a recorded step would keep; use wgan-gp or r1");
  const ef::DType dtype = a.dtype == "float64" ? ef::kFloat64 : ef::kFloat32;
  const ef::DType compute = ef::apps::compute_dtype(a);
  ef::set_num_threads(a.threads > 0 ? a.threads : ef::parallel::cpu_threads_per_device(devices));
  const ef::Device first = devices[0];
  ef::apps::Run run(a, a.out, kColumns, run_metadata(a));
  const bool primary = run.primary();
  if (primary) fs::create_directories(fs::path(a.out) / "samples");
  // A classifier asked for by name must be there; only the default may be missing (metric skipped).
  std::error_code ec;
  const bool have_classifier = !resnet && fs::exists(a.classifier, ec);
  EF_CHECK(!ec, "--classifier ", a.classifier, ": ", ec.message());
  EF_CHECK(have_classifier || resnet || a.classifier == Args::kDefaultClassifier, "--classifier ", a.classifier,
           " does not exist");
  // The images: FashionMNIST's, or for the ResNet a synthetic set (Note [Models]).
  const int64_t channels = resnet ? 3 : 1, image_size = resnet ? 32 : 28;
  std::shared_ptr<ef::data::FashionMNIST> train_set, test_set;
  if (!resnet) {
    train_set = std::make_shared<ef::data::FashionMNIST>(ef::data::Split::Train, a.data);
    test_set = std::make_shared<ef::data::FashionMNIST>(ef::data::Split::Test, a.data);
  }

  // Host draws (noise, interpolation weights) come from cpu:0's generator: part of the checkpoint.
  ef::manual_seed(a.seed);
  const Tensor fixed_noise = ef::randn({64, a.z_dim}, {.dtype = dtype});
  const Tensor fid_noise = ef::randn({a.fid_samples, a.z_dim}, {.dtype = dtype});
  // --precision bf16: both networks' convolutions and products in bfloat16 but the generator's last,
  // which writes the images, the critic's first, which reads them, and the critic's score layer
  // (set_precision); the penalty's norm and everything else float32 (Note [bfloat16 compute]).
  const bool channels_last = a.layout == "channels-last";
  const nn::ModuleOptions options{.dtype = dtype};
  std::shared_ptr<nn::Module> generator, critic_net;
  if (resnet) {
    generator = std::make_shared<ef::apps::WganResnetGenerator>(a.z_dim, a.width, options, channels_last);
    critic_net = std::make_shared<ef::apps::WganResnetCritic>(a.width, options, channels_last);
    ef::apps::set_precision(*generator, compute, ef::apps::WganResnetGenerator::kFloat32Layers);
    ef::apps::set_precision(*critic_net, compute, ef::apps::WganResnetCritic::kFloat32Layers);
  } else {
    generator = std::make_shared<ef::apps::WganGenerator>(a.z_dim, a.width, options, channels_last);
    critic_net = std::make_shared<ef::apps::WganCritic>(a.width, a.norm, options, channels_last);
    ef::apps::set_precision(*generator, compute, ef::apps::WganGenerator::kFloat32Layers);
    ef::apps::set_precision(*critic_net, compute, ef::apps::WganCritic::kFloat32Layers);
  }
  par::DataParallelModel gen(generator, devices);
  par::DataParallelModel critic(critic_net, devices);
  const ef::optim::AdamOptions adam{.lr = a.lr, .betas = {a.beta1, a.beta2}};
  par::ReplicatedOptimizer<ef::optim::Adam> opt_g(gen, adam), opt_d(critic, adam);
  par::DataParallelCriterion criterion(critic);
  // The generator that samples (Note [Generator average]): the average, or the trained one.
  const std::shared_ptr<nn::Module> average = a.ema_decay > 0 ? gen.module().clone() : nullptr;
  if (average) average->eval();
  const Tensor average_statistics_noise =
      average ? own_noise(a, 2048, kAverageStatisticsStream, dtype).to(first) : Tensor();
  const auto refresh_average_statistics = [&] {
    if (!average) return;
    ef::NoGradGuard no_grad;
    nn::update_batchnorm_statistics(*average, [&] {
      for (int64_t start = 0; start < average_statistics_noise.size(0); start += a.batch_size)
        (*average)(ef::narrow(average_statistics_noise, 0, start,
                              std::min(a.batch_size, average_statistics_noise.size(0) - start)));
    });
  };

  // Before a resume restores the generators: building the classifier draws its initial weights.
  ef::apps::FashionFrechet fid;
  if (have_classifier) {
    fid.net = ef::apps::make_fashion_cnn();  // float32, as classify saves it, whatever --dtype is
    ef::io::load_module(*fid.net, a.classifier);
    ef::io::check_finite(*fid.net, "--classifier " + a.classifier);
    fid.net->to(first);
    fid.noise = fid_noise;
    fid.reference =
        ef::apps::feature_stats(fid.features(ef::apps::dataset_images(*test_set, test_set->size(), dtype, first)));
    fid.floor = fid.floor_of(*train_set, a.fid_samples, dtype, first);
    std::printf("Frechet distance floor (%" PRId64 " real training images vs the test set): %.3f\n", a.fid_samples,
                fid.floor);
  } else if (resnet) {
    std::printf("--model resnet trains on synthetic images: no Frechet distance\n");
  } else {
    std::printf("no classifier at %s: the Frechet distance is skipped (train one with apps/classify)\n",
                a.classifier.c_str());
  }
  // The first device's generator is every device's (share_first_generator), so a checkpoint resumes
  // on any devices; host draws come from cpu:0's (both in the training state).
  std::vector<par::TrainingState::Extra> extras;
  if (average) extras.push_back({"gen_average", *average});
  par::TrainingState state({{"gen", gen, opt_g}, {"critic", critic, opt_d}}, extras);
  run.resume(state, "generator step");
  ef::io::TrainingProgress& progress = run.progress();

  std::printf("training %s (width %" PRId64 ") on %s, %s, batch %" PRId64 ", %" PRId64
              " critic steps per generator step, norm %s, penalty %s, layout %s\n",
              a.model.c_str(), a.width, ef::apps::describe_devices(devices).c_str(),
              ef::apps::describe_precision(a).c_str(), a.batch_size, a.critic_steps, a.norm.c_str(), a.penalty.c_str(),
              a.layout.c_str());
  std::fflush(stdout);

  // Note [Models]
  // --model dcgan (the default) is the DCGAN-style pair of apps/common/wgan_{generator,critic}.h on
  // FashionMNIST, small enough for a CPU; --model resnet is the WGAN-GP paper's CIFAR-10 ResNet
  // (apps/common/wgan_resnet.h, width 128: ~1.2M parameters a network), a model that keeps a GPU busy.
  // CIFAR-10 is not packaged here, so the ResNet trains on a synthetic set of 2048 RGB images, drawn
  // from --seed (uniform noise: for speed and correctness checks, not for sample quality; no Frechet
  // distance, which needs FashionMNIST's classifier).
  std::shared_ptr<ef::data::Dataset> images_set = train_set;
  if (resnet) {
    // Uniform in [0, 1], as FashionMNIST's pixels are, from their own stream.
    const Tensor synthetic = drawn_apart(a, kSyntheticImagesStream, [&] {
      return ef::rand({2048, channels, image_size, image_size}, {.dtype = ef::kFloat32});
    });
    images_set = std::make_shared<ef::data::TensorDataset>(
        ef::data::Batch{synthetic, ef::zeros({synthetic.size(0)}, {.dtype = ef::kInt64})});
  }
  ef::data::DataLoader loader(images_set, {.batch_size = a.batch_size,
                                           .shuffle = true,
                                           .seed = a.seed,
                                           .drop_last = true,
                                           .num_workers = a.workers,
                                           .device = ef::cpu(),
                                           .batch_part = critic.batch_part()});
  const int64_t per_epoch = loader.num_batches();
  EF_CHECK(per_epoch > 0, "the training set has fewer images (", images_set->size(), ") than a batch (", a.batch_size,
           ")");

  // --- Pieces of a step ---------------------------------------------------------------------------------
  const auto sample = [&](int64_t step) {
    if (!primary) return;
    ef::NoGradGuard no_grad;
    gen.module().eval();
    const Tensor images = (average ? *average : gen.module())(fixed_noise.to(first));
    gen.module().train();
    char name[64];
    std::snprintf(name, sizeof name, "step_%06" PRId64 ".png", step);
    const ef::apps::RgbImage grid = ef::apps::image_grid(images, 8, -1.0, 1.0, 2);
    ef::apps::write_png((fs::path(a.out) / "samples" / name).string(), grid);
    run.image("samples", grid, step);
  };
  // The distance of the images generator `which` (by default the sampling one) makes from `noise`.
  const auto frechet_of = [&](const Tensor& noise, nn::Module* which = nullptr) -> double {
    if (!fid.net || !primary) return NAN;
    nn::Module& g = which ? *which : average ? *average : gen.module();
    ef::NoGradGuard no_grad;
    gen.module().eval();
    std::vector<Tensor> images;
    for (int64_t start = 0; start < noise.size(0); start += 500) {
      const Tensor z = ef::narrow(noise, 0, start, std::min<int64_t>(500, noise.size(0) - start));
      images.push_back(g(z.to(first)));
    }
    gen.module().train();
    return ef::apps::frechet_distance(ef::apps::feature_stats(fid.features(ef::cat(images, 0))), fid.reference);
  };
  const auto frechet = [&] { return frechet_of(fid.noise); };
  const auto save = [&] {
    run.save(state, [&] {
      write_curves(run.file("curves.png"), run.metrics(),
                   resnet ? "WGAN-GP, CIFAR-10 ResNet on synthetic images" : "WGAN-GP on FashionMNIST");
      ef::io::save_module(average ? *average : gen.module(), run.file("generator.safetensors"));
      ef::io::save_module(critic.module(), run.file("critic.safetensors"));
    });
  };
  const auto set_critic_trainable = [&](bool on) {
    for (int r = 0; r < critic.size(); ++r)
      for (Tensor p : critic.replica(r).parameters()) p.requires_grad_(on);
  };

  // The batches, in the loader's order, from where a resumed run stopped: `critic_steps` a step,
  // epoch after epoch (Note [Resuming a loader] in data/loader.h).
  ef::data::DataLoader::Iterator it = loader.after(progress.step * a.critic_steps).begin();
  const int processes = par::processes()->size();
  // Across processes each reads its part of every batch, and draws for the whole batch (every
  // process the same numbers) before keeping its part, critic.process_part: a sample sees the
  // numbers it would see in one process (Note [Random numbers per sample] in engine/tensor.h).
  const auto next_real = [&]() -> Tensor {
    if (it == loader.end()) it = loader.begin();  // the next epoch
    Tensor images = it->images.to(dtype) * 2.0 - 1.0;
    ++it;
    return images;
  };

  // --- The step's inputs (Note [Step buffers] in apps/common/step_buffers.h) ---------------------------------
  const int64_t n = a.batch_size;  // the whole batch, over every process (the loader drops a last partial one)
  const ef::BatchRows part_rows = critic.process_rows(n);  // this process's rows of each batch
  const int64_t part = part_rows.count;
  const bool draws_eps = a.penalty == "wgan-gp", draws_noise = a.penalty == "dragan";
  const ef::Shape image_row = {channels, image_size, image_size};
  // Each critic step's real batch, noise and what its penalty reads (wgan-gp's interpolation weights,
  // dragan's perturbation), then the generator step's noise.
  std::vector<ef::apps::StepBuffers::Field> fields;
  const auto input = [](const char* what, int64_t k) { return std::string(what) + " " + std::to_string(k); };
  for (int64_t k = 0; k < a.critic_steps; ++k) {
    fields.push_back({input("real", k), image_row});
    fields.push_back({input("z", k), {a.z_dim}});
    if (draws_eps) fields.push_back({input("eps", k), {1, 1, 1}});
    if (draws_noise) fields.push_back({input("noise", k), image_row});
  }
  fields.push_back({"z gen", {a.z_dim}});
  const ef::apps::StepBuffers buffers(devices, part, dtype, fields);
  const std::vector<int64_t>& chunk = buffers.rows();
  std::vector<double> real_stds(static_cast<size_t>(a.critic_steps), 0.0);  // dragan's, per critic step
  // Draws and loads one generator step's inputs on the host, in the order the step uses them, and
  // copies them in.
  const auto load_step_inputs = [&] {
    std::vector<Tensor> host;
    for (int64_t k = 0; k < a.critic_steps; ++k) {
      const Tensor real = next_real();
      ef::Shape noise_shape = real.shape();
      noise_shape[0] = n;
      host.push_back(real);
      host.push_back(critic.process_part(ef::randn({n, a.z_dim}, {.dtype = dtype})));
      // Only what the penalty reads (an unread uniform batch cost time every critic step:
      // docs/benchmarks.md, "The program's host work").
      if (draws_eps) host.push_back(critic.process_part(ef::rand({n, 1, 1, 1}, {.dtype = dtype})));
      if (draws_noise) host.push_back(critic.process_part(ef::rand(noise_shape, {.dtype = dtype})));
      // In one process, the whole batch's std; across processes, from every process's part.
      real_stds[static_cast<size_t>(k)] = !draws_noise     ? 0.0
                                          : processes == 1 ? std::sqrt(ef::var(ef::flatten(real), {0}).item())
                                                           : batch_std(real, n, critic.group().processes());
    }
    host.push_back(critic.process_part(ef::randn({n, a.z_dim}, {.dtype = dtype})));
    buffers.load(host);
  };

  // --- One generator step on the devices -----------------------------------------------------------------
  // Its losses, in one tensor on the first device that the host reads after the step: each critic
  // step's loss, the generator's, then the last critic step's Wasserstein estimate per replica.
  Tensor step_values;
  const auto device_step = [&] {
    std::vector<Tensor> values;
    // Each replica's Wasserstein term of the last critic step, mean(d_fake) - mean(d_real): its
    // negation is the estimate the log reports (exactly: a - b = -(b - a)), read without a kernel.
    std::vector<Tensor> wasserstein_terms(chunk.size());
    for (int64_t k = 0; k < a.critic_steps; ++k) {
      const auto reals = critic.scatter(buffers[input("real", k)], part_rows);
      const auto zs = buffers[input("z", k)];
      const auto none = par::PerDevice<Tensor>(chunk.size());
      const auto epss = draws_eps ? buffers[input("eps", k)] : none;
      const auto noises = draws_noise ? buffers[input("noise", k)] : none;
      par::PerDevice<Tensor> fakes;
      {
        ef::NoGradGuard no_grad;
        fakes = gen(zs);
      }
      const double real_std = real_stds[static_cast<size_t>(k)];
      const Tensor loss = criterion([&](int r) {
        const auto i = static_cast<size_t>(r);
        nn::Module& d = critic.replica(r);
        const Tensor d_real = d(reals[i]), d_fake = d(fakes[i]);
        const Tensor wasserstein_term = ef::losses::wasserstein_critic_loss(d_real, d_fake);
        wasserstein_terms[i] = wasserstein_term.detach();
        return wasserstein_term + penalty(a, d, reals[i], fakes[i], epss[i], noises[i], real_std);
      });
      opt_d.zero_grad();
      loss.backward();
      opt_d.step();
      values.push_back(loss.detach());
    }
    {
      // The critic frozen for the generator step, and trainable again however the step ends (a
      // recording that fails here is run again eagerly: ReplayedStep).
      const FrozenCritic frozen(set_critic_trainable);
      const par::PerDevice<Tensor> fakes = gen(buffers["z gen"]);
      // Weighed by the critic's current batch, the last real batch: the same size, split the same way.
      const Tensor loss =
          criterion([&](int r) { return ef::losses::wasserstein_generator_loss(critic.replica(r)(fakes[r])); });
      opt_g.zero_grad();
      loss.backward();
      opt_g.step();
      values.push_back(loss.detach());
    }
    for (const Tensor& w : wasserstein_terms) values.push_back(w.to(first));
    step_values = ef::stack(values, 0);
  };
  ef::ReplayedStep step(devices, device_step, {.record = a.cuda_graph, .warm_up = 2, .log = nullptr});

  // --- Training -----------------------------------------------------------------------------------------------
  // The host reads a step's losses after queuing the next step (read_later), so that it never waits
  // for the devices but at evaluations and checkpoints, where it reads every step queued.
  ef::apps::setup_done();
  using Clock = std::chrono::steady_clock;
  ef::apps::ProgressBar bar;
  bar.start("generator steps", a.steps, progress.step + 1);
  double seconds = 0;  // training time (without evaluations and checkpoints), up to the last step read
  auto since = Clock::now();
  int64_t images_seen = 0;
  struct Queued {
    int64_t step;
    ef::HostValues values;
    double lr;
  };
  std::deque<Queued> queued;
  // Reads the oldest queued step's losses and logs its row; with `evaluate`, its Frechet distance too.
  const auto read_oldest = [&](bool evaluate) {
    Queued q = std::move(queued.front());
    queued.pop_front();
    const std::vector<double> v = q.values.get();
    seconds += std::chrono::duration<double>(Clock::now() - since).count();
    since = Clock::now();
    images_seen += n * a.critic_steps;
    const auto k = static_cast<size_t>(a.critic_steps);
    // In the order the losses arose (a NaN stops the run before any save).
    for (size_t c = 0; c < k; ++c)
      run.check_loss(v[c], q.step, "critic loss",
                     "step " + std::to_string(q.step) + " critic " + std::to_string(c + 1));
    const double critic_loss = v[k - 1], generator_loss = v[k];
    // The Wasserstein estimate of the last critic step, mean(d_real) - mean(d_fake), chunk-weighted
    // over the replicas.
    double wasserstein = 0;
    for (size_t r = 0; r < chunk.size(); ++r)
      wasserstein -= v[k + 1 + r] * static_cast<double>(chunk[r]) / static_cast<double>(n);
    wasserstein = critic.group().processes().sum(wasserstein);
    run.check_loss(generator_loss, q.step, "generator loss", "step " + std::to_string(q.step) + " generator");
    const double images_per_s = static_cast<double>(images_seen) / seconds;
    bar.update(q.step, critic_loss, images_per_s);
    double frechet_distance = NAN;
    if (evaluate) {
      refresh_average_statistics();
      if (q.step % a.fid_every == 0 || q.step == a.steps) {
        frechet_distance = frechet();
        if (!std::isnan(frechet_distance)) {
          bar.finish();
          std::printf("step %" PRId64 "  Frechet distance %.3f (floor %.3f)\n", q.step, frechet_distance, fid.floor);
          std::fflush(stdout);
        }
      }
    }
    run.log({{"step", static_cast<double>(q.step)},
             {"critic_loss", critic_loss},
             {"generator_loss", generator_loss},
             {"wasserstein", wasserstein},
             {"frechet", frechet_distance},
             {"frechet_floor", std::isnan(frechet_distance) ? NAN : fid.floor},
             {"seconds", seconds},
             {"images_per_s", images_per_s}});
    // TensorBoard only: the last critic step's loss is its Wasserstein term (minus the estimate)
    // plus its penalty, both weighted by chunk as the criterion weighs them.
    run.scalar("penalty", critic_loss + wasserstein, q.step);
    run.scalar("learning_rate", q.lr, q.step);
  };
  while (progress.step < a.steps) {
    const double lr =
        a.lr_decay_steps > 0 ? ef::optim::linear_lr(progress.step, a.lr, 1.0, 0.0, a.lr_decay_steps) : a.lr;
    opt_d.primary().set_lr(lr);
    opt_g.primary().set_lr(lr);
    load_step_inputs();
    step();
    if (average) ef::apps::update_average(*average, gen.module(), a.ema_decay, progress.step);
    queued.push_back({progress.step + 1, ef::read_later(step_values), lr});
    ++progress.step;
    const bool last = progress.step == a.steps;
    const bool checkpoint = progress.step % a.sample_every == 0 || progress.step % a.fid_every == 0 || last;
    // On a GPU the host reads a step's losses one step behind; a CPU device has them already.
    const size_t behind = first.is_cuda() ? 1 : 0;
    while (queued.size() > (checkpoint ? 1 : behind)) read_oldest(false);
    if (!checkpoint) continue;
    read_oldest(true);
    if (progress.step % a.sample_every == 0 || last) sample(progress.step);
    save();
    since = Clock::now();  // evaluations and checkpoints are not training time
  }
  bar.finish();
  if (fid.net && primary && a.final_fid_samples > 0 && progress.step == a.steps) {
    const Tensor noise = own_noise(a, a.final_fid_samples, kFinalNoiseStream, dtype);
    const int64_t images = noise.size(0);
    const double distance = frechet_of(noise);
    const double floor = fid.floor_of(*train_set, images, dtype, first);
    std::printf("final Frechet distance (%" PRId64 " generated images vs the test set): %.3f (floor %.3f)\n", images,
                distance, floor);
    // Written with full precision (a double's 17 digits); JSON has no NaN, and a distance that is not
    // finite means the generator's images are not numbers either: an error, not a file.
    nlohmann::ordered_json evaluation = {
        {"step", progress.step}, {"images", images}, {"frechet", distance}, {"floor", floor}};
    // With an average, the trained generator's distance from the same noise too: what the average bought.
    if (average) {
      const double d = frechet_of(noise, &gen.module());
      std::printf("final Frechet distance of the trained generator, not the average: %.3f\n", d);
      evaluation["frechet_trained_generator"] = d;
    }
    for (const auto& [key, value] : evaluation.items())
      EF_CHECK(!value.is_number_float() || std::isfinite(value.get<double>()), "the final evaluation's ", key, " is ",
               value.get<double>(), ": evaluation.json is not written (the generator's images hold NaN or inf?)");
    const std::string json = evaluation.dump() + "\n";
    ef::io::write_file_atomically(run.file("evaluation.json"),
                                  [&](ef::io::OutputFile& f) { f.write(json.data(), json.size()); });
    run.scalar("final_frechet", distance, progress.step);
  }
  std::printf("done: %" PRId64 " generator steps; outputs in %s\n", progress.step, a.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::unique_ptr<CLI::App> app_owner =
      ef::apps::make_app("Train a WGAN-GP on FashionMNIST, data-parallel over the devices found (evenflow)");
  CLI::App& app = *app_owner;
  Args a;
  ef::apps::add_run_options(app, a, "seed of the initialization, noise and data order");
  ef::apps::add_integer(app, "--steps", a.steps, "generator steps in all", 1);
  ef::apps::add_integer(app, "--batch-size", a.batch_size, "batch size", 1);
  ef::apps::add_integer(app, "--critic-steps", a.critic_steps, "critic steps per generator step (the paper's: 5)", 1);
  ef::apps::add_number(
      app, "--lambda", a.lambda,
      "the penalty's coefficient: lambda of WGAN-GP and DRAGAN, gamma of R1 (which adds gamma/2 times the "
      "mean squared gradient norm)",
      {.min = 0});
  ef::apps::add_number(app, "--lr", a.lr, "Adam learning rate of both networks (the paper's: 1e-4)",
                       {.min = 0, .min_excluded = true});
  ef::apps::add_integer(app, "--lr-decay-steps", a.lr_decay_steps,
                        "both learning rates fall linearly from --lr to 0 at this generator step (0: constant; usually "
                        "--steps)",
                        0);
  ef::apps::add_number(app, "--beta1", a.beta1, "Adam beta1", {.min = 0, .max = 1, .max_excluded = true});
  ef::apps::add_number(app, "--beta2", a.beta2, "Adam beta2", {.min = 0, .max = 1, .max_excluded = true});
  app.add_option("--model", a.model,
                 "dcgan: the DCGAN-style networks on FashionMNIST; resnet: the WGAN-GP paper's CIFAR-10 ResNet on "
                 "synthetic 32x32 RGB images (no Frechet distance)")
      ->check(CLI::IsMember({"dcgan", "resnet"}));
  app.add_option("--norm", a.norm, "critic normalization: none, layernorm, syncbn (default: layernorm; resnet: none)");
  app.add_option("--penalty", a.penalty, "wgan-gp, dragan or r1");
  app.add_option("--layout", a.layout,
                 "channels-last: both networks' convolutions keep their activations channels-last (NHWC in "
                 "memory) where the backend runs them so (oneDNN on CPUs: faster; the same values to rounding), "
                 "or contiguous (NCHW)")
      ->check(CLI::IsMember({"channels-last", "contiguous"}));
  ef::apps::add_number(
      app, "--ema-decay", a.ema_decay,
      "the samples, the Frechet distance and generator.safetensors come from an exponential moving "
      "average of the generator's weights with this decay (0: from the trained generator, as the paper)",
      {.min = 0, .max = 0.99999});
  ef::apps::add_integer(app, "--width", a.width,
                        "channels of the first critic layer / last generator layer (default: dcgan 32, resnet "
                        "128)",
                        1, 4096)
      ->default_str("");  // the model's, not 0
  ef::apps::add_integer(app, "--z-dim", a.z_dim, "noise dimension", 1, 65536);
  ef::apps::add_integer(app, "--sample-every", a.sample_every, "write a sample grid every K steps", 1);
  ef::apps::add_integer(app, "--fid-every", a.fid_every, "Frechet distance every K steps", 1);
  ef::apps::add_integer(app, "--fid-samples", a.fid_samples, "generated (and real) images the distance uses", 2,
                        100000);
  ef::apps::add_integer(app, "--final-fid-samples", a.final_fid_samples,
                        "generated (and real) images of the distance after the last step, in evaluation.json (0: none)",
                        0, 100000);
  app.add_option("--classifier", a.classifier, "apps/classify's model.safetensors (the feature space)");
  return ef::apps::run_program(app, argc, argv, "wgan_gp", [&] {
    // The model's defaults (Note [Models]). --width and --norm state no default of their own, so a
    // run's config.toml leaves them out where they were not given (run_program): read back with
    // another --model, it takes that model's.
    if (a.width == 0) a.width = a.model == "resnet" ? 128 : 32;
    if (a.norm.empty()) a.norm = a.model == "resnet" ? "none" : "layernorm";
    return run(a);
  });
}
