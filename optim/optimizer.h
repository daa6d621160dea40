/// @file
/// Optimizers, as torch.optim: a base that holds the parameters and their per-parameter state, and
/// SGD, Adam and AdamW with PyTorch's exact update rules. Parameters are updated in place under
/// NoGradGuard, so they keep their identity (modules and other holders see the new values).
///
/// Note [Optimizer state]
/// Each parameter i has a step count (the number of updates it received: a parameter without a
/// gradient at some step is skipped, as in PyTorch) and named state tensors on its device, created
/// at its first update. state() exports them as "state.<i>.step" (int64 0-d, on the CPU) and
/// "state.<i>.<name>" ("state.3.exp_avg"), plus "lr" (float64 0-d), so that a checkpoint can hold
/// them next to the model's state dict and load_state() resumes the run exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "evenflow/layers/module.h"

namespace evenflow::optim {

using nn::NamedTensors;

/// The base of the optimizers: the parameters (distinct float32 or float64 leaf tensors), the
/// learning rate and each parameter's state (Note [Optimizer state] in optimizer.h). Not copyable.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a gradient.
  void step();
  /// Clears the parameters' gradients (set_to_none) or zeroes them in place.
  void zero_grad(bool set_to_none = true);

  const std::vector<Tensor>& params() const { return params_; }  ///< the parameters, in the order given
  double lr() const { return lr_; }                              ///< the current learning rate
  void set_lr(double lr);                                        ///< schedules call this; ef::Error when negative

  /// The learning rate and every updated parameter's state, for a checkpoint: Note [Optimizer state].
  NamedTensors state() const;
  /// Replaces the state by an exported one (checked against the parameters first).
  void load_state(const NamedTensors& state);

 protected:
  /// `name`: the class name, for error messages. Throws ef::Error when lr is negative or a
  /// parameter is undefined, not float32 or float64, not a leaf, or given twice.
  Optimizer(const char* name, std::vector<Tensor> params, double lr);

  /// One parameter's update: its update count is already incremented (1 on the first update).
  struct Update {
    size_t index;  ///< the parameter's place in params()
    Tensor param;  ///< the parameter, detached
    Tensor grad;   ///< its gradient, detached
    int64_t step;  ///< its update count, this update included
  };
  /// Updates every parameter of `updates` (those with a gradient, in order), at once where the
  /// optimizer can (Adam's multi-tensor step). Runs under NoGradGuard.
  virtual void update(const std::vector<Update>& updates) = 0;
  /// The names of the state tensors this optimizer, as configured, keeps for every parameter it has
  /// updated (load_state requires each of them beside a step count).
  virtual std::vector<std::string> state_names() const = 0;
  /// Checks a state tensor load_state is given (already known by name, shape and dtype) for values
  /// this optimizer could never have written; ef::Error naming `key`. Default: none.
  virtual void check_state_values(const std::string& key, const std::string& name, const Tensor& t) const;

  /// Parameter i's state tensor `name` (a handle: update it in place), made by init() on first use.
  Tensor state_tensor(size_t i, const std::string& name, const std::function<Tensor()>& init);
  /// Parameter i's update count (its updates so far, Note [Optimizer state]).
  int64_t step_count(size_t i) const { return state_[i].step; }

  const char* name_;  ///< the class name ("SGD", "Adam", "AdamW"), for error messages

 private:
  struct ParamState {
    int64_t step = 0;
    NamedTensors tensors;
  };

  std::vector<Tensor> params_;
  std::vector<ParamState> state_;
  double lr_;
};

/// SGD's settings, with torch.optim.SGD's defaults (lr, which PyTorch requires, is 1e-3 here).
struct SGDOptions {
  double lr = 1e-3;         ///< the learning rate; non-negative
  double momentum = 0;      ///< the momentum factor; non-negative, 0 for none
  double dampening = 0;     ///< after the first step, the gradient enters the buffer scaled by 1 - dampening
  double weight_decay = 0;  ///< L2 penalty: weight_decay·p is added to the gradient; non-negative
  bool nesterov = false;    ///< Nesterov momentum; needs momentum > 0 and dampening 0
};

/// d = g + weight_decay·p; with momentum: b = d at the first step, then b = momentum·b + (1-dampening)·d,
/// and d = d + momentum·b (nesterov) or d = b; p -= lr·d. State: "momentum_buffer".
class SGD : public Optimizer {
 public:
  /// Throws ef::Error on a bad option (see SGDOptions) or parameter (see Optimizer).
  SGD(std::vector<Tensor> params, const SGDOptions& o = {});
  const SGDOptions& options() const { return o_; }  ///< the settings it was built with

 protected:
  void update(const std::vector<Update>& updates) override;
  std::vector<std::string> state_names() const override {
    return o_.momentum != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
  }

 private:
  SGDOptions o_;
};

/// Adam's and AdamW's settings, with torch.optim's defaults.
struct AdamOptions {
  double lr = 1e-3;                             ///< the learning rate; non-negative
  std::pair<double, double> betas{0.9, 0.999};  ///< (β1, β2), the moments' decay rates, each in [0, 1)
  double eps = 1e-8;                            ///< added to the denominator; non-negative
  /// Adam: an L2 term added to the gradient (default 0); AdamW: decoupled decay (default 1e-2).
  std::optional<double> weight_decay = std::nullopt;
  bool amsgrad = false;  ///< divide by the running maximum of v instead of v (AMSGrad)
};

/// Adam: g += weight_decay·p; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
/// p -= lr/(1-β1^t) · m / (√v/√(1-β2^t) + eps) (amsgrad: v replaced by its running maximum).
/// State: "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (amsgrad).
class Adam : public Optimizer {
 public:
  /// Throws ef::Error on a bad option (see AdamOptions; weight_decay must be non-negative) or
  /// parameter (see Optimizer).
  Adam(std::vector<Tensor> params, const AdamOptions& o = {});
  const AdamOptions& options() const { return o_; }  ///< the settings it was built with

 protected:
  /// `name`: for error messages; `default_weight_decay`: used when o.weight_decay is nullopt;
  /// `decoupled`: AdamW's decay of p instead of the L2 term in the gradient.
  Adam(const char* name, std::vector<Tensor> params, const AdamOptions& o, double default_weight_decay, bool decoupled);
  void update(const std::vector<Update>& updates) override;
  std::vector<std::string> state_names() const override;
  /// The fused kernel's arguments for an update of count `step` at the current learning rate.
  AdamArgs args_at(int64_t step) const;
  /// Every moment finite, the second moments (exp_avg_sq, max_exp_avg_sq) non-negative: a negative
  /// one would put the square root of a negative number into every later step.
  void check_state_values(const std::string& key, const std::string& name, const Tensor& t) const override;

 private:
  AdamOptions o_;
  double weight_decay_;
  bool decoupled_;
};

/// AdamW: p *= 1 - lr·weight_decay, then Adam's update without weight decay in the gradient.
class AdamW : public Adam {
 public:
  /// As Adam's constructor; weight_decay defaults to 1e-2.
  AdamW(std::vector<Tensor> params, const AdamOptions& o = {});
};

}  // namespace evenflow::optim
