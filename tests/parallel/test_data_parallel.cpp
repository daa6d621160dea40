// The data-parallel invariants on CPU devices, in float64: N devices equal one device on the whole
// batch (losses and every parameter gradient, 1e-10) for a CNN, uneven splits, a batch smaller than
// the group, a WGAN-GP penalty computed per device, and SyncBatchNorm under a penalty; replicas stay
// bitwise identical; failures on one device reach the caller and the group runs again; gradients that
// reach several parameters through one tensor are neither summed twice nor left strided.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "evenflow/layers/layers.h"
#include "evenflow/losses/losses.h"
#include "evenflow/optim/optim.h"
#include "evenflow/parallel/data_parallel.h"
#include "evenflow/parallel/sync_batch_norm.h"
#include "evenflow/parallel/training_state.h"
#include "tests/io/test_files.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::parallel;
using namespace evenflow::testing;

namespace {

constexpr double kTol = 1e-10;
const nn::ModuleOptions f64{.dtype = kFloat64};

Tensor nll(const Tensor& logits, const Tensor& labels) {
  return neg(mean(gather(log_softmax(logits, 1), 1, unsqueeze(labels, 1))));
}

std::shared_ptr<nn::Module> make_cnn() {
  manual_seed(cpu(), 11);
  return std::make_shared<nn::Sequential>(nn::Conv2d(1, 4, 3, {.padding = 1}, f64), nn::ReLU(), nn::MaxPool2d(2),
                                          nn::Flatten(), nn::Linear(4 * 4 * 4, 5, true, f64));
}

std::shared_ptr<nn::Module> make_critic(bool batch_norm) {
  manual_seed(cpu(), 12);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(nn::Linear(6, 8, true, f64));
  if (batch_norm) net->push_back(nn::BatchNorm1d(8, {}, f64));
  net->push_back(nn::Tanh());
  net->push_back(nn::Linear(8, 1, true, f64));
  return net;
}

// The WGAN-GP critic loss of one batch (or chunk): mean D(fake) - mean D(real) + 10·mean (|∇D(x̂)| - 1)²
// with x̂ = eps·real + (1 - eps)·fake.
Tensor critic_loss(nn::Module& critic, const Tensor& real, const Tensor& fake, const Tensor& eps) {
  Tensor interpolates = (eps * real + (1.0 - eps) * fake).detach();
  interpolates.requires_grad_(true);
  const Tensor g = grad({sum(critic(interpolates))}, {interpolates}, {}, {.create_graph = true})[0];
  const Tensor penalty = mean(square(norm(g, 2.0, {1}) - 1.0));
  return mean(critic(fake)) - mean(critic(real)) + 10.0 * penalty;
}

void check_close(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::string diff = compare(got.to(cpu()), want.to(cpu()), kTol, kTol);
  CHECK_MESSAGE(diff.empty(), what, ": ", diff);
}

// Every replica's gradients against the reference module's, as backward() left them: synchronized
// when it returns (no finish_gradient_sync call).
void check_grads(DataParallelModel& model, nn::Module& reference) {
  const auto want = reference.named_parameters();
  for (int r = 0; r < model.size(); ++r) {
    const auto got = model.replica(r).named_parameters();
    for (size_t i = 0; i < want.size(); ++i) {
      REQUIRE(got[i].second.grad().defined());
      check_close(got[i].second.grad(), want[i].second.grad(), "replica " + std::to_string(r) + " " + want[i].first);
    }
  }
}

// One CNN step on `devices` and on one device over the whole batch of `batch` images.
void check_cnn_step(const std::string& devices_spec, int64_t batch) {
  CAPTURE(devices_spec);
  CAPTURE(batch);
  auto net = make_cnn();
  auto reference = net->clone();
  DataParallelModel model(net, devices(devices_spec), {.bucket_bytes = 256});
  DataParallelCriterion criterion(model, DataParallelCriterion::mean_over_samples(nll));
  manual_seed(cpu(), 21);
  const Tensor x = randn({batch, 1, 8, 8}, {.dtype = kFloat64});
  const Tensor y = argmax(randn({batch, 5}), 1);

  const auto xs = model.scatter(x);
  CHECK(xs.size() == static_cast<size_t>(std::min<int64_t>(batch, model.size())));
  const Tensor loss = criterion(model(xs), model.scatter(y));
  loss.backward();
  const Tensor want = nll(reference->forward(x), y);
  want.backward();
  CHECK(loss.device() == model.devices()[0]);
  check_close(loss, want, "loss");
  check_grads(model, *reference);
  // NCCL reduces flat buffers: a strided gradient (linear's weight) would fail on distinct GPUs.
  for (int r = 0; r < model.size(); ++r) CHECK(gradient_layout_problem(model.replica(r).named_parameters()).empty());
  // The torch DataParallel pattern gives the same loss (it only costs more memory on device 0).
  check_close(criterion.gathered(model(model.scatter(x)), model.scatter(y)), want, "gathered loss");
}

}  // namespace

TEST_CASE("data parallel: a CNN on N devices equals one device on the whole batch") {
  check_cnn_step("cpu:2", 8);   // even chunks
  check_cnn_step("cpu:4", 10);  // uneven: 3, 3, 2, 2
  check_cnn_step("cpu:4", 2);   // smaller than the group: two devices idle
  check_cnn_step("cpu:1", 5);
}

namespace {
// A model given by its parameters (name, initial values) and a forward function over them: the
// patterns whose gradients once reached several parameters through one shared tensor (Note
// [Gradient layout] in engine/autograd.cpp).
struct PatternNet : nn::Cloneable<PatternNet> {
  using Forward = std::function<Tensor(const nn::Module& self, const Tensor& x)>;
  PatternNet(std::string pattern, const std::vector<std::pair<std::string, Shape>>& params, Forward fn)
      : pattern_(std::move(pattern)), fn_(std::move(fn)) {
    for (const auto& [name, shape] : params) register_parameter(name, randn(shape, {.dtype = kFloat64}));
  }
  std::string name() const override { return "PatternNet(" + pattern_ + ")"; }
  Tensor forward(const Tensor& x) override { return fn_(*this, x); }

