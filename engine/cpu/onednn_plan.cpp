#include "evenflow/engine/cpu/onednn_plan.h"

#include <algorithm>
#include <unordered_map>

#include "evenflow/engine/cpu/cpu_conv.h"
#include "evenflow/engine/cpu/threads.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

namespace {

dnnl::stream& thread_stream() {
  // A oneDNN stream per thread: primitives executed on one stream from two threads at once would
  // race, and every CPU device's worker runs kernels concurrently.
  thread_local dnnl::stream stream(onednn_engine());
  return stream;
}

size_t round_up(size_t bytes) {
  return (bytes + 63) / 64 * 64;
}

}  // namespace

const dnnl::engine& onednn_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

void finish_plan(OnednnPlan& plan, const dnnl::memory::desc& primitive_scratch, const dnnl::primitive_attr& attr) {
  const dnnl::engine& eng = onednn_engine();
  size_t scratch_bytes = primitive_scratch.get_size();
  for (OnednnOperand* op : {&plan.in0, &plan.in1, &plan.out}) {
    if (op->used == op->plain) continue;
    const bool input = op != &plan.out;
    const dnnl::reorder::primitive_desc rpd(eng, input ? op->plain : op->used, eng, input ? op->used : op->plain, attr);
    op->reorder = dnnl::reorder(rpd);
    scratch_bytes = std::max(scratch_bytes, rpd.scratchpad_desc().get_size());
  }
  plan.scratch = dnnl::memory::desc({static_cast<int64_t>(scratch_bytes)}, dnnl::memory::data_type::u8,
                                    dnnl::memory::format_tag::a);
  size_t bytes = round_up(scratch_bytes);
  // The reordered operands follow the largest scratchpad: every primitive here runs in turn.
  for (OnednnOperand* op : {&plan.in0, &plan.in1, &plan.out}) {
    if (!op->reorder) continue;
    op->offset = bytes;
    bytes += round_up(op->used.get_size());
  }
  plan.workspace_bytes = bytes;
}

void execute_plan(const OnednnPlan& plan, int threads, const void* in0, const void* in1, void* out, const void* bias) {
  set_team_size(threads);
  std::byte* ws = static_cast<std::byte*>(thread_workspace(plan.workspace_bytes));
  const dnnl::engine& eng = onednn_engine();
  dnnl::stream& stream = thread_stream();
  // Scratchpads are bytes: one memory serves the primitive and the reorders.
  const dnnl::memory scratch(plan.scratch, eng, ws);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SCRATCHPAD, scratch}};
  const auto input = [&](const OnednnOperand& op, const void* data) {
    dnnl::memory plain(op.plain, eng, const_cast<void*>(data));
    if (!op.reorder) return plain;
    dnnl::memory used(op.used, eng, ws + op.offset);
    op.reorder.execute(stream, {{DNNL_ARG_FROM, plain}, {DNNL_ARG_TO, used}, {DNNL_ARG_SCRATCHPAD, scratch}});
    return used;
  };
  args.emplace(plan.in0.arg, input(plan.in0, in0));
  args.emplace(plan.in1.arg, input(plan.in1, in1));
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, dnnl::memory(plan.bias, eng, const_cast<void*>(bias)));
  const dnnl::memory out_plain(plan.out.plain, eng, out);
  const dnnl::memory out_used = plan.out.reorder ? dnnl::memory(plan.out.used, eng, ws + plan.out.offset) : out_plain;
  args.emplace(plan.out.arg, out_used);
  plan.primitive.execute(stream, args);
  if (plan.out.reorder)
    plan.out.reorder.execute(stream,
                             {{DNNL_ARG_FROM, out_used}, {DNNL_ARG_TO, out_plain}, {DNNL_ARG_SCRATCHPAD, scratch}});
  stream.wait();
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
