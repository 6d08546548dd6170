#!/usr/bin/env python3
"""Where a forward step's GPU time goes: a summary of Nsight Compute's CSV for scripts/gpu_check's
profile steps (each kernel's gpu__time_duration.sum and dram__bytes_read.sum, kernels run one at a
time by ncu).

  ncu_summary.py CSV [--step last|first|N]     (default: the last step)

The kernels are cut into forward steps at each embedding kernel (the first kernel of every
step; what ran before the first is set-up and left out). For the chosen step it prints the
kernels' count, their summed time and DRAM bytes read, then each kernel (by name and grid) with
its launches, time, share and read rate, longest first, and ends with a "result:" line. The sum
is of the kernels alone: the gaps between them (launch latency, host work) are what a timed run
adds on top. Exit 1 when the CSV holds no kernel or no step. Standard library only.
"""
import csv
import re
import sys


def read_kernels(path):
    """[(id, name, grid, ns, bytes)] in launch order, from ncu's --csv --print-units base output."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = {}
    for row in csv.DictReader(lines[start:]):
        try:
            i = int(row["ID"])
            value = float(row["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        k = rows.setdefault(i, {"name": row["Kernel Name"], "grid": row["Grid Size"],
                                "ns": 0.0, "bytes": 0.0})
        if row["Metric Name"] == "gpu__time_duration.sum":
            k["ns"] = value
        elif row["Metric Name"] == "dram__bytes_read.sum":
            k["bytes"] = value
    return [(i, k["name"], k["grid"], k["ns"], k["bytes"]) for i, k in sorted(rows.items())]


def short_name(name):
    name = re.sub(r"\(.*", "", name)  # the parameter list
    for prefix in ("void ", "ltm::<unnamed>::", "ltm::kernels::cuda::", "(anonymous namespace)::"):
        name = name.replace(prefix, "")
    return name[:80]


def steps_of(kernels):
    starts = [n for n, k in enumerate(kernels) if "embedding" in k[1]]
    return [kernels[a:b] for a, b in zip(starts, starts[1:] + [len(kernels)])]


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    which = argv[argv.index("--step") + 1] if "--step" in argv else "last"
    kernels = read_kernels(argv[1])
    steps = steps_of(kernels)
    if not kernels or not steps:
        print("result: no %s in %s" % ("step" if kernels else "kernel", argv[1]))
        return 1
    n = {"last": len(steps) - 1, "first": 0}.get(which)
    if n is None:
        n = int(which)
    step = steps[n]
    total_ns = sum(k[3] for k in step)
    total_bytes = sum(k[4] for k in step)
    print("%d steps; step %d: %d kernels, %.3f ms of kernel time, %.3f GB read from DRAM"
          % (len(steps), n, len(step), total_ns / 1e6, total_bytes / 1e9))
    groups = {}
    for _, name, grid, ns, nbytes in step:
        g = groups.setdefault((short_name(name), grid), [0, 0.0, 0.0])
        g[0] += 1
        g[1] += ns
        g[2] += nbytes
    for (name, grid), (count, ns, nbytes) in sorted(groups.items(), key=lambda x: -x[1][1]):
        share = ns / total_ns if total_ns else 0.0
        rate = nbytes / ns if ns else 0.0  # bytes per ns = GB/s
        print("  %8.3f ms %5.1f%% %5dx %8.0f GB/s  %s grid %s"
              % (ns / 1e6, 100 * share, count, rate, name, grid))
    top = sorted(groups.items(), key=lambda x: -x[1][1])[:3]
    print("result: step %d of %d: %d kernels, %.3f ms, %.2f GB read; longest: %s" % (
        n, len(steps), len(step), total_ns / 1e6, total_bytes / 1e9,
        ", ".join("%s %.2f ms" % (name.split("<")[0].split("::")[-1], v[1] / 1e6)
                  for (name, _), v in top)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
