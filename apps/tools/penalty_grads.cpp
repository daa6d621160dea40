// penalty_grads: the WGAN-GP penalty's gradients with respect to apps/wgan_gp's critic parameters,
// computed five ways from one inputs file -- float64, float32, wgan_gp --precision bf16's arithmetic
// (Note [bfloat16 compute] in engine/ops.h: the critic's convolutions and products with bfloat16
// operands and float32 accumulation but the first, which reads the images, and the score layer
// (apps::set_precision); the LayerNorm, the penalty's norm and every sum in float32), the same with
// those two layers in bfloat16 too, and wgan_gp's bf16 with every activation between the critic's
// layers stored in bfloat16 (critic_with_bf16_storage) -- written to one output file as
// "<float64|float32|bf16|bf16_all|bf16_storage>.<parameter>". scripts/bench_penalty.sh
// writes the inputs with PyTorch (critic weights, a real and a generated batch, the interpolation
// weights), computes PyTorch's own gradients (float64, float32, autocast bfloat16) and prints each
// one's relative error against float64.
#include <CLI/App.hpp>
#include <cstdio>
#include <memory>

#include "apps/common/program.h"
#include "apps/common/run.h"
#include "apps/common/wgan_critic.h"
#include "evenflow/engine/autograd.h"
#include "evenflow/io/safetensors.h"
#include "evenflow/losses/losses.h"

namespace ef = evenflow;

namespace {

// The critic's forward (WganCritic::forward's, contiguous) with every activation between its layers
// stored in bfloat16: the value, its gradient and its gradient's gradient rounded to bfloat16 there
// (a round trip through the dtype, whose casts round in both directions of autograd), as
// torch.autocast keeps a convolution's output and its gradient. What holding activations in
// bfloat16 (to halve their memory traffic) would cost the penalty; the engine holds them in
// float32 (Note [bfloat16 compute]).
ef::Tensor critic_with_bf16_storage(const ef::apps::WganCritic& critic, const ef::Tensor& x) {
  const auto stored = [](const ef::Tensor& t) { return t.to(ef::kBFloat16).to(ef::kFloat32); };
  ef::Tensor h = stored(critic.child(ef::apps::WganCritic::kImageLayer)->forward(x));
  h = stored(ef::leaky_relu(h, 0.2));
  h = stored(critic.child("conv2")->forward(h));
  h = stored(critic.child("norm")->forward(h));
  h = stored(ef::leaky_relu(h, 0.2));
  return ef::reshape(critic.child("fc")->forward(ef::flatten(h, 1)), {x.size(0)});
}

}  // namespace

int main(int argc, char** argv) {
  const std::unique_ptr<CLI::App> app_owner =
      ef::apps::make_app("the WGAN-GP penalty's critic gradients in float64, float32 and bfloat16 compute");
  CLI::App& app = *app_owner;
  std::string inputs, out, norm = "layernorm";
  int64_t width = 32;
  double lambda = 10.0;
  int threads = 1;
  app.add_option("--inputs", inputs,
                 "safetensors: critic.<parameter> (PyTorch's names, float32), real, fake [N, 1, 28, 28] and eps "
                 "[N, 1, 1, 1] (float32)")
      ->required();
  app.add_option(
         "--out", out,
         "safetensors written: float64.<parameter>, float32.<...>, bf16.<...>, bf16_all.<...>, bf16_storage.<...>")
      ->required();
  ef::apps::add_integer(app, "--width", width, "the critic's width, as wgan_gp's --width", 1);
  app.add_option("--norm", norm, "the critic's normalization: layernorm, syncbn or none");
  ef::apps::add_number(app, "--lambda", lambda, "the penalty's coefficient", {.min = 0, .min_excluded = true});
  ef::apps::add_integer(app, "--threads", threads, "CPU threads", 1);
  return ef::apps::run_program(app, argc, argv, "penalty_grads", [&] {
    ef::set_num_threads(threads);
    const ef::io::SafetensorsFile file = ef::io::load_safetensors(inputs);
    for (const char* name : {"real", "fake", "eps"})
      EF_CHECK(file.at(name).dtype() == ef::kFloat32, inputs, ": ", name, " must be float32, got ",
               ef::dtype_name(file.at(name).dtype()));
    ef::apps::setup_done();
    ef::io::NamedTensors grads;
    for (const auto& [mode, dtype, compute] :
         {std::tuple{"float64", ef::kFloat64, ef::kFloat64}, std::tuple{"float32", ef::kFloat32, ef::kFloat32},
          std::tuple{"bf16", ef::kFloat32, ef::kBFloat16}, std::tuple{"bf16_all", ef::kFloat32, ef::kBFloat16},
          std::tuple{"bf16_storage", ef::kFloat32, ef::kBFloat16}}) {
      ef::apps::WganCritic critic(width, norm, {.dtype = dtype});
      ef::nn::NamedTensors weights;
      for (const auto& [name, p] : critic.named_parameters())
        weights.emplace_back(name, file.at("critic." + name).to(dtype));
      // Every parameter is named; syncbn's running statistics are not used in training mode.
      critic.load_state_dict(weights, /*strict=*/false);
      const std::string m = mode;
      if (m == "bf16" || m == "bf16_storage")
        ef::apps::set_precision(critic, compute, ef::apps::WganCritic::kFloat32Layers);  // as wgan_gp --precision bf16
      else if (compute == ef::kBFloat16)
        critic.set_compute_dtype(compute);
      const ef::losses::Critic d = [&critic, &m](const ef::Tensor& x) {
        return m == "bf16_storage" ? critic_with_bf16_storage(critic, x) : critic(x);
      };
      const ef::Tensor penalty = ef::losses::wgan_gp_penalty(d, file.at("real").to(dtype), file.at("fake").to(dtype),
                                                             {.lambda = lambda, .eps = file.at("eps").to(dtype)});
      const auto params = critic.named_parameters();
      std::vector<ef::Tensor> leaves;
      for (const auto& np : params) leaves.push_back(np.second);
      // The penalty does not depend on every parameter (fc.bias: not at all; the LayerNorm's bias only
      // through LeakyReLU's slope, piecewise constant): those gradients are zero.
      const std::vector<ef::Tensor> g = ef::grad({penalty}, leaves, {}, {.allow_unused = true});
      for (size_t i = 0; i < params.size(); ++i)
        grads.emplace_back(std::string(mode) + "." + params[i].first,
                           g[i].defined() ? g[i] : ef::zeros_like(leaves[i]));
      std::printf("%s: penalty %.9g\n", mode, penalty.item());
    }
    ef::io::save_safetensors(out, grads);
    return 0;
  });
}