  std::string pattern_;
  Forward fn_;
};

std::vector<std::shared_ptr<PatternNet>> aliasing_patterns() {
  manual_seed(cpu(), 31);
  using M = const nn::Module&;
  const Shape v{4}, w{4, 4};
  return {
      std::make_shared<PatternNet>("x + (a + b)", std::vector<std::pair<std::string, Shape>>{{"a", v}, {"b", v}},
                                   [](M m, const Tensor& x) { return x + (m.tensor("a") + m.tensor("b")); }),
      std::make_shared<PatternNet>(
          "LoRA-style linear(x, W0 + dW, c)",
          std::vector<std::pair<std::string, Shape>>{{"W0", w}, {"dW", w}, {"c", v}},
          [](M m, const Tensor& x) { return linear(x, m.tensor("W0") + m.tensor("dW"), m.tensor("c")); }),
      std::make_shared<PatternNet>(
          "two biases linear(x, W) + b1 + b2",
          std::vector<std::pair<std::string, Shape>>{{"W", w}, {"b1", v}, {"b2", v}},
          [](M m, const Tensor& x) { return linear(x, m.tensor("W"), Tensor()) + m.tensor("b1") + m.tensor("b2"); }),
      std::make_shared<PatternNet>("clone(a) + b", std::vector<std::pair<std::string, Shape>>{{"a", v}, {"b", v}},
                                   [](M m, const Tensor& x) { return x * (clone(m.tensor("a")) + m.tensor("b")); }),
      std::make_shared<PatternNet>("x * (sum(a) + sum(b))",
                                   std::vector<std::pair<std::string, Shape>>{{"a", v}, {"b", v}},
                                   [](M m, const Tensor& x) { return x * (sum(m.tensor("a")) + sum(m.tensor("b"))); }),
      std::make_shared<PatternNet>("a + mean(tanh(x W^T)) per sample",
                                   std::vector<std::pair<std::string, Shape>>{{"a", v}, {"W", w}},
                                   [](M m, const Tensor& x) {
                                     return m.tensor("a") + mean(tanh(linear(x, m.tensor("W"), Tensor())), {1}, true);
                                   }),
      std::make_shared<PatternNet>("W used twice: linear(tanh(linear(x, W, b)), W, b)",
                                   std::vector<std::pair<std::string, Shape>>{{"W", w}, {"b", v}},
                                   [](M m, const Tensor& x) {
                                     const Tensor& W = m.tensor("W");
                                     const Tensor& b = m.tensor("b");
                                     return linear(tanh(linear(x, W, b)), W, b);
                                   }),
  };
}
}  // namespace

namespace {
// Each aliasing pattern on `specs`, with one-parameter (1-byte) and default buckets, against one CPU
// device on the whole batch (float64, 1e-10); every gradient contiguous and its own.
void check_aliasing_patterns(const std::vector<std::string>& specs) {
  const auto square_mean = [](const Tensor& out, const Tensor&) { return mean(square(out)); };
  for (const auto& pattern : aliasing_patterns()) {
    for (const std::string& spec : specs) {
      for (size_t bucket_bytes : {size_t{1}, DataParallelOptions{}.bucket_bytes}) {
        CAPTURE(pattern->pattern_);
        CAPTURE(spec);
        CAPTURE(bucket_bytes);
        auto reference = pattern->clone();
        DataParallelModel model(pattern->clone(), devices(spec), {.bucket_bytes = bucket_bytes});
        DataParallelCriterion criterion(model, DataParallelCriterion::mean_over_samples(square_mean));
        manual_seed(cpu(), 32);
        const Tensor x = randn({7, 4}, {.dtype = kFloat64});
        const auto xs = model.scatter(x);
        const Tensor loss = criterion(model(xs), xs);
        loss.backward();
        const Tensor want = square_mean(reference->forward(x), x);
        want.backward();
        check_close(loss, want, "loss");
        check_grads(model, *reference);
        for (int r = 0; r < model.size(); ++r)
          CHECK(gradient_layout_problem(model.replica(r).named_parameters()).empty());
        CHECK(gradient_layout_problem(reference->named_parameters()).empty());
        // Clipping scales each gradient once (an aliased one would be scaled twice).
        const double total = optim::clip_grad_norm_(reference->parameters(), 1e-3);
        for (int r = 0; r < model.size(); ++r)
          CHECK(optim::clip_grad_norm_(model.replica(r).parameters(), 1e-3) == doctest::Approx(total).epsilon(1e-12));
        check_grads(model, *reference);
      }
    }
  }
}
}  // namespace

TEST_CASE("data parallel: gradients reaching several parameters through one tensor are not summed twice") {
  check_aliasing_patterns({"cpu:2", "cpu:3"});
}

TEST_CASE("data parallel: CUDA logical devices equal one CPU device (float64)") {
  if (!cuda_devices_available(2)) return;
  check_cnn_step("cuda:0,1", 10);
  check_cnn_step("cuda", 3);
  check_aliasing_patterns({"cuda:0,1"});
}

namespace {
// The WGAN-GP critic loss computed per device on `spec` (with SyncBatchNorm or without a norm)
// against one CPU device on the whole batch of 7: loss, every gradient, SyncBatchNorm's buffers.
void check_penalty_step(const std::string& spec) {
  CAPTURE(spec);
  for (bool sync_bn : {false, true}) {
    CAPTURE(sync_bn);
    auto net = make_critic(sync_bn);
    auto reference = net->clone();
    DataParallelModel model(sync_bn ? convert_sync_batchnorm(net) : net, devices(spec), {.bucket_bytes = 128});
    if (sync_bn) CHECK(model.replica(1).repr().find("SyncBatchNorm") != std::string::npos);
    DataParallelCriterion criterion(model);
    manual_seed(cpu(), 22);
    const Tensor real = randn({7, 6}, {.dtype = kFloat64});
    const Tensor fake = randn({7, 6}, {.dtype = kFloat64});
    const Tensor eps = rand({7, 1}, {.dtype = kFloat64});
    const auto reals = model.scatter(real), fakes = model.scatter(fake), epss = model.scatter(eps);
    std::vector<int64_t> sizes;
    for (const Tensor& t : reals) sizes.push_back(t.size(0));
    CHECK(sizes == split_sizes(7, model.size()));

    const Tensor loss = criterion([&](int r) { return critic_loss(model.replica(r), reals[r], fakes[r], epss[r]); });
    loss.backward();
    const Tensor want = critic_loss(*reference, real, fake, eps);
    want.backward();
    check_close(loss, want, "loss");
    check_grads(model, *reference);
    if (sync_bn) {
      // SyncBatchNorm's running statistics are the whole batch's, on every replica.
      const auto want_buffers = reference->named_buffers();
      for (int r = 0; r < model.size(); ++r) {
        const auto got = model.replica(r).named_buffers();
        for (size_t i = 0; i < want_buffers.size(); ++i)
          check_close(got[i].second, want_buffers[i].second, "buffer " + want_buffers[i].first);
      }
    }
  }
}
}  // namespace

