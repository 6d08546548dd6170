#!/usr/bin/env python3
"""scripts/gpu_check's model step: the whole model in bf16 on the GPU against the CPU backend in
fp32, on two checkpoints made here with torch, each read from its folder by ltm-worker.

  gpu_check_model.py LTM_WORKER OUT_DIR [DEVICE]

DEVICE is cuda unless given (devsim, the emulated device, runs the step's logic on a CPU:
tests/python/test_gpu_check_model.py). The checkpoints: GPT-2 (4 layers, d 256, 4 heads of 64,
vocab 512) and Qwen2 (the Llama family: RMSNorm, RoPE, SwiGLU, q/k/v biases, 8 query heads of
32 over 2 KV heads; 4 layers, hidden 256, vocab 512), both bf16 so both runs read the same
values, their tied token embedding scaled to std 0.1 (the rest std 0.02, W^Q/W^K 0.2 for GPT-2
and 0.08 for Qwen2): the tied LM head then gives each step's top token a margin far above bf16's
error, so greedy decoding must agree token for token, while attention (peaked, so that RoPE and
the KV heads' mapping matter) and the MLP still move every logit. Checked for each over 32
greedy steps: the same tokens; each step's logits within TOL_REL x that step's largest |logit|
of the fp32 ones (bf16 keeps 8 significant bits; 4 layers of bf16 activations with fp32
accumulation stay well inside 3%); the fp32 run's smallest top-2 margin above twice that bound
(else the checkpoint could not tell a wrong token from rounding, and the step fails).
Then the draft model on the device (--speculative draft --draft-device device, the GPT-2
checkpoint its own draft): its greedy tokens must be the device run's without speculation, its
drafts proposed and accepted, and the log must name the device it ran on.
Prints "result: ..." (scripts/gpu_check's detail) and exits 1 on any failure.
"""
import json
import os
import struct
import subprocess
import sys

TOL_REL = 0.03
STEPS = 32
PROMPT = [17, 301, 45, 9, 250, 77, 3, 128]


