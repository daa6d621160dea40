// Optimizer base (parameters, per-parameter state, export and import), SGD, Adam and AdamW (see
// optimizer.h). Update rules follow torch/optim/{sgd,adam,adamw}.py (PyTorch 1.13,
// single-tensor path), step for step, so that runs match PyTorch's to rounding.
#include "evenflow/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "evenflow/engine/capture_internal.h"
#include "evenflow/engine/step_graph.h"

namespace evenflow::optim {

namespace {

void check_non_negative(const char* opt, const char* what, double v) {
  EF_CHECK(v >= 0, opt, ": ", what, " must be non-negative, got ", v);
}

void check_beta(const char* opt, const char* which, double b) {
  EF_CHECK(b >= 0 && b < 1, opt, ": ", which, " must be in [0, 1), got ", b);
}

// "state.12.exp_avg" -> (12, "exp_avg"); false if the key has another form.
bool parse_state_key(const std::string& key, size_t* index, std::string* name) {
  const std::string prefix = "state.";
  if (key.compare(0, prefix.size(), prefix) != 0) return false;
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size() || dot + 1 == key.size()) return false;
  const std::string digits = key.substr(prefix.size(), dot - prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) return false;
  *index = static_cast<size_t>(std::stoul(digits));
  *name = key.substr(dot + 1);
  return true;
}

}  // namespace

// --- Optimizer ------------------------------------------------------------------------------------------

Optimizer::Optimizer(const char* name, std::vector<Tensor> params, double lr)
    : name_(name), params_(std::move(params)), state_(params_.size()), lr_(lr) {
  check_non_negative(name, "lr", lr);
  std::set<TensorImpl*> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    EF_CHECK(p.defined(), name, ": parameter ", i, " is undefined");
    EF_CHECK(is_floating(p.dtype()), name, ": parameter ", i, " is ", dtype_name(p.dtype()),
             ", only float32 and float64 tensors can be optimized");
    EF_CHECK(p.is_leaf(), name, ": parameter ", i, " is not a leaf tensor (it was computed by ",
             p.grad_fn() ? p.grad_fn()->name() : "an op", "): optimize the tensors it was computed from");
    EF_CHECK(seen.insert(p.impl()).second, name, ": parameter ", i, " appears more than once");
  }
}

void Optimizer::set_lr(double lr) {
  check_non_negative(name_, "lr", lr);
  lr_ = lr;
}

void Optimizer::step() {
  // Gradients match their parameter's shape, dtype and device: Tensor::set_grad and the engine's
  // accumulation guarantee it.
  NoGradGuard no_grad;
  std::vector<Update> updates;
  std::vector<size_t> stepped;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    updates.push_back({i, params_[i].detach(), g.detach(), state_[i].step + 1});
    stepped.push_back(i);
  }
  if (updates.empty()) return;
  // Counted now, or at each replay of a recorded step (Note [Step scalars] in engine/step_graph.cpp).
  each_step(updates[0].param.device(), [this, stepped = std::move(stepped)] {
    for (size_t i : stepped) ++state_[i].step;
  });
  update(updates);
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (Tensor p : params_) {  // a handle: set_grad is not const
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      p.grad().detach().zero_();
    }
  }
}

Tensor Optimizer::state_tensor(size_t i, const std::string& name, const std::function<Tensor()>& init) {
  NamedTensors& tensors = state_[i].tensors;
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  tensors.emplace_back(name, init());
  return tensors.back().second;
}

NamedTensors Optimizer::state() const {
  NamedTensors out;
  out.emplace_back("lr", scalar_tensor(lr_, {.dtype = kFloat64}));
  for (size_t i = 0; i < state_.size(); ++i) {
    if (state_[i].step == 0) continue;
    const std::string prefix = "state." + std::to_string(i) + ".";
    out.emplace_back(prefix + "step", from_int_vector({state_[i].step}, {}));
    for (const auto& [n, t] : state_[i].tensors) out.emplace_back(prefix + n, t.detach());
  }
  return out;
}