TEST_CASE("data parallel: a WGAN-GP penalty computed per device equals the whole batch's") {
  check_penalty_step("cpu:3");  // chunks 3, 2, 2
}

TEST_CASE("data parallel: a WGAN-GP penalty and SyncBatchNorm on CUDA logical devices equal one CPU device") {
  if (!cuda_devices_available(2)) return;
  check_penalty_step("cuda");
}

TEST_CASE("SyncBatchNorm: float32 variance of values far from zero stays exact across devices") {
  // mean 100, std 0.01: a one-pass variance (Σx² - n·mean², Σx² ≈ 9e4 with float32 steps of 8e-3)
  // would lose every digit of n·var ≈ 1e-3; the per-device centred sums combine without cancelling
  // (Note [SyncBatchNorm statistics]). momentum 1: running_var is the batch's unbiased variance.
  manual_seed(cpu(), 27);
  const Tensor x = (randn({9, 3}, {.dtype = kFloat64}) * 0.01 + 100.0).to(kFloat32);
  const nn::BatchNormConfig config{.momentum = 1.0, .affine = false};
  DataParallelModel model(std::make_shared<SyncBatchNorm>(3, config), devices("cpu:3"));
  const auto ys = model(model.scatter(x));
  nn::BatchNorm1d reference(3, config, {.dtype = kFloat64});
  const Tensor want = reference.forward(x.to(kFloat64));  // the float32 values, in float64
  const std::string running =
      compare(model.module().tensor("running_var").to(kFloat64), reference.tensor("running_var"), 0.0, 1e-3);
  CHECK_MESSAGE(running.empty(), running);
  // The outputs carry the float32 mean's rounding (about 1e-5 against a std of 1e-2).
  const Tensor y = cat({ys[0], ys[1].to(cpu()), ys[2].to(cpu())}, 0).to(kFloat64);
  const std::string diff = compare(y, want, 1e-2, 1e-2);
  CHECK_MESSAGE(diff.empty(), diff);
}

TEST_CASE("data parallel: a gradient penalty has the exact expected gradient") {
  // D(x) = x·w: ∇ₓD = w for every sample, so the penalty is λ(|w| - 1)² and its gradient is
  // 2λ(|w| - 1)·w/|w|, whatever the batch and its split.
  auto net = std::make_shared<nn::Linear>(4, 1, false, f64);
  DataParallelModel model(net, devices("cpu:3"));
  DataParallelCriterion criterion(model);
  manual_seed(cpu(), 23);
  const auto xs = model.scatter(randn({5, 4}, {.dtype = kFloat64}));
  const Tensor loss = criterion([&](int r) {
    Tensor x = xs[r].detach();
    x.requires_grad_(true);
    const Tensor g = grad({sum(model.replica(r)(x))}, {x}, {}, {.create_graph = true})[0];
    return mean(square(norm(g, 2.0, {1}) - 1.0)) * 3.0;
  });
  loss.backward();
  const Tensor w = net->tensor("weight").detach();
  const double n = norm(w).item();
  const Tensor expected = w * (2.0 * 3.0 * (n - 1.0) / n);
  check_close(loss, full({}, 3.0 * (n - 1.0) * (n - 1.0), {.dtype = kFloat64}), "penalty");
  for (int r = 0; r < 3; ++r) check_close(model.replica(r).tensor("weight").grad(), expected, "weight gradient");
}

TEST_CASE("data parallel: the per-rank criterion weighs by the current batch and names what is wrong") {
  auto net = std::make_shared<nn::Linear>(4, 1, false, f64);
  DataParallelModel model(net, devices("cpu:2"));
  DataParallelCriterion criterion(model);
  const auto constant = [&](int r) { return zeros({}, {.dtype = kFloat64, .device = model.devices()[r]}); };
  std::string msg = error_of([&] { criterion(constant); });
  CHECK_MESSAGE(msg.find("the model has no current batch: scatter one") != std::string::npos, msg);
  const auto xs = model.scatter(randn({5, 4}, {.dtype = kFloat64}));  // chunks of 3 and 2
  // Rank r's loss, a mean over its chunk, is r + 1: weighted 3/5 and 2/5.
  const Tensor loss =
      criterion([&](int r) { return full({}, r + 1.0, {.dtype = kFloat64, .device = xs[r].device()}); });
  CHECK(loss.item() == doctest::Approx(1.0 * 3 / 5 + 2.0 * 2 / 5).epsilon(1e-15));
  // As parts: sums 1 and 2 over weights 4 and 1 (a chunk's own weight, not its size): 3 / 5.
  const Tensor parts = criterion([&](int r) {
    const TensorOptions o{.dtype = kFloat64, .device = model.devices()[r]};
    return losses::LossParts(full({}, r + 1.0, o), full({}, r == 0 ? 4.0 : 1.0, o));
  });
  CHECK(parts.item() == doctest::Approx(3.0 / 5).epsilon(1e-15));
  msg = error_of([&] {
    criterion([&](int r) {
      const Tensor one = full({}, 1.0, {.dtype = kFloat64, .device = model.devices()[r]});
      return r == 0 ? losses::LossParts(one, one) : losses::LossParts(one, one) + losses::LossParts(one, one);
    });
  });
  CHECK_MESSAGE(msg.find("the loss on cpu:1 has 2 terms, on cpu:0 1") != std::string::npos, msg);
  msg = error_of([&] { criterion([&](int) { return zeros({}, {.dtype = kFloat64}); }); });
  CHECK_MESSAGE(msg.find("the loss of rank 1 is on cpu:0, not on its device cpu:1") != std::string::npos, msg);
}

