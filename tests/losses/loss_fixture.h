// The PyTorch fixture of the losses (tests/fixtures/losses.json, written by
// scripts/make_loss_fixtures.py) and the code that runs one of its cases here: each case names a
// loss of losses/losses.h, its options and its inputs; penalty cases also hold the weights of a small
// MLP critic, rebuilt here as a function of its parameters.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evenflow/losses/losses.h"
#include "tests/testing/json_file.h"

namespace evenflow::testing {

using Json = nlohmann::json;
using Inputs = std::map<std::string, Tensor>;

inline const Json& loss_fixture() {
  static const Json j = read_json_file(std::string(EF_FIXTURE_DIR) + "/losses.json", "scripts/make_loss_fixtures.py");
  return j;
}

// {"shape", "dtype", "data"} -> a tensor; float data as `float_dtype`.
inline Tensor tensor_from_json(const Json& j, const Device& device = cpu(), DType float_dtype = kFloat64) {
  const Shape shape = j.at("shape").get<Shape>();
  if (j.at("dtype") == "int64") return from_int_vector(j.at("data").get<std::vector<int64_t>>(), shape, device);
  return from_vector(j.at("data").get<std::vector<double>>(), shape, {.dtype = float_dtype, .device = device});
}

inline Inputs inputs_from_json(const Json& c, const Device& device = cpu(), DType float_dtype = kFloat64) {
  Inputs in;
  for (const auto& [name, t] : c.at("inputs").items()) in[name] = tensor_from_json(t, device, float_dtype);
  return in;
}

inline bool is_penalty(const Json& c) {
  return c.contains("critic");
}

// The fixture's critic: flatten, linear, tanh, linear, with parameters {w1, b1, w2, b2}.
inline losses::Critic mlp_critic(const std::vector<Tensor>& p) {
  return [p](const Tensor& x) { return linear(tanh(linear(reshape(x, {x.size(0), -1}), p[0], p[1])), p[2], p[3]); };
}

inline std::vector<Tensor> critic_params_from_json(const Json& c, const Device& device = cpu(),
                                                   DType dtype = kFloat64) {
  std::vector<Tensor> p;
  for (const Json& pair : c.at("critic")) p.push_back(tensor_from_json(pair.at(1), device, dtype));
  return p;
}

inline losses::Reduction reduction_of(const Json& o) {
  const std::string r = o.at("reduction");
  return r == "none" ? losses::Reduction::None : r == "sum" ? losses::Reduction::Sum : losses::Reduction::Mean;
}

inline Tensor input_or_none(const Inputs& in, const std::string& name) {
  const auto it = in.find(name);
  return it == in.end() ? Tensor() : it->second;
}

// The case's loss on `in` (a penalty: on the critic with parameters `critic`).
inline Tensor run_case(const Json& c, const Inputs& in, const std::vector<Tensor>& critic = {}) {
  namespace L = losses;
  const std::string loss = c.at("loss");
  const Json& o = c.at("options");
  const auto& at = [&](const char* name) { return in.at(name); };
  if (loss == "cross_entropy" || loss == "nll_loss") {
    const L::CrossEntropyOptions opts{.ignore_index = o.at("ignore_index"),
                                      .weight = input_or_none(in, "weight"),
                                      .label_smoothing = o.at("label_smoothing"),
                                      .reduction = reduction_of(o)};
    return loss == "nll_loss" ? L::nll_loss(at("log_probs"), at("target"), opts)
                              : L::cross_entropy(at("logits"), at("target"), opts);
  }
  if (loss == "focal_loss") {
    return L::focal_loss(at("logits"), at("target"),
                         {.gamma = o.at("gamma"),
                          .alpha = input_or_none(in, "alpha"),
                          .ignore_index = o.at("ignore_index"),
                          .reduction = reduction_of(o)});
  }
  if (loss == "dice_loss") {
    return L::dice_loss(at("logits"), at("target"),
                        {.smooth = o.at("smooth"), .ignore_index = o.at("ignore_index"), .reduction = reduction_of(o)});
  }
  if (loss == "lovasz_softmax") {
    return L::lovasz_softmax(
        at("logits"), at("target"),
        {.ignore_index = o.at("ignore_index"), .only_present = o.at("only_present"), .reduction = reduction_of(o)});
  }
  if (loss == "ohem_cross_entropy") {
    return L::ohem_cross_entropy(at("logits"), at("target"),
                                 {.threshold = o.at("threshold"),
                                  .min_kept = o.at("min_kept"),
                                  .ignore_index = o.at("ignore_index"),
                                  .reduction = reduction_of(o)});
  }
  if (loss == "mse_loss") return L::mse_loss(at("input"), at("target"), reduction_of(o));
  if (loss == "l1_loss") return L::l1_loss(at("input"), at("target"), reduction_of(o));
  if (loss == "smooth_l1_loss") return L::smooth_l1_loss(at("input"), at("target"), o.at("beta"), reduction_of(o));
  if (loss == "binary_cross_entropy_with_logits") {
    return L::binary_cross_entropy_with_logits(at("logits"), at("target"),
                                               {.weight = input_or_none(in, "weight"),
                                                .pos_weight = input_or_none(in, "pos_weight"),
                                                .reduction = reduction_of(o)});
  }
  if (loss == "wasserstein_critic_loss") return L::wasserstein_critic_loss(at("d_real"), at("d_fake"));
  if (loss == "wasserstein_generator_loss") return L::wasserstein_generator_loss(at("d_fake"));
  if (loss == "wgan_gp_penalty") {
    return L::wgan_gp_penalty(mlp_critic(critic), at("real"), at("fake"), {.lambda = o.at("lambda"), .eps = at("eps")});
  }
  if (loss == "dragan_penalty") {
    return L::dragan_penalty(mlp_critic(critic), at("real"),
                             {.lambda = o.at("lambda"), .c = o.at("c"), .noise = at("noise")});
  }
  if (loss == "r1_penalty") return L::r1_penalty(mlp_critic(critic), at("real"), {.gamma = o.at("gamma")});
  EF_ERROR("fixture case ", c.at("name").get<std::string>(), ": unknown loss ", loss);
}

// The names of the case's inputs that PyTorch differentiated (the stored gradients).
inline std::vector<std::string> differentiated(const Json& c) {
  std::vector<std::string> names;
  if (c.contains("grads"))
    for (const auto& [name, g] : c.at("grads").items()) names.push_back(name);
  return names;
}

}  // namespace evenflow::testing
