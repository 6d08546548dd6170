"""End-to-end tests of the server: `mpirun -n 4 ltm-worker --tp 2 --pp 2 --listen 127.0.0.1:PORT`
driven through its public gRPC API (clients/python/ltm_client.py, ltm-client, ltm-loadgen and
hand-built messages), DESIGN.md "Serving".

  - greedy outputs of 32 concurrent requests = one at a time = the one-shot command (Python and
    C++ clients); streamed text = unary text, every message whole UTF-8, the last one carries
    finish_reason and usage;
  - every bad request gets INVALID_ARGUMENT naming the field (RESOURCE_EXHAUSTED for an oversized
    message) and the next request is served; a full queue answers RESOURCE_EXHAUSTED;
  - cancelled, expired and disconnected calls free their KV blocks; a KV budget too small for the
    batch preempts and still gives every request its solo output; a 64-client load run loses
    nothing; health and reflection answer;
  - SIGTERM drains (running calls finish, or are cancelled after --drain-timeout; new calls get
    UNAVAILABLE; exit 0); a killed rank ends in-flight calls with UNAVAILABLE and the group exits
    non-zero.

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

import pytest
import torch

from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.server import Server
from ltm_testing.worker import generate_json

import grpc  # noqa: E402  (after ltm_testing.server, which puts the stubs on sys.path)
from ltm_client import make_request  # noqa: E402
from ltm.v1 import ltm_pb2  # noqa: E402

BUILD_DIR = os.environ.get("LTM_BUILD_DIR", "")
CLIENT = os.path.join(BUILD_DIR, "launcher", "ltm-client")
LOADGEN = os.path.join(BUILD_DIR, "launcher", "ltm-loadgen")
GPT2_DIR = os.environ.get("LTM_GPT2_DIR", "")
LOAD_SECONDS = float(os.environ.get("LTM_E2E_LOAD_SECONDS", "45"))

SMALL = dict(n_positions=256, n_embd=64, n_layer=3, n_head=4)
# KV per token twice the small model's per stage layer, 4 layers per stage: 1 MiB per rank holds
# 64 blocks of 8 tokens, two full contexts.
PREEMPT = dict(n_positions=256, n_embd=128, n_layer=8, n_head=4)
CONTEXT = 256
VOCAB = 50257
MAX_MESSAGE_BYTES = 64 * 1024

GENERATE = "/ltm.v1.Generation/Generate"
GENERATE_STREAM = "/ltm.v1.Generation/GenerateStream"
TOKENIZE = "/ltm.v1.Generation/Tokenize"

pytestmark = pytest.mark.skipif(not (os.environ.get("LTM_WORKER") and GPT2_DIR),
                                reason="run through ctest (LTM_WORKER, LTM_GPT2_DIR)")


# ---- protobuf wire format, for messages the generated classes refuse to build or parse ---------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32/int64: ten bytes of two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def wire_bytes(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def wire_varint(field: int, value: int) -> bytes:
    return _varint(field << 3 | 0) + _varint(value)


def wire_fields(buf: bytes) -> List[Tuple[int, int, object]]:
    """(field number, wire type, value: int or bytes) of a serialized message, top level only."""
    out, i = [], 0

    def varint():
        nonlocal i
        shift = value = 0
        while True:
            b = buf[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    while i < len(buf):
        key = varint()
        field, wt = key >> 3, key & 7
        if wt == 0:
            out.append((field, wt, varint()))
        elif wt == 2:
            n = varint()
            out.append((field, wt, buf[i:i + n]))
            i += n
        elif wt == 1:
            out.append((field, wt, buf[i:i + 8]))
            i += 8
        elif wt == 5:
            out.append((field, wt, buf[i:i + 4]))
            i += 4
        else:
            raise ValueError(f"wire type {wt} at byte {i}")
    return out


# ---- GPT-2 token bytes (to know which tokens end inside a UTF-8 character) ---------------------

def _byte_decoder() -> Dict[str, int]:
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_TOKEN_BYTES: Dict[int, bytes] = {}


def token_bytes(token: int) -> bytes:
    if not _TOKEN_BYTES:
        dec = _byte_decoder()
        with open(os.path.join(GPT2_DIR, "vocab.json"), encoding="utf-8") as f:
            for s, i in json.load(f).items():
                _TOKEN_BYTES[i] = bytes(dec[ch] for ch in s)
    return _TOKEN_BYTES[token]


def is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8", "strict")
        return True
    except UnicodeDecodeError:
        return False


# ---- fixtures and helpers ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("e2e") / "small")
    make_checkpoint(path, copy_vocab_from=GPT2_DIR, std=0.2, seed=11, **SMALL)
    return path


@pytest.fixture(scope="module")
def preempt_model(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("e2e") / "preempt")
    make_checkpoint(path, copy_vocab_from=GPT2_DIR, std=0.2, seed=12, **PREEMPT)
    return path


@pytest.fixture(scope="module")
def server(small_model, tmp_path_factory):
    """The shared server: small model, 16 MiB of KV per rank, 64 KiB message limit."""
    srv = Server(small_model, extra=["--kv-memory-mb", 16, "--max-message-bytes", MAX_MESSAGE_BYTES],
                 log_dir=str(tmp_path_factory.mktemp("logs")), name="shared")
    with srv:
        yield srv
        print(f"--- shared server log (tail) ---\n{srv.log_tail(3000)}")


def ids_of(n: int, seed: int) -> List[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


TEXTS = [
    "Hello, my name is",
    "The quick brown fox jumps over",
    "Grüße aus Köln — naïve café, ünïcödé ✓",
    "日本語のテキストと中文",
    "🙂 emoji 🚀 rocket",
    " leading space and\ttab",
    "a",
    "Line one\n\nLine two: 3.14159 + 2 = ?",
]


def requests_32() -> List[dict]:
    """32 greedy requests: text and id prompts of 1..120 tokens, 1..64 new tokens."""
    news = [1, 2, 5, 16, 24, 33, 48, 64]
    lens = [1, 3, 9, 30, 77, 120]
    out = []
    for i in range(32):
        r = dict(max_new_tokens=news[i % len(news)], temperature=0.0, ignore_eos=True)
        if i % 2 == 0:
            r["prompt"] = TEXTS[(i // 2) % len(TEXTS)] + ("" if i < 16 else f" #{i}")
        else:
            r["prompt_token_ids"] = ids_of(lens[(i // 2) % len(lens)], 100 + i)
        out.append(r)
    return out


def one_shot(model: str, r: dict) -> dict:
    extra = ["--ignore-eos", "--threads", "1"]
    for s in r.get("stop", ()):
        extra += ["--stop", s]
    kw = dict(prompt=r.get("prompt"), prompt_ids=r.get("prompt_token_ids"),
              max_new_tokens=r["max_new_tokens"], extra=extra, timeout=120)
    return generate_json(model, **kw)


def run_all(fn, items, workers: int, timeout: float = 180.0) -> list:
    """fn(item) for every item, `workers` at a time, released together by a barrier when every
    item has a thread; exceptions are returned in place of results."""
    barrier = threading.Barrier(min(workers, len(items)), timeout=60)

    def call(item):
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass
        try:
            return fn(item)
        except Exception as e:  # noqa: BLE001  (returned to the test, which asserts on it)
            return e

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(call, it) for it in items]
        done, not_done = concurrent.futures.wait(futures, timeout=timeout)
        assert not not_done, f"{len(not_done)} of {len(items)} calls still running after {timeout} s"
        return [f.result() for f in futures]


def code_of(x) -> grpc.StatusCode:
    if isinstance(x, grpc.RpcError):
        return x.code()
    if isinstance(x, Exception):
        raise x
    return grpc.StatusCode.OK


def raw_channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1),
                                                   ("grpc.max_receive_message_length", -1)])


def raw_call(channel: grpc.Channel, method: str, payload: bytes, timeout: float = 30.0):
    """A unary call with a hand-serialized request; returns the raw response bytes."""
    return channel.unary_unary(method)(payload, timeout=timeout)


def raw_stream(channel: grpc.Channel, payload: bytes, timeout: float = 60.0) -> List[bytes]:
    """GenerateStream with a hand-serialized request; returns every message's raw bytes."""
    return list(channel.unary_stream(GENERATE_STREAM)(payload, timeout=timeout))


