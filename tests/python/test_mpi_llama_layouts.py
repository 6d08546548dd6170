"""Llama-family folders give the one-rank tokens in every tp x pp layout, and the reference's
logits: Llama with 12 query heads over 4 KV heads (tp 4: one KV head per rank) and Qwen2 with
8 over 2 (tp 4: each KV head replicated on two ranks), under tp 2 x pp 2 and tp 4 (mpirun)."""
import numpy as np
import pytest
import torch

from ltm_testing.llama_checkpoint import make_llama_checkpoint
from ltm_testing.worker import generate_json
from test_llama_model import LLAMA, QWEN2, TOL, VOCAB, reference_for

LAYOUTS = [(1, 1), (2, 2), (4, 1)]


def ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


@pytest.mark.parametrize("family,shape", [("llama", LLAMA), ("qwen2", QWEN2)])
def test_layouts_match_one_rank_and_reference(tmp_path, family, shape):
    path = str(tmp_path / family)
    make_llama_checkpoint(path, family, seed=11, **shape)
    prompt = ids(13, 11)
    runs = {}
    for tp, pp in LAYOUTS:
        npy = tmp_path / f"logits_{tp}x{pp}.npy"
        out = generate_json(path, prompt_ids=prompt, max_new_tokens=16, ranks=tp * pp,
                            extra=["--tp", tp, "--pp", pp, "--ignore-eos", "--threads", "1",
                                   "--kv-dtype", "f32", "--dump-logits", npy],
                            env={"LTM_AMX": "0"})
        runs[(tp, pp)] = (out["generated_ids"], np.load(npy))
    base, base_logits = runs[(1, 1)]
    assert len(set(base)) > 4, "the output should vary"
    ref = reference_for(path).logits(prompt + base).numpy()[len(prompt) - 1: -1]
    for (tp, pp), (gen, logits) in runs.items():
        d_one = np.abs(logits - base_logits).max()
        d_ref = np.abs(logits - ref).max()
        print(f"{family} tp={tp} pp={pp}: max |logits - (1,1)| {d_one:.3g}, "
              f"max |logits - reference| {d_ref:.3g}")
        assert gen == base, (tp, pp)
        assert d_ref < TOL, (tp, pp)
