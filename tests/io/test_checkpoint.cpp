// Training checkpoints: a run interrupted after 3 Adam steps, saved, loaded into a fresh model and
// optimizer (different init, different generator state) and continued for 3 more steps ends
// bitwise equal, in losses and parameters, to an uninterrupted run of 6 steps; the CNN has dropout,
// so this also checks that the generator state is restored. And the failures: a different
// architecture, a file that is not a training checkpoint, negative counters, module files round
// trips; and the clean-up of temporaries that killed writes left.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "evenflow/engine/ops.h"
#include "evenflow/io/checkpoint.h"
#include "evenflow/io/file.h"
#include "evenflow/layers/layers.h"
#include "evenflow/optim/optim.h"
#include "tests/io/test_files.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using evenflow::testing::error_of;
using evenflow::testing::TempDir;
using evenflow::testing::vals;

namespace {

// conv-bn-relu-pool-flatten-linear with dropout: [N, 1, 8, 8] -> [N, 3].
std::shared_ptr<nn::Sequential> small_cnn(int64_t hidden = 4) {
  const nn::ModuleOptions f64{.dtype = kFloat64};
  return std::make_shared<nn::Sequential>(nn::Conv2d(1, hidden, 3, {.padding = 1}, f64),
                                          nn::BatchNorm2d(hidden, {}, f64), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                                          nn::Dropout(0.3), nn::Linear(hidden * 16, 3, true, f64));
}

struct Data {
  Tensor x, labels;
};

Data fixed_data() {
  manual_seed(cpu(), 1234);
  return {randn({6, 1, 8, 8}, {.dtype = kFloat64}), from_int_vector({0, 1, 2, 2, 1, 0}, {6, 1})};
}

// One Adam step on the cross-entropy of the batch; returns the loss.
double train_step(nn::Module& model, optim::Optimizer& opt, const Data& d) {
  const Tensor loss = neg(mean(gather(log_softmax(model(d.x), 1), 1, d.labels)));
  opt.zero_grad();
  loss.backward();
  opt.step();
  return loss.item();
}

std::vector<double> all_values(const nn::Module& m) {
  std::vector<double> out;
  for (const auto& [name, t] : m.state_dict()) {
    const std::vector<double> v = t.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST_CASE("checkpoint: a resumed run is bitwise equal to an uninterrupted one") {
  const Data data = fixed_data();
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");

  manual_seed(cpu(), 7);
  auto reference = small_cnn();
  optim::Adam ref_opt(reference->parameters(), {.lr = 1e-2});
  std::vector<double> ref_losses;
  for (int i = 0; i < 6; ++i) ref_losses.push_back(train_step(*reference, ref_opt, data));

  manual_seed(cpu(), 7);
  auto first = small_cnn();
  optim::Adam first_opt(first->parameters(), {.lr = 1e-2});
  std::vector<double> losses;
  for (int i = 0; i < 3; ++i) losses.push_back(train_step(*first, first_opt, data));
  io::save_training_checkpoint(path, *first, first_opt, {.step = 3, .epoch = 1}, {cpu()}, {{"note", "test"}});

  manual_seed(cpu(), 99);  // a different init and generator state, both overwritten by the load
  auto resumed = small_cnn();
  optim::Adam resumed_opt(resumed->parameters(), {.lr = 5e-2});
  CHECK(all_values(*resumed) != all_values(*first));
  const io::TrainingCheckpoint ck = io::load_training_checkpoint(path, *resumed, resumed_opt, {cpu()});
  CHECK(ck.progress.step == 3);
  CHECK(ck.progress.epoch == 1);
  CHECK(ck.metadata.at("note") == "test");
  CHECK(resumed_opt.lr() == 1e-2);
  CHECK(all_values(*resumed) == all_values(*first));
  for (int i = 0; i < 3; ++i) losses.push_back(train_step(*resumed, resumed_opt, data));

  CHECK(losses == ref_losses);  // bitwise
  CHECK(all_values(*resumed) == all_values(*reference));
}

TEST_CASE("checkpoint: an Adam state no run could have written is refused, naming the file and the key") {
  const Data data = fixed_data();
  TempDir dir;
  manual_seed(cpu(), 8);
  auto model = small_cnn(4);
  optim::Adam opt(model->parameters(), {.amsgrad = true});
  train_step(*model, opt, data);
  io::save_training_checkpoint(dir.file("good.safetensors"), *model, opt, {.step = 1, .epoch = 0});
  const std::vector<double> before = all_values(*model);
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, double>>{{"optim.state.2.exp_avg_sq", -0.5},
                                                   {"optim.state.0.max_exp_avg_sq", -1e-30},
                                                   {"optim.state.1.exp_avg", std::nan("")}}) {
    CAPTURE(key);
    io::SafetensorsFile file = io::load_safetensors(dir.file("good.safetensors"));
    std::vector<double> v = file.at(key).to_vector();
    v[0] = value;
    const Tensor bad = from_vector(v, file.at(key).shape(), {.dtype = file.at(key).dtype()});
    io::NamedTensors tensors;
    for (const auto& [name, t] : file.tensors) tensors.emplace_back(name, name == key ? bad : t);
    const std::string path = dir.file("bad.safetensors");
    io::save_safetensors(path, tensors, file.metadata);
    const std::string err = error_of([&] { io::load_training_checkpoint(path, *model, opt); });
    CHECK_MESSAGE(err.find("load_training_checkpoint: " + path + ": Adam.load_state: \"" +
                           key.substr(std::string("optim.").size()) + "\" holds") == 0,
                  err);
    CHECK(all_values(*model) == before);
  }
}

TEST_CASE("checkpoint: loading into a different architecture fails naming the key and changes nothing") {
  const Data data = fixed_data();
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  manual_seed(cpu(), 7);
  auto model = small_cnn(4);
  optim::Adam opt(model->parameters());
  train_step(*model, opt, data);
  io::save_training_checkpoint(path, *model, opt, {.step = 1, .epoch = 0}, {cpu()});

  auto wider = small_cnn(5);
  optim::Adam wider_opt(wider->parameters());
  const std::vector<double> before = all_values(*wider);
  const std::string err = error_of([&] { io::load_training_checkpoint(path, *wider, wider_opt, {cpu()}); });
  CHECK_MESSAGE(err.find("model.0.weight") != std::string::npos, err);
  CHECK(all_values(*wider) == before);
  CHECK(wider_opt.state().size() == 1);  // only "lr": no state was loaded

  auto deeper = std::make_shared<nn::Sequential>(*small_cnn(4));
  deeper->push_back(nn::ReLU());
  deeper->push_back(nn::Linear(3, 2, true, {.dtype = kFloat64}));
  optim::Adam deeper_opt(deeper->parameters());
  const std::string missing = error_of([&] { io::load_training_checkpoint(path, *deeper, deeper_opt); });
  CHECK_MESSAGE(missing.find("model.8.weight") != std::string::npos, missing);

  // A module file is not a training checkpoint.
  io::save_module(*model, dir.file("model.safetensors"));
  const std::string not_ckpt =
      error_of([&] { io::load_training_checkpoint(dir.file("model.safetensors"), *model, opt); });
  CHECK_MESSAGE(not_ckpt.find("not a training checkpoint") != std::string::npos, not_ckpt);
  // A generator the file does not hold is named.
  const std::string no_gen = error_of([&] { io::load_training_checkpoint(path, *model, opt, {cpu(3)}); });
  CHECK_MESSAGE(no_gen.find("generator.cpu:3") != std::string::npos, no_gen);
  // A negative counter is no place to resume from.
  io::save_training_checkpoint(dir.file("negative.safetensors"), *model, opt, {.step = -5, .epoch = 0}, {cpu()});
  CHECK(error_of([&] {
          io::load_training_checkpoint(dir.file("negative.safetensors"), *model, opt, {cpu()});
        }).find("\"train.step\" must be a count (>= 0), got -5") != std::string::npos);
}

TEST_CASE("checkpoint: module files hold PyTorch's names and round trip") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  manual_seed(cpu(), 3);
  auto model = small_cnn();
  io::save_module(*model, path);
  const io::SafetensorsFile file = io::load_safetensors(path);
  std::vector<std::string> names;
  for (const auto& [name, t] : file.tensors) names.push_back(name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                                          "1.num_batches_tracked", "6.weight", "6.bias"});

