"""Automatic prefix caching (issue 21) on real ranks: a tp 2 x pp 2 server with the cache on and
a KV cache small enough to preempt gives every request the greedy tokens and top-5 logprobs
(within 2e-4) of a one-rank server with --prefix-cache off, for concurrent requests whose
prompts share prefixes of different lengths (inside a block, on a block boundary, the whole
prompt, a cached prompt again), on the base model and two LoRA adapters; echo + logprobs
requests compute (and score) their whole prompt; /metrics counts the hit tokens, the
preemptions happened, and GetModelInfo shows cached blocks once the server is idle.
Loopback only, every wait bounded."""
from __future__ import annotations

import os

import pytest
import torch

from ltm_testing.checkpoint import load_config, make_checkpoint
from ltm_testing.e2e import GPT2_DIR, PREEMPT, VOCAB, run_all
from ltm_testing.http import HttpServer
from ltm_testing.lora import make_adapter

assert os.environ.get("LTM_WORKER") and GPT2_DIR, "run through ctest (LTM_WORKER, LTM_GPT2_DIR)"

BLOCK = 8
# New tokens a request. With 16 the wave's eight requests need ~42 blocks at their ends (counted
# from their prompts, whole shared blocks once) against the 36 the server has, so they preempted
# only where all ran at once; beside four busy loops the client sent them so far apart that five
# waves in a row did not (2026-12-07). With 48 each holds 4 more blocks for 3x as long.
NEW = 48
TOL = 2e-4


def ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


SHARED = ids(45, 1)  # five whole blocks of 8 and five tokens


def requests():
    """(prompt ids, adapter or None) for one concurrent wave."""
    out = [
        (SHARED[:5] + ids(6, 2), None),     # shares part of the first block only
        (SHARED[:16] + ids(5, 3), None),    # shares two whole blocks, ends on the boundary
        (SHARED + ids(7, 4), None),         # shares the whole prefix
        (SHARED, None),                     # is the prefix
        (SHARED[:40], None),                # five whole blocks: its last one is computed
        (SHARED + ids(7, 4), "a"),          # the same prompts on two adapters
        (SHARED + ids(7, 4), "b"),
        (SHARED[:16] + ids(5, 3), "a"),
    ]
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix")
    model = str(root / "m")
    make_checkpoint(model, copy_vocab_from=GPT2_DIR, std=0.2, seed=31, **PREEMPT)
    config = load_config(model)
    make_adapter(str(root / "a"), config, r=4, alpha=8, seed=1)
    make_adapter(str(root / "b"), config, r=4, alpha=8, seed=2, modules=["attn.c_attn", "mlp.c_fc"])
    lora = ["--lora", f"a={root / 'a'}", "--lora", f"b={root / 'b'}"]
    return dict(root=root, model=model, lora=lora)


def complete(srv, prompt, adapter, **kw):
    body = dict(prompt=prompt, max_tokens=NEW, temperature=0, logprobs=5, **kw)
    if adapter:
        body["model"] = adapter
    return srv.complete(**body)["choices"][0]


def wave(srv, reqs, **kw):
    out = run_all(lambda r: complete(srv, r[0], r[1], **kw), reqs, workers=len(reqs))
    for x in out:
        assert not isinstance(x, Exception), f"{x!r}\n{srv.log_tail()}"
    return out


def same(got, want, what):
    g, w = got["logprobs"], want["logprobs"]
    assert g["tokens"] == w["tokens"], what
    for i, (a, b) in enumerate(zip(g["token_logprobs"], w["token_logprobs"])):
        if a is None or b is None:
            assert a is None and b is None, (what, i)
            continue
        assert abs(a - b) < TOL, (what, i, a, b)
    for i, (a, b) in enumerate(zip(g["top_logprobs"], w["top_logprobs"])):
        if a is None or b is None:
            continue
        common = set(a) & set(b)
        assert len(common) >= 4, (what, i, a, b)  # near-ties may swap the fifth
        for t in common:
            assert abs(a[t] - b[t]) < TOL, (what, i, t, a[t], b[t])


def test_cached_prefixes_give_the_uncached_one_rank_answers(setup, tmp_path):
    reqs = requests()
    scored = [(SHARED, None), (SHARED[:16] + ids(5, 3), "a")]
    with HttpServer(setup["model"], ranks=1, tp=1, pp=1, name="off",
                    extra=["--prefix-cache", "off", "--block-size", BLOCK, *setup["lora"]],
                    log_dir=str(tmp_path)) as off:
        want = wave(off, reqs)
        want_scored = wave(off, scored, echo=True)
        fams = off.metrics()
        assert off.sample("ltm_prefix_cache_query_tokens_total", fams) == 0
    # 1 MiB of KV per rank: 64 blocks of 8 tokens, fewer than the wave's requests grow to.
    with HttpServer(setup["model"], ranks=4, tp=2, pp=2, name="on",
                    extra=["--kv-memory-mb", 1, "--block-size", BLOCK, *setup["lora"]],
                    log_dir=str(tmp_path)) as on:
        info = on.model_info()
        assert info.kv_blocks_total * BLOCK < sum(len(p) + NEW for p, _ in reqs), info
        # The prefix alone first (on the base model and on "a"), then the wave, twice: the
        # second wave also finds the first one's prompts and answers cached.
        warm = wave(on, [(SHARED + ids(3, 9), None), (SHARED + ids(3, 9), "a")])
        assert all(len(w["logprobs"]["tokens"]) == NEW for w in warm)
        # The wave preempts only where enough of its requests run at once: on a loaded machine the
        # client's threads can send them far apart (seen beside busy loops, 2026-12-07). So up to
        # five waves, until one preempted.
        hits = []
        for round in range(5):
            got = wave(on, reqs)
            for i, (g, w) in enumerate(zip(got, want)):
                same(g, w, (round, i, reqs[i][1], len(reqs[i][0])))
            hits.append(on.sample("ltm_prefix_cache_hit_tokens_total"))
            if round >= 1 and on.sample("ltm_preemptions_total") > 0:
                break
        got_scored = wave(on, scored, echo=True)
        for i, (g, w) in enumerate(zip(got_scored, want_scored)):
            assert len(g["logprobs"]["tokens"]) == len(scored[i][0]) + NEW
            same(g, w, ("echo", i))
        fams = on.wait_http_idle()
        query = on.sample("ltm_prefix_cache_query_tokens_total", fams)
        preempted = on.sample("ltm_preemptions_total", fams)
        cached = on.sample("ltm_kv_blocks_cached", fams)
        info = on.model_info()
        print(f"hit tokens after each wave {hits}, query tokens {query}, preemptions {preempted},"
              f" cached blocks {cached} of {info.kv_blocks_total}")
        assert preempted > 0, f"none of {len(hits)} waves preempted: the KV cache is too large"
        # The first wave reuses at least the whole blocks of the prefix the warm-up cached for
        # the requests that share them (if not evicted by the preemptions in between).
        assert hits[0] >= BLOCK and hits[1] > hits[0], hits
        assert query > hits[1]
        assert info.kv_blocks_cached == cached > 0
        assert info.kv_blocks_free == info.kv_blocks_total
