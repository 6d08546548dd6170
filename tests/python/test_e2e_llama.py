"""A Llama-family folder (grouped-query attention, untied head, GPT-2's vocabulary as its
tokenizer.json) through both front doors and --perplexity: a tp 2 server answers gRPC and HTTP
(/v1/completions) with the one-shot worker's greedy tokens and text, its Tokenize agrees with the
folder's tokenizer, and `--perplexity` equals the PyTorch reference's (ltm_testing/llama_reference.py)
on the same ids. The layouts and the numerics against the reference are test_mpi_llama_layouts.py
and test_llama_model.py."""
import json
import math
import os

import pytest
import torch

from ltm_testing.e2e import GPT2_DIR
from ltm_testing.http import HttpServer
from ltm_testing.llama_checkpoint import load_llama_checkpoint, load_llama_config, \
    make_llama_checkpoint
from ltm_testing.llama_reference import LlamaReference
from ltm_testing.worker import generate_json, run_worker

assert os.environ.get("LTM_WORKER") and GPT2_DIR, "run through ctest (LTM_WORKER, LTM_GPT2_DIR)"

PROMPT = "In the beginning God created the heaven and the earth."
TEXT = ("And the earth was without form, and void; and darkness was upon the face of the deep. "
        "And the Spirit of God moved upon the face of the waters.")
N_NEW = 12


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("llama") / "m")
    # 8 query heads over 4 KV heads: tp 2 splits both. Weights at std 0.2 so tokens vary.
    make_llama_checkpoint(path, "llama", seed=7, vocab_size=50304, hidden_size=64,
                          intermediate_size=128, n_layer=2, n_head=8, n_kv_head=4,
                          rope_theta=500000.0, max_position_embeddings=128, std=0.2,
                          tokenizer_from=GPT2_DIR)
    return path


def test_llama_both_front_doors_give_the_one_shot_tokens(folder, tmp_path):
    alone = generate_json(folder, prompt=PROMPT, max_new_tokens=N_NEW, extra=["--kv-dtype", "f32"])
    assert len(set(alone["generated_ids"])) > 2, f"the output should vary: {alone}"
    with HttpServer(folder, ranks=2, tp=2, pp=1, extra=["--kv-dtype", "f32"],
                    log_dir=str(tmp_path)) as srv:
        client = srv.client(timeout=120)
        assert client.tokenize(PROMPT) == alone["prompt_ids"]
        got = client.generate(PROMPT, max_new_tokens=N_NEW, temperature=0.0)
        assert list(got.token_ids) == alone["generated_ids"], srv.log_tail()
        assert got.text == alone["text"]
        body = srv.complete(prompt=PROMPT, max_tokens=N_NEW, temperature=0)
        assert body["choices"][0]["text"] == alone["text"], body
        assert body["usage"]["completion_tokens"] == len(alone["generated_ids"]), body


def test_llama_perplexity_equals_reference(folder, tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    p = run_worker(["--model", folder, "--perplexity", str(path), "--output", "json",
                    "--kv-dtype", "f32"])
    ltm = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
    ids = generate_json(folder, prompt=TEXT, max_new_tokens=1)["prompt_ids"]
    assert ltm["tokens"] == len(ids) and ltm["windows"] == 1, ltm
    ref = LlamaReference(load_llama_checkpoint(folder), load_llama_config(folder))
    logp = torch.log_softmax(ref.logits(ids).double(), dim=-1)
    nll = -float(logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].sum())
    want = math.exp(nll / (len(ids) - 1))
    print(f"perplexity: ltm {ltm['perplexity']:.5f}, reference {want:.5f} over {len(ids)} tokens")
    assert ltm["tokens_scored"] == len(ids) - 1
    assert abs(ltm["perplexity"] / want - 1) < 1e-3, (ltm, want)
