"""OpenAI logprobs (echo + top alternatives) are the same in every tp x pp layout, and equal a
float64 log-softmax of the dumped logits.

The last stage reduces each row to its token's logprob and the top-N alternatives (RowLogprobs,
runtime/sampling/sampler.h), inside its TP group when tp > 1, so rank 0 never receives a
vocabulary-sized row; this checks that reduction against the one-rank server and against the
logits the one-shot command dumps. The vocabulary (50261) is split unevenly by tp 2."""
import json

import numpy as np
import pytest
import torch

from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.e2e import GPT2_DIR
from ltm_testing.http import HttpServer
from ltm_testing.worker import generate_json

# GPT-2's tokenizer (the HTTP door needs one) over an odd vocabulary that tp 2 splits unevenly.
SHAPE = dict(vocab_size=50261, n_positions=128, n_embd=64, n_layer=4, n_head=4)
LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]
N_TOP = 5


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mpi_logprobs") / "m")
    make_checkpoint(path, copy_vocab_from=GPT2_DIR, std=0.2, seed=33, **SHAPE)
    return path


def prompt_ids():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, 50257, (13,), generator=g).tolist()


def logprobs_of(srv: HttpServer) -> dict:
    status, _, raw = srv.request("POST", "/v1/completions",
                                 {"prompt": prompt_ids(), "max_tokens": 6, "temperature": 0,
                                  "echo": True, "logprobs": N_TOP, "ignore_eos": True},
                                 timeout=120)
    assert status == 200, raw
    return json.loads(raw)["choices"][0]["logprobs"]


def test_logprobs_agree_across_layouts_and_with_the_logits(model, tmp_path):
    results = {}
    for tp, pp in LAYOUTS:
        with HttpServer(model, ranks=tp * pp, tp=tp, pp=pp, log_dir=str(tmp_path),
                        name=f"lp_{tp}x{pp}") as srv:
            results[(tp, pp)] = logprobs_of(srv)
    base = results[(1, 1)]
    assert len(base["token_logprobs"]) == 13 + 6 and base["token_logprobs"][0] is None
    for layout, lp in results.items():
        assert lp["tokens"] == base["tokens"], layout
        worst = 0.0
        for a, b in zip(base["token_logprobs"][1:], lp["token_logprobs"][1:]):
            worst = max(worst, abs(a - b))
        for a, b in zip(base["top_logprobs"][1:], lp["top_logprobs"][1:]):
            assert list(a.keys()) == list(b.keys()), layout
            worst = max(worst, max(abs(a[k] - b[k]) for k in a))
        print(f"tp={layout[0]} pp={layout[1]}: max |logprob - (1,1)| = {worst:.2e}")
        assert worst < 1e-4, layout

    # Against the logits the one-shot command dumps for the same prompt (prompt rows + new rows).
    npy_prompt, npy_new = tmp_path / "prompt.npy", tmp_path / "new.npy"
    out = generate_json(model, prompt_ids=prompt_ids(), max_new_tokens=6, ranks=1,
                        extra=["--ignore-eos", "--dump-prompt-logits", npy_prompt,
                               "--dump-logits", npy_new, "--threads", "1"])
    # Prompt position i predicts token i + 1; the last prompt row is also the first new row.
    rows = np.concatenate([np.load(npy_prompt), np.load(npy_new)[1:]]).astype(np.float64)
    ids = prompt_ids() + out["generated_ids"]
    log_softmax = rows - np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - rows.max(1, keepdims=True)
    want = [log_softmax[i, ids[i + 1]] for i in range(len(ids) - 1)]
    got = base["token_logprobs"][1:]
    assert np.abs(np.array(got) - np.array(want)).max() < 1e-4
    best = np.argsort(-log_softmax[3], kind="stable")[:N_TOP]
    assert [round(float(log_softmax[3, i]), 3) for i in best] == \
        [round(v, 3) for v in base["top_logprobs"][4].values()]