def read_npy(path):
    """(shape, flat list of floats) of a little-endian float32 .npy (no numpy needed)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x93NUMPY", path
    major = data[6]
    hlen = struct.unpack_from("<H" if major == 1 else "<I", data, 8)[0]
    start = (10 if major == 1 else 12) + hlen
    header = data[(10 if major == 1 else 12):start].decode("latin1")
    d = eval(header, {"__builtins__": {}})  # numpy's own header is a Python dict literal
    assert d["descr"] == "<f4" and not d["fortran_order"], header
    n = 1
    for s in d["shape"]:
        n *= s
    return tuple(d["shape"]), list(struct.unpack_from(f"<{n}f", data, start))


def testing_modules():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "tests", "python"))
    from ltm_testing import checkpoint as ck, llama_checkpoint as lc  # torch from this Python
    return ck, lc


def make_model(path):
    ck, _ = testing_modules()

    ck.make_checkpoint(path, vocab_size=512, n_positions=128, n_embd=256, n_layer=4, n_head=4,
                       std=0.02, qk_std=0.2, seed=20, dtype="BF16")
    weights = ck.load_checkpoint(path)
    weights["wte.weight"] = weights["wte.weight"] * 5.0
    records = []
    for name, t in weights.items():
        raw, _ = ck._to_bytes(t, "BF16")
        records.append((ck.PREFIX + name, "BF16", tuple(t.shape), raw))
    ck.write_safetensors(os.path.join(path, ck.SINGLE_FILE), records, {"format": "pt"})


def make_qwen2_model(path):
    ck, lc = testing_modules()
    weights = lc.make_llama_checkpoint(
        path, family="qwen2", vocab_size=512, hidden_size=256, intermediate_size=512, n_layer=4,
        n_head=8, n_kv_head=2, tie_word_embeddings=True, max_position_embeddings=128, std=0.02,
        qk_std=0.08, seed=20, dtype="BF16")
    weights["embed_tokens.weight"] = weights["embed_tokens.weight"] * 5.0
    records = []
    for name, t in weights.items():
        raw, _ = ck._to_bytes(t, "BF16")
        records.append((lc.PREFIX + name, "BF16", tuple(t.shape), raw))
    ck.write_model_files(path, records)


def run(worker, model, device, dtype, logits_path, extra=(), full=False):
    cmd = [worker, "--model", model, "--device", device, "--weight-dtype", dtype,
           "--kv-dtype", dtype, "--prompt-ids", ",".join(map(str, PROMPT)),
           "--max-new-tokens", str(STEPS), "--temperature", "0", "--output", "json", *extra]
    if logits_path:
        cmd += ["--dump-logits", logits_path]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    sys.stdout.write(p.stderr[-2000:])
    if p.returncode != 0:
        raise RuntimeError(f"{device} run failed (exit {p.returncode}): {p.stderr.strip()[-300:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return (out, p.stderr) if full else out["generated_ids"]


def logit_gap(ref, got, vocab, steps):
    """(largest |ref - got| of a step over that step's largest |ref|, smallest top-2 margin of
    ref over the same scale), over the first `steps` rows of two flat [steps, vocab] lists."""
    worst_rel, min_margin_rel = 0.0, float("inf")
    for i in range(steps):
        r, g = ref[i * vocab:(i + 1) * vocab], got[i * vocab:(i + 1) * vocab]
        scale = max(abs(x) for x in r)
        worst_rel = max(worst_rel, max(abs(a - b) for a, b in zip(r, g)) / scale)
        top = sorted(r, reverse=True)
        min_margin_rel = min(min_margin_rel, (top[0] - top[1]) / scale)
    return worst_rel, min_margin_rel


def check(worker, out, name, make, device):
    """One checkpoint: returns the problems found (empty: passed) and prints its result line."""
    model = os.path.join(out, name)
    try:
        make(model)
        cpu_ids = run(worker, model, "cpu", "f32", os.path.join(out, f"{name}_cpu_logits.npy"))
        gpu_ids = run(worker, model, device, "bf16",
                      os.path.join(out, f"{name}_{device}_logits.npy"))
        (n, v), cpu = read_npy(os.path.join(out, f"{name}_cpu_logits.npy"))
        shape, gpu = read_npy(os.path.join(out, f"{name}_{device}_logits.npy"))
    except Exception as e:  # noqa: BLE001 - every failure is this step's result
        print(f"result: {name}: {e}")
        return [str(e)]
    print(f"{name} cpu ids  ", cpu_ids)
    print(f"{name} {device} ids", gpu_ids)
    problems = []
    if len(cpu_ids) != STEPS or cpu_ids != gpu_ids:
        first = next((i for i, (a, b) in enumerate(zip(cpu_ids, gpu_ids)) if a != b),
                     min(len(cpu_ids), len(gpu_ids)))
        problems.append(f"tokens differ from step {first}")
    if shape != (n, v) or n < STEPS:
        problems.append(f"logits shapes {shape} and {(n, v)}, expected ({STEPS}, vocab)")
    worst_rel, min_margin_rel = logit_gap(cpu, gpu, v, min(n, shape[0]))
    if worst_rel > TOL_REL:
        problems.append(f"logits differ by {worst_rel:.4f} of the row's largest |logit| "
                        f"(tolerance {TOL_REL})")
    if min_margin_rel <= 2 * TOL_REL:
        problems.append(f"the checkpoint's smallest top-2 margin {min_margin_rel:.4f} is not "
                        f"above twice the tolerance")
    summary = (f"{name}: {STEPS} greedy tokens {'identical' if cpu_ids == gpu_ids else 'DIFFERENT'}"
               f"; max |logit diff| {worst_rel:.4f} of row max (tolerance {TOL_REL}); smallest "
               f"top-2 margin {min_margin_rel:.3f} of row max")
    print("result:", summary + ("; " + "; ".join(problems) if problems else ""))
    return problems


def check_draft(worker, out, device):
    """The GPT-2 checkpoint (made by check) as its own draft on the device: the tokens of the
    device run without speculation, drafts proposed and accepted, run where the log says."""
    model = os.path.join(out, "gpt2")
    try:
        want = run(worker, model, device, "bf16", None)
        got, log = run(worker, model, device, "bf16", None,
                       ["--speculative", "draft", "--draft-model", model, "--draft-device",
                        "device", "--spec-token-cost", "0.01"], full=True)
    except Exception as e:  # noqa: BLE001 - every failure is this step's result
        print(f"result: draft on the device: {e}")
        return [str(e)]
    spec = got["speculative"]
    where = next((line.split(") on ", 1)[1] for line in log.splitlines()
                  if "draft model (--speculative draft): " in line and ") on " in line), "?")
    problems = []
    if got["generated_ids"] != want:
        problems.append("tokens differ from the run without speculation")
    if not 0 < spec["accepted_tokens"] <= spec["proposed_tokens"]:
        problems.append(f"drafts {spec}")
    if not where.startswith(device):
        problems.append(f"the draft ran on {where}, not on {device}")
    print(f"result: draft on the device: {STEPS} greedy tokens "
          f"{'identical' if got['generated_ids'] == want else 'DIFFERENT'}; "
          f"{spec['accepted_tokens']} of {spec['proposed_tokens']} drafts accepted; on "
          f"{where[:60]}" + ("; " + "; ".join(problems) if problems else ""))
    return problems


def main():
    worker, out = sys.argv[1], sys.argv[2]
    device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    os.makedirs(out, exist_ok=True)
    failed = [name for name, make in (("gpt2", make_model), ("qwen2", make_qwen2_model))
              if check(worker, out, name, make, device)]
    if "gpt2" not in failed and check_draft(worker, out, device):
        failed.append("draft on the device")
    if failed:
        print(f"result: failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
