// A step recorded once and replayed (engine/step_graph.h, Note [A step that can be replayed]): on CPU
// devices, where CI runs, replayed steps equal eager ones bit for bit -- a critic step with its
// gradient penalty's double backward, random draws, Adam, on one device and on two -- and what breaks
// the contract is refused (a host read, a copy from the host, a synchronization, SGD, Adam's first
// step) or, for a counter passed by value, shows as a replay that differs from the eager step. The
// same checks on CUDA devices run where a GPU is ("cuda step graph: ..."; scripts/gpu_check.sh).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "evenflow/engine/step_graph.h"
#include "evenflow/layers/layers.h"
#include "evenflow/losses/losses.h"
#include "evenflow/optim/optim.h"
#include "evenflow/parallel/data_parallel.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using evenflow::testing::CudaMathGuard;
using evenflow::testing::error_of;
namespace par = evenflow::parallel;

namespace {

// A small WGAN-GP critic: convolution, layer norm, leaky ReLU, linear; [N, 1, 8, 8] -> [N].
class TinyCritic : public nn::Cloneable<TinyCritic> {
 public:
  std::string name() const override { return "TinyCritic"; }
  explicit TinyCritic(DType dtype) {
    const nn::ModuleOptions o{.dtype = dtype};
    register_module("conv", std::make_shared<nn::Conv2d>(1, 4, 3, nn::Conv2dConfig{.stride = 2, .padding = 1}, o));
    register_module("norm", std::make_shared<nn::LayerNorm>(Shape{4, 4, 4}, nn::LayerNormConfig{}, o));
    register_module("fc", std::make_shared<nn::Linear>(64, 1, true, o));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = leaky_relu(child("norm")->forward(child("conv")->forward(x)), 0.2);
    return reshape(child("fc")->forward(flatten(h, 1)), {x.size(0)});
  }
};

// What one training run records of itself: the loss of every step and the final parameters.
struct Trace {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;
  std::vector<double> adam_steps;  // each parameter's step count, from the optimizer's state
};

// `steps` critic steps with the WGAN-GP penalty (interpolation weights drawn inside the step when
// `draw_inside`, else copied in from the host with the batches), Adam, on `devices`, through
// ReplayedStep: recorded after two eager steps when `record`, else every step eager.
Trace train_critic(const std::vector<Device>& devices, DType dtype, bool record, int steps, bool draw_inside,
                   std::string* log = nullptr) {
  manual_seed(7);
  par::DataParallelModel critic(std::make_shared<TinyCritic>(dtype), devices);
  par::ReplicatedOptimizer<optim::Adam> opt(critic, optim::AdamOptions{.lr = 1e-2, .betas = {0.0, 0.9}});
  par::DataParallelCriterion criterion(critic);
  const int64_t batch = 6;
  const std::vector<int64_t> sizes = par::split_sizes(batch, static_cast<int>(devices.size()));
  // The step's buffers: each device's chunk of the batches.
  par::PerDevice<Tensor> real, fake, eps;
  for (size_t r = 0; r < devices.size(); ++r) {
    real.push_back(zeros({sizes[r], 1, 8, 8}, {.dtype = dtype, .device = devices[r]}));
    fake.push_back(zeros({sizes[r], 1, 8, 8}, {.dtype = dtype, .device = devices[r]}));
    eps.push_back(zeros({sizes[r], 1, 1, 1}, {.dtype = dtype, .device = devices[r]}));
  }
  Tensor loss;
  const auto step = [&] {
    const auto reals = critic.scatter(real);
    loss = criterion([&](int r) {
      nn::Module& d = critic.replica(r);
      const Tensor d_real = d(reals[static_cast<size_t>(r)]), d_fake = d(fake[static_cast<size_t>(r)]);
      const losses::Critic fn = [&d](const Tensor& x) { return d(x); };
      return losses::wasserstein_critic_loss(d_real, d_fake) +
             losses::wgan_gp_penalty(fn, reals[static_cast<size_t>(r)], fake[static_cast<size_t>(r)],
                                     {.lambda = 10.0, .eps = draw_inside ? Tensor() : eps[static_cast<size_t>(r)]});
    });
    opt.zero_grad();
    loss.backward();
    opt.step();
  };
  ReplayedStep run(devices, step, {.record = record, .warm_up = 2, .log = [&](const std::string& line) {
                                     if (log) *log += line + "\n";
                                   }});
  Trace trace;
  for (int s = 0; s < steps; ++s) {
    // The batches, from the host, into the step's buffers: the same numbers whatever the devices.
    manual_seed(cpu(), 1000 + static_cast<uint64_t>(s));
    const Tensor host_real = randn({batch, 1, 8, 8}, {.dtype = dtype});
    const Tensor host_fake = randn({batch, 1, 8, 8}, {.dtype = dtype});
    const Tensor host_eps = rand({batch, 1, 1, 1}, {.dtype = dtype});
    int64_t start = 0;
    for (size_t r = 0; r < devices.size(); ++r) {
      real[r].copy_(narrow(host_real, 0, start, sizes[r]));
      fake[r].copy_(narrow(host_fake, 0, start, sizes[r]));
      eps[r].copy_(narrow(host_eps, 0, start, sizes[r]));
      start += sizes[r];
    }
    run();
    trace.losses.push_back(read_later(loss).get()[0]);
    CHECK(run.replayed() == (record && s >= 2));
  }
  for (const Tensor& p : critic.module().parameters()) trace.params.push_back(p.to_vector());
  for (const auto& [name, t] : opt.primary().state())
    if (name.size() > 5 && name.substr(name.size() - 5) == ".step") trace.adam_steps.push_back(t.item());
  critic.check_replicas();
  return trace;
}

void check_equal(const Trace& a, const Trace& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s) {
    INFO("step " << s);
    CHECK(a.losses[s] == b.losses[s]);
  }
  REQUIRE(a.params.size() == b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(a.params[i] == b.params[i]);
  }
  CHECK(a.adam_steps == b.adam_steps);
}