TEST_CASE("data parallel: weights the host knows are added there, beside device weights, and checked") {
  auto net = std::make_shared<nn::Linear>(4, 1, false, f64);
  DataParallelModel model(net, devices("cpu:2"));
  DataParallelCriterion criterion(model);
  const auto xs = model.scatter(randn({5, 4}, {.dtype = kFloat64}));
  const auto options = [&](int r) { return TensorOptions{.dtype = kFloat64, .device = model.devices()[r]}; };
  // Sums 1 and 2 over weights 4 and 1: 3 / 5, whether the host or the devices hold the weights.
  const double host =
      criterion([&](int r) { return losses::LossParts(full({}, r + 1.0, options(r)), r == 0 ? 4.0 : 1.0); }).item();
  const double mixed =
      criterion([&](int r) {
        const Tensor sum = full({}, r + 1.0, options(r));
        return r == 0 ? losses::LossParts(sum, 4.0) : losses::LossParts(sum, full({}, 1.0, options(r)));
      }).item();
  CHECK(host == doctest::Approx(3.0 / 5).epsilon(1e-15));
  CHECK(mixed == doctest::Approx(3.0 / 5).epsilon(1e-15));
  // A term of weight 0 everywhere (nothing counted: its sums are 0) counts 0, not NaN; the other
  // term (weights 1 and 3) still divides.
  const double empty = criterion([&](int r) {
                         return losses::LossParts(zeros({}, options(r)), 0.0) +
                                losses::LossParts(full({}, 2.0, options(r)), r == 0 ? 1.0 : 3.0);
                       }).item();
  CHECK(empty == doctest::Approx(1.0).epsilon(1e-15));
  const Tensor one = ones({}, {.dtype = kFloat64});
  for (const double bad : {-1.0, std::nan(""), HUGE_VAL}) {
    const std::string msg = error_of([&] { losses::LossParts(one, bad); });
    CHECK_MESSAGE(msg.find("LossParts: the weight must be finite and not negative") != std::string::npos, msg);
  }
  const std::string msg = error_of([&] { losses::LossParts(ones({2}, {.dtype = kFloat64}), 1.0); });
  CHECK_MESSAGE(msg.find("LossParts: the sum must be a one-element tensor") != std::string::npos, msg);

  // One device in one process: the chunk is the whole batch, and its mean is the loss itself (no
  // kernel scaled it by its count and back).
  DataParallelModel single(std::make_shared<nn::Linear>(4, 1, false, f64), devices("cpu:1"));
  DataParallelCriterion single_criterion(single);
  const auto x = single.scatter(randn({5, 4}, {.dtype = kFloat64}));
  Tensor mean_of_rank;
  const Tensor loss = single_criterion([&](int r) { return mean_of_rank = mean(single.replica(r)(x[r])); });
  CHECK(loss.data_ptr() == mean_of_rank.data_ptr());
}

TEST_CASE("data parallel: replicas stay bitwise identical and follow the one-device run") {
  auto net = make_cnn();
  auto reference = net->clone();
  DataParallelModel model(net, devices("cpu:3"), {.bucket_bytes = 512});
  DataParallelCriterion criterion(model, DataParallelCriterion::mean_over_samples(nll));
  ReplicatedOptimizer<optim::Adam> opt(model, optim::AdamOptions{.lr = 1e-2});
  optim::Adam reference_opt(reference->parameters(), {.lr = 1e-2});
  manual_seed(cpu(), 24);
  for (int step = 0; step < 4; ++step) {
    const Tensor x = randn({7, 1, 8, 8}, {.dtype = kFloat64});
    const Tensor y = argmax(randn({7, 5}), 1);
    opt.zero_grad();
    const Tensor loss = criterion(model(model.scatter(x)), model.scatter(y));
    loss.backward();
    opt.step();
    reference_opt.zero_grad();
    const Tensor want = nll(reference->forward(x), y);
    want.backward();
    reference_opt.step();
    check_close(loss, want, "loss at step " + std::to_string(step));
    model.check_replicas();  // bitwise
  }
  const auto want = reference->named_parameters();
  const auto got = model.module().named_parameters();
  for (size_t i = 0; i < want.size(); ++i) check_close(got[i].second, want[i].second, want[i].first);
}

TEST_CASE("data parallel: gradients are synchronized when backward returns; finish_gradient_sync adds nothing") {
  // Two idle devices and a parameter no replica uses: the sync at the end of backward reduces what
  // the buckets (one parameter each) did not: the idle ranks' zeros. The unused one stays without.
  manual_seed(cpu(), 31);
  auto net = std::make_shared<PatternNet>(
      "tanh(linear(x, w, b))", std::vector<std::pair<std::string, Shape>>{{"w", {2, 3}}, {"b", {2}}, {"unused", {2}}},
      [](const nn::Module& m, const Tensor& x) { return tanh(linear(x, m.tensor("w"), m.tensor("b"))); });
  auto reference = net->clone();
  DataParallelModel model(net, devices("cpu:4"), {.bucket_bytes = 1});
  DataParallelCriterion criterion(
      model, DataParallelCriterion::mean_over_samples([](const Tensor& y, const Tensor&) { return mean(square(y)); }));
  const Tensor x = randn({2, 3}, {.dtype = kFloat64});
  criterion(model(model.scatter(x)), model.scatter(x)).backward();
  mean(square(reference->forward(x))).backward();
  // Every replica against the reference, which has no gradient for "unused" either.
  const auto want = reference->named_parameters();
  for (int r = 0; r < 4; ++r) {
    const auto got = model.replica(r).named_parameters();
    for (size_t i = 0; i < want.size(); ++i) {
      CAPTURE(r);
      CAPTURE(want[i].first);
      REQUIRE(got[i].second.grad().defined() == want[i].second.grad().defined());
      if (want[i].second.grad().defined()) check_close(got[i].second.grad(), want[i].second.grad(), want[i].first);
    }
  }
  std::vector<std::vector<double>> before;
  for (int r = 0; r < 4; ++r)
    for (const auto& [name, p] : model.replica(r).named_parameters())
      if (p.grad().defined()) before.push_back(p.grad().to_vector());
  model.finish_gradient_sync();
  size_t i = 0;
  for (int r = 0; r < 4; ++r)
    for (const auto& [name, p] : model.replica(r).named_parameters())
      if (p.grad().defined()) CHECK(p.grad().to_vector() == before[i++]);
}