  manual_seed(cpu(), 4);
  auto other = small_cnn();
  CHECK(all_values(*other) != all_values(*model));
  const io::LoadReport report = io::load_module(*other, path);
  CHECK(report.missing.empty());
  CHECK(report.unexpected.empty());
  CHECK(all_values(*other) == all_values(*model));

  auto wrong = small_cnn(2);
  const std::string err = error_of([&] { io::load_module(*wrong, path); });
  CHECK_MESSAGE(err.find("0.weight") != std::string::npos, err);
}

TEST_CASE("checkpoint folders: temporaries of killed writes are removed, those of live writers kept") {
  TempDir dir;
  const pid_t dead = ::fork();
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);  // reaped: no process has this pid now
  const std::string stale = dir.file("checkpoint.safetensors.tmp." + std::to_string(dead));
  const std::string live = dir.file("metrics.csv.tmp." + std::to_string(::getppid()));
  const std::string own = dir.file("model.safetensors.tmp." + std::to_string(::getpid()));
  const std::string other = dir.file("notes.tmp.draft");
  for (const std::string& f : {stale, live, own, other}) testing::write_bytes(f, "x");
  CHECK(io::remove_stale_temporaries(dir.path().string()) == 1);
  CHECK_FALSE(std::filesystem::exists(stale));
  for (const std::string& f : {live, own, other}) CHECK(std::filesystem::exists(f));
  CHECK(io::remove_stale_temporaries(dir.file("missing")) == 0);
}