// A linear classifier trained with cross-entropy on class targets (the loss's target check and its
// gather: indexing ops) and Adam, on `devices`, through ReplayedStep (recorded after two eager steps
// when `record`). Each call copies a batch of 6 rows into the step's buffers, runs the step and reads
// its loss; what the step throws -- on CPU devices at the replay, on a GPU at the read after it --
// reaches the caller.
class ClassifierSteps {
 public:
  ClassifierSteps(const std::vector<Device>& devices, bool record)
      : model_(initial_model(), devices),
        opt_(model_, optim::AdamOptions{.lr = 1e-2}),
        criterion_(model_),
        sizes_(par::split_sizes(kBatch, static_cast<int>(devices.size()))) {
    for (size_t r = 0; r < devices.size(); ++r) {
      x_.push_back(zeros({sizes_[r], 8}, {.dtype = kFloat64, .device = devices[r]}));
      target_.push_back(zeros({sizes_[r]}, {.dtype = kInt64, .device = devices[r]}));
    }
    step_ = std::make_unique<ReplayedStep>(
        devices,
        [this] {
          const auto xs = model_.scatter(x_);
          loss_ = criterion_([&](int r) {
            const auto i = static_cast<size_t>(r);
            return losses::cross_entropy(model_.replica(r)(xs[i]), target_[i]);
          });
          opt_.zero_grad();
          loss_.backward();
          opt_.step();
        },
        ReplayedStep::Options{
            .record = record, .warm_up = 2, .log = [this](const std::string& line) { log += line + "\n"; }});
  }

  // Step `s`'s batch (the same numbers whatever the devices), with the first row's target `first`
  // and the last row's (on the last device) `last`.
  double operator()(int s, int64_t first = 1, int64_t last = 2) {
    manual_seed(cpu(), 500 + static_cast<uint64_t>(s));
    const Tensor x = randn({kBatch, 8}, {.dtype = kFloat64});
    std::vector<int64_t> t = {first};
    for (int64_t i = 1; i < kBatch - 1; ++i) t.push_back((i * 3 + s) % 5);
    t.push_back(last);
    const Tensor target = from_int_vector(t, {kBatch});
    int64_t start = 0;
    for (size_t r = 0; r < sizes_.size(); ++r) {
      x_[r].copy_(narrow(x, 0, start, sizes_[r]));
      target_[r].copy_(narrow(target, 0, start, sizes_[r]));
      start += sizes_[r];
    }
    (*step_)();
    return read_later(loss_).get()[0];
  }
  bool replayed() const { return step_->replayed(); }
  std::vector<double> params() {
    std::vector<double> out;
    for (const Tensor& p : model_.module().parameters())
      for (double v : p.to_vector()) out.push_back(v);
    return out;
  }
  std::string log;

