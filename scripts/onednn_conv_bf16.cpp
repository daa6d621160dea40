// What a oneDNN version's bfloat16 convolutions buy on wgan_gp's convolutions, against its float32
// ones, the way engine/cpu/onednn_conv.cpp runs them: primitives on the layouts they choose
// (format_tag::any), bfloat16 inputs with float32 outputs, and the reorders from and to our plain
// float32 NCHW / OIHW around every call. Then the same passes with the activations channels-last
// (NHWC) on both sides, as an engine that kept its activations in that layout would run them: the
// primitive's float32 output is then ours as it is, and a bfloat16 input needs only a conversion.
// Built against any oneDNN 2.x or 3.x by scripts/bench_onednn_bf16.sh, which compares Debian's 2.6
// with the 3.2 evenflow links in the same run.
//   onednn_conv_bf16 [BATCH]       (threads: OMP_NUM_THREADS)
#include <oneapi/dnnl/dnnl.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using dnnl::memory;
using dt = memory::data_type;
using Tag = memory::format_tag;
using Args = std::unordered_map<int, memory>;

struct Shape {
  const char* name;
  int64_t c_in, h, c_out, oh;  // 4x4 kernels, stride 2, padding 1, as wgan_gp's
};

memory::dims dims_of(const memory::desc& md) {
#if DNNL_VERSION_MAJOR >= 3
  return md.get_dims();
#else
  return md.dims();
#endif
}

// Normal-looking float32 values (deterministic), converted by a reorder when the memory is bf16.
memory filled(const memory::desc& md, const dnnl::engine& eng, dnnl::stream& s) {
  memory m(md, eng);
  const memory::dims dims = dims_of(md);
  const memory::desc plain(dims, dt::f32, dims.size() == 4 ? Tag::nchw : Tag::a);
  memory src(plain, eng);
  auto* p = static_cast<float*>(src.get_data_handle());
  uint32_t state = 12345;
  for (size_t i = 0; i < plain.get_size() / sizeof(float); ++i) {
    state = state * 1103515245u + 12345u;
    p[i] = static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  dnnl::reorder(src, m).execute(s, src, m);
  s.wait();
  return m;
}

// Microseconds per run of `body`, after a warm-up.
template <class F>
double microseconds(F&& body, dnnl::stream& s) {
  for (int i = 0; i < 20; ++i) body();
  s.wait();
  constexpr int kReps = 200;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) body();
  s.wait();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kReps;
}

// One primitive with its arguments, and the reorders between its layouts and ours (float32; weights
// OIHW, activations in `ours`): `inputs` are reordered in before, `output` out after (into fresh
// memory, as our kernels do); none where the layouts agree.
struct Pass {
  dnnl::primitive prim;
  Args args;
  std::vector<std::pair<memory, memory>> to_prim;    // ours -> the primitive's memory
  std::vector<std::pair<memory, memory>> from_prim;  // the primitive's output -> ours
  std::string impl;
};

memory::desc our_desc(int arg, const memory::desc& md, Tag ours) {
  const bool weights = arg == DNNL_ARG_WEIGHTS || arg == DNNL_ARG_DIFF_WEIGHTS;
  return memory::desc(dims_of(md), dt::f32, weights ? Tag::oihw : ours);
}

Pass make_pass(const dnnl::engine& eng, dnnl::stream& s, dnnl::primitive prim, const char* impl,
               std::vector<std::pair<int, memory::desc>> inputs, std::pair<int, memory::desc> output,
               const memory::desc& scratch, Tag ours) {
  memory out(output.second, eng);
  Pass p{std::move(prim), {{output.first, out}}, {}, {}, impl};  // impl copied: its descriptor goes first
  const memory::desc out_ours = our_desc(output.first, output.second, ours);
  if (!(out_ours == output.second)) p.from_prim.emplace_back(out, memory(out_ours, eng));
  for (const auto& [arg, md] : inputs) {
    const memory::desc in_ours = our_desc(arg, md, ours);
    memory plain = filled(in_ours, eng, s);
    if (in_ours == md) {
      p.args.emplace(arg, plain);
      continue;
    }
    memory mine(md, eng);
    p.to_prim.emplace_back(plain, mine);
    p.args.emplace(arg, mine);
  }
  p.args.emplace(DNNL_ARG_SCRATCHPAD, memory(scratch, eng));
  return p;
}

struct Timing {
  double kernel, with_reorders;
};