TEST_CASE("data parallel: no_sync accumulates, and a second unsynchronized backward is an error") {
  auto net = make_cnn();
  auto reference = net->clone();
  DataParallelModel model(net, devices("cpu:2"));
  DataParallelCriterion criterion(model, DataParallelCriterion::mean_over_samples(nll));
  manual_seed(cpu(), 25);
  const Tensor x = randn({8, 1, 8, 8}, {.dtype = kFloat64});
  const Tensor y = argmax(randn({8, 5}), 1);
  auto half_loss = [&](int64_t start) {
    return criterion(model(model.scatter(narrow(x, 0, start, 4))), model.scatter(narrow(y, 0, start, 4))) * 0.5;
  };
  {
    auto guard = model.no_sync();
    half_loss(0).backward();
  }
  half_loss(4).backward();
  nll(reference->forward(x), y).backward();
  check_grads(model, *reference);

  // Synchronized already (and no zero_grad since): summing again would count it twice.
  const std::string twice = error_of([&] { half_loss(0).backward(); });
  CHECK(twice.find("received a gradient again after it was synchronized") != std::string::npos);
}

TEST_CASE("data parallel: the caller's NoGradGuard covers the replicas' forward") {
  DataParallelModel model(make_cnn(), devices("cpu:2"));
  const auto xs = model.scatter(randn({4, 1, 8, 8}, {.dtype = kFloat64}));
  CHECK(model(xs)[1].requires_grad());
  NoGradGuard no_grad;
  for (const Tensor& y : model(xs)) CHECK(!y.requires_grad());
}

TEST_CASE("data parallel: mismatched replicas are detected and named") {
  DataParallelModel model(make_cnn(), devices("cpu:3"));
  model.check_replicas();
  {
    NoGradGuard no_grad;
    model.replica(2).tensor("4.bias").add_(full({5}, 1e-12, {.dtype = kFloat64, .device = cpu(2)}));
  }
  const std::string message = error_of([&] { model.check_replicas(); });
  CHECK(message.find("replica 2 on cpu:2 differs from replica 0 in '4.bias'") != std::string::npos);
}

namespace {
// Identity, except that it throws (forward or backward) on one device while `armed`.
struct Tripwire : nn::Cloneable<Tripwire> {
  std::shared_ptr<std::atomic<int>> forward_on = std::make_shared<std::atomic<int>>(-1);
  std::shared_ptr<std::atomic<int>> backward_on = std::make_shared<std::atomic<int>>(-1);
  std::string name() const override { return "Tripwire"; }
  Tensor forward(const Tensor& x) override {
    EF_CHECK(x.device().index != forward_on->load(), "tripwire in forward");
    Tensor y;
    {
      NoGradGuard no_grad;
      y = x.clone();
    }
    const int index = x.device().index;
    auto armed = backward_on;
    record("Tripwire", {y}, {x}, {}, [index, armed](const std::vector<Tensor>& g) {
      EF_CHECK(index != armed->load(), "tripwire in backward");
      return g;
    });
    return y;
  }
};
}  // namespace

TEST_CASE(
    "data parallel: a failure on one device mid-forward or mid-backward reaches the caller; the group runs again") {
  auto tripwire = std::make_shared<Tripwire>();
  manual_seed(cpu(), 26);
  // The tripwire sits between two SyncBatchNorms, so when it fails the other devices are waiting in
  // a collective: the second one's forward, or the first one's backward.
  auto net = std::make_shared<nn::Sequential>(nn::Linear(3, 4, true, f64));
  net->push_back(std::make_shared<SyncBatchNorm>(4, nn::BatchNormConfig{}, f64));
  net->push_back(tripwire);
  net->push_back(std::make_shared<SyncBatchNorm>(4, nn::BatchNormConfig{}, f64));
  DataParallelModel model(net, devices("cpu:3"), {.collective_timeout = std::chrono::milliseconds(60000)});
  DataParallelCriterion criterion(model, DataParallelCriterion::mean_over_samples(
                                             [](const Tensor& out, const Tensor&) { return mean(square(out)); }));
  const Tensor x = randn({6, 3}, {.dtype = kFloat64});
  auto step = [&] {
    const auto xs = model.scatter(x);
    criterion(model(xs), xs).backward();
  };

  const auto start = std::chrono::steady_clock::now();
  *tripwire->forward_on = 1;  // replicas share the flag: clone copies the handle
  CHECK(error_of(step) == "on cpu:1: tripwire in forward");
  *tripwire->forward_on = -1;
  *tripwire->backward_on = 2;
  const std::string backward_error = error_of(step);
  CHECK(backward_error.find("in backward of Tripwire on cpu:2: tripwire in backward") != std::string::npos);
  *tripwire->backward_on = -1;
  // Neither failure waited for the 60 s collective timeout.
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 30.0);
  for (int r = 0; r < 3; ++r) model.replica(r).zero_grad();
  model.reset_gradient_sync();
  CHECK(error_of(step) == "(no error)");
}