 private:
  static constexpr int64_t kBatch = 6;
  static std::shared_ptr<nn::Module> initial_model() {
    manual_seed(3);
    return std::make_shared<nn::Linear>(8, 5, true, nn::ModuleOptions{.dtype = kFloat64});
  }
  par::DataParallelModel model_;
  par::ReplicatedOptimizer<optim::Adam> opt_;
  par::DataParallelCriterion criterion_;
  std::vector<int64_t> sizes_;
  par::PerDevice<Tensor> x_, target_;
  Tensor loss_;
  std::unique_ptr<ReplayedStep> step_;
};

// Replayed steps of ClassifierSteps equal eager ones bitwise; a bad target in a replayed step, on
// the first device or the last, is an error naming the loss and the class, once: the steps after it
// run (every flag it set was cleared).
void check_classifier_steps(const std::vector<Device>& devices) {
  ClassifierSteps eager(devices, false), replayed(devices, true);
  for (int s = 0; s < 5; ++s) {
    CAPTURE(s);
    CHECK(eager(s) == replayed(s));
    CHECK(replayed.replayed() == (s >= 2));
  }
  CHECK(eager.params() == replayed.params());
  CHECK_MESSAGE(replayed.log.find("recorded the step on " + devices[0].str()) != std::string::npos, replayed.log);
  const std::string e = error_of([&] { (void)replayed(5, 7); });
  CHECK_MESSAGE(e.find("cross_entropy: target holds class 7, outside [0, 5)") != std::string::npos, e);
  if (devices[0].is_cuda()) CHECK(e.find("in a replayed step") != std::string::npos);
  CHECK(std::isfinite(replayed(6)));
  CHECK(replayed.replayed());
  const std::string last = error_of([&] { (void)replayed(7, 1, -4); });
  CHECK_MESSAGE(last.find("cross_entropy: target holds class -4") != std::string::npos, last);
  CHECK(std::isfinite(replayed(8)));
  CHECK(std::isfinite(replayed(9)));
}

}  // namespace

TEST_CASE("step graph: replayed critic steps with a gradient penalty equal eager ones bitwise (float32, one device)") {
  std::string log;
  const Trace eager = train_critic({cpu(0)}, kFloat32, false, 6, false);
  const Trace replayed = train_critic({cpu(0)}, kFloat32, true, 6, false, &log);
  check_equal(eager, replayed);
  CHECK(log.find("recorded the step on cpu:0") != std::string::npos);
  CHECK(log.find("0 blocks obtained while recording") != std::string::npos);  // warm-up sized the pool
  CHECK(eager.adam_steps == std::vector<double>(eager.adam_steps.size(), 6.0));
  // The steps did train: the losses moved.
  CHECK(eager.losses.front() != eager.losses.back());
}

// A recorded step's kernels are a GPU step's graph nodes, each a few microseconds however small its
// work (docs/gpu.md): the count is the cost of a step that small, so it has a budget. TinyCritic's
// critic step with its WGAN-GP penalty on one CPU device (the kernels a CUDA device runs for it, but
// for the CUDA backend's own: cuDNN's, a bias add): 114 kernel calls until 2026-12-01, when the
// one-device loss was scaled by its sample count and back, a norm's root guarded by where(), a mean
// two kernels and a parameter's four gradients added pair by pair; 82 since (docs/benchmarks.md, "A
// recorded WGAN-GP step in fewer kernels"); 80 since 2026-12-02, when the penalty's double backward
// stopped filling zeros for the layer norm's weight and bias gradients it does not reach.
TEST_CASE("step graph: a critic step with its gradient penalty records no more kernel calls than its budget") {
  std::string log;
  (void)train_critic({cpu(0)}, kFloat32, true, 3, false, &log);
  const size_t at = log.find(" kernel calls");
  REQUIRE_MESSAGE(at != std::string::npos, log);
  const size_t start = log.rfind(' ', at - 1) + 1;
  const int64_t calls = std::stoll(log.substr(start, at - start));
  CHECK_MESSAGE(calls <= 80, log);
}

