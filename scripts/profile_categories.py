#!/usr/bin/env python3
"""Sorts the samples of a `perf record -g` profile into where the time goes (read by scripts/profile.sh).

Reads `perf script -F ip,sym,dso` on stdin. Each sample is charged to the first frame, from the leaf up,
that a rule below claims: a page fault inside a convolution is memory, the convolution's own
instructions are convolution. Kernel frames other than page faults and futex waits are skipped, so a
system call is charged to the user code that made it. Prints a markdown table, largest first.
"""
import re
import sys
from collections import Counter

RULES = [  # (category, regex on "symbol (dso)"), tried in order on each frame
    ("memory: page faults", r"exc_page_fault|do_anonymous_page"),
    ("threads: wake-ups and waits", r"futex|schedule\b|finish_task_switch|libgomp|pthread_cond|sched_yield"),
    ("startup: shared libraries' initializers", r"call_init|_dl_start|_dl_relocate|dl_main"),
    # oneDNN's kernels are generated at run time: perf sees them as [JIT] code, without call stacks.
    ("oneDNN kernels (convolution, GEMM)", r"\[JIT\]|perf-\d+\.map|libdnnl"),
    ("convolution kernels", r"conv2d_forward|conv2d_input_grad|conv2d_weight_grad|conv_\w+_typed|im2col|col2im"
     r"|packed_gemm|onednn_conv|ConvWork"),
    ("matmul kernels (GEMM)", r"cpu_backend::gemm|gemm_typed|eigen_gemm|gemm_one|dnnl_sgemm|gebp_kernel"),
    ("random numbers", r"random_typed|philox|Philox"),
    ("max pooling kernel", r"max_pool"),
    ("optimizer kernel (fused Adam)", r"adam_typed"),
    ("elementwise, reduction, indexing kernels", r"cpu_backend::|libm\.so"),
    ("memory: allocation", r"\bmalloc\b|\bfree\b|cfree|_int_malloc|_int_free|operator new|operator delete|"
     r"CachingAllocator|Allocator::|raw_alloc|raw_free"),
    ("autograd: graph and backward bookkeeping", r"evenflow::(record|Node|run_node|backward|grad\b|"
     r"AccumulateGrad|autograd|detail::Engine)"),
    ("data loading", r"evenflow::data::|libz\.so|libpng"),
    ("optimizer", r"evenflow::optim::"),
    ("ops: checks, shapes, dispatch (other evenflow code)", r"evenflow::"),
]
COMPILED = [(name, re.compile(rx)) for name, rx in RULES]
KERNEL_SKIP = re.compile(r"\[kernel")


def category(frames):
    for frame in frames:
        for name, rx in COMPILED:
            if rx.search(frame):
                return name
    return "other (libc, libstdc++, unresolved)"


def main():
    counts = Counter()
    frames = []
    for line in sys.stdin:
        line = line.strip()
        if not line:
            if frames:
                counts[category(frames)] += 1
            frames = []
            continue
        parts = line.split(None, 1)
        if len(parts) == 2 and re.fullmatch(r"[0-9a-f]+", parts[0]):
            frames.append(parts[1])
    if frames:
        counts[category(frames)] += 1
    total = sum(counts.values()) or 1
    print("| where the CPU time goes | share |")
    print("|---|---|")
    for name, n in counts.most_common():
        print(f"| {name} | {100.0 * n / total:.1f}% |")
    print(f"\n{total} samples")


if __name__ == "__main__":
    main()