def expect_ok_request(client, what: str, srv: Server) -> None:
    """A normal request right after a bad one is served."""
    try:
        r = client.generate("Hello", max_new_tokens=2, temperature=0, ignore_eos=True, timeout=60)
    except grpc.RpcError as e:
        raise AssertionError(f"after {what}: a normal request failed: {e.code()}: {e.details()}"
                             f"\n{srv.log_tail()}") from None
    assert len(r.token_ids) == 2 and r.finish_reason == ltm_pb2.FINISH_REASON_LENGTH, what


def cxx_client(address: str, r: dict, stream: bool) -> subprocess.Popen:
    cmd = [CLIENT, "--server", address, "--max-new-tokens", str(r["max_new_tokens"]),
           "--temperature", "0", "--ignore-eos", "--logprobs", "--timeout-s", "120"]
    if not stream:
        cmd.append("--no-stream")
    if "prompt" in r:
        cmd += ["--prompt", r["prompt"]]
    else:
        cmd += ["--prompt-ids", ",".join(map(str, r["prompt_token_ids"]))]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def parse_cxx_client(p: subprocess.Popen, timeout: float = 150.0) -> Tuple[List[int], str]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"ltm-client exited {p.returncode}: {err.decode(errors='replace')}"
    ids = [int(line.split()[1]) for line in err.decode().splitlines() if line.startswith("token ")]
    assert out.endswith(b"\n")
    return ids, out[:-1].decode("utf-8")


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