TEST_CASE("step graph: random draws inside a replayed step are new at every replay, as eager ones (float64)") {
  const Trace eager = train_critic({cpu(0)}, kFloat64, false, 5, true);
  const Trace replayed = train_critic({cpu(0)}, kFloat64, true, 5, true);
  check_equal(eager, replayed);
}

TEST_CASE("step graph: two CPU devices replay what they run eagerly, and what one device runs (float64)") {
  const Trace one = train_critic({cpu(0)}, kFloat64, false, 5, true);
  const Trace eager = train_critic({cpu(0), cpu(1)}, kFloat64, false, 5, true);
  const Trace replayed = train_critic({cpu(0), cpu(1)}, kFloat64, true, 5, true);
  check_equal(eager, replayed);
  for (size_t s = 0; s < one.losses.size(); ++s)
    CHECK(replayed.losses[s] == doctest::Approx(one.losses[s]).epsilon(1e-10));
  for (size_t i = 0; i < one.params.size(); ++i)
    for (size_t j = 0; j < one.params[i].size(); ++j)
      CHECK(replayed.params[i][j] == doctest::Approx(one.params[i][j]).epsilon(1e-10));
}

// Indexing ops are recorded (Note [Index checks in a recorded step]): a CPU replay runs their checks
// and throws a bad index at once.
TEST_CASE("step graph: a loss's class targets and gather replay as eager steps; a bad target is an error") {
  check_classifier_steps({cpu(0)});
  check_classifier_steps({cpu(0), cpu(1)});
}

TEST_CASE("step graph: what a recorded step may not do is refused, naming it") {
  const Device d = cpu(3);
  const Tensor w = ones({4}, {.device = d});
  StepGraph g;
  SUBCASE("a host read") {
    const std::string e = error_of([&] { g.capture({d}, [&] { (void)sum(w * 2.0).item(); }); });
    CHECK(e.find("inside a recorded step") != std::string::npos);
    CHECK(e.find("cpu:3") != std::string::npos);
  }
  SUBCASE("a copy from the host") {
    const Tensor host = ones({4}, {.device = cpu(4)});
    const std::string e = error_of([&] { g.capture({d}, [&] { w.copy_(host); }); });
    CHECK(e.find("inside a recorded step") != std::string::npos);
    const std::string v = error_of([&] { g.capture({d}, [&] { (void)from_vector({1, 2}, {2}, {.device = d}); }); });
    CHECK(v.find("from_vector") != std::string::npos);
  }
  SUBCASE("a synchronization") {
    const std::string e = error_of([&] { g.capture({d}, [&] { synchronize(d); }); });
    CHECK(e.find("synchronize") != std::string::npos);
  }
  SUBCASE("SGD, whose learning rate is a kernel argument") {
    Tensor p = ones({3}, {.device = d, .requires_grad = true});
    optim::SGD sgd({p}, {.lr = 0.1});
    const std::string e = error_of([&] {
      g.capture({d}, [&] {
        p.set_grad(ones({3}, {.device = d}));
        sgd.step();
      });
    });
    CHECK(e.find("SGD inside a recorded step") != std::string::npos);
  }
  SUBCASE("Adam's first step, which makes its moments") {
    Tensor p = ones({3}, {.device = d, .requires_grad = true});
    optim::Adam adam({p}, {.lr = 0.1});
    const std::string e = error_of([&] {
      g.capture({d}, [&] {
        p.set_grad(ones({3}, {.device = d}));
        adam.step();
      });
    });
    CHECK(e.find("first step inside a recorded step") != std::string::npos);
    CHECK(adam.state().size() == 1);  // only "lr": the refused step counted nothing
  }
  SUBCASE("devices of two kinds, or none") {
    CHECK(error_of([&] { g.capture({}, [] {}); }).find("no devices") != std::string::npos);
    CHECK(error_of([&] { g.replay(); }).find("nothing is recorded") != std::string::npos);
  }
  CHECK(g.empty());
  // The device is usable as before.
  CHECK(sum(w * 2.0).item() == 8.0);
}

