// Learning-rate schedules (see lr_scheduler.h): PyTorch's closed forms (_get_closed_form_lr).
#include "evenflow/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace evenflow::optim {

double step_lr(int64_t step, double base_lr, int64_t step_size, double gamma) {
  return base_lr * std::pow(gamma, static_cast<double>(step / step_size));
}

double cosine_annealing_lr(int64_t step, double base_lr, int64_t t_max, double eta_min) {
  const double phase = std::numbers::pi * static_cast<double>(step) / static_cast<double>(t_max);
  return eta_min + (base_lr - eta_min) * (1 + std::cos(phase)) / 2;
}

double linear_lr(int64_t step, double base_lr, double start_factor, double end_factor, int64_t total_iters) {
  const double progress = static_cast<double>(std::min(step, total_iters)) / static_cast<double>(total_iters);
  return base_lr * (start_factor + (end_factor - start_factor) * progress);
}

// --- LRScheduler ----------------------------------------------------------------------------------------

LRScheduler::LRScheduler(Optimizer& optimizer, Schedule schedule)
    : optimizer_(&optimizer), schedule_(std::move(schedule)), base_lr_(optimizer.lr()) {
  optimizer_->set_lr(lr());
}

void LRScheduler::step() {
  ++last_epoch_;
  optimizer_->set_lr(lr());
}

NamedTensors LRScheduler::state() const {
  return {{"last_epoch", from_int_vector({last_epoch_}, {})},
          {"base_lr", scalar_tensor(base_lr_, {.dtype = kFloat64})}};
}

void LRScheduler::load_state(const NamedTensors& state) {
  std::optional<int64_t> epoch;
  std::optional<double> base;
  for (const auto& [key, t] : state) {
    EF_CHECK(t.defined() && t.numel() == 1, "LRScheduler.load_state: \"", key, "\" must hold one value");
    if (key == "last_epoch") {
      EF_CHECK(t.dtype() == kInt64 && t.item() >= 0,
               "LRScheduler.load_state: \"last_epoch\" must be a non-negative "
               "int64, got ",
               t.str());
      epoch = static_cast<int64_t>(t.item());
    } else if (key == "base_lr") {
      EF_CHECK(t.item() >= 0, "LRScheduler.load_state: \"base_lr\" must be non-negative, got ", t.item());
      base = t.item();
    } else {
      EF_ERROR("LRScheduler.load_state: unexpected key \"", key, "\"");
    }
  }
  EF_CHECK(epoch && base, "LRScheduler.load_state: needs \"last_epoch\" and \"base_lr\"");
  last_epoch_ = *epoch;
  base_lr_ = *base;
  optimizer_->set_lr(lr());
}

// --- Schedules ------------------------------------------------------------------------------------------

namespace {

LRScheduler::Schedule checked_step(int64_t step_size, double gamma) {
  EF_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  EF_CHECK(gamma >= 0, "StepLR: gamma must be non-negative, got ", gamma);
  return [=](int64_t step, double base) { return step_lr(step, base, step_size, gamma); };
}

void check_cosine(const char* what, int64_t t_max, double eta_min) {
  EF_CHECK(t_max > 0, what, ": t_max must be positive, got ", t_max);
  EF_CHECK(eta_min >= 0, what, ": eta_min must be non-negative, got ", eta_min);
}

void check_linear(const char* what, double start_factor, double end_factor, int64_t total_iters) {
  EF_CHECK(start_factor > 0 && start_factor <= 1, what, ": start_factor must be in (0, 1], got ", start_factor);
  EF_CHECK(end_factor >= 0 && end_factor <= 1, what, ": end_factor must be in [0, 1], got ", end_factor);
  EF_CHECK(total_iters > 0, what, ": the number of warm-up steps must be positive, got ", total_iters);
}

LRScheduler::Schedule checked_cosine(int64_t t_max, double eta_min) {
  check_cosine("CosineAnnealingLR", t_max, eta_min);
  return [=](int64_t step, double base) { return cosine_annealing_lr(step, base, t_max, eta_min); };
}

LRScheduler::Schedule checked_linear(double start_factor, double end_factor, int64_t total_iters) {
  check_linear("LinearLR", start_factor, end_factor, total_iters);
  return [=](int64_t step, double base) { return linear_lr(step, base, start_factor, end_factor, total_iters); };
}

LRScheduler::Schedule checked_warmup_cosine(int64_t warmup, int64_t total, double start_factor, double eta_min) {
  check_linear("WarmupCosineLR", start_factor, 1.0, warmup);
  EF_CHECK(total > warmup, "WarmupCosineLR: total_steps ", total, " must exceed warmup_steps ", warmup);
  check_cosine("WarmupCosineLR", total - warmup, eta_min);
  return [=](int64_t step, double base) {
    return step < warmup ? linear_lr(step, base, start_factor, 1.0, warmup)
                         : cosine_annealing_lr(step - warmup, base, total - warmup, eta_min);
  };
}

}  // namespace

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, checked_step(step_size, gamma)) {}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer, checked_cosine(t_max, eta_min)) {}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(optimizer, checked_linear(start_factor, end_factor, total_iters)) {}

WarmupCosineLR::WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double start_factor,
                               double eta_min)
    : LRScheduler(optimizer, checked_warmup_cosine(warmup_steps, total_steps, start_factor, eta_min)) {}

}  // namespace evenflow::optim