def _req(**kw) -> bytes:
    return make_request(**kw).SerializeToString()


def bad_requests() -> List[Tuple[str, bytes, str]]:
    """(what, serialized GenerateRequest, the field its error must name)."""
    ok = dict(max_new_tokens=4, temperature=0.0)
    long_ids = ids_of(CONTEXT + 10, 5)
    return [
        ("empty prompt", _req(prompt="", **ok), "prompt"),
        ("no prompt", _req(**ok), "prompt"),
        ("prompt and ids", _req(prompt="Hi", prompt_token_ids=[1, 2], **ok), "prompt_token_ids"),
        ("ids longer than the context", _req(prompt_token_ids=long_ids, **ok), "prompt_token_ids"),
        ("ids as long as the context", _req(prompt_token_ids=long_ids[:CONTEXT], **ok),
         "prompt_token_ids"),
        ("text longer than the context", _req(prompt="hello " * 400, **ok), "prompt"),
        ("max_new_tokens 0", _req(prompt="Hi", max_new_tokens=0), "max_new_tokens"),
        ("max_new_tokens -3", _req(prompt="Hi", max_new_tokens=-3), "max_new_tokens"),
        ("max_new_tokens past the context",
         _req(prompt_token_ids=ids_of(10, 6), max_new_tokens=CONTEXT - 9), "max_new_tokens"),
        ("max_new_tokens huge", _req(prompt="Hi", max_new_tokens=2**31 - 1), "max_new_tokens"),
        ("temperature -0.5", _req(prompt="Hi", max_new_tokens=4, temperature=-0.5),
         "temperature"),
        ("temperature nan", _req(prompt="Hi", max_new_tokens=4, temperature=float("nan")),
         "temperature"),
        ("top_p 0", _req(prompt="Hi", max_new_tokens=4, top_p=0.0), "top_p"),
        ("top_p 1.5", _req(prompt="Hi", max_new_tokens=4, top_p=1.5), "top_p"),
        ("top_k -1", _req(prompt="Hi", max_new_tokens=4, top_k=-1), "top_k"),
        ("repetition_penalty 0", _req(prompt="Hi", max_new_tokens=4, repetition_penalty=0.0),
         "repetition_penalty"),
        ("token id -1", _req(prompt_token_ids=[5, -1, 7], **ok), "prompt_token_ids"),
        ("token id = vocab size", _req(prompt_token_ids=[VOCAB], **ok), "prompt_token_ids"),
        ("token id 2^31-1", _req(prompt_token_ids=[1, 2**31 - 1], **ok), "prompt_token_ids"),
        ("empty stop string", _req(prompt="Hi", stop=["x", ""], **ok), "stop"),
        ("17 stop strings", _req(prompt="Hi", stop=[f"s{i}" for i in range(17)], **ok), "stop"),
        ("request_id of 300 bytes", _req(prompt="Hi", request_id="r" * 300, **ok), "request_id"),
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
                ("detokenize id out of range", wire_bytes(2, _varint(VOCAB) + _varint(3)),
                 "token_ids"),
                ("tokenize nothing", b"", "text")]:
            with pytest.raises(grpc.RpcError) as e:
                raw_call(channel, TOKENIZE, payload)
            print(f"{what}: {e.value.code().name}: {e.value.details()}")
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
            assert field in e.value.details(), what
            expect_ok_request(client, what, server)

        # Larger than --max-message-bytes: refused by gRPC before it is parsed.
        big = _req(prompt="a" * (MAX_MESSAGE_BYTES + 1000), max_new_tokens=1)
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


