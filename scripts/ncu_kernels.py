#!/usr/bin/python3
"""Each kernel's GPU time per training step, from Nsight Compute's records of two runs of one program
that differ only in their number of steps: the longer run's kernels less the shorter's, divided by
the difference in steps, so that what runs once -- start-up, cuDNN's timed search at the first step,
the last sample -- cancels. For scripts/profile_wgan_gp.sh.

    ncu_kernels.py SHORT.csv LONG.csv --steps N [--label NAME] [--top K]
    ncu_kernels.py --self-test

Each CSV is what `ncu --csv --print-units base --print-kernel-base demangled --metrics
gpu__time_duration.sum --log-file FILE PROGRAM ...` writes: ncu's own lines, then a header line
("ID", ..., "Kernel Name", ..., "Metric Name", "Metric Unit", "Metric Value") and a row per kernel
launch. Prints a line "<label>: K kernels a step, T us of GPU time a step", then the K kernels
(--top, default 25) that take the most time a step, by name shortened to what tells kernels apart:
no return type, parameters or namespaces, template arguments cut at 70 characters."""
import argparse
import csv
import sys

METRIC = "gpu__time_duration.sum"
TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def short_name(name):
    """'void ns::(anonymous namespace)::kernel<A, B>(float *, int)' -> 'kernel<A, B>'."""
    name = name.replace("(anonymous namespace)::", "").strip()
    if name.startswith("void "):
        name = name[len("void "):]
    depth, end, start = 0, len(name), 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            end = i  # the parameters
            break
        elif ch == ":" and depth == 0 and name[i + 1:i + 2] == ":":
            start = i + 2  # past a namespace or class
    name = name[start:end]
    lt = name.find("<")
    if lt >= 0 and len(name) - lt > 70:
        name = name[:lt + 69] + "...>"
    return name


def kernels(path):
    """{short name: [launches, microseconds]} of one ncu CSV."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if header is None:
        raise SystemExit(f"ncu_kernels.py: {path} holds no ncu CSV header (a line starting \"ID\")")
    rows = csv.DictReader([line for line in lines[header:] if line.startswith('"')])
    out = {}
    for row in rows:
        if row.get("Metric Name") != METRIC:
            continue
        unit = row.get("Metric Unit", "")
        if unit not in TO_US:
            raise SystemExit(f"ncu_kernels.py: {path}: unit '{unit}' of {METRIC} is not one of {sorted(TO_US)}")
        us = float(row["Metric Value"].replace(",", "")) * TO_US[unit]
        entry = out.setdefault(short_name(row["Kernel Name"]), [0, 0.0])
        entry[0] += 1
        entry[1] += us
    if not out:
        raise SystemExit(f"ncu_kernels.py: {path} has no {METRIC} rows")
    return out


def per_step(short, long, steps):
    """[(name, launches a step, microseconds a step)], most time first; kernels the longer run does not
    run more often than the shorter are left out."""
    rows = []
    for name, (n, us) in long.items():
        n0, us0 = short.get(name, (0, 0.0))
        if n > n0:
            rows.append((name, (n - n0) / steps, max(us - us0, 0.0) / steps))
    return sorted(rows, key=lambda r: -r[2])


def report(rows, label, top):
    launches = sum(r[1] for r in rows)
    total = sum(r[2] for r in rows)
    lines = [f"{label}: {launches:.0f} kernels a step, {total:.0f} us of GPU time a step"]
    lines.append(f"  {'us/step':>9} {'share':>6} {'calls':>7}  kernel")
    for name, n, us in rows[:top]:
        lines.append(f"  {us:9.1f} {100 * us / total if total else 0:5.1f}% {n:7.1f}  {name}")
    return "\n".join(lines)


def self_test():
    import os
    import tempfile
    head = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",' \
           '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'

    def row(i, kernel, value, unit="nsecond", metric=METRIC):
        return f'"{i}","1","wgan_gp","host","{kernel}","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0",' \
               f'"Command line profiler metrics","{metric}","{unit}","{value}"'

    conv = "void cudnn::cnn::conv_kernel<float, 128>(float const*, int)"
    ours = "void evenflow::cuda_backend::(anonymous namespace)::map_kernel<evenflow::scalar::Relu, float>(float*, long)"
    search = "void cudnn::search_kernel<int>(int)"
    # Start-up (a search kernel, once), then two launches of each per step; the longer run has 3 steps.
    short = ["==PROF== Connected to process 1", head, row(0, search, "9,000"), row(1, conv, "2,000"),
             row(2, ours, "500"), row(3, conv, "2000"), row(4, ours, "500"),
             row(5, ours, "1", metric="sm__cycles_elapsed.avg")]
    long = short[:3] + [row(i, conv if i % 2 else ours, "1.5" if i % 2 else "0.25", unit="usecond") for i in range(1, 5)]
    long += [row(i, conv if i % 2 else ours, "2000" if i % 2 else "250") for i in range(5, 13)]
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for name, lines in (("short.csv", short), ("long.csv", long)):
            paths.append(os.path.join(d, name))
            with open(paths[-1], "w") as f:
                f.write("\n".join(lines) + "\n")
        rows = per_step(kernels(paths[0]), kernels(paths[1]), 2)
    assert short_name(conv) == "conv_kernel<float, 128>", short_name(conv)
    assert short_name(ours) == "map_kernel<evenflow::scalar::Relu, float>", short_name(ours)
    # long: conv 1.5 + 1.5 + 4 x 2 us = 11 us in 6 launches, against 4 us in 2: 3.5 us a step, 2 launches.
    # ours: 0.25 x 2 + 0.25 x 4 = 1.5 us in 6 launches, against 1 us in 2: 0.25 us a step.
    want = [("conv_kernel<float, 128>", 2.0, 3.5), ("map_kernel<evenflow::scalar::Relu, float>", 2.0, 0.25)]
    assert [(n, c, round(u, 6)) for n, c, u in rows] == want, rows
    text = report(rows, "test", 5)
    assert text.splitlines()[0] == "test: 4 kernels a step, 4 us of GPU time a step", text
    print("ncu_kernels.py: self-test passed")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("short", nargs="?")
    p.add_argument("long", nargs="?")
    p.add_argument("--steps", type=int, help="how many more steps the longer run took")
    p.add_argument("--label", default="kernels")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args()
    if a.self_test:
        return self_test()
    if not a.short or not a.long or not a.steps or a.steps < 1:
        p.error("give SHORT.csv LONG.csv and --steps N (N >= 1), or --self-test")
    print(report(per_step(kernels(a.short), kernels(a.long), a.steps), a.label, a.top))


if __name__ == "__main__":
    sys.exit(main())
