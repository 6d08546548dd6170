"""ltm-plan against what ltm-worker reports for the same layout (issue 10, item 1).

GPT-2-124M's shape (configs/gpt2-124m.json, random bf16 weights: ~250 MB in all) runs one-shot
under mpirun as tp 2 and as pp 2; every rank's weight bytes, KV cache bytes and resident memory at
start-up (the worker's `memory_per_rank_at_load`) must be within 5% of ltm-plan --json's figures
for that layout and stage. The hand-computed values for GPT-3 125M and 175B are in
tests/model/capacity_plan_test.cpp."""
import json
import os
import subprocess

import pytest

from ltm_testing.worker import generate_json, run_worker

BUILD = os.environ.get("LTM_BUILD_DIR", "build")
SOURCE = os.environ.get("LTM_SOURCE_DIR", ".")
PLAN = os.path.join(BUILD, "launcher", "ltm-plan")
MODEL = os.path.join(SOURCE, "configs", "gpt2-124m.json")


def plan(*args, check=True):
    p = subprocess.run([PLAN, *map(str, args)], capture_output=True, text=True, timeout=60)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def plan_json(*args):
    return json.loads(plan(*args, "--json").stdout)


def within(got, want, tolerance=0.05):
    return abs(got - want) <= tolerance * want


# The last case: --kv-resident on both, so the worker's start-up memory holds the whole KV cache
# (one context, ~19 MB a rank in f32: more than the 5% tolerance of its resident memory).
@pytest.mark.parametrize("tp,pp,dtype,resident", [(2, 1, "bf16", False), (1, 2, "bf16", False),
                                                  (2, 1, "int8", False), (2, 1, "f32", True)])