# ---- 4. a full queue -------------------------------------------------------------------------

def test_full_queue_answers_resource_exhausted(small_model, tmp_path):
    n = 8
    reqs = [dict(prompt_token_ids=ids_of(16, 300 + i), max_new_tokens=200, temperature=0.0,
                 ignore_eos=True) for i in range(n)]
    with Server(small_model, extra=["--kv-memory-mb", 16, "--max-queue", 1, "--max-running", 1],
                log_dir=str(tmp_path), name="queue") as srv:
        client = srv.client(timeout=120)
        results = run_all(lambda r: client.generate(**r), reqs, workers=n)
        codes = [code_of(x) for x in results]
        print("codes:", [c.name for c in codes])
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, (
            [(c.name, getattr(x, "details", lambda: "")()) for c, x in zip(codes, results)],
            srv.log_tail())
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 1
        assert codes.count(grpc.StatusCode.OK) >= 1
        for x in results:
            if isinstance(x, grpc.RpcError):
                assert "queue" in x.details(), x.details()
        srv.wait_idle()
        # What completed is right, and the queue takes requests again.
        for r, x in zip(reqs, results):
            if not isinstance(x, Exception):
                assert list(x.token_ids) == list(client.generate(**r).token_ids)
        srv.wait_idle()


# ---- 5. cancel, deadline and disconnect free the KV blocks -----------------------------------

def test_cancel_deadline_and_disconnect_free_blocks(server):
    client = server.client(timeout=120)
    before = server.wait_idle()
    long = lambda seed: dict(prompt_token_ids=ids_of(16, seed), max_new_tokens=CONTEXT - 16,  # noqa: E731
                             temperature=0.0, ignore_eos=True)
    results: Dict[str, list] = {}

    def cancel_stream(seed):
        msgs = 0
        stream = client._stub.GenerateStream(make_request(**long(seed)), timeout=120)
        for _ in stream:
            msgs += 1
            if msgs == 2:
                stream.cancel()
                break
        try:  # the call must end as cancelled
            next(stream)
        except grpc.RpcError as e:
            return e.code()
        except StopIteration:
            return "stopped"
        return "more messages"

    def unary_deadline(seed):
        try:
            client.generate(**long(seed), timeout=0.2)
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    def stream_deadline(seed):
        try:
            for _ in client.generate_stream(**long(seed), timeout=0.4):
                pass
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK

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
    jobs = ([(cancel_stream, 400 + i) for i in range(8)] + [(unary_deadline, 500 + i) for i in range(4)]
            + [(stream_deadline, 600 + i) for i in range(4)])
    out = run_all(lambda job: job[0](job[1]), jobs, workers=len(jobs))
    results = {f.__name__: [o for (f2, _), o in zip(jobs, out) if f2 is f]
               for f in (cancel_stream, unary_deadline, stream_deadline)}
    print({k: [getattr(c, "name", c) for c in v] for k, v in results.items()})
    assert all(c == grpc.StatusCode.CANCELLED for c in results["cancel_stream"]), results
    assert all(c == grpc.StatusCode.DEADLINE_EXCEEDED for c in results["unary_deadline"]), results
    assert all(c == grpc.StatusCode.DEADLINE_EXCEEDED for c in results["stream_deadline"]), results

    t0 = time.monotonic()
    after = server.wait_idle(timeout=20)
    print(f"idle {time.monotonic() - t0:.2f} s after the last call ended: "
          f"{after.kv_blocks_free}/{after.kv_blocks_total} blocks free")
    submitted = len(jobs) + len(killed)
    assert after.requests_served - before.requests_served == submitted, (
        "every submitted request must be finished by the engine (cancelled ones included)")
    expect_ok_request(client, "the cancellations", server)


