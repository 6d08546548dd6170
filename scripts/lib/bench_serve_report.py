#!/usr/bin/python3
"""scripts/bench_serve's summary: reads the rounds on stdin, one line each
"c1 c32 llama_c32 pp_m1 pp_m2 pp_n1 pp_n2 loadavg" (0 where a part did not run), and the
`ltm-bench --limits-only --json` lines of the run (argv[1]); argv[2] "0" when the pipeline part
did not run; argv[3] the ISA path named for the heading. Prints each round's figures, the medians
and issue 22's serving targets (c32/c1 >= 8, c32 >= 2x llama-server, c32 >= 0.75 of the FMA
roofline counting prefill and decode FLOPs) as met or not."""
import json
import statistics
import sys


def main():
    limits = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
    pipeline = sys.argv[2] != "0"
    isa = sys.argv[3]
    rows = [tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
    if not limits or not rows:
        sys.exit("bench_serve_report.py: no limits or no rounds")
    roof = max(j["fma_peak_gflop_s"] for j in limits)
    read = max(j["read_bandwidth_gb_s"] for j in limits)
    per_token = limits[0]["gflop_per_generated_token"]
    print(f"limits ({len(limits)} probes, {limits[0]['threads']} threads, {limits[0]['probe_isa']} "
          f"path): FMA roofline {roof:.1f} GFLOP/s (probes "
          + " ".join(f"{j['fma_peak_gflop_s']:.1f}" for j in limits) + f"), read {read:.1f} GB/s; "
          f"a request ({limits[0]['prompt_tokens']} + {limits[0]['new_tokens']} tokens) "
          f"{limits[0]['request_gflop']:.2f} GFLOP = {per_token:.4f} GFLOP a generated token")
    c32_c1, frac, vs_llama = [], [], []
    for i, (t1, t32, l32, m1, m2, n1, n2, load) in enumerate(rows, 1):
        gflops = t32 * per_token
        c32_c1.append(t32 / t1)
        frac.append(gflops / roof)
        line = (f"round {i} (load {load:.2f}): c1 {t1:.1f}, c32 {t32:.1f} tokens/s (c32/c1 "
                f"{t32 / t1:.2f}); c32 {gflops:.1f} GFLOP/s = {gflops / roof:.3f} of the roofline")
        if l32 > 0:
            vs_llama.append(t32 / l32)
            line += f"; llama-server c32 {l32:.1f} (ltm / llama-server {t32 / l32:.2f})"
        if pipeline:
            line += (f"; pp 2, one micro-batch vs two: c64 {m1:.1f} vs {m2:.1f} ({m2 / m1:.2f}), "
                     f"c128 {n1:.1f} vs {n2:.1f} ({n2 / n1:.2f})")
        print(line)

    def summary(name, xs, fmt):
        return f"{name} {statistics.median(xs):{fmt}} (range {min(xs):{fmt}}-{max(xs):{fmt}})"

    parts = [summary("c32/c1", c32_c1, ".2f"), summary("c32 fraction of the roofline", frac, ".3f")]
    if vs_llama:
        parts.append(summary("c32 ltm / llama-server", vs_llama, ".2f"))
    if pipeline:
        parts.append(summary("two micro-batches / one at c64", [r[4] / r[3] for r in rows], ".2f"))
        parts.append(summary("at c128", [r[6] / r[5] for r in rows], ".2f"))
    print(f"median over {len(rows)} rounds ({isa} path): " + "; ".join(parts))
    targets = [("c32/c1 >= 8", statistics.median(c32_c1), 8.0),
               ("c32 >= 0.75 of the FMA roofline", statistics.median(frac), 0.75)]
    if vs_llama:
        targets.append(("c32 >= 2x llama-server", statistics.median(vs_llama), 2.0))
    print("targets (medians): " + "; ".join(
        f"{name}: {value:.2f} {'met' if value >= goal else 'NOT met'}" for name, value, goal in targets))


if __name__ == "__main__":
    main()