Timing run(Pass& p, dnnl::stream& s) {
  const double kernel = microseconds([&] { p.prim.execute(s, p.args); }, s);
  const double all = microseconds(
      [&] {
        for (auto& [from, to] : p.to_prim) dnnl::reorder(from, to).execute(s, from, to);
        p.prim.execute(s, p.args);
        for (auto& [from, to] : p.from_prim) dnnl::reorder(from, to).execute(s, from, to);
      },
      s);
  return {kernel, all};
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t batch = argc > 1 ? std::atoll(argv[1]) : 64;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const Shape shapes[] = {{"critic conv1 1->32, 28->14", 1, 28, 32, 14}, {"critic conv2 32->64, 14->7", 32, 14, 64, 7}};
  std::printf(
      "oneDNN %d.%d.%d, batch %lld, microseconds per call: kernel alone / with the reorders to and from our layout\n"
      "(NCHW: the primitive's own layouts, as evenflow runs it; NHWC: activations channels-last on both sides)\n",
      DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR, DNNL_VERSION_PATCH, static_cast<long long>(batch));
  std::printf(
      "| convolution | pass | float32 NCHW | bf16 NCHW | float32 / bf16 | float32 NHWC | bf16 NHWC | float32 / bf16 | "
      "bf16 implementations (NCHW; NHWC) |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    const memory::dims src{batch, sh.c_in, sh.h, sh.h}, wei{sh.c_out, sh.c_in, 4, 4},
        dst{batch, sh.c_out, sh.oh, sh.oh};
    const memory::dims strides{2, 2}, pad{1, 1};
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // float32 and bf16 on NCHW, then on NHWC.
    const struct {
      dt in;
      Tag ours;
    } cases[4] = {{dt::f32, Tag::nchw}, {dt::bf16, Tag::nchw}, {dt::f32, Tag::nhwc}, {dt::bf16, Tag::nhwc}};
    Timing t[4][3];
    std::string impl[4][3];
    for (int c = 0; c < 4; ++c) {
      const dt in = cases[c].in;
      const Tag act = cases[c].ours == Tag::nchw ? Tag::any : Tag::nhwc;
      const auto desc = [&](const memory::dims& d, dt t, bool activation) {
        return memory::desc(d, t, activation ? act : Tag::any);
      };
      const auto alg = dnnl::algorithm::convolution_direct;
#if DNNL_VERSION_MAJOR >= 3
      const dnnl::convolution_forward::primitive_desc fwd(eng, dnnl::prop_kind::forward_training, alg,
                                                          desc(src, in, true), desc(wei, in, false),
                                                          desc(dst, dt::f32, true), strides, pad, pad, attr);
      const dnnl::convolution_backward_data::primitive_desc bwd_data(
          eng, alg, desc(src, dt::f32, true), desc(wei, in, false), desc(dst, in, true), strides, pad, pad, fwd, attr);
      const dnnl::convolution_backward_weights::primitive_desc bwd_weights(
          eng, alg, desc(src, in, true), desc(wei, dt::f32, false), desc(dst, in, true), strides, pad, pad, fwd, attr);
#else
      const dnnl::convolution_forward::primitive_desc fwd(
          {dnnl::prop_kind::forward_training, alg, desc(src, in, true), desc(wei, in, false), desc(dst, dt::f32, true),
           strides, pad, pad},
          attr, eng);
      const dnnl::convolution_backward_data::primitive_desc bwd_data(
          {alg, desc(src, dt::f32, true), desc(wei, in, false), desc(dst, in, true), strides, pad, pad}, attr, eng,
          fwd);
      const dnnl::convolution_backward_weights::primitive_desc bwd_weights(
          {alg, desc(src, in, true), desc(wei, dt::f32, false), desc(dst, in, true), strides, pad, pad}, attr, eng,
          fwd);
#endif
      const Tag ours = cases[c].ours;
      Pass passes[3] = {
          make_pass(eng, s, dnnl::convolution_forward(fwd), fwd.impl_info_str(),
                    {{DNNL_ARG_SRC, fwd.src_desc()}, {DNNL_ARG_WEIGHTS, fwd.weights_desc()}},
                    {DNNL_ARG_DST, fwd.dst_desc()}, fwd.scratchpad_desc(), ours),
          make_pass(eng, s, dnnl::convolution_backward_data(bwd_data), bwd_data.impl_info_str(),
                    {{DNNL_ARG_DIFF_DST, bwd_data.diff_dst_desc()}, {DNNL_ARG_WEIGHTS, bwd_data.weights_desc()}},
                    {DNNL_ARG_DIFF_SRC, bwd_data.diff_src_desc()}, bwd_data.scratchpad_desc(), ours),
          make_pass(eng, s, dnnl::convolution_backward_weights(bwd_weights), bwd_weights.impl_info_str(),
                    {{DNNL_ARG_SRC, bwd_weights.src_desc()}, {DNNL_ARG_DIFF_DST, bwd_weights.diff_dst_desc()}},
                    {DNNL_ARG_DIFF_WEIGHTS, bwd_weights.diff_weights_desc()}, bwd_weights.scratchpad_desc(), ours)};
      for (int k = 0; k < 3; ++k) {
        t[c][k] = run(passes[k], s);
        impl[c][k] = passes[k].impl;
      }
    }
    const char* names[3] = {"forward", "input gradient", "weight gradient"};
    for (int k = 0; k < 3; ++k) {
      std::printf("| %s | %s", sh.name, names[k]);
      for (int c = 0; c < 4; c += 2)
        std::printf(" | %.0f / %.0f | %.0f / %.0f | %.2f / %.2f", t[c][k].kernel, t[c][k].with_reorders,
                    t[c + 1][k].kernel, t[c + 1][k].with_reorders, t[c][k].kernel / t[c + 1][k].kernel,
                    t[c][k].with_reorders / t[c + 1][k].with_reorders);
      std::printf(" | %s; %s |\n", impl[1][k].c_str(), impl[3][k].c_str());
    }
  }
}