namespace {
// A critic with dropout, trained `steps` WGAN-GP steps (the penalty's interpolation weights drawn by
// the loss itself) on `spec`, or on one device without the parallel module when spec is empty.
// Returns the losses and the final parameters. Every draw is per sample (Note [Random numbers per
// sample] in engine/tensor.h), so every layout must give the same numbers.
std::pair<std::vector<double>, nn::NamedTensors> train_critic_with_dropout(const std::string& spec, int steps) {
  manual_seed(cpu(), 30);
  auto net = std::make_shared<nn::Sequential>(nn::Linear(6, 8, true, f64), nn::Dropout(0.5), nn::Tanh(),
                                              nn::Linear(8, 1, true, f64));
  const auto loss_of = [](nn::Module& critic, const Tensor& real, const Tensor& fake) {
    const losses::Critic d = [&](const Tensor& x) { return critic(x); };
    return losses::wasserstein_critic_loss(critic(real), critic(fake)) + losses::wgan_gp_penalty(d, real, fake);
  };
  std::vector<double> losses_seen;
  if (spec.empty()) {
    optim::Adam opt(net->parameters(), {.lr = 1e-2});
    for (int step = 0; step < steps; ++step) {
      const Tensor real = randn({7, 6}, {.dtype = kFloat64}), fake = randn({7, 6}, {.dtype = kFloat64});
      opt.zero_grad();
      const Tensor loss = loss_of(*net, real, fake);
      loss.backward();
      opt.step();
      losses_seen.push_back(loss.item());
    }
    return {losses_seen, net->named_parameters()};
  }
  DataParallelModel model(net, devices(spec), {.bucket_bytes = 128});
  DataParallelCriterion criterion(model);
  ReplicatedOptimizer<optim::Adam> opt(model, optim::AdamOptions{.lr = 1e-2});
  for (int step = 0; step < steps; ++step) {
    const Tensor real = randn({7, 6}, {.dtype = kFloat64}), fake = randn({7, 6}, {.dtype = kFloat64});
    const auto reals = model.scatter(real), fakes = model.scatter(fake);
    opt.zero_grad();
    const Tensor loss = criterion([&](int r) { return loss_of(model.replica(r), reals[r], fakes[r]); });
    loss.backward();
    opt.step();
    losses_seen.push_back(loss.item());
    model.check_replicas();
  }
  return {losses_seen, model.module().named_parameters()};
}
}  // namespace

TEST_CASE("data parallel: dropout masks and a penalty's drawn weights are the one-device run's, at any split") {
  const auto [want_losses, want_params] = train_critic_with_dropout("", 4);
  for (const std::string spec : {"cpu:1", "cpu:2", "cpu:3", "cpu:4"}) {
    CAPTURE(spec);
    const auto [losses_seen, params] = train_critic_with_dropout(spec, 4);
    for (size_t i = 0; i < want_losses.size(); ++i)
      CHECK(losses_seen[i] == doctest::Approx(want_losses[i]).epsilon(kTol));
    for (size_t i = 0; i < want_params.size(); ++i)
      check_close(params[i].second, want_params[i].second, params[i].first);
  }
  // The draws do depend on the step: four steps' losses are not all one value.
  CHECK(want_losses[0] != want_losses[1]);
}

// What a loader's Batch::rows give scatter: the part of a job's batch that one process of several
// reads draws, in every layer, the numbers those rows draw when one device holds the whole batch.
TEST_CASE("data parallel: a batch given with its rows of the job's batch draws as those rows; bad rows are named") {
  const Tensor x = full({9, 4}, 1.0, {.dtype = kFloat64});
  DataParallelModel model(std::make_shared<nn::Sequential>(nn::Dropout(0.5)), devices("cpu:2"));
  const auto host_rows = [](const PerDevice<Tensor>& ys) { return cat({ys[0].to(cpu()), ys[1].to(cpu())}, 0); };
  manual_seed(cpu(), 32);
  const Tensor whole = host_rows(model(model.scatter(x)));
  CHECK(amax(whole).item() == 2.0);  // some rows kept, some dropped
  CHECK(sum(whole).item() < 72.0);
  manual_seed(cpu(), 32);
  const auto xs = model.scatter(narrow(x, 0, 3, 6), {.start = 3, .count = 6, .total = 9});
  const std::vector<BatchRows> rows = model.batch_rows();
  REQUIRE(rows.size() == 2);
  CHECK((rows[0].start == 3 && rows[0].count == 3 && rows[0].total == 9));
  CHECK((rows[1].start == 6 && rows[1].count == 3 && rows[1].total == 9));
  CHECK(host_rows(model(xs)).to_vector() == narrow(whole, 0, 3, 6).to_vector());
  CHECK(model.batch_rows()[1].start == 6);  // forward on the batch's chunks keeps its rows
  // Chunks already split, with their rows.
  manual_seed(cpu(), 32);
  CHECK(host_rows(model(model.scatter(xs, {.start = 3, .count = 6, .total = 9}))).to_vector() ==
        narrow(whole, 0, 3, 6).to_vector());

  // One process: its rows are the whole batch, its part the tensor itself.
  const BatchRows mine = model.process_rows(9);
  CHECK((mine.start == 0 && mine.count == 9 && mine.total == 9));
  CHECK(model.process_part(x).data<double>() == x.data<double>());

  CHECK(error_of([&] { model.scatter(x, {.start = 0, .count = 8, .total = 9}); }) ==
        "DataParallelModel::scatter: a batch of 9 rows given as rows 0 to 8 of 9");
  CHECK(error_of([&] { model.scatter(x, {.start = 3, .count = 9, .total = 9}); }) ==
        "DataParallelModel::scatter: a batch of 9 rows given as rows 3 to 12 of 9");
  CHECK(error_of([&] { model.scatter(xs, {.start = 0, .count = 5, .total = 9}); }) ==
        "DataParallelModel::scatter: chunks of 6 rows given as rows 0 to 5 of 9");
}

TEST_CASE("batch draws: a device's rows are those rows of the whole batch's draw; a wrong row count is named") {
  manual_seed(cpu(), 31);
  const Tensor whole = batch_randn({5, 3}, {.dtype = kFloat64});
  for (const auto& [start, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 3}, {4, 1}}) {
    manual_seed(cpu(), 31);
    const BatchRowsGuard rows({.start = start, .count = count, .total = 5});
    CHECK(batch_randn({count, 3}, {.dtype = kFloat64}).to_vector() ==
          slice(whole, 0, start, start + count).to_vector());
    // Every part advances the generator by the whole batch's count.
    CHECK(generator_state(cpu()).offset == 15);
  }
  const BatchRowsGuard rows({.start = 1, .count = 2, .total = 5});
  CHECK(error_of([] { batch_rand({3, 3}); }).find("batch_rand: shape [3, 3] does not start with the 2 rows") == 0);
  CHECK(error_of([] { BatchRowsGuard bad({.start = 4, .count = 2, .total = 5}); }) ==
        "BatchRows: rows 4 to 6 do not fit a batch of 5");
}

