"""Decode steps as captured graphs (--cuda-graphs, runtime/model/decode_graphs.h) through the
emulated device (--device devsim), where capture records the stream's ops and replay runs the
recorded list (with the registry checks again); the TP all-reduces are recorded in the graph and
run over MPI at each replay. Graphs on and off must give the same tokens and the same logits bit
for bit, tp 2 and tp 2 x pp 2, with the prompt prefilled in chunks (eager) before the decode
steps (graphs); the run with graphs must have replayed some, the run without none. On the CPU
backend --cuda-graphs on is refused with a message."""
import numpy as np
import pytest
import torch

from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.worker import generate_json, run_worker

SHAPE = dict(vocab_size=97, n_positions=64, n_embd=48, n_layer=2, n_head=6)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("graphs") / "m")
    make_checkpoint(path, std=0.5, seed=5, **SHAPE)
    return path


def ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, SHAPE["vocab_size"], (n,), generator=g).tolist()


def run(model, tmp_path, tp, pp, graphs):
    npy = tmp_path / f"logits_{tp}x{pp}_{graphs}.npy"
    out = generate_json(model, prompt_ids=ids(9, 3), max_new_tokens=10, ranks=tp * pp,
                        extra=["--tp", tp, "--pp", pp, "--device", "devsim", "--ignore-eos",
                               "--dump-logits", npy, "--threads", "1", "--max-batch-tokens", 4,
                               "--cuda-graphs", graphs])
    return out, np.load(npy)


@pytest.mark.parametrize("tp,pp", [(2, 1), (2, 2)])
def test_graph_tokens_equal_eager_tokens_through_devsim(model, tmp_path, tp, pp):
    off, off_logits = run(model, tmp_path, tp, pp, "off")
    on, on_logits = run(model, tmp_path, tp, pp, "on")
    print(f"tp {tp} pp {pp}: graphs {on['decode_graphs']}, without {off['decode_graphs']}")
    assert off["decode_graphs"] == {"captured": 0, "replays": 0}
    assert on["decode_graphs"]["captured"] == 1  # one sequence: bucket 1
    assert on["decode_graphs"]["replays"] >= 8  # 10 tokens: the first from prefill, one capture
    assert len(set(on["generated_ids"])) > 2, on["generated_ids"]
    assert on["generated_ids"] == off["generated_ids"]
    assert not np.isnan(on_logits).any(), "poison (NaN) reached the logits"
    assert np.array_equal(on_logits, off_logits), float(np.abs(on_logits - off_logits).max())


def test_cuda_graphs_on_is_refused_on_the_cpu(model):
    p = run_worker(["--model", model, "--prompt-ids", "1,2", "--max-new-tokens", "2",
                    "--device", "cpu", "--cuda-graphs", "on"], check=False, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "--cuda-graphs on needs --device cuda" in p.stderr, p.stderr
    p = run_worker(["--model", model, "--prompt-ids", "1,2", "--max-new-tokens", "2",
                    "--cuda-graphs", "maybe"], check=False, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "--cuda-graphs must be on or off, not 'maybe'" in p.stderr, p.stderr
