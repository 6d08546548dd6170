#!/usr/bin/env python3
"""scripts/gpu_check's targets step: ltm-bench's GPT-3 6.7B runs beside the GPU's limits
measured in the same run (ltm-gpu-limits before and after the benchmark; the better of the two).

  gpu_check_targets.py OUT_DIR      (reads limits_*.log and bench_*.log there)

Decode limit (tokens/s) = batch x copy bandwidth / bytes a step reads (every weight once plus
each sequence's K and V so far); prefill limit = GEMM rate / FLOPs (2 per weight per token plus
causal attention), the formulas of ltm-bench's own CPU limits. Targets: batch-1 decode >= 0.80
of its limit (bf16; int8 weights, whose limit counts their 1.0625 bytes a weight: >= 0.60, a
first bar for our own kernel), prefill >= 0.60 of its limit; batch-64 decode is reported. Exit 1 below a target
or when a measurement is missing; a step that failed (steps.tsv) counts as missing, whatever it
printed. Standard library only.
"""
import json
import os
import sys

TARGETS = {"bench_decode_b1": 0.80, "bench_prefill_2048": 0.60, "bench_decode_b1_int8": 0.60}


def passed_steps(d):
    try:
        with open(os.path.join(d, "steps.tsv")) as f:
            return {line.split("\t")[0] for line in f if line.split("\t")[1:2] == ["PASS"]}
    except OSError:
        return set()


def json_lines(path):
    name = os.path.basename(path)[:-len(".log")]
    if name not in PASSED:
        return []
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


PASSED = set()


def main():
    d = sys.argv[1]
    PASSED.update(passed_steps(d))
    limits = [j for s in ("limits_before", "limits_after")
              for j in json_lines(os.path.join(d, s + ".log")) if "copy_gb_s" in j]
    if not limits:
        print("result: no limits measured (ltm-gpu-limits failed or not built)")
        return 1
    bw = max(j["copy_gb_s"] for j in limits) * 1e9
    gemm = max(j["gemm_bf16_tflop_s"] for j in limits) * 1e12
    print(f"copy bandwidth {bw / 1e9:.1f} GB/s, bf16 GEMM {gemm / 1e12:.1f} TFLOP/s")
    results, problems = {}, []
    for step, kind in (("bench_decode_b1", "decode"), ("bench_decode_b64", "decode"),
                       ("bench_prefill_2048", "prefill"), ("bench_decode_b1_int8", "decode"),
                       ("bench_decode_b64_int8", "decode")):
        m = [j for j in json_lines(os.path.join(d, step + ".log")) if j.get("measurement") == kind]
        if not m:
            problems.append(f"{step}: no measurement")
            continue
        j = m[-1]
        L, dm, vocab, batch = j["n_layer"], j["n_embd"], j["vocab_size"], j["batch"]
        prompt, new = j["prompt_tokens"], j["new_tokens"]
        kv_size = {"f32": 4, "bf16": 2, "fp16": 2}.get(j.get("kv_dtype"), 2)
        if kind == "decode":
            step_bytes = j["weight_bytes"] + batch * (prompt + new / 2) * 2 * L * dm * kv_size
            limit = batch * bw / step_bytes
        else:
            layer_params = 12.0 * dm * dm + 13.0 * dm
            flops = batch * (2 * layer_params * L * prompt
                             + 4.0 * L * dm * prompt * (prompt + 1) / 2 + 2.0 * vocab * dm)
            limit = gemm / flops * batch * prompt
        ratio = j["tokens_per_s"] / limit
        results[step] = ratio
        target = TARGETS.get(step)
        print(f"{step}: {j['tokens_per_s']:.1f} tokens/s, limit {limit:.1f}, ratio {ratio:.3f}"
              + (f" (target {target})" if target else ""))
        if target and ratio < target:
            problems.append(f"{step} ratio {ratio:.2f} < {target}")
    summary = ", ".join(f"{k.replace('bench_', '')} {v:.2f}" for k, v in results.items())
    print("result:", "ratios " + summary + ("; " + "; ".join(problems) if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