TEST_CASE("step graph: a counter passed by value is frozen by the recording, which the comparison with eager shows") {
  // The engine cannot tell a constant from a counter: the step below breaks the contract (its
  // learning-rate-like scalar changes every step but is a kernel argument), and the replays keep the
  // value it had when recorded. This is what the bitwise comparisons of the tests above catch.
  const Device d = cpu(3);
  const auto run = [&](bool record) {
    Tensor x = zeros({2}, {.device = d});
    int counter = 0;
    ReplayedStep step({d}, [&] { x.add_(full({2}, static_cast<double>(++counter), {.device = d})); },
                      {.record = record, .warm_up = 1, .log = [](const std::string&) {}});
    for (int s = 0; s < 4; ++s) step();
    return x.to_vector()[0];
  };
  CHECK(run(false) == 1.0 + 2.0 + 3.0 + 4.0);
  CHECK(run(true) == 1.0 + 2.0 + 2.0 + 2.0);  // recorded at the second call, with counter 2
}

TEST_CASE("step graph: host effects run at each replay and not while recording; values read later") {
  const Device d = cpu(3);
  Tensor x = zeros({3}, {.device = d});
  int effects = 0;
  StepGraph g;
  g.capture({d}, [&] {
    each_step(d, [&] { ++effects; });
    x.add_(ones({3}, {.device = d}));
  });
  CHECK(effects == 0);
  CHECK(x.to_vector() == std::vector<double>{0, 0, 0});  // nothing ran
  CHECK(g.stats().calls >= 2);
  CHECK(g.stats().effects == 1);
  g.replay();
  g.replay();
  CHECK(effects == 2);
  HostValues v = read_later(x);
  CHECK(v.get() == std::vector<double>{2, 2, 2});
  CHECK(error_of([&] { (void)v.get(); }).find("no values") != std::string::npos);
  // A new recording replaces the old one.
  g.capture({d}, [&] { x.mul_(3.0); });
  g.replay();
  CHECK(x.to_vector() == std::vector<double>{6, 6, 6});
  CHECK(effects == 2);
}

TEST_CASE("step graph: a changed signature records the step again, saying so") {
  const Device d = cpu(3);
  Tensor x = zeros({2}, {.device = d});
  std::string log;
  ReplayedStep step({d}, [&] { x.add_(ones({2}, {.device = d})); },
                    {.warm_up = 1, .log = [&](const std::string& line) { log += line + "\n"; }});
  step("batch 2");
  step("batch 2");
  CHECK(step.replayed());
  step("batch 3");
  CHECK(!step.replayed());
  CHECK(log.find("the step changed (batch 2") != std::string::npos);
  step("batch 3");
  CHECK(step.replayed());
  CHECK(x.to_vector()[0] == 4.0);
  // The CUDA math settings are part of it (on a GPU they choose the recorded kernels), the
  // bfloat16 convolution results among them.
  {
    CudaMath m = cuda_math();
    m.allow_bf16_conv_results = !m.allow_bf16_conv_results;
    const CudaMathGuard toggled(m);
    step("batch 3");
  }
  CHECK(!step.replayed());
  CHECK(log.find("bfloat16 convolution results 1") != std::string::npos);
}

// The pool's free blocks include those a recording's replays write -- its intermediates, and here
// `out`, let go after the recording -- so an eager warm-up given them would have its results
// overwritten by the next replay: a warm-up drops the recording first, as a capture does.
TEST_CASE("step graph: a warm-up after a recording drops it, so that no replay writes the warm-up's tensors") {
  const Device d = cpu(3);
  const Tensor w = full({64}, 2.0, {.device = d});
  Tensor out;
  StepGraph g;
  const auto step = [&] { out = w * 3.0 + 1.0; };
  g.warm_up({d}, step);
  g.capture({d}, step);
  g.replay();
  CHECK(out.to_vector()[0] == 7.0);
  out = Tensor();
  Tensor kept;
  g.warm_up({d}, [&] { kept = w * 10.0 - 1.0; });
  CHECK(g.empty());
  const std::string e = error_of([&] { g.replay(); });
  CHECK_MESSAGE(e.find("nothing is recorded") != std::string::npos, e);
  CHECK(kept.to_vector() == std::vector<double>(64, 19.0));
}