void Optimizer::load_state(const NamedTensors& state) {
  const std::vector<std::string> names = state_names();
  const std::set<std::string> known(names.begin(), names.end());
  std::vector<ParamState> loaded(params_.size());
  std::vector<bool> has_step(params_.size(), false);
  std::optional<double> lr;
  std::set<std::string> seen;
  for (const auto& [key, t] : state) {
    EF_CHECK(seen.insert(key).second, name_, ".load_state: key \"", key, "\" appears twice");
    EF_CHECK(t.defined(), name_, ".load_state: \"", key, "\" is an undefined tensor");
    if (key == "lr") {
      EF_CHECK(t.numel() == 1, name_, ".load_state: \"lr\" must hold one value, got shape ", shape_str(t.shape()));
      lr = t.item();
      continue;
    }
    size_t i = 0;
    std::string n;
    EF_CHECK(parse_state_key(key, &i, &n), name_, ".load_state: unexpected key \"", key, "\"");
    EF_CHECK(i < params_.size(), name_, ".load_state: \"", key, "\" names parameter ", i, " but there are ",
             params_.size());
    if (n == "step") {
      EF_CHECK(t.numel() == 1 && t.dtype() == kInt64 && t.item() >= 1, name_, ".load_state: \"", key,
               "\" must be a positive int64 count, got ", t.str());
      loaded[i].step = static_cast<int64_t>(t.item());
      has_step[i] = true;
      continue;
    }
    EF_CHECK(known.count(n), name_, ".load_state: unexpected key \"", key, "\" (", name_, " keeps no \"", n, "\")");
    const Tensor& p = params_[i];
    EF_CHECK(t.shape() == p.shape() && t.dtype() == p.dtype(), name_, ".load_state: \"", key, "\" is ",
             shape_str(t.shape()), " ", dtype_name(t.dtype()), " but parameter ", i, " is ", shape_str(p.shape()), " ",
             dtype_name(p.dtype()));
    check_state_values(key, n, t);
    loaded[i].tensors.emplace_back(n, t.detach().clone().to(p.device()));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    EF_CHECK(has_step[i] || loaded[i].tensors.empty(), name_, ".load_state: parameter ", i,
             " has state tensors but no \"state.", i, ".step\"");
    // A missing moment would restart from zero without a word: resuming would not be exact.
    for (const std::string& n : names) {
      const bool present = std::any_of(loaded[i].tensors.begin(), loaded[i].tensors.end(),
                                       [&](const auto& named) { return named.first == n; });
      EF_CHECK(!has_step[i] || present, name_, ".load_state: parameter ", i, " has \"state.", i,
               ".step\" but no \"state.", i, ".", n, "\": the state is incomplete");
    }
  }
  if (lr) set_lr(*lr);
  state_ = std::move(loaded);
}

void Optimizer::check_state_values(const std::string&, const std::string&, const Tensor&) const {}

// --- SGD ------------------------------------------------------------------------------------------------

SGD::SGD(std::vector<Tensor> params, const SGDOptions& o) : Optimizer("SGD", std::move(params), o.lr), o_(o) {
  check_non_negative(name_, "momentum", o.momentum);
  check_non_negative(name_, "weight_decay", o.weight_decay);
  EF_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
           "SGD: nesterov needs momentum > 0 and dampening 0, got "
           "momentum ",
           o.momentum, " and dampening ", o.dampening);
}

void SGD::update(const std::vector<Update>& updates) {
  for (const auto& [i, p, g, step] : updates) {
    EF_CHECK(!recording(p.device()), name_, " inside a recorded step (", p.device().str(),
             "): its learning rate is a kernel argument, which a replay would keep; use Adam or AdamW, whose "
             "step scalars live in device memory (Note [Step scalars])");
    Tensor d = o_.weight_decay != 0 ? g + p * o_.weight_decay : g;
    if (o_.momentum != 0) {
      bool first = false;
      const Tensor buf = state_tensor(i, "momentum_buffer", [&] {
        first = true;
        return d.clone();  // the first step's buffer is the update itself, undamped
      });
      if (!first) {
        buf.mul_(o_.momentum);
        buf.add_(d, 1 - o_.dampening);
      }
      d = o_.nesterov ? d + buf * o_.momentum : buf;
    }
    p.add_(d, -lr());
  }
}

