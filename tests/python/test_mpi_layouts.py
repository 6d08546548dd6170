"""Every tp x pp layout gives the one-rank answer (issue: tensor and pipeline parallelism).

A random checkpoint with n_head 4, n_layer 5 and a vocabulary (997, prime) that no tp divides runs
under mpirun in each layout; greedy tokens for 32 steps, dumped logits (within 1e-4) and seeded
sampling must equal the (1, 1) run. Also: refused layouts, bytes read per rank, and a dead rank."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import torch

from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.worker import MPIEXEC, WORKER, generate_json, run_worker

SHAPE = dict(vocab_size=997, n_positions=128, n_embd=64, n_layer=5, n_head=4)
LAYOUTS = [(1, 1), (2, 1), (4, 1), (1, 2), (1, 4), (2, 2), (1, 5)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mpi") / "m")
    make_checkpoint(path, std=0.2, seed=21, **SHAPE)
    return path


def ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, SHAPE["vocab_size"], (n,), generator=g).tolist()


def run_layout(model, tp, pp, tmp_path, extra=()):
    npy = tmp_path / f"logits_{tp}x{pp}.npy"
    out = generate_json(model, prompt_ids=ids(11, 1), max_new_tokens=32, ranks=tp * pp,
                        extra=["--tp", tp, "--pp", pp, "--ignore-eos", "--dump-logits", npy,
                               "--threads", "1", *extra])
    return out, np.load(npy)


def test_every_layout_matches_one_rank(model, tmp_path):
    base, base_logits = run_layout(model, 1, 1, tmp_path)
    assert len(set(base["generated_ids"])) > 4
    for tp, pp in LAYOUTS[1:]:
        out, logits = run_layout(model, tp, pp, tmp_path)
        diff = np.abs(logits - base_logits).max()
        print(f"tp={tp} pp={pp}: max |logits - (1,1)| = {diff:.3g}")
        assert out["generated_ids"] == base["generated_ids"], (tp, pp)
        assert diff < 1e-4, (tp, pp)
        # Without --dump-logits the TP ranks send only their greedy candidate, not their logits.
        plain = generate_json(model, prompt_ids=ids(11, 1), max_new_tokens=32, ranks=tp * pp,
                              extra=["--tp", tp, "--pp", pp, "--ignore-eos", "--threads", "1"])
        assert plain["generated_ids"] == base["generated_ids"], (tp, pp)


def test_int8_weights_in_every_layout_match_one_rank(model, tmp_path):
    # int8 weights: every rank quantizes its own slice. The TP slices of the row-parallel matrices
    # start on multiples of 32 rows for tp 2 (d_local 32, ffn 128), so each rank quantizes the
    # groups one rank does. Pipeline stages compute exactly what one rank does (1e-4); TP ranks add
    # their partial sums in another order, which can move an activation across a rounding
    # boundary of the next quantization (a step: measured 0.04 here), so the logits agree to 0.1
    # and the greedy tokens exactly. (tp 4 would slice d into 16-row pieces, groups of their own.)
    extra = ["--weight-dtype", "int8"]
    base, base_logits = run_layout(model, 1, 1, tmp_path, extra)
    assert base["layout"]["weight_dtype"] == "int8"
    for tp, pp in [(2, 1), (1, 2), (2, 2), (1, 5)]:
        out, logits = run_layout(model, tp, pp, tmp_path, extra)
        diff = np.abs(logits - base_logits).max()
        print(f"int8 tp={tp} pp={pp}: max |logits - (1,1)| = {diff:.3g}")
        assert out["generated_ids"] == base["generated_ids"], (tp, pp)
        assert diff < (1e-4 if tp == 1 else 0.1), (tp, pp)


def test_seeded_sampling_is_the_same_in_every_layout(model, tmp_path):
    args = ["--temperature", "0.8", "--top-p", "0.9", "--seed", "1234"]
    outs = {}
    for tp, pp in LAYOUTS:
        outs[(tp, pp)] = generate_json(model, prompt_ids=ids(7, 2), max_new_tokens=24,
                                       ranks=tp * pp,
                                       extra=["--tp", tp, "--pp", pp, "--ignore-eos",
                                              "--threads", "1", *args])["generated_ids"]
    base = outs[(1, 1)]
    for layout, got in outs.items():
        assert got == base, layout


@pytest.mark.parametrize("ranks,tp,pp,message", [
    (3, 2, 2, "needs 4"),
    (3, 3, 1, "n_head"),
    (6, 1, 6, "6"),
])
def test_refused_layouts_name_the_numbers(model, ranks, tp, pp, message):
    p = run_worker(["--model", model, "--prompt-ids", "1,2", "--max-new-tokens", "2",
                    "--tp", tp, "--pp", pp], ranks=ranks, check=False, timeout=120)
    assert p.returncode != 0
    assert message in p.stderr, p.stderr


def test_tp2_rank_reads_about_half_of_the_layer_weights(model):
    one = generate_json(model, prompt_ids=[1, 2], max_new_tokens=1, ranks=1)
    two = generate_json(model, prompt_ids=[1, 2], max_new_tokens=1, ranks=2,
                        extra=["--tp", "2"])
    full = one["bytes_read_per_rank"][0]
    halves = two["bytes_read_per_rank"]
    print(f"bytes read: tp=1 {full}, tp=2 {halves}")
    assert len(halves) == 2
    for b in halves:
        # Layer weights halve; LayerNorms, E_pos and row-parallel biases are replicated.
        assert 0.45 * full < b < 0.6 * full


def _start(model, ranks, extra):
    cmd = [MPIEXEC, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", WORKER,
           "--model", model, "--prompt-ids", ",".join(map(str, ids(8, 3))),
           "--max-new-tokens", "1000", "--ignore-eos", "--threads", "1", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _worker_pids(mpirun_pid):
    out = subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP])
def test_a_dead_or_stuck_rank_ends_the_group(model, tmp_path, how):
    timeout = 4
    # A bigger model (random weights from a config) so that the run is still going, ~10 s, when
    # a rank is stopped.
    big = str(tmp_path / "big.json")
    with open(big, "w") as f:
        json.dump(dict(vocab_size=997, n_positions=1024, n_embd=512, n_layer=8, n_head=8,
                       n_inner=None, activation_function="gelu_new"), f)
    proc = _start(big, 4, ["--tp", "2", "--pp", "2", "--collective-timeout", str(timeout)])
    pids = []
    for _ in range(100):
        time.sleep(0.2)
        pids = _worker_pids(proc.pid)
        if len(pids) == 4:
            break
    assert len(pids) == 4, "workers did not start"
    time.sleep(1.0)
    assert proc.poll() is None, "the run ended before a rank could be stopped"
    victim = pids[2]
    t0 = time.time()
    os.kill(victim, how)
    try:
        out, err = proc.communicate(timeout=timeout + 20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    elapsed = time.time() - t0
    print(f"{how.name}: group ended with {proc.returncode} after {elapsed:.1f} s\n{err[-2000:]}")
    assert proc.returncode != 0
    assert elapsed < timeout + 20
    if how == signal.SIGSTOP:
        assert "did not finish within" in err
    else:
        assert err.strip(), "the run must say why it ended"