TEST_CASE("data parallel: every rank runs its backward collectives in one order, even where graphs differ") {
  // Batch 7 over cpu:4 gives rank 3 a chunk of one row, whose graph lacks nodes the others have
  // (sum_to of an equal shape adds none), so without Note [Collectives in backward] its engine ran
  // the SyncBatchNorm all_reduces of the penalty's double backward in another order than the other
  // ranks', and the communicator summed unrelated tensors: gradients off by up to 0.8.
  manual_seed(cpu(), 30);
  auto net = std::make_shared<nn::Sequential>(nn::Linear(6, 8, true, f64), SyncBatchNorm(8, {}, f64), nn::Tanh(),
                                              nn::Tanh(), nn::Linear(8, 1, true, f64));
  auto reference = net->clone();
  DataParallelModel model(net, devices("cpu:4"));
  DataParallelCriterion criterion(model);
  const Tensor real = randn({7, 6}, {.dtype = kFloat64}), fake = randn({7, 6}, {.dtype = kFloat64});
  const Tensor eps = rand({7, 1}, {.dtype = kFloat64});
  const auto loss_of = [](nn::Module& critic, const Tensor& r, const Tensor& f, const Tensor& e) {
    const losses::Critic d = [&](const Tensor& x) { return critic(x); };
    return losses::wasserstein_critic_loss(critic(r), critic(f)) + losses::wgan_gp_penalty(d, r, f, {.eps = e});
  };
  const auto reals = model.scatter(real), fakes = model.scatter(fake), epss = model.scatter(eps);
  REQUIRE(reals[3].size(0) == 1);
  const Tensor loss = criterion([&](int r) { return loss_of(model.replica(r), reals[r], fakes[r], epss[r]); });
  loss.backward();
  const Tensor want = loss_of(*reference, real, fake, eps);
  want.backward();
  check_close(loss, want, "loss");
  check_grads(model, *reference);
}

// --- The criterion exact by default (Note [Losses across devices] in losses/losses.h) ---------------

namespace {

// One loss of losses.h as DataParallelCriterion takes it, its one-device value, and its target.
struct CriterionCase {
  std::string name;
  std::function<DataParallelCriterion(DataParallelModel&)> make;
  std::function<Tensor(const Tensor& logits, const Tensor& target)> one_device;
  bool class_target = true;
};

std::vector<CriterionCase> criterion_cases(const Tensor& class_weight) {
  using namespace losses;
  constexpr int64_t kIgnore = 255, kClasses = 3;
  std::vector<CriterionCase> out;
  auto add = [&](std::string name, auto loss, bool class_target = true) {
    out.push_back({std::move(name), [loss](DataParallelModel& m) { return DataParallelCriterion(m, loss); },
                   [loss](const Tensor& x, const Tensor& t) { return loss(x, t); }, class_target});
  };
  add("cross_entropy", CrossEntropyLoss{{.ignore_index = kIgnore, .weight = class_weight, .label_smoothing = 0.1}});
  add("nll_loss", NllLoss{{.ignore_index = kIgnore, .weight = class_weight}});
  add("focal_loss", FocalLoss{{.gamma = 1.5, .alpha = class_weight, .ignore_index = kIgnore}});
  add("dice_loss", DiceLoss{{.ignore_index = kIgnore}});
  add("lovasz_softmax", LovaszSoftmaxLoss{{.ignore_index = kIgnore}});
  add("ohem_cross_entropy", OhemCrossEntropyLoss{{.threshold = 0.5, .min_kept = 4, .ignore_index = kIgnore}});
  add("mse_loss", MseLoss{}, false);
  add("l1_loss", L1Loss{}, false);
  add("smooth_l1_loss", SmoothL1Loss{.beta = 0.5}, false);
  add("binary_cross_entropy_with_logits", BceWithLogitsLoss{{.pos_weight = reshape(class_weight, {kClasses, 1, 1})}},
      false);
  return out;
}

}  // namespace

// Logits x·w (w a leaf on the first device, broadcast differentiably) of 7 images split 3, 2, 2 over
// cpu:3, the first chunk mostly ignored pixels: the loss, its gradient and a second-order gradient
// (of |∇w|²) equal one device's on the whole batch, for every loss; the chunk-size weighting of a
// plain mean, what the criterion did before, is off for the pixel means.
TEST_CASE("data parallel: the criterion gives the whole batch's loss for every loss, to second order") {
  manual_seed(cpu(), 31);
  constexpr int64_t kIgnore = 255, kClasses = 3;
  const Tensor x = randn({7, kClasses, 4, 4}, {.dtype = kFloat64});
  const Tensor w0 = add_scalar(rand({kClasses}, {.dtype = kFloat64}), 0.5);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 7 * 16; ++i) {
    const bool mostly_ignored = i < 3 * 16 && i % 16 != 0;  // the first chunk: one valid pixel per image
    labels.push_back(mostly_ignored || i % 7 == 3 ? kIgnore : i % kClasses);
  }
  const Tensor class_target = from_int_vector(labels, {7, 4, 4});
  const Tensor float_target = rand({7, kClasses, 4, 4}, {.dtype = kFloat64});
  const Tensor class_weight = from_vector({0.2, 1.0, 3.0}, {kClasses}, {.dtype = kFloat64});

  // Value, gradient and second-order gradient with respect to w of loss(w).
  const auto derivatives = [](const Tensor& w, const std::function<Tensor(const Tensor&)>& loss) {
    const Tensor leaf = w.detach().requires_grad_(true);
    const Tensor l = loss(leaf);
    const Tensor g = grad({l}, {leaf}, {}, {.create_graph = true})[0];
    // l1's gradient is piecewise constant in w: no graph, a second derivative of 0.
    const Tensor gg = g.requires_grad() ? grad({sum(square(g))}, {leaf})[0] : zeros_like(leaf);
    return std::vector<Tensor>{l.detach().to(cpu()), g.detach().to(cpu()), gg.to(cpu())};
  };
  const auto logits_of = [](const Tensor& xi, const Tensor& wi) { return xi * reshape(wi, {1, -1, 1, 1}); };

  DataParallelModel model(std::make_shared<nn::Linear>(1, 1, false, f64), devices("cpu:3"));
  for (const CriterionCase& c : criterion_cases(class_weight)) {
    CAPTURE(c.name);
    const Tensor target = c.class_target ? class_target : float_target;
    const auto one = derivatives(w0, [&](const Tensor& w) {
      const Tensor logits = logits_of(x, w);
      return c.one_device(c.name == "nll_loss" ? log_softmax(logits, 1) : logits, target);
    });
    const DataParallelCriterion criterion = c.make(model);
    const auto xs = model.scatter(x), ts = model.scatter(target);
    const auto on_devices = [&](const Tensor& w) {
      const std::vector<Tensor> ws = broadcast(w, model.devices());
      PerDevice<Tensor> outputs;
      for (size_t r = 0; r < xs.size(); ++r) {
        const Tensor logits = logits_of(xs[r], ws[r]);
        outputs.push_back(c.name == "nll_loss" ? log_softmax(logits, 1) : logits);
      }
      return criterion(outputs, ts);
    };
    const auto three = derivatives(w0, on_devices);
    for (size_t i = 0; i < one.size(); ++i) {
      CAPTURE(i);
      const std::string diff = compare(three[i], one[i], 1e-12, 1e-10);
      CHECK_MESSAGE(diff.empty(), diff);
    }
    if (c.name == "cross_entropy" || c.name == "focal_loss") {
      // Before: each chunk's mean weighted by its size, 3/7 for a chunk of 3 valid pixels.
      const DataParallelCriterion by_size(model, DataParallelCriterion::mean_over_samples(c.one_device));
      const auto sized = derivatives(w0, [&](const Tensor& w) {
        const std::vector<Tensor> ws = broadcast(w, model.devices());
        PerDevice<Tensor> outputs;
        for (size_t r = 0; r < xs.size(); ++r) outputs.push_back(logits_of(xs[r], ws[r]));
        return by_size(outputs, ts);
      });
      CHECK(compare(sized[0], one[0], 1e-3, 1e-3) != "");
    }
  }
}