// --- Adam, AdamW ----------------------------------------------------------------------------------------

Adam::Adam(std::vector<Tensor> params, const AdamOptions& o) : Adam("Adam", std::move(params), o, 0.0, false) {}

Adam::Adam(const char* name, std::vector<Tensor> params, const AdamOptions& o, double default_weight_decay,
           bool decoupled)
    : Optimizer(name, std::move(params), o.lr),
      o_(o),
      weight_decay_(o.weight_decay.value_or(default_weight_decay)),
      decoupled_(decoupled) {
  check_beta(name, "betas.first", o.betas.first);
  check_beta(name, "betas.second", o.betas.second);
  check_non_negative(name, "eps", o.eps);
  check_non_negative(name, "weight_decay", weight_decay_);
}

AdamW::AdamW(std::vector<Tensor> params, const AdamOptions& o) : Adam("AdamW", std::move(params), o, 1e-2, true) {}

void Adam::check_state_values(const std::string& key, const std::string& name, const Tensor& t) const {
  const std::vector<double> v = t.to_vector();
  const bool second_moment = name == "exp_avg_sq" || name == "max_exp_avg_sq";
  for (size_t j = 0; j < v.size(); ++j) {
    EF_CHECK(std::isfinite(v[j]), name_, ".load_state: \"", key, "\" holds ", v[j], " at element ", j,
             ": a moment is finite");
    EF_CHECK(!second_moment || v[j] >= 0, name_, ".load_state: \"", key, "\" holds ", v[j], " at element ", j,
             ": a second moment (a mean of squares) is never negative");
  }
}

std::vector<std::string> Adam::state_names() const {
  if (o_.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

// Parameters that share a step count, device and dtype (usually all of a model's) take one
// multi-tensor adam_.
AdamArgs Adam::args_at(int64_t step) const {
  const auto [beta1, beta2] = o_.betas;
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(beta2, static_cast<double>(step)));
  AdamArgs a;
  a.decay = decoupled_ ? 1 - lr() * weight_decay_ : 1;
  a.weight_decay = decoupled_ ? 0 : weight_decay_;
  a.beta1 = beta1;
  a.beta2 = beta2;
  a.eps = o_.eps;
  a.inv_bias_correction2_sqrt = 1.0 / bias_correction2_sqrt;
  a.step = -lr() / bias_correction1;
  a.amsgrad = o_.amsgrad;
  return a;
}

void Adam::update(const std::vector<Update>& updates) {
  std::vector<bool> done(updates.size(), false);
  for (size_t first = 0; first < updates.size(); ++first) {
    if (done[first]) continue;
    const Update& u = updates[first];
    const Device device = u.param.device();
    AdamArgs a = args_at(u.step);
    // In a recorded step the kernel reads them from device memory, written at each replay from the
    // learning rate and step count then (Note [Step scalars] in engine/step_graph.cpp): the group
    // shares its first parameter's count.
    a.in_device =
        static_cast<const AdamArgs*>(detail::step_scalars(device, sizeof(AdamArgs), [this, i = u.index](void* out) {
          const AdamArgs now = args_at(step_count(i));
          std::memcpy(out, &now, sizeof now);
        }));
    std::vector<AdamTensors> group;
    for (size_t k = first; k < updates.size(); ++k) {
      const auto& [i, p, g, step] = updates[k];
      if (done[k] || step != u.step || p.device() != device || p.dtype() != u.param.dtype()) continue;
      done[k] = true;
      // A first step makes the moments (zeros): as part of a recording it would zero them at every
      // replay.
      EF_CHECK(a.in_device == nullptr || step > 1, name_, ": parameter ", i,
               "'s first step inside a recorded step: its moments are made then, and a replay would make them "
               "again; record a step after at least one eager one (StepGraph::warm_up)");
      const auto zeros = [&] { return zeros_like(p); };
      group.push_back({p, g, state_tensor(i, "exp_avg", zeros), state_tensor(i, "exp_avg_sq", zeros),
                       o_.amsgrad ? state_tensor(i, "max_exp_avg_sq", zeros) : Tensor()});
    }
    adam_(a, group);
  }
}

}  // namespace evenflow::optim
