// Learning-rate schedules against PyTorch 1.13's (tests/fixtures/optim.json): StepLR,
// CosineAnnealingLR past t_max, LinearLR warm-up, and warm-up followed by cosine (SequentialLR);
// their state for checkpoints and their argument errors.
#include <doctest/doctest.h>

#include "evenflow/optim/optim.h"
#include "tests/layers/fixture.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::testing;
using namespace evenflow::optim;

namespace {

std::unique_ptr<LRScheduler> make_schedule(const std::string& name, Optimizer& opt) {
  if (name == "step") return std::make_unique<StepLR>(opt, 3, 0.5);
  if (name == "cosine") return std::make_unique<CosineAnnealingLR>(opt, 5, 0.01);
  if (name == "linear_warmup") return std::make_unique<LinearLR>(opt, 0.1, 1.0, 4);
  if (name == "warmup_cosine") return std::make_unique<WarmupCosineLR>(opt, 3, 10, 0.1, 0.001);
  return nullptr;
}

}  // namespace

TEST_CASE("schedules match PyTorch's learning rates") {
  int n = 0;
  const Json fixture = load_fixture("optim.json");
  for (const Json& c : fixture.at("schedules")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    Tensor p = zeros({1}, {.requires_grad = true});
    SGD opt({p}, {.lr = c.at("base_lr")});
    const std::unique_ptr<LRScheduler> sched = make_schedule(name, opt);
    REQUIRE_MESSAGE(sched != nullptr, "no schedule for fixture case ", name);
    const std::vector<double> want = c.at("lrs");
    for (size_t step = 0; step < want.size(); ++step) {
      CAPTURE(step);
      if (step > 0) sched->step();
      CHECK(sched->last_epoch() == static_cast<int64_t>(step));
      CHECK(opt.lr() == doctest::Approx(want[step]).epsilon(1e-12));
      CHECK(sched->lr() == opt.lr());
    }
    ++n;
  }
  CHECK(n == 4);
}

TEST_CASE("a schedule's state restores its step and the optimizer's lr") {
  Tensor p = zeros({1}, {.requires_grad = true});
  SGD opt({p}, {.lr = 0.2});
  WarmupCosineLR sched(opt, 2, 8);
  for (int i = 0; i < 5; ++i) sched.step();
  const NamedTensors state = sched.state();
  const double lr5 = opt.lr();

  Tensor q = zeros({1}, {.requires_grad = true});
  SGD opt2({q}, {.lr = 0.7});
  WarmupCosineLR resumed(opt2, 2, 8);
  resumed.load_state(state);
  CHECK(resumed.last_epoch() == 5);
  CHECK(resumed.base_lr() == 0.2);
  CHECK(opt2.lr() == lr5);
  sched.step();
  resumed.step();
  CHECK(opt2.lr() == opt.lr());
  CHECK(error_of([&] {
          resumed.load_state({{"epoch", from_int_vector({1}, {})}});
        }) == "LRScheduler.load_state: unexpected key \"epoch\"");
  CHECK(error_of([&] { resumed.load_state({}); }) == "LRScheduler.load_state: needs \"last_epoch\" and \"base_lr\"");
}

TEST_CASE("schedule argument errors") {
  Tensor p = zeros({1}, {.requires_grad = true});
  SGD opt({p}, {.lr = 0.1});
  CHECK(error_of([&] { StepLR(opt, 0); }) == "StepLR: step_size must be positive, got 0");
  CHECK(error_of([&] { CosineAnnealingLR(opt, 0); }) == "CosineAnnealingLR: t_max must be positive, got 0");
  CHECK(error_of([&] { LinearLR(opt, 0.0); }) == "LinearLR: start_factor must be in (0, 1], got 0");
  CHECK(error_of([&] { WarmupCosineLR(opt, 5, 5); }) == "WarmupCosineLR: total_steps 5 must exceed warmup_steps 5");
  CHECK(opt.lr() == 0.1);  // a failed construction leaves the optimizer alone
}
