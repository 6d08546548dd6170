"""End-to-end test of deadline-aware admission (runtime/sched/admission.h) through both front
doors of one server (`ltm-worker --listen ... --http ... --max-running 1`, one rank):

  - a request that cannot meet its deadline is refused at once: HTTP 429 with a Retry-After
    header for an impossible `timeout`, gRPC RESOURCE_EXHAUSTED for an impossible deadline;
  - /metrics counts both as ltm_requests_refused_total{reason="deadline"};
  - feasible requests (a generous timeout or deadline) still complete.

What makes the deadline impossible is work, not a guess about the machine's speed: a blocker
holds the one running slot for 1000 tokens and the refused request asks for 1000 more behind it,
so its projected finish is at least 2000 steps of the model's (GPT-2 vocabulary) LM head away,
far beyond 0.5 s on any CPU. The blocker first streams a dozen tokens, so the server's step cost
model has seen the steps it needs before it refuses anything (a cold server admits everything).
"""
from __future__ import annotations

import json
import os

import grpc
import pytest

from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.e2e import GPT2_DIR
from ltm_testing.http import HttpServer

assert os.environ.get("LTM_WORKER") and GPT2_DIR, "run through ctest (LTM_WORKER, LTM_GPT2_DIR)"

LONG = dict(n_positions=1024, n_embd=256, n_layer=4, n_head=4)
PROMPT = [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("goodput") / "long")
    make_checkpoint(path, copy_vocab_from=GPT2_DIR, std=0.2, seed=21, **LONG)
    return path


def test_impossible_deadlines_are_refused_and_feasible_requests_complete(model, tmp_path):
    srv = HttpServer(model, ranks=1, tp=1, pp=1, name="goodput", log_dir=str(tmp_path),
                     extra=["--max-running", 1, "--kv-memory-mb", 32])
    with srv:
        client = srv.client(timeout=120)
        before = srv.metrics()
        assert srv.sample("ltm_requests_refused_total", before, reason="deadline") == 0
        assert srv.sample("ltm_requests_shed_total", before, reason="deadline") == 0

        blocker = client.generate_stream(prompt_token_ids=PROMPT, max_new_tokens=1000,
                                         ignore_eos=True, temperature=0, timeout=300)
        got = 0
        for msg in blocker:  # handshake: the blocker runs and the cost model has its steps
            got += len(msg.token_ids)
            if got >= 12:
                break
        assert got >= 12, srv.log_tail()

        status, headers, body = srv.request(
            "POST", "/v1/completions",
            {"prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True, "timeout": 0.5})
        assert status == 429, f"HTTP {status}: {body[:2000]!r}\n{srv.log_tail()}"
        assert int(headers["retry-after"]) >= 1, headers
        err = json.loads(body)["error"]
        assert "deadline" in err["message"], err

        with pytest.raises(grpc.RpcError) as refused:
            client.generate(prompt_token_ids=PROMPT, max_new_tokens=1000, ignore_eos=True,
                            temperature=0, timeout=0.5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        assert "deadline" in refused.value.details(), refused.value.details()

        # A bad timeout is a 400 naming the field.
        status, _, body = srv.request("POST", "/v1/completions",
                                      {"prompt": PROMPT, "max_tokens": 2, "timeout": -1})
        assert status == 400 and json.loads(body)["error"]["param"] == "timeout", body

        blocker.close()  # cancels the call (ltm_client.generate_stream)
        srv.wait_http_idle()

        # Feasible deadlines: admitted and completed through both doors.
        out = srv.complete(prompt=PROMPT, max_tokens=4, ignore_eos=True, temperature=0,
                           timeout=120)
        assert out["usage"]["completion_tokens"] == 4
        reply = client.generate(prompt_token_ids=PROMPT, max_new_tokens=4, ignore_eos=True,
                                temperature=0, timeout=120)
        assert len(reply.token_ids) == 4

        after = srv.metrics()
        assert srv.sample("ltm_requests_refused_total", after, reason="deadline") == 2
        assert srv.sample("ltm_requests_refused_total", after, reason="queue_full") == 0
        assert srv.sample("ltm_requests_shed_total", after, reason="deadline") == 0
        assert srv.sample("ltm_requests_total", after, front_door="http",
                          outcome="queue_full") == 1
        assert srv.sample("ltm_requests_total", after, front_door="grpc",
                          outcome="queue_full") == 1
