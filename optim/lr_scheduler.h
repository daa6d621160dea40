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

/// The closed forms, shared by the classes below.
double step_lr(int64_t step, double base_lr, int64_t step_size, double gamma);
double cosine_annealing_lr(int64_t step, double base_lr, int64_t t_max, double eta_min);
double linear_lr(int64_t step, double base_lr, double start_factor, double end_factor, int64_t total_iters);

class LRScheduler {
 public:
  using Schedule = std::function<double(int64_t step, double base_lr)>;
  LRScheduler(Optimizer& optimizer, Schedule schedule);
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  void step();  ///< one more step; sets the optimizer's lr
  double lr() const { return schedule_(last_epoch_, base_lr_); }
  int64_t last_epoch() const { return last_epoch_; }
  double base_lr() const { return base_lr_; }

  /// "last_epoch" (int64 0-d) and "base_lr" (float64 0-d), for checkpoints; load_state also sets
  /// the optimizer's lr to the loaded step's.
  NamedTensors state() const;
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
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
};

/// eta_min + (base_lr - eta_min)·(1 + cos(π·step / t_max)) / 2 (it rises again after t_max, as PyTorch's)
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0);
};

/// Linear warm-up: base_lr · (start + (end - start)·min(step, total_iters) / total_iters)
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);
};

/// Linear warm-up from base_lr·start_factor over warmup_steps, then cosine annealing to eta_min at
/// total_steps: PyTorch's SequentialLR([LinearLR(start_factor, total_iters=warmup_steps),
/// CosineAnnealingLR(T_max=total_steps - warmup_steps, eta_min)], milestones=[warmup_steps]).
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double start_factor = 1.0 / 3,
                 double eta_min = 0);
};

}  // namespace evenflow::optim
