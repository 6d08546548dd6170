"""The tp x pp layout matrix through the emulated device (--device devsim,
runtime/backend/devsim_backend.h): device buffers in a registry of its own, ops that run only when
the stream is drained, host reads before that poisoned with NaN, activations on the device
communicator (parallel/devsim_communicator.h), which refuses host memory. Each layout must give
the plain CPU backend's tokens and logits in the same layout bit for bit (same kernels, same
reduction order), and the one-rank CPU run's tokens (logits within 1e-4, as test_mpi_layouts.py).

Matrix: tp 1, 2, 3 x pp 1, 2, 3 (up to 9 ranks oversubscribed), with the prompt prefilled in
chunks (--max-batch-tokens 4) and 1 or 2 micro-batches; then served concurrent requests with a KV
budget too small for all of them (preemption) and 2 micro-batches, devsim against cpu."""
import concurrent.futures
import os

import numpy as np
import pytest
import torch

from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.worker import generate_json, run_worker

# n_head 6: tp 2 and 3 divide it; n_layer 3: pp up to 3; vocab 97 (prime): no tp divides it.
SHAPE = dict(vocab_size=97, n_positions=64, n_embd=48, n_layer=3, n_head=6)
LAYOUTS = [(tp, pp) for tp in (1, 2, 3) for pp in (1, 2, 3)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("devsim") / "m")
    make_checkpoint(path, std=0.5, seed=2, **SHAPE)
    return path


def ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, SHAPE["vocab_size"], (n,), generator=g).tolist()


def run(model, device, tp, pp, tmp_path, micro_batches=1, extra=()):
    npy = tmp_path / f"logits_{device}_{tp}x{pp}_{micro_batches}.npy"
    out = generate_json(model, prompt_ids=ids(11, 1), max_new_tokens=8, ranks=tp * pp,
                        extra=["--tp", tp, "--pp", pp, "--device", device, "--ignore-eos",
                               "--dump-logits", npy, "--threads", "1",
                               "--max-batch-tokens", 4, "--micro-batches", micro_batches,
                               *extra])
    return out["generated_ids"], np.load(npy)


@pytest.fixture(scope="module")
def base(model, tmp_path_factory):
    """The one-rank CPU run."""
    got = run(model, "cpu", 1, 1, tmp_path_factory.mktemp("base"))
    assert len(set(got[0])) > 2, got[0]
    return got


@pytest.mark.parametrize("tp,pp", LAYOUTS)
def test_layout_through_devsim_equals_cpu(model, base, tmp_path, tp, pp):
    base_ids, base_logits = base
    cpu_ids, cpu_logits = run(model, "cpu", tp, pp, tmp_path)
    for mb in ((1, 2) if pp > 1 else (1,)):  # micro-batches matter only with stages
        got_ids, got_logits = run(model, "devsim", tp, pp, tmp_path, micro_batches=mb)
        assert not np.isnan(got_logits).any(), "poison (NaN) reached the logits"
        assert got_ids == cpu_ids, (tp, pp, mb)
        assert np.array_equal(got_logits, cpu_logits), (
            tp, pp, mb, float(np.abs(got_logits - cpu_logits).max()))
        assert got_ids == base_ids, (tp, pp, mb)
        assert float(np.abs(got_logits - base_logits).max()) < 1e-4, (tp, pp, mb)


def test_seeded_sampling_through_devsim_equals_cpu(model, tmp_path):
    # tp 3 x pp 2 without --dump-logits: the TP ranks exchange sampling candidates on the host
    # communicator while the activations travel on the device one.
    args = ["--temperature", "0.9", "--top-k", "20", "--seed", "77"]
    outs = [generate_json(model, prompt_ids=ids(7, 2), max_new_tokens=10, ranks=6,
                          extra=["--tp", 3, "--pp", 2, "--device", device, "--ignore-eos",
                                 "--threads", "1", *args])["generated_ids"]
            for device in ("cpu", "devsim")]
    assert outs[0] == outs[1]


SAMPLING = [["--temperature", "0"],
            ["--temperature", "0.9", "--top-k", "20", "--top-p", "0.9",
             "--repetition-penalty", "1.3", "--seed", "5"],
            ["--temperature", "1.1", "--top-p", "0.8", "--seed", "9"]]


@pytest.mark.parametrize("tp,pp", [(1, 1), (1, 2), (2, 1), (3, 1)])
def test_device_sampling_through_devsim_equals_cpu(model, tmp_path, tp, pp):
    """Without --dump-logits, a tp 1 last stage samples with the backend's op
    (Backend::sample_rows) where the logits lie, and a tp > 1 one selects each rank's candidates
    with Backend::select_candidates: on devsim the ops run in stream order and only ids and
    logprobs, or candidates, come back (a host read before the stream got there reads poison,
    which the engine refuses). Greedy and seeded draws give the CPU backend's ids and logprobs
    exactly. Greedy rows run with LTM_DEVSIM_MAX_COPY_BACK=64: a copy back of the logits (the
    batch row's slice of the 97-token vocab: 196 or 132 bytes at tp 2 or 3) aborts the run."""
    for args in SAMPLING:
        greedy = args == ["--temperature", "0"]
        env = {"LTM_DEVSIM_MAX_COPY_BACK": "64"} if greedy else None
        outs = [generate_json(model, prompt_ids=ids(9, 3), max_new_tokens=12, ranks=tp * pp,
                              extra=["--tp", tp, "--pp", pp, "--device", device, "--ignore-eos",
                                     "--threads", "1", *args],
                              env=env if device == "devsim" else None)
                for device in ("cpu", "devsim")]
        assert outs[0]["generated_ids"] == outs[1]["generated_ids"], (tp, pp, args)
        assert outs[0]["logprobs"] == outs[1]["logprobs"], (tp, pp, args)
        assert all(np.isfinite(outs[1]["logprobs"])), (tp, pp, args)


def test_cuda_groups_are_no_longer_refused_for_their_layout():
    """Multi-rank CUDA is wired (NCCL device communicators): on a machine without a GPU the run
    fails because there is no device, not because of the layout."""
    build = os.environ.get("LTM_BUILD_DIR", "")
    if not os.path.exists(os.path.join(build, "lib", "libltm_backend_cuda.so")):
        pytest.skip("this build has no CUDA backend")
    p = run_worker(["--model", os.path.join(os.environ["LTM_SOURCE_DIR"], "configs",
                                            "gpt2-124m.json"),
                    "--prompt-ids", "1,2", "--max-new-tokens", "2", "--device", "cuda",
                    "--tp", "2"], ranks=2, check=False, timeout=120)
    if p.returncode == 0:
        pytest.skip("this machine has a CUDA device (the gpu tests cover it)")
    assert "CUDA device" in p.stderr, p.stderr
    assert "one rank" not in p.stderr and "not yet connected" not in p.stderr, p.stderr