TEST_CASE("checkpoint: a failed load of several parts leaves every model and optimizer as it was") {
  const Data data = fixed_data();
  TempDir dir;
  const std::string path = dir.file("two.safetensors");
  manual_seed(cpu(), 7);
  auto a = small_cnn(4), b = small_cnn(4);
  optim::Adam a_opt(a->parameters()), b_opt(b->parameters());
  train_step(*a, a_opt, data);
  train_step(*b, b_opt, data);
  io::save_training_checkpoint(path, {{"a", a.get(), &a_opt}, {"b", b.get(), &b_opt}}, {.step = 1, .epoch = 0});

  // Part a loads (it matches); part b is wider and fails: a must be given its state back.
  auto fresh_a = small_cnn(4), wider_b = small_cnn(5);
  optim::Adam fresh_a_opt(fresh_a->parameters()), wider_b_opt(wider_b->parameters());
  const std::vector<double> a_before = all_values(*fresh_a), b_before = all_values(*wider_b);
  const std::string err = error_of([&] {
    io::load_training_checkpoint(path, {{"a", fresh_a.get(), &fresh_a_opt}, {"b", wider_b.get(), &wider_b_opt}});
  });
  CHECK_MESSAGE(err.find("b.model.0.weight") != std::string::npos, err);
  CHECK(all_values(*fresh_a) == a_before);
  CHECK(all_values(*wider_b) == b_before);
  CHECK(fresh_a_opt.state().size() == 1);  // only "lr": part a's loaded state was undone
  CHECK(wider_b_opt.state().size() == 1);
}

TEST_CASE("checkpoint: a part without an optimizer (a weight average) round trips, model keys only") {
  const Data data = fixed_data();
  TempDir dir;
  const std::string path = dir.file("average.safetensors");
  manual_seed(cpu(), 7);
  auto model = small_cnn(4), average = small_cnn(4);
  optim::Adam opt(model->parameters());
  train_step(*model, opt, data);
  io::save_training_checkpoint(path, {{"gen", model.get(), &opt}, {"gen_average", average.get(), nullptr}},
                               {.step = 1, .epoch = 0});
  const auto file = io::load_safetensors(path);
  CHECK(file.contains("gen_average.model.0.weight"));
  for (const auto& [key, t] : file.tensors) CHECK(key.rfind("gen_average.optim.", 0) != 0);

  manual_seed(cpu(), 99);  // other initial weights
  auto fresh = small_cnn(4), fresh_average = small_cnn(4);
  optim::Adam fresh_opt(fresh->parameters());
  CHECK(all_values(*fresh_average) != all_values(*average));
  io::load_training_checkpoint(path, {{"gen", fresh.get(), &fresh_opt}, {"gen_average", fresh_average.get(), nullptr}});
  CHECK(all_values(*fresh_average) == all_values(*average));
  CHECK(all_values(*fresh) == all_values(*model));
}
