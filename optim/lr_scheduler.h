/// @file
/// Learning-rate schedules, as torch.optim.lr_scheduler, in closed form: each is a function of the
/// step count (PyTorch's last_epoch) and the optimizer's learning rate when the schedule was made.
/// Constructing one sets the optimizer's lr for step 0; step() advances and sets it again. A
/// schedule refers to its optimizer, which must outlive it.
#pragma once

#include <cstdint>
#include <functional>

#include "evenflow/optim/optimizer.h"

namespace evenflow::optim {

/// @name Closed forms
/// The closed forms, shared by the classes below. They check nothing: step_size, t_max and
/// total_iters must be positive (the classes check their arguments).
/// @{

/// base_lr · gamma^⌊step / step_size⌋ (StepLR).
double step_lr(int64_t step, double base_lr, int64_t step_size, double gamma);
/// eta_min + (base_lr - eta_min)·(1 + cos(π·step / t_max)) / 2 (CosineAnnealingLR).
double cosine_annealing_lr(int64_t step, double base_lr, int64_t t_max, double eta_min);
/// base_lr · (start_factor + (end_factor - start_factor)·min(step, total_iters) / total_iters)
/// (LinearLR).
double linear_lr(int64_t step, double base_lr, double start_factor, double end_factor, int64_t total_iters);
/// @}

/// A learning-rate schedule bound to an optimizer: at step count s the optimizer's lr is
/// schedule(s, base_lr). The subclasses below are the usual schedules; this class takes any
/// function. Not copyable.
class LRScheduler {
 public:
  /// The learning rate for a step count and base learning rate.
  using Schedule = std::function<double(int64_t step, double base_lr)>;
  /// Reads base_lr from `optimizer` (which must outlive the scheduler) and sets its lr to
  /// schedule(0, base_lr); ef::Error when that is negative.
  LRScheduler(Optimizer& optimizer, Schedule schedule);
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  void step();                                                    ///< one more step; sets the optimizer's lr
  double lr() const { return schedule_(last_epoch_, base_lr_); }  ///< schedule(last_epoch(), base_lr())
  int64_t last_epoch() const { return last_epoch_; }              ///< the step count: 0, then +1 per step()
  double base_lr() const { return base_lr_; }  ///< the optimizer's lr at construction, or the loaded one

  /// "last_epoch" (int64 0-d) and "base_lr" (float64 0-d), for checkpoints; load_state also sets
  /// the optimizer's lr to the loaded step's.
  NamedTensors state() const;
  /// Restores what state() exported: exactly "last_epoch" (a non-negative int64) and "base_lr"
  /// (non-negative), one value each, else ef::Error.
  void load_state(const NamedTensors& state);

 private:
  Optimizer* optimizer_;
  Schedule schedule_;
  double base_lr_;
  int64_t last_epoch_ = 0;
};

/// base_lr · gamma^⌊step / step_size⌋
class StepLR : public LRScheduler {
 public:
  /// `step_size` positive, `gamma` non-negative, else ef::Error.
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
};

/// eta_min + (base_lr - eta_min)·(1 + cos(π·step / t_max)) / 2 (it rises again after t_max, as PyTorch's)
class CosineAnnealingLR : public LRScheduler {
 public:
  /// `t_max` positive, `eta_min` non-negative, else ef::Error.
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0);
};

/// Linear warm-up: base_lr · (start + (end - start)·min(step, total_iters) / total_iters)
class LinearLR : public LRScheduler {
 public:
  /// `start_factor` in (0, 1], `end_factor` in [0, 1], `total_iters` positive, else ef::Error.
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);
};

/// Linear warm-up from base_lr·start_factor over warmup_steps, then cosine annealing to eta_min at
/// total_steps: PyTorch's SequentialLR([LinearLR(start_factor, total_iters=warmup_steps),
/// CosineAnnealingLR(T_max=total_steps - warmup_steps, eta_min)], milestones=[warmup_steps]).
class WarmupCosineLR : public LRScheduler {
 public:
  /// `warmup_steps` positive, `total_steps` above it, `start_factor` in (0, 1], `eta_min`
  /// non-negative, else ef::Error.
  WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double start_factor = 1.0 / 3,
                 double eta_min = 0);
};

}  // namespace evenflow::optim
