"""End-to-end tests of the request path: `mpirun -n 4 ltm-worker --tp 2 --pp 2 --listen
127.0.0.1:PORT` driven through its public gRPC API (clients/python/ltm_client.py, ltm-client,
ltm-loadgen and hand-built messages), docs/architecture.md "Serving".

  - greedy outputs of 32 concurrent requests = one at a time = the one-shot command (Python and
    C++ clients); streamed text = unary text, every message whole UTF-8, the last one carries
    finish_reason and usage; stop strings cut alike everywhere;
  - every bad request gets INVALID_ARGUMENT naming the field (RESOURCE_EXHAUSTED for an oversized
    message) and the next request is served;
  - cancelled, expired and disconnected calls free their KV blocks; a 64-client load run loses
    nothing; health and reflection answer.

Environment: LTM_E2E_LOAD_SECONDS (default 45) is how long the load run starts new calls.
Models are random GPT-2 checkpoints with GPT-2's real vocabulary (std 0.2, so greedy outputs have
no near-ties); all addresses are loopback and every wait is bounded.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import threading
import time
from typing import Dict, List, Optional, Tuple

import grpc
import pytest

from ltm_testing.e2e import *  # noqa: F401,F403  (fixtures, clients, wire helpers)
from ltm_testing.e2e import GPT2_DIR
from ltm.v1 import ltm_pb2  # noqa: E402

# Run through ctest, which sets LTM_WORKER and LTM_GPT2_DIR (scripts/setup fetches the vocab):
# without them this is a broken set-up, which must fail, not skip.
assert os.environ.get("LTM_WORKER") and GPT2_DIR, "run through ctest (LTM_WORKER, LTM_GPT2_DIR)"

# ---- 1. concurrent = sequential = one-shot --------------------------------------------------

def test_concurrent_greedy_equals_sequential_and_one_shot(server, small_model):
    reqs = requests_32()
    client = server.client(timeout=120)

    t0 = time.monotonic()
    concurrent_out = run_all(lambda r: client.generate(**r), reqs, workers=32)
    t_concurrent = time.monotonic() - t0
    for i, x in enumerate(concurrent_out):
        assert not isinstance(x, Exception), f"request {i}: {x}\n{server.log_tail()}"
    t0 = time.monotonic()
    sequential = [client.generate(**r) for r in reqs]
    t_sequential = time.monotonic() - t0

    procs = [cxx_client(server.address, r, stream=(i % 2 == 0)) for i, r in enumerate(reqs)]
    try:
        cxx = [parse_cxx_client(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()

    refs = run_all(lambda r: one_shot(small_model, r), reqs, workers=2, timeout=300)
    print(f"32 requests: concurrent {t_concurrent:.2f} s, sequential {t_sequential:.2f} s")
    distinct = set()
    for i, (r, c, s, (cxx_ids, cxx_text), ref) in enumerate(
            zip(reqs, concurrent_out, sequential, cxx, refs)):
        assert not isinstance(ref, Exception), f"one-shot {i}: {ref}"
        want_ids, want_text = ref["generated_ids"], ref["text"]
        assert len(want_ids) == r["max_new_tokens"], i
        assert list(s.token_ids) == want_ids, f"request {i}: sequential != one-shot"
        assert list(c.token_ids) == want_ids, f"request {i}: concurrent != one-shot"
        assert cxx_ids == want_ids, f"request {i}: ltm-client != one-shot"
        assert s.text == want_text and c.text == want_text, f"request {i}: text differs"
        assert cxx_text == want_text, f"request {i}: ltm-client text differs"
        for resp in (c, s):
            assert resp.finish_reason == ltm_pb2.FINISH_REASON_LENGTH, i
            assert resp.usage.prompt_tokens == len(ref["prompt_ids"]), i
            assert resp.usage.completion_tokens == r["max_new_tokens"], i
        distinct.add(tuple(want_ids))
    assert len(distinct) >= 24, "the requests should not all give the same output"
    server.wait_idle()


# ---- 2. streaming ----------------------------------------------------------------------------

def check_stream(messages: List[bytes], unary: ltm_pb2.GenerateResponse, what: str) -> int:
    """Checks one stream against the unary answer; returns the number of tokens that end inside
    a UTF-8 character (their text must come with a later token)."""
    assert messages, what
    ids, text, split = [], "", 0
    request_id = None
    for k, raw in enumerate(messages):
        texts = [v for f, wt, v in wire_fields(raw) if f == 3 and wt == 2]
        for t in texts:
            assert is_utf8(t), f"{what}: message {k} text is not valid UTF-8: {t!r}"
        m = ltm_pb2.GenerateResponse.FromString(raw)
        last = k == len(messages) - 1
        if request_id is None:
            request_id = m.request_id
        assert m.request_id == request_id and request_id, what
        assert len(m.logprobs) in (0, len(m.token_ids)), what
        if not last:
            assert m.finish_reason == ltm_pb2.FINISH_REASON_UNSPECIFIED, f"{what}: message {k}"
            assert not m.HasField("usage"), f"{what}: message {k} has usage before the end"
            assert m.token_ids or m.text, f"{what}: message {k} is empty"
        ids += list(m.token_ids)
        text += m.text
        for t in m.token_ids:
            if not is_utf8(token_bytes(t)):
                split += 1
    final = ltm_pb2.GenerateResponse.FromString(messages[-1])
    assert final.finish_reason != ltm_pb2.FINISH_REASON_UNSPECIFIED, f"{what}: no finish_reason"
    assert final.finish_reason == unary.finish_reason, what
    assert final.HasField("usage"), f"{what}: the last message has no usage"
    assert final.usage.completion_tokens == len(ids), what
    assert final.usage.prompt_tokens == unary.usage.prompt_tokens, what
    assert final.HasField("timings") and final.timings.total_ms > 0, what
    assert ids == list(unary.token_ids), f"{what}: streamed ids != unary ids"
    assert text == unary.text, f"{what}: streamed text != unary text"
    return split


def test_stream_equals_unary_and_is_whole_utf8(server):
    client = server.client(timeout=120)
    channel = raw_channel(server.address)
    try:
        reqs = [dict(r, return_logprobs=True) for r in requests_32()[:8]]
        # Sampled requests (seeded, so unary and stream agree) reach the byte-level tokens that
        # split UTF-8 characters; a few stop early on EOS or a stop string.
        for k in range(8):
            reqs.append(dict(prompt=TEXTS[k], max_new_tokens=120, temperature=1.5, seed=1000 + k,
                             ignore_eos=k % 2 == 0, stop=["\n\n\n"] if k == 3 else []))

        def one(r):
            unary = client.generate(**r)
            return unary, raw_stream(channel, make_request(**r).SerializeToString())

        results = run_all(one, reqs, workers=8)
        split = 0
        for i, x in enumerate(results):
            assert not isinstance(x, Exception), f"request {i}: {x}\n{server.log_tail()}"
            split += check_stream(x[1], x[0], f"request {i}")
        print(f"tokens ending inside a UTF-8 character: {split}")
        assert split > 0, "no streamed token ended inside a character: the test covers too little"
    finally:
        channel.close()
    server.wait_idle()


def test_stop_strings_cut_stream_unary_and_one_shot_alike(server, small_model):
    """A stop string taken from the middle of a greedy output ends it there (text cut before the
    first occurrence, finish_reason STOP) in the unary call, the stream and the one-shot command."""
    client = server.client(timeout=120)
    channel = raw_channel(server.address)
    try:
        base = [r for r in requests_32() if r["max_new_tokens"] >= 48][:4]
        cases = []
        for r in base:
            full = client.generate(**r)
            text = full.text
            assert len(text) > 20, text
            stop = text[len(text) // 2:len(text) // 2 + 4]
            cases.append((r, full, [stop, "§never§"], text[:text.index(stop)]))
        for i, (r, full, stops, want_text) in enumerate(cases):
            rs = dict(r, stop=stops)
            unary = client.generate(**rs)
            messages = raw_stream(channel, make_request(**rs).SerializeToString())
            check_stream(messages, unary, f"stop case {i}")
            ref = one_shot(small_model, rs)
            print(f"stop {stops[0]!r}: {len(unary.token_ids)} of {len(full.token_ids)} tokens")
            assert unary.finish_reason == ltm_pb2.FINISH_REASON_STOP, i
            assert unary.text == want_text, i
            ids = list(unary.token_ids)
            assert ids == list(full.token_ids)[:len(ids)] and len(ids) < len(full.token_ids), i
            assert ids == ref["generated_ids"] and unary.text == ref["text"], i
            assert ref["finish_reason"].lower() == "stop", ref["finish_reason"]
    finally:
        channel.close()
    server.wait_idle()


# ---- 3. bad requests ---------------------------------------------------------------------------

def bad_requests() -> List[Tuple[str, bytes, str]]:
    """(what, serialized GenerateRequest, the field its error must name)."""
    ok = dict(max_new_tokens=4, temperature=0.0)
    long_ids = ids_of(CONTEXT + 10, 5)
    return [
        ("empty prompt", request_bytes(prompt="", **ok), "prompt"),
        ("no prompt", request_bytes(**ok), "prompt"),
        ("prompt and ids", request_bytes(prompt="Hi", prompt_token_ids=[1, 2], **ok), "prompt_token_ids"),
        ("ids longer than the context", request_bytes(prompt_token_ids=long_ids, **ok), "prompt_token_ids"),
        ("ids as long as the context", request_bytes(prompt_token_ids=long_ids[:CONTEXT], **ok),
         "prompt_token_ids"),
        ("text longer than the context", request_bytes(prompt="hello " * 400, **ok), "prompt"),
        ("max_new_tokens 0", request_bytes(prompt="Hi", max_new_tokens=0), "max_new_tokens"),
        ("max_new_tokens -3", request_bytes(prompt="Hi", max_new_tokens=-3), "max_new_tokens"),
        ("max_new_tokens past the context",
         request_bytes(prompt_token_ids=ids_of(10, 6), max_new_tokens=CONTEXT - 9), "max_new_tokens"),
        ("max_new_tokens huge", request_bytes(prompt="Hi", max_new_tokens=2**31 - 1), "max_new_tokens"),
        ("temperature -0.5", request_bytes(prompt="Hi", max_new_tokens=4, temperature=-0.5),
         "temperature"),
        ("temperature nan", request_bytes(prompt="Hi", max_new_tokens=4, temperature=float("nan")),
         "temperature"),
        ("top_p 0", request_bytes(prompt="Hi", max_new_tokens=4, top_p=0.0), "top_p"),
        ("top_p 1.5", request_bytes(prompt="Hi", max_new_tokens=4, top_p=1.5), "top_p"),
        ("top_k -1", request_bytes(prompt="Hi", max_new_tokens=4, top_k=-1), "top_k"),
        ("repetition_penalty 0", request_bytes(prompt="Hi", max_new_tokens=4, repetition_penalty=0.0),
         "repetition_penalty"),
        ("token id -1", request_bytes(prompt_token_ids=[5, -1, 7], **ok), "prompt_token_ids"),
        ("token id = vocab size", request_bytes(prompt_token_ids=[VOCAB], **ok), "prompt_token_ids"),
        ("token id 2^31-1", request_bytes(prompt_token_ids=[1, 2**31 - 1], **ok), "prompt_token_ids"),
        ("empty stop string", request_bytes(prompt="Hi", stop=["x", ""], **ok), "stop"),
        ("17 stop strings", request_bytes(prompt="Hi", stop=[f"s{i}" for i in range(17)], **ok), "stop"),
        ("request_id of 300 bytes", request_bytes(prompt="Hi", request_id="r" * 300, **ok), "request_id"),
        # Hand-built: the generated classes refuse to serialize strings that are not UTF-8.
        ("prompt with invalid UTF-8",
         wire_bytes(1, b"Hello \xff\xfe world") + wire_varint(3, 4), "prompt"),
        ("prompt with a truncated UTF-8 character",
         wire_bytes(1, "caf".encode() + b"\xc3") + wire_varint(3, 4), "prompt"),
        ("prompt with an encoded surrogate",
         wire_bytes(1, b"x\xed\xa0\x80y") + wire_varint(3, 4), "prompt"),
        ("stop with invalid UTF-8",
         wire_bytes(1, b"Hello") + wire_varint(3, 4) + wire_bytes(9, b"ok")
         + wire_bytes(9, b"\x80bad"), "stop"),
    ]


def test_bad_requests_get_invalid_argument_naming_the_field(server):
    client = server.client(timeout=60)
    channel = raw_channel(server.address)
    try:
        for what, payload, field in bad_requests():
            for method in (GENERATE, GENERATE_STREAM):
                with pytest.raises(grpc.RpcError) as e:
                    if method == GENERATE:
                        raw_call(channel, GENERATE, payload)
                    else:
                        raw_stream(channel, payload)
                code, details = e.value.code(), e.value.details()
                print(f"{what} ({method.rsplit('/', 1)[1]}): {code.name}: {details}")
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (what, method, code, details)
                assert field in details, (what, method, details)
            expect_ok_request(client, what, server)

        # Tokenize checks its input too.
        for what, payload, field in [
                ("tokenize invalid UTF-8", wire_bytes(1, b"ab\xffcd"), "text"),
                ("detokenize id out of range", wire_bytes(2, encode_varint(VOCAB) + encode_varint(3)),
                 "token_ids"),
                ("tokenize nothing", b"", "text")]:
            with pytest.raises(grpc.RpcError) as e:
                raw_call(channel, TOKENIZE, payload)
            print(f"{what}: {e.value.code().name}: {e.value.details()}")
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
            assert field in e.value.details(), what
            expect_ok_request(client, what, server)

        # Larger than --max-message-bytes: refused by gRPC before it is parsed.
        big = request_bytes(prompt="a" * (MAX_MESSAGE_BYTES + 1000), max_new_tokens=1)
        for method in (GENERATE, GENERATE_STREAM):
            with pytest.raises(grpc.RpcError) as e:
                if method == GENERATE:
                    raw_call(channel, GENERATE, big)
                else:
                    raw_stream(channel, big)
            print(f"oversized ({len(big)} bytes): {e.value.code().name}: {e.value.details()}")
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, method
            expect_ok_request(client, "an oversized message", server)
    finally:
        channel.close()
    server.wait_idle()
    # Refused without libprotobuf's per-request ERROR line ("String field ... contains invalid
    # UTF-8 data when parsing a protocol buffer"): the server checks the strings first.
    assert "invalid UTF-8 data" not in server.log(), server.log_tail()


def test_cancel_deadline_and_disconnect_free_blocks(server):
    client = server.client(timeout=120)
    before = server.wait_idle()
    long = lambda seed: dict(prompt_token_ids=ids_of(16, seed), max_new_tokens=CONTEXT - 16,  # noqa: E731
                             temperature=0.0, ignore_eos=True)
    results: Dict[str, list] = {}
    # The order matters on a fast host (kjv-small: ~0.8 ms a step of 8 rows on the Zen 5 VM, all
    # 224 tokens of a call in ~0.18 s). Calls with short deadlines that came first would make
    # deadline-aware admission refuse the long calls after them whenever it projected that they
    # could still meet their deadlines (the cancellations would not be tested), and alone they
    # could finish in time. So the streams to cancel start first; the calls with deadlines start
    # once every stream has its first token, and run beside them (16 rows a step), with 0.1 s:
    # they are refused up front or run past it. The streams are cancelled when those have ended.
    n_cancel, n_deadline = 8, 8
    state = threading.Condition()
    count = {"answered": 0, "deadlines_ended": 0}  # streams with a token (or failed); deadlines

    def bump(key):
        with state:
            count[key] += 1
            state.notify_all()

    def wait_until(key, n):
        with state:
            state.wait_for(lambda: count[key] >= n, timeout=60)

    def cancel_stream(seed):
        msgs = 0
        stream = client._stub.GenerateStream(make_request(**long(seed)), timeout=120)
        try:
            for _ in stream:
                msgs += 1
                if msgs == 1:
                    bump("answered")
                    wait_until("deadlines_ended", n_deadline)
                    stream.cancel()
                    break
        finally:
            if msgs == 0:
                bump("answered")  # refused or failed: it does not hold the others
        try:  # the call must end as cancelled
            next(stream)
        except grpc.RpcError as e:
            return e.code()
        except StopIteration:
            return "stopped"
        return "more messages"

    def deadline_call(call):
        wait_until("answered", n_cancel)
        try:
            call()
        except grpc.RpcError as e:
            return e.code()
        finally:
            bump("deadlines_ended")
        return grpc.StatusCode.OK

    def unary_deadline(seed):
        return deadline_call(lambda: client.generate(**long(seed), timeout=0.1))

    def stream_deadline(seed):
        # As for unary: with 0.4 s (and no other calls running) the small model once streamed
        # all 240 tokens in time and the call ended OK.
        return deadline_call(lambda: [_ for _ in client.generate_stream(**long(seed), timeout=0.1)])

    # ltm-client processes killed while they stream (the connection drops).
    killed = []
    for seed in (700, 701):
        p = subprocess.Popen([CLIENT, "--server", server.address, "--prompt-ids",
                              ",".join(map(str, ids_of(16, seed))), "--max-new-tokens",
                              str(CONTEXT - 16), "--temperature", "0", "--ignore-eos",
                              "--timeout-s", "60"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        killed.append(p)
    for p in killed:
        p.stdout.read(1)  # it has started streaming (or exited: then read gives b"")
        p.kill()
        p.wait(timeout=10)
    jobs = ([(cancel_stream, 400 + i) for i in range(n_cancel)]
            + [(unary_deadline, 500 + i) for i in range(n_deadline // 2)]
            + [(stream_deadline, 600 + i) for i in range(n_deadline - n_deadline // 2)])
    out = run_all(lambda job: job[0](job[1]), jobs, workers=len(jobs))
    results = {f.__name__: [o for (f2, _), o in zip(jobs, out) if f2 is f]
               for f in (cancel_stream, unary_deadline, stream_deadline)}
    print({k: [getattr(c, "name", c) for c in v] for k, v in results.items()})
    assert all(c == grpc.StatusCode.CANCELLED for c in results["cancel_stream"]), results
    # Past its deadline, or refused at once because the server projected it could not meet it
    # (deadline-aware admission, runtime/sched/admission.h).
    missed = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert all(c in missed for c in results["unary_deadline"]), results
    assert all(c in missed for c in results["stream_deadline"]), results

    t0 = time.monotonic()
    after = server.wait_idle(timeout=20)
    print(f"idle {time.monotonic() - t0:.2f} s after the last call ended: "
          f"{after.kv_blocks_free}/{after.kv_blocks_total} blocks free")
    refused = sum(c == grpc.StatusCode.RESOURCE_EXHAUSTED
                  for c in results["unary_deadline"] + results["stream_deadline"])
    submitted = len(jobs) + len(killed) - refused  # a refused request never reaches the engine
    assert after.requests_served - before.requests_served == submitted, (
        "every submitted request must be finished by the engine (cancelled ones included)")
    expect_ok_request(client, "the cancellations", server)


# ---- 7. load --------------------------------------------------------------------------------


def test_load_64_streams_loses_nothing(server):
    client = server.client(timeout=120)
    before = server.wait_idle()
    # Python streams alongside, checked against their unary answers after the run.
    py_reqs = [dict(prompt_token_ids=ids_of(12, 900 + i), max_new_tokens=24, temperature=0.0,
                    ignore_eos=True) for i in range(8)]
    py_results: List[list] = []
    stop_py = threading.Event()

    def py_load(r):
        outs = []
        for _ in range(10000):
            if stop_py.is_set():
                break
            ids = []
            for m in client.generate_stream(**r):
                ids += list(m.token_ids)
                last = m
            outs.append((ids, last.finish_reason, last.usage.completion_tokens))
        return outs

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(py_reqs))
    futures = [pool.submit(py_load, r) for r in py_reqs]
    try:
        p = subprocess.run([LOADGEN, "--server", server.address, "--concurrency", "64",
                            "--duration-s", str(LOAD_SECONDS), "--prompt-tokens", "16",
                            "--max-new-tokens", "16", "--timeout-s", "120", "--json"],
                           capture_output=True, text=True, timeout=LOAD_SECONDS + 200)
    finally:
        stop_py.set()
        py_results = [f.result(timeout=200) for f in futures]
        pool.shutdown()
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    print(json.dumps({k: report[k] for k in ("wall_s", "requests", "requests_ok", "by_code",
                                             "generated_tokens", "generated_tokens_per_s")}))
    assert report["requests"] > 64, "the load run made too few calls"
    assert report["by_code"] == {"OK": report["requests"]}, (report["by_code"], server.log_tail())
    assert report["requests_ok"] == report["requests"]
    assert report["generated_tokens"] == 16 * report["requests"], "tokens were lost"

    n_py = 0
    for r, outs in zip(py_reqs, py_results):
        want = list(client.generate(**r).token_ids)
        assert outs, "a Python stream made no call"
        for ids, reason, n in outs:
            assert ids == want and n == len(want) and reason == ltm_pb2.FINISH_REASON_LENGTH
        n_py += len(outs)
    after = server.wait_idle(timeout=30)
    served = after.requests_served - before.requests_served
    # + the unary reference calls just made
    assert served == report["requests"] + n_py + len(py_reqs), (served, report["requests"], n_py)


# ---- health and reflection ---

def test_health_serving_and_reflection_lists_generation(server):
    channel = raw_channel(server.address)
    try:
        assert health_status(channel) == 1
        assert health_status(channel, "ltm.v1.Generation") == 1
        with pytest.raises(grpc.RpcError) as e:
            health_status(channel, "no.such.Service")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        names = reflection_services(channel)
        print("reflection:", names)
        assert "ltm.v1.Generation" in names
        assert "grpc.health.v1.Health" in names
    finally:
        channel.close()