TEST_CASE("step graph: a step that cannot be recorded runs eagerly, saying why") {
  const Device d = cpu(3);
  Tensor x = zeros({1}, {.device = d});
  double seen = -1;
  std::string log;
  ReplayedStep step({d},
                    [&] {
                      x.add_(ones({1}, {.device = d}));
                      seen = x.item();  // a host read inside the step
                    },
                    {.warm_up = 1, .log = [&](const std::string& line) { log += line + "\n"; }});
  for (int s = 0; s < 3; ++s) step();
  CHECK(x.item() == 3.0);
  CHECK(seen == 3.0);
  CHECK(log.find("running the step eagerly") != std::string::npos);
  CHECK(log.find("item()") != std::string::npos);
}

// Note [Conversions kept for a step] in engine/capture_internal.h: within one call of a step, a
// weight is converted to bfloat16 once while its version holds. Counted in kernel calls (one call
// per conversion, however the backend multiplies bfloat16), the values checked against the same
// convolutions outside any step.
TEST_CASE("step graph: a step converts a weight to bfloat16 once until an update, which it sees") {
  const Device d = cpu(3);
  manual_seed(5);
  const Tensor w = randn({4, 2, 3, 3}, {.device = d}), other = randn({4, 2, 3, 3}, {.device = d});
  const Tensor x1 = randn({2, 2, 6, 6}, {.device = d}), x2 = randn({2, 2, 6, 6}, {.device = d});
  const Conv2dOptions o{.padding = {1, 1}, .compute = kBFloat16};
  Tensor y1, y2;
  const auto recorded_calls = [&](const std::function<void()>& step) {
    StepGraph g;
    g.warm_up({d}, step);
    g.capture({d}, step);
    g.replay();
    return g.stats().calls;
  };
  const int64_t one_weight = recorded_calls([&] {
    y1 = conv2d(x1, w, Tensor(), o);
    y2 = conv2d(x2, w, Tensor(), o);
  });
  CHECK(y1.to_vector() == conv2d(x1, w, Tensor(), o).to_vector());
  CHECK(y2.to_vector() == conv2d(x2, w, Tensor(), o).to_vector());
  const int64_t two_weights = recorded_calls([&] {
    y1 = conv2d(x1, w, Tensor(), o);
    y2 = conv2d(x2, other, Tensor(), o);
  });
  CHECK(one_weight == two_weights - 1);
  // An update between the passes bumps the weight's version: the second pass converts it again (one
  // call more for the update, one for the conversion), and its result is the updated weight's.
  const int64_t updated = recorded_calls([&] {
    y1 = conv2d(x1, w, Tensor(), o);
    w.add_(0.25);
    y2 = conv2d(x2, w, Tensor(), o);
  });
  CHECK(updated == one_weight + 2);
  CHECK(y2.to_vector() == conv2d(x2, w, Tensor(), o).to_vector());
}

// Nothing is kept from one call to the next: the host may write a weight without bumping its version
// (through data()), as a replay does on a GPU.
TEST_CASE("step graph: a weight's bfloat16 copy is not kept from one step to the next") {
  const Device d = cpu(3);
  manual_seed(6);
  const Tensor w = randn({4, 2, 3, 3}, {.device = d}), x = randn({2, 2, 6, 6}, {.device = d});
  const Conv2dOptions o{.padding = {1, 1}, .compute = kBFloat16};
  Tensor y;
  ReplayedStep step({d}, [&] { y = conv2d(x, w, Tensor(), o); }, {.record = false, .warm_up = 2, .log = nullptr});
  step();
  const std::vector<double> before = y.to_vector();
  w.data<float>()[0] += 1.0f;  // no version bump
  step();
  CHECK(y.to_vector() != before);
  CHECK(y.to_vector() == conv2d(x, w, Tensor(), o).to_vector());
}