def test_plan_matches_the_workers_memory_report(tp, pp, dtype, resident):
    flags = ["--kv-resident"] if resident else []
    expected = plan_json("--model", MODEL, "--device", "cpu", "-n", 2, "--weight-dtype", dtype,
                         "--one-shot", *flags)
    layout = next(l for l in expected["layouts"] if l["tp"] == tp and l["pp"] == pp)
    out = generate_json(MODEL, prompt_ids=[1, 2, 3], max_new_tokens=2, ranks=2,
                        extra=["--tp", tp, "--pp", pp, "--weight-dtype", dtype, "--threads", "1",
                               *flags])
    ranks = out["memory_per_rank_at_load"]
    assert len(ranks) == 2
    for rank, got in enumerate(ranks):
        stage = layout["stages"][rank // tp]
        print(f"tp {tp} pp {pp} rank {rank}: worker {got}, plan weights "
              f"{stage['weight_bytes_per_rank']} KV {stage['worker_kv_bytes_per_rank']} "
              f"resident {stage['resident_at_load_bytes_per_rank']}")
        assert within(got["weight_bytes"], stage["weight_bytes_per_rank"]), (rank, got)
        assert within(got["kv_cache_bytes"], stage["worker_kv_bytes_per_rank"]), (rank, got)
        assert within(got["peak_resident_bytes"], stage["resident_at_load_bytes_per_rank"]), \
            (rank, got, stage)


def test_a_resident_kv_cache_that_does_not_fit_is_refused_at_start_up():
    # 2 ranks of 10 TB of cache each: both refuse, with the numbers, before touching any of it.
    p = run_worker(["--model", MODEL, "--prompt-ids", "1,2,3", "--max-new-tokens", 2,
                    "--tp", 2, "--threads", 1, "--kv-resident", "--kv-memory-mb", 10_000_000],
                   ranks=2, check=False, timeout=120)
    assert p.returncode != 0, p.stdout
    assert "--kv-resident: the KV cache needs" in p.stderr, p.stderr
    assert "2 rank(s) on this host" in p.stderr and "MemAvailable" in p.stderr, p.stderr


def test_plan_text_names_every_figure_and_a_recommendation():
    text = plan("--model", "gpt3-175b", "--device", "h100-sxm", "-n", 16,
                "--weight-dtype", "bf16").stdout
    for needed in ["174604259328 exact", "12 n_layer d^2 = 173946175488", "tp 8 x pp 2",
                   "KV per token/rank", "FLOPs/token/rank", "all-reduces/block", "decode",
                   "prefill", "recommended: tp 8 x pp 2", "NVIDIA H100"]:
        assert needed in text, needed


def test_plan_takes_the_workers_default_cache_type():
    """bf16 weights on a GPU get a bf16 KV cache (CUDA's activations are bf16 then), on the CPU
    an fp16 one, as ltm-worker chooses (launcher/model_setup.cpp); --kv-dtype overrides it."""
    big = os.path.join(SOURCE, "configs", "gpt3-6.7b.json")
    for device, kv in (("h100-sxm", "bf16"), ("a100-80gb", "bf16"), ("cpu", "fp16")):
        d = plan_json("--model", big, "--device", device, "--weight-dtype", "bf16")
        assert (d["weight_dtype"], d["kv_dtype"]) == ("bf16", kv), (device, d["kv_dtype"])
    d = plan_json("--model", big, "--device", "h100-sxm", "--weight-dtype", "fp16")
    assert d["kv_dtype"] == "fp16"
    d = plan_json("--model", big, "--device", "h100-sxm", "--weight-dtype", "bf16",
                  "--kv-dtype", "fp16")
    assert d["kv_dtype"] == "fp16"


def test_plan_refuses_bad_input_with_a_clear_message():
    p = plan("--model", MODEL, "--device", "tpu-v9", check=False)
    assert p.returncode == 2 and "'tpu-v9' is not in the table" in p.stderr, p.stderr
    p = plan("--model", "/no/such/model", "--device", "cpu", check=False)
    assert p.returncode == 2 and "/no/such/model" in p.stderr, p.stderr
    p = plan("--model", MODEL, "--device", "cpu", "--weight-dtype", "int3", check=False)
    assert p.returncode == 2 and "int3" in p.stderr, p.stderr
    p = plan("--model", MODEL, "--memory-gb", 16, check=False)  # no bandwidth, FLOPs or link
    assert p.returncode == 2 and "needs memory, memory bandwidth" in p.stderr, p.stderr
    # Figures from flags alone.
    j = plan_json("--model", MODEL, "--memory-gb", 16, "--bandwidth-gbs", 100, "--tflops", 1,
                  "--link-gbs", 10, "-n", 4)
    assert j["device"]["name"] == "custom" and j["recommended"] is not None
    # A layout the model cannot split is reported, not planned: GPT-2's 12 heads over tp 8.
    j = plan_json("--model", MODEL, "--device", "cpu", "-n", 8)
    tp8 = next(l for l in j["layouts"] if l["tp"] == 8)
    assert not tp8["valid"] and "12 attention heads" in tp8["invalid"]


KJV = os.path.join(SOURCE, "models", "kjv-small")


def test_plan_counts_the_draft_model_as_the_worker_holds_it(tmp_path):
    """--speculative draft: rank 0 also holds the draft model. ltm-plan (same flags as the worker)
    reports the draft's weights and KV cache as the worker holds them (its one-shot JSON), the
    figures match what the checkpoint and the config give by hand, and rank 0's total includes
    them (issue 22)."""
    from ltm_testing.checkpoint import read_safetensors
    from ltm_testing.draft_models import truncated_copy

    draft = truncated_copy(KJV, str(tmp_path / "draft"), 2)
    spec = ["--speculative", "draft", "--draft-model", draft]
    without = plan_json("--model", KJV, "--device", "cpu", "--weight-dtype", "fp16", "--one-shot")
    got = plan_json("--model", KJV, "--device", "cpu", "--weight-dtype", "fp16", "--one-shot",
                    *spec)
    d = got["draft"]
    # By hand, from the draft's checkpoint: its parameters, matrices (and the tied embedding)
    # in fp16, vectors and the position table in f32 as the loader keeps them.
    tensors = read_safetensors(os.path.join(draft, "model.safetensors"))
    parameters = sum(a.size for _, _, a in tensors.values())
    weight_bytes = sum(a.size * (2 if len(shape) == 2 and not name.endswith("wpe.weight") else 4)
                       for name, (_, shape, a) in tensors.items())
    with open(os.path.join(draft, "config.json"), encoding="utf-8") as f:
        c = json.load(f)
    sequences = min(4, 64) + 1  # --spec-max-batch 4, --max-running 64: and one more
    blocks = sequences * -(-c["n_positions"] // 16)
    kv_bytes = blocks * 16 * 2 * c["n_layer"] * c["n_embd"] * 2  # K and V, fp16
    print(f"draft: plan {d}, by hand {parameters} parameters, {weight_bytes} B weights, "
          f"{kv_bytes} B KV")
    assert d["parameters"] == parameters
    assert d["weight_bytes"] == weight_bytes
    assert d["kv_blocks"] == blocks and d["kv_bytes"] == kv_bytes
    assert d["weight_dtype"] == "fp16" and d["kv_dtype"] == "fp16"
    # Rank 0's figures include it; without the flags they do not.
    a, b = without["layouts"][0], got["layouts"][0]
    assert b["rank0_bytes"] == a["rank0_bytes"] + weight_bytes + kv_bytes
    assert b["resident_at_load_bytes_per_rank"] == a["resident_at_load_bytes_per_rank"] + weight_bytes
    assert b["resident_bytes_per_rank"] == a["resident_bytes_per_rank"] + weight_bytes + kv_bytes
    text = plan("--model", KJV, "--device", "cpu", "--weight-dtype", "fp16", *spec).stdout
    assert "draft model (--speculative draft" in text and "rank 0 in all" in text, text
    # The worker holds what the plan says (its one-shot JSON and its memory report).
    out = generate_json(KJV, prompt_ids=[1, 2, 3], max_new_tokens=2,
                        extra=["--threads", "1", "--verbose", *spec])
    m = out["memory"]
    print(f"worker: {m}")
    assert m["draft_weight_bytes"] == d["weight_bytes"]
    assert m["draft_kv_cache_bytes"] == d["kv_bytes"]
    assert m["draft_kv_blocks"] == d["kv_blocks"]
    assert out["memory_per_rank_at_load"][0]["draft_weight_bytes"] == d["weight_bytes"]
    # Refused as the worker refuses them.
    p = plan("--model", KJV, "--device", "cpu", "--speculative", "draft", check=False)
    assert p.returncode == 2 and "needs --draft-model" in p.stderr, p.stderr
    p = plan("--model", KJV, "--device", "cpu", *spec[:2], "--draft-model", MODEL, check=False)
    assert p.returncode == 2 and "tokenizer" in p.stderr, p.stderr
    # On a GPU: in rank 0's host memory by default; --draft-device device counts it against the
    # GPU with its activations and workspaces (as the worker reserves it there).
    gpu = ["--model", KJV, "--device", "h100-sxm", "--weight-dtype", "fp16", "--json", *spec]
    host = json.loads(plan(*gpu).stdout)["draft"]
    dev = json.loads(plan(*gpu, "--draft-device", "device").stdout)["draft"]
    assert not host["counted_against_rank0_memory"] and not host["on_device"], host
    assert dev["counted_against_rank0_memory"] and dev["on_device"], dev
    assert dev["device_extra_bytes"] > 0 and dev["kv_bytes"] == host["kv_bytes"], dev
    p = plan(*gpu, "--draft-device", "gpu", check=False)
    assert p.returncode == 2 and "--draft-device must be cpu or device" in p.stderr, p.stderr
    for k in (0, 65):  # the worker's range: a verify step's rows stay within what is checked
        p = plan(*gpu, "--spec-tokens", k, check=False)
        assert p.returncode == 2 and "--spec-tokens must be in [1, 64]" in p.stderr, p.stderr


def test_a_plan_that_the_draft_pushes_over_says_so(tmp_path):
    from ltm_testing.draft_models import truncated_copy

    draft = truncated_copy(KJV, str(tmp_path / "draft"), 4)  # as big as the target
    spec = ["--speculative", "draft", "--draft-model", draft]
    # The cpu device (the ranks share the host: the draft counts against rank 0's share), with
    # less memory.
    base = ["--model", KJV, "--weight-dtype", "fp16", "--device", "cpu", "--overhead-mb", 0]
    # Memory for the target and one context of its KV, and half the draft more.
    alone = plan_json(*base, "--memory-gb", 1, *spec)
    l = alone["layouts"][0]
    need = l["weight_bytes_per_rank"] + 256 * l["kv_bytes_per_token_per_rank"]
    memory_gb = (need + alone["draft"]["weight_bytes"] // 2) / 0.9 / 1e9  # usable 0.9 of it
    ok = plan_json(*base, "--memory-gb", memory_gb)
    assert ok["layouts"][0]["fits"], ok
    over = plan_json(*base, "--memory-gb", memory_gb, *spec)
    print(over["reason"])
    assert not over["layouts"][0]["fits"] and over["layouts"][0]["draft_pushes_over"]
    assert "draft model" in over["reason"] and "pushes it over" in over["reason"]
    text = plan(*base, "--memory-gb", memory_gb, *spec).stdout
    assert "the draft model is what pushes rank 0 over" in text, text