// Note [Training state]: a critic with dropout and SyncBatchNorm trained 4 steps on cpu:3 in one go,
// and 2 steps on cpu:3, saved, loaded into a fresh model on cpu:2 and trained 2 more: the same
// losses and weights (float64). A file that does not fit (another width) changes nothing.
TEST_CASE("data parallel: the training state saved on 3 devices resumes exactly on 2") {
  const auto make = [] {
    return std::make_shared<nn::Sequential>(nn::Linear(6, 8, true, f64), SyncBatchNorm(8, {}, f64), nn::Dropout(0.3),
                                            nn::Tanh(), nn::Linear(8, 1, true, f64));
  };
  const auto loss_of = [](nn::Module& critic, const Tensor& real, const Tensor& fake) {
    const losses::Critic d = [&](const Tensor& x) { return critic(x); };
    return losses::wasserstein_critic_loss(critic(real), critic(fake)) + losses::wgan_gp_penalty(d, real, fake);
  };
  const auto train = [&](DataParallelModel& model, ReplicatedOptimizer<optim::Adam>& opt, int from, int to) {
    std::vector<double> seen;
    DataParallelCriterion criterion(model);
    for (int step = from; step < to; ++step) {
      manual_seed(cpu(), 100 + static_cast<uint64_t>(step));  // the batch of step `step`
      const Tensor real = randn({7, 6}, {.dtype = kFloat64}), fake = randn({7, 6}, {.dtype = kFloat64});
      const auto reals = model.scatter(real), fakes = model.scatter(fake);
      opt.zero_grad();
      const Tensor loss = criterion([&](int r) { return loss_of(model.replica(r), reals[r], fakes[r]); });
      loss.backward();
      opt.step();
      seen.push_back(loss.item());
    }
    return seen;
  };
  manual_seed(cpu(), 40);
  DataParallelModel whole(make(), devices("cpu:3"));
  ReplicatedOptimizer<optim::Adam> whole_opt(whole, optim::AdamOptions{.lr = 1e-2});
  const std::vector<double> want = train(whole, whole_opt, 0, 4);

  manual_seed(cpu(), 40);
  TempDir dir;
  const std::string path = dir.file("state.safetensors");
  std::vector<double> got;
  {
    DataParallelModel first(make(), devices("cpu:3"));
    ReplicatedOptimizer<optim::Adam> first_opt(first, optim::AdamOptions{.lr = 1e-2});
    got = train(first, first_opt, 0, 2);
    TrainingState({{"critic", first, first_opt}}).save(path, {.step = 2}, {{"run", "test"}});
  }
  manual_seed(cpu(), 999);  // whatever the fresh process draws before loading
  DataParallelModel second(make(), devices("cpu:2"));
  ReplicatedOptimizer<optim::Adam> second_opt(second, optim::AdamOptions{.lr = 1e-2});
  TrainingState state({{"critic", second, second_opt}});
  const io::TrainingCheckpoint ck = state.load(path);
  CHECK(ck.progress.step == 2);
  CHECK(ck.metadata.at("run") == "test");
  second.check_replicas();
  for (const double l : train(second, second_opt, 2, 4)) got.push_back(l);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 1e-10 * (1 + std::abs(want[i])));
  // Adam divides by the root of small second moments: rounding of another device count shows at 1e-10.
  const auto a = whole.module().named_parameters(), b = second.module().named_parameters();
  for (size_t i = 0; i < a.size(); ++i) CHECK_MESSAGE(compare(b[i].second, a[i].second, 1e-8, 1e-8) == "", a[i].first);

  // Another architecture: refused, naming the file, and the model and optimizer unchanged.
  DataParallelModel wider(
      std::make_shared<nn::Sequential>(nn::Linear(6, 9, true, f64), nn::Tanh(), nn::Linear(9, 1, true, f64)),
      devices("cpu:2"));
  ReplicatedOptimizer<optim::Adam> wider_opt(wider, optim::AdamOptions{.lr = 1e-2});
  const std::vector<double> before = wider.replica(1).parameters()[0].to_vector();
  const std::string err = error_of([&] { TrainingState({{"critic", wider, wider_opt}}).load(path); });
  CHECK_MESSAGE(err.find("load_training_checkpoint: " + path) == 0, err);
  CHECK(wider.replica(1).parameters()[0].to_vector() == before);
}