// --- On a GPU (scripts/gpu_check.sh; EF_CUDA_DEVICES=0,0 makes two logical devices of one GPU) ------------

namespace {
// The settings with cuDNN's algorithms that repeat bit for bit: eager and replayed steps compared
// bitwise must run the same sums.
CudaMath deterministic_cudnn() {
  CudaMath m = cuda_math();
  m.deterministic = true;
  return m;
}
}  // namespace

TEST_CASE("cuda step graph: replayed critic steps with a gradient penalty equal eager ones bitwise") {
  if (!evenflow::testing::cuda_devices_available(1)) return;
  const CudaMathGuard deterministic(deterministic_cudnn());
  for (const DType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dtype));
    std::string log;
    const Trace eager = train_critic({cuda(0)}, dtype, false, 8, true);
    const Trace replayed = train_critic({cuda(0)}, dtype, true, 8, true, &log);
    MESSAGE(log);
    check_equal(eager, replayed);
    CHECK(log.find("recorded the step on cuda:0") != std::string::npos);
    CHECK(eager.losses.front() != eager.losses.back());
  }
}

TEST_CASE("cuda step graph: two logical devices replay what they run eagerly, and what one device runs (float64)") {
  if (!evenflow::testing::cuda_devices_available(2)) return;
  const CudaMathGuard deterministic(deterministic_cudnn());
  const Trace one = train_critic({cuda(0)}, kFloat64, true, 6, true);
  const Trace eager = train_critic({cuda(0), cuda(1)}, kFloat64, false, 6, true);
  std::string log;
  const Trace replayed = train_critic({cuda(0), cuda(1)}, kFloat64, true, 6, true, &log);
  MESSAGE(log);
  check_equal(eager, replayed);
  // cuDNN's sums over other chunks, in float64 (as the data-parallel CUDA tests allow).
  for (size_t s = 0; s < one.losses.size(); ++s)
    CHECK(std::abs(replayed.losses[s] - one.losses[s]) <= 1e-9 * (1.0 + std::abs(one.losses[s])));
}

TEST_CASE("cuda step graph: what a recorded step may not do is refused, and the device works after") {
  if (!evenflow::testing::cuda_devices_available(1)) return;
  const Device d = cuda(0);
  const Tensor w = ones({4}, {.device = d});
  StepGraph g;
  const std::string read = error_of([&] { g.capture({d}, [&] { (void)sum(w * 2.0).item(); }); });
  CHECK(read.find("inside a recorded step") != std::string::npos);
  const Tensor host = ones({4});
  const std::string copy = error_of([&] { g.capture({d}, [&] { w.copy_(host); }); });
  CHECK(copy.find("a copy from host memory on cuda:0 inside a recorded step") != std::string::npos);
  const std::string sync = error_of([&] { g.capture({d}, [&] { synchronize(d); }); });
  CHECK(sync.find("synchronize") != std::string::npos);
  CHECK(g.empty());
  CHECK(sum(w * 2.0).item() == 8.0);  // the stream left capture mode
  // A step recorded after the refusals replays.
  Tensor x = zeros({3}, {.device = d});
  g.capture({d}, [&] { x.add_(ones({3}, {.device = d})); });
  for (int i = 0; i < 3; ++i) g.replay();
  CHECK(x.to_vector() == std::vector<double>{3, 3, 3});
  CHECK(g.stats().calls >= 2);
}