# ---- 6. preemption ---------------------------------------------------------------------------

def test_preemption_keeps_every_output(preempt_model, tmp_path):
    n = 16
    reqs = [dict(prompt_token_ids=ids_of(8 + (i * 5) % 17, 800 + i), max_new_tokens=40 + (i * 13) % 61,
                 temperature=0.0, ignore_eos=True) for i in range(n)]
    with Server(preempt_model, extra=["--kv-memory-mb", 1, "--block-size", 8],
                log_dir=str(tmp_path), name="preempt") as srv:
        info = srv.model_info()
        most = max(-(-(len(r["prompt_token_ids"]) + r["max_new_tokens"]) // 8) for r in reqs)
        print(f"{info.kv_blocks_total} blocks of {info.kv_block_size}; a request needs up to "
              f"{most}; all together {sum(-(-(len(r['prompt_token_ids']) + r['max_new_tokens']) // 8) for r in reqs)}")
        assert info.kv_blocks_total <= 2 * CONTEXT // 8, "the KV budget should hold ~2 contexts"
        client = srv.client(timeout=300)
        alone = [client.generate(**r) for r in reqs]

        peak = {"running": 0}
        stop = threading.Event()

        def watch():
            with srv.client() as c:
                for _ in range(3000):
                    if stop.wait(0.02):
                        return
                    peak["running"] = max(peak["running"], c.model_info(timeout=5).running)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            together = run_all(lambda r: client.generate(**r), reqs, workers=n, timeout=300)
        finally:
            stop.set()
            watcher.join(timeout=30)
        fit = info.kv_blocks_total // most
        print(f"peak running {peak['running']}; {fit} fit at full length")
        for i, (a, t) in enumerate(zip(alone, together)):
            assert not isinstance(t, Exception), f"request {i}: {t}\n{srv.log_tail()}"
            assert list(t.token_ids) == list(a.token_ids), f"request {i}: preempted != alone"
            assert t.text == a.text, i
            assert t.finish_reason == ltm_pb2.FINISH_REASON_LENGTH, i
        assert peak["running"] > fit, "more sequences ran together than fit: preemption happened"
        srv.wait_idle()


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


# ---- health and reflection -------------------------------------------------------------------

def health_status(channel: grpc.Channel, service: str = "") -> int:
    """grpc.health.v1.Health/Check with a hand-built request: 1 SERVING, 2 NOT_SERVING."""
    raw = raw_call(channel, "/grpc.health.v1.Health/Check",
                   wire_bytes(1, service.encode()) if service else b"", timeout=10)
    fields = [v for f, wt, v in wire_fields(raw) if f == 1 and wt == 0]
    return fields[0] if fields else 0  # UNKNOWN is the default (absent) value


def reflection_services(channel: grpc.Channel) -> List[str]:
    """The services listed by server reflection (v1alpha, else v1)."""
    for version in ("v1alpha", "v1"):
        method = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
        try:
            responses = list(channel.stream_stream(method)(iter([wire_bytes(7, b"*")]),
                                                           timeout=10))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                continue
            raise
        names = []
        for raw in responses:
            for f, wt, v in wire_fields(raw):
                if f == 6 and wt == 2:  # list_services_response
                    for f2, wt2, v2 in wire_fields(v):
                        if f2 == 1 and wt2 == 2:  # service
                            names += [n.decode() for f3, _, n in wire_fields(v2) if f3 == 1]
        return names
    raise AssertionError("no server reflection service")


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


# ---- 8. SIGTERM ------------------------------------------------------------------------------

def _stream_until_first_token(srv: Server, reqs: List[dict]):
    """Starts one thread per request, streaming it; returns (threads, results, started) where
    results[i] becomes (code, ids, last message) and started[i] is set at the first token."""
    client = srv.client(timeout=120)
    results: List[Optional[tuple]] = [None] * len(reqs)
    started = [threading.Event() for _ in reqs]

    def run(i):
        ids, last = [], None
        try:
            for m in client.generate_stream(**reqs[i]):
                ids += list(m.token_ids)
                last = m
                started[i].set()
            results[i] = (grpc.StatusCode.OK, ids, last)
        except grpc.RpcError as e:
            results[i] = (e.code(), ids, e.details())
        finally:
            started[i].set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for ev in started:
        assert ev.wait(60), "a stream did not start"
    return threads, results


def _refused_while_draining(srv: Server, threads, timeout: float = 10.0) -> dict:
    """Sends new calls after the signal until one is refused (at most `timeout` seconds); returns
    what was seen: code and details of the refusal, how many of our streams still ran then, the
    health status and ModelInfo at that moment (None where the server no longer answered)."""
    seen = dict(code=None, details="", streams_running=0, health=None, info=None, accepted=0)
    channel = raw_channel(srv.address)
    try:
        deadline = time.monotonic() + timeout
        for _ in range(1000):
            if time.monotonic() > deadline:
                break
            try:
                raw_call(channel, GENERATE, _req(prompt="Hi", max_new_tokens=1), timeout=10)
                seen["accepted"] += 1
            except grpc.RpcError as e:
                seen.update(code=e.code(), details=e.details(),
                            streams_running=sum(t.is_alive() for t in threads))
                try:
                    seen["health"] = health_status(channel)
                    seen["info"] = srv.model_info(timeout=5)
                except grpc.RpcError:
                    pass
                break
            time.sleep(0.02)
    finally:
        channel.close()
    return seen


@pytest.mark.parametrize("target", ["launcher", "rank0"])
def test_sigterm_finishes_running_calls_and_exits_0(small_model, tmp_path, target):
    """SIGTERM to the launcher (launcher/ltm-mpirun, as scripts/demo, an operator or a service
    manager stopping the job does) or to the coordinator: running calls finish, new ones get
    UNAVAILABLE, exit 0."""
    n, new = 8, CONTEXT - 16
    reqs = [dict(prompt_token_ids=ids_of(16, 1100 + i), max_new_tokens=new, temperature=0.0,
                 ignore_eos=True) for i in range(n)]
    with Server(small_model, extra=["--kv-memory-mb", 16, "--drain-timeout", 120],
                log_dir=str(tmp_path), name=f"sigterm-{target}") as srv:
        client = srv.client(timeout=120)
        want = [list(x.token_ids) for x in run_all(lambda r: client.generate(**r), reqs, n)]
        threads, results = _stream_until_first_token(srv, reqs)
        pid = srv.proc.pid if target == "launcher" else srv.rank_pids()[0]
        os.kill(pid, signal.SIGTERM)
        try:
            seen = _refused_while_draining(srv, threads)
        finally:
            for t in threads:
                t.join(timeout=120)
            code = srv.wait(timeout=60)
            log = srv.log_tail()
    print(f"after SIGTERM to {target}: {seen}\nexit {code}\n{log}")
    for i, r in enumerate(results):
        assert r is not None, i
        assert r[0] == grpc.StatusCode.OK, f"stream {i}: {r[0]}: {r[2]}\n{log}"
        assert r[1] == want[i], f"stream {i}: output differs from before the signal"
    assert seen["code"] == grpc.StatusCode.UNAVAILABLE, seen
    assert seen["streams_running"] > 0, f"refused only after the running calls ended: {seen}"
    assert "draining" in seen["details"], seen
    assert seen["health"] == 2, f"health must say NOT_SERVING while draining: {seen}"
    assert seen["info"] is not None, "GetModelInfo must still answer while draining"
    assert code == 0, f"mpirun exited {code} after SIGTERM (want 0)\n{log}"


def test_drain_timeout_cancels_what_is_left(small_model, tmp_path):
    n = 16
    reqs = [dict(prompt_token_ids=ids_of(16, 1200 + i), max_new_tokens=CONTEXT - 16,
                 temperature=0.0, ignore_eos=True) for i in range(n)]
    drain = 0.5
    with Server(small_model, extra=["--kv-memory-mb", 16, "--drain-timeout", drain],
                log_dir=str(tmp_path), name="drain-timeout") as srv:
        threads, results = _stream_until_first_token(srv, reqs)
        t0 = time.monotonic()
        os.kill(srv.rank_pids()[0], signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        t_calls = time.monotonic() - t0
        code = srv.wait(timeout=60)
        t_exit = time.monotonic() - t0
        log = srv.log_tail()
    codes = [r[0] for r in results]
    print(f"calls ended {t_calls:.2f} s after SIGTERM, exit {code} after {t_exit:.2f} s; "
          f"codes {[c.name for c in codes]}\n{log}")
    assert all(r is not None for r in results)
    cut = [r for r in results if r[0] != grpc.StatusCode.OK]
    assert cut, "every stream finished before --drain-timeout: the test covers too little"
    for r in cut:
        assert r[0] in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), (r[0], r[2])
    for r in results:
        if r[0] == grpc.StatusCode.OK:
            assert len(r[1]) == CONTEXT - 16
    assert t_calls < drain + 15, "the calls outlived --drain-timeout by far"
    assert code == 0, f"exit {code} after a drain that timed out (want 0)\n{log}"


# ---- 9. a dead rank --------------------------------------------------------------------------

def test_killed_rank_ends_streams_with_unavailable(small_model, tmp_path):
    n = 16
    reqs = [dict(prompt_token_ids=ids_of(16, 1300 + i), max_new_tokens=CONTEXT - 16,
                 temperature=0.0, ignore_eos=True) for i in range(n)]
    with Server(small_model, extra=["--kv-memory-mb", 16, "--collective-timeout", 10],
                log_dir=str(tmp_path), name="kill-rank") as srv:
        pids = srv.rank_pids()
        assert sorted(pids) == [0, 1, 2, 3], pids
        threads, results = _stream_until_first_token(srv, reqs)
        t0 = time.monotonic()
        os.kill(pids[2], signal.SIGKILL)
        for t in threads:
            t.join(timeout=60)
        t_calls = time.monotonic() - t0
        assert not any(t.is_alive() for t in threads), "a stream hangs after a rank died"
        code = srv.wait(timeout=60)
        t_exit = time.monotonic() - t0
        log = srv.log_tail()
    codes = [r[0] for r in results]
    print(f"calls ended {t_calls:.2f} s after the kill, mpirun exit {code} after {t_exit:.2f} s; "
          f"codes {[c.name for c in codes]}: {[r[2] for r in results if r[0] != grpc.StatusCode.OK][:3]}"
          f"\n{log}")
    assert code is not None, "the group did not exit after a rank died"
    assert code != 0
    in_flight = [r for r in results if r[0] != grpc.StatusCode.OK]
    assert in_flight, "every stream finished before the kill: the test covers too little"
    for r in in_flight:
        assert r[0] == grpc.StatusCode.UNAVAILABLE, (r[0], r[2])
