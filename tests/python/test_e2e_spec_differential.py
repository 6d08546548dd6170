"""Speculative decoding against plain decoding, request by request (issue 22: greedy output
identical to non-speculative decoding; seeded sampling keeps its tokens too). The same requests go
to two servers of models/kjv-small, one with --speculative off and one with ngram, and every
answer must be the same: token ids, finish reason, text and logprobs, bit for bit.

The servers are made to expose what differs between a verify step and plain decode steps: int8
weights (a row's activations are rounded to int8 per group, so a last-bit difference upstream
becomes a different token far more often than with fp32), two LoRA adapters (their update must
give a row the same bits in a verify step as alone), --spec-tokens 20 with a draft row priced at
0.02 of a step (drafts at every batch size, and verify steps of up to 21 rows a sequence, past
the 16 from which attention's matrix form would sum otherwise). The requests are the property
search's (ltm_testing/property_cases.py, a fixed seed: greedy or seeded ones, valid, over gRPC
unary and streamed), half of them made to run to the end of the context, where kjv-small's text
loops and prompt lookup's drafts are accepted; six at a time, so steps mix sequences.

It fails on the build before the fixes it checks (main at bcf918a, 2026-12-07: 8 of the 126
answers differed, in their tokens from the 100th or 178th on, or in their logprobs' last bits:
LoRA's update on OpenBLAS, sgemv for a row and sgemm for several, and verify steps of 16 rows or
more on attention's matrix form) and passes after them (docs/architecture.md, "A verify row is a
one-row step")."""
import concurrent.futures
import os
import random

import grpc
import pytest

from ltm_testing.http import HttpServer
from ltm_testing.lora import make_adapter
from ltm_testing.property_cases import MODEL, SHAPE, TEXTS, draw_cases, long_texts

SEED = 6       # a draw that showed the differences (a scratch search's, 2026-12-07)
DRAWS = 400    # cases drawn; the valid greedy or seeded gRPC ones are sent
THREADS = 6
TIMEOUT = 120.0  # a hang detector, not a speed assertion
# The KV cache a server, MiB. 24 holds every request; LTM_SPEC_DIFF_KV_MB=2 makes the servers
# preempt and recompute sequences, which is known to change later tokens (docs/architecture.md,
# "Known limits"): a measurement, under which this test is expected to fail.
KV_MB = int(os.environ.get("LTM_SPEC_DIFF_KV_MB", "24"))


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("spec_differential"))
    lora = os.path.join(root, "lora")
    make_adapter(os.path.join(lora, "p"), SHAPE.config, r=4, alpha=8, seed=1, std=0.05)
    make_adapter(os.path.join(lora, "q"), SHAPE.config, r=2, alpha=4, seed=2, std=0.05,
                 modules=["attn.c_attn", "mlp.c_proj"])
    common = ["--kv-memory-mb", KV_MB, "--lora-dir", lora, "--lora-max-rank", 8,
              "--weight-dtype", "int8"]
    spec = ["--speculative", "ngram", "--spec-tokens", 20, "--spec-token-cost", 0.02,
            "--spec-max-batch", 64]
    off = HttpServer(MODEL, ranks=1, tp=1, pp=1, log_dir=root, name="off", extra=common)
    on = HttpServer(MODEL, ranks=1, tp=1, pp=1, log_dir=root, name="ngram", extra=common + spec)
    with off, on:
        for srv in (off, on):
            with srv.client(timeout=60) as c:
                for a in "pq":
                    assert c.load_adapter(a).loaded
        yield off, on


def deterministic_cases(off):
    """The draw's valid gRPC cases that are greedy or seeded, half run to the context's end."""
    with off.client(timeout=60) as c:
        texts = {t: len(c.tokenize(t)) for t in TEXTS + long_texts()}
    texts = {t: n for t, n in texts.items() if n < SHAPE.context - 1}
    cases = []
    for case in draw_cases(SEED, DRAWS, texts):
        if case.expect is not None or not case.grpc:
            continue
        if case.f.get("temperature") != 0.0 and case.f.get("seed") is None:
            continue  # sampled without a seed: no answer to compare
        if random.Random(case.index).random() < 0.5 and case.n_prompt is not None:
            case.f["max_new"] = max(1, SHAPE.context - case.n_prompt)
        cases.append(case)
    return cases


def answer(srv, case):
    """(token ids, finish reason, text, logprobs) or ("error", code, details)."""
    req = case.grpc_request()
    with srv.client(timeout=TIMEOUT) as c:
        try:
            if case.stream:
                ids, text, logprobs, finish = [], "", [], None
                for m in c._stub.GenerateStream(req, timeout=TIMEOUT, metadata=c._metadata):
                    ids += list(m.token_ids)
                    text += m.text
                    logprobs += list(m.logprobs)
                    if m.finish_reason:
                        finish = m.finish_reason
                return ids, finish, text, logprobs
            r = c._stub.Generate(req, timeout=TIMEOUT, metadata=c._metadata)
            return list(r.token_ids), r.finish_reason, r.text, list(r.logprobs)
        except grpc.RpcError as e:
            return ("error", e.code().name, e.details())


def test_ngram_answers_every_request_as_off_does(servers):
    off, on = servers
    cases = deterministic_cases(off)
    assert len(cases) >= 100, len(cases)
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        want = list(pool.map(lambda c: answer(off, c), cases))
        got = list(pool.map(lambda c: answer(on, c), cases))
    differ = []
    for case, a, b in zip(cases, want, got):
        assert a[0] != "error", f"off refused a valid request: {a} for {case.describe()[:300]}"
        if a != b:
            first = next((i for i in range(min(len(a[0]), len(b[0]))) if a[0][i] != b[0][i]),
                         None)
            differ.append(f"{case.describe()[:300]}\n  first differing token {first}; off "
                          f"{str(a)[:200]}\n  ngram {str(b)[:200]}")
    long = sum(len(a[0]) >= 64 for a in want)
    on.wait_http_idle()
    fams = on.metrics()
    proposed = on.sample("ltm_spec_proposed_tokens_total", fams)
    accepted = on.sample("ltm_spec_accepted_tokens_total", fams)
    preempted = [srv.sample("ltm_preemptions_total") for srv in (off, on)]
    print(f"{len(cases)} requests ({long} of 64 tokens or more): {len(differ)} differ; "
          f"{accepted:.0f} of {proposed:.0f} drafts accepted; preemptions off {preempted[0]:.0f}, "
          f"ngram {preempted[1]:.0f}")
    assert not differ, f"{len(differ)} of {len(cases)} differ:\n" + "\n".join(differ[:5])
    # Not vacuous: long answers, and many drafts verified and accepted.
    assert long >= 30, long
    assert accepted >= 1000 and proposed > accepted, (proposed, accepted)