// The scratch buffer (library workspaces, bfloat16 operand copies) is regrown by eager work that needs
// more than the step did -- classify's evaluation batches are ten times its training batches -- while
// the recorded kernels keep the address they were given: the recording holds that buffer, so replays
// after the regrowth still have it (Note [Library handles and threads] in engine/cuda/cuda_internal.h).
// Freed instead, a replay wrote into memory no longer the buffer's: an illegal address, or a tensor
// made since overwritten.
TEST_CASE("cuda step graph: a workspace regrown by eager work after the recording stays the recording's") {
  if (!evenflow::testing::cuda_devices_available(1)) return;
  const Device d = cuda(0);
  manual_seed(3);
  const Tensor a = randn({8, 16}, {.device = d}), b = randn({16, 8}, {.device = d});
  const MatmulOptions bf16{.compute = kBFloat16};  // its operands' copies are in the scratch buffer
  const std::vector<double> want = matmul(a, b, bf16).to_vector();
  Tensor y = zeros({8, 8}, {.device = d});
  StepGraph g;
  const auto step = [&] { y.copy_(matmul(a, b, bf16)); };
  g.warm_up({d}, step);
  g.capture({d}, step);
  g.replay();
  CHECK(y.to_vector() == want);
  std::vector<Tensor> made_since;
  for (const int64_t n : {1024, 2048, 4096}) {
    CAPTURE(n);
    // 2 MiB of operand copies and more, few operations (compute-sanitizer runs this too).
    const Tensor big = ones({n, 1024}, {.device = d});
    CHECK(matmul(big, ones({1024, 1}, {.device = d}), bf16).to_vector()[0] == 1024.0);
    made_since.push_back(full({n, 1024}, 7.0, {.device = d}));
    y.zero_();
    g.replay();
    CHECK(y.to_vector() == want);
    CHECK(made_since.back().to_vector()[0] == 7.0);
    CHECK(made_since.front().to_vector().back() == 7.0);
  }
}

// On a GPU the recorded checks write flags the recording holds, read at the next synchronization: the
// bad target is thrown at the loss read after its replay, and the next replay's read is clean.
TEST_CASE("cuda step graph: a loss's class targets and gather replay as eager steps; a bad target is an error") {
  if (!evenflow::testing::cuda_devices_available(2)) return;
  check_classifier_steps({cuda(0)});
  check_classifier_steps({cuda(0), cuda(1)});
}

// On a GPU a bad index of the last replay is thrown where the devices are next waited for: when the
// step changed, by dropping the recording. The changed step must then not replay the recording made
// before the change -- the signature is taken only once it is dropped.
TEST_CASE("cuda step graph: a bad index thrown as the step changes leaves no recording of the old step") {
  if (!evenflow::testing::cuda_devices_available(1)) return;
  const Device d = cuda(0);
  const Tensor x = arange(0.0, 4.0, 1.0, {.device = d});
  const Tensor index = zeros({2}, {.dtype = kInt64, .device = d});
  Tensor y = zeros({2}, {.device = d});
  ReplayedStep step({d}, [&] { y.add_(index_select(x, 0, index)); }, {.warm_up = 1, .log = [](const std::string&) {}});
  step("a");
  step("a");
  CHECK(step.replayed());
  index.copy_(full({2}, 9.0, {.dtype = kInt64, .device = d}));
  step("a");  // queued: its bad index is found when the device is next waited for
  const std::string e = error_of([&] { step("b"); });
  CHECK_MESSAGE(e.find("index_select: index 9 is out of range") != std::string::npos, e);
  index.zero_();
  step("b");
  CHECK(!step.replayed());  // a warm-up: the recording of "a" is gone
  step("b");
  CHECK(step.replayed());
}

TEST_CASE("cuda step graph: a changed signature or math setting records the step again, saying so") {
  if (!evenflow::testing::cuda_devices_available(1)) return;
  const Device d = cuda(0);
  Tensor x = zeros({2}, {.device = d});
  std::string log;
  ReplayedStep step({d}, [&] { x.add_(ones({2}, {.device = d})); },
                    {.warm_up = 1, .log = [&](const std::string& line) { log += line + "\n"; }});
  step("batch 2");
  step("batch 2");
  CHECK(step.replayed());
  {
    CudaMath m = cuda_math();
    m.allow_tf32_conv = !m.allow_tf32_conv;
    const CudaMathGuard toggled(m);
    step("batch 2");
  }
  CHECK(!step.replayed());
  CHECK(log.find("the step changed") != std::string::npos);
  step("batch 3");
  step("batch 3");
  CHECK(step.replayed());
  CHECK(x.to_vector()[0] == 5.0);
}
