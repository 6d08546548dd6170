"""Shared pieces of the end-to-end server tests (test_e2e_server.py, test_e2e_lifecycle.py):
models, the shared server fixture, clients, hand-built protobuf wire messages and waits."""
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

from .checkpoint import make_checkpoint
from .server import Server
from .worker import generate_json

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
# The small model with a context of 2048: streams of SMALL_LONG_CONTEXT - 16 tokens, ~8x as
# long as the small model's, for tests that act while calls run (a signal, a killed rank) and
# must not find them already finished on a slow or loaded machine. With 256-token streams a
# SIGTERM test beside two busy loops found every stream's tokens made ~0.1 s after the signal,
# before its probe's second call (2026-12-07).
SMALL_LONG = dict(SMALL, n_positions=2048)
SMALL_LONG_CONTEXT = 2048
VOCAB = 50257
MAX_MESSAGE_BYTES = 64 * 1024

GENERATE = "/ltm.v1.Generation/Generate"
GENERATE_STREAM = "/ltm.v1.Generation/GenerateStream"
TOKENIZE = "/ltm.v1.Generation/Tokenize"



# ---- protobuf wire format, for messages the generated classes refuse to build or parse ---------

def encode_varint(n: int) -> bytes:
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


def request_bytes(**kw) -> bytes:
    """A GenerateRequest built by the Python client's make_request, serialized."""
    return make_request(**kw).SerializeToString()


def wire_bytes(field: int, data: bytes) -> bytes:
    return encode_varint(field << 3 | 2) + encode_varint(len(data)) + data


def wire_varint(field: int, value: int) -> bytes:
    return encode_varint(field << 3 | 0) + encode_varint(value)


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
def small_long_model(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("e2e") / "small_long")
    make_checkpoint(path, copy_vocab_from=GPT2_DIR, std=0.2, seed=13, **SMALL_LONG)
    return path


@pytest.fixture(scope="module")
def preempt_model(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("e2e") / "preempt")
    make_checkpoint(path, copy_vocab_from=GPT2_DIR, std=0.2, seed=12, **PREEMPT)
    return path


@pytest.fixture(scope="module")
def server(small_model, tmp_path_factory):
    """The shared server: small model, 16 MiB of KV per rank, 64 KiB message limit, reflection."""
    srv = Server(small_model, extra=["--kv-memory-mb", 16, "--max-message-bytes", MAX_MESSAGE_BYTES,
                                     "--reflection"],
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


# Servers that need TLS or an API key (test_e2e_tls.py): address -> {"ca": PEM path,
# "api_key_file": path, "cert"/"key": client certificate}. raw_channel and cxx_client use them.
TRANSPORTS: Dict[str, dict] = {}


def _read(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def raw_channel(address: str) -> grpc.Channel:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    t = TRANSPORTS.get(address)
    if not t:
        return grpc.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(root_certificates=_read(t.get("ca")),
                                         private_key=_read(t.get("key")),
                                         certificate_chain=_read(t.get("cert")))
    if t.get("api_key_file"):
        key = _read(t["api_key_file"]).decode().strip()
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(key))
    return grpc.secure_channel(address, creds, options=options)


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
    t = TRANSPORTS.get(address, {})
    for flag, name in (("--tls-ca", "ca"), ("--tls-cert", "cert"), ("--tls-key", "key"),
                       ("--api-key-file", "api_key_file")):
        if t.get(name):
            cmd += [flag, t[name]]
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


# ---- 8. SIGTERM ------------------------------------------------------------------------------

def stream_until_first_token(srv: Server, reqs: List[dict]):
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


def refused_while_draining(srv: Server, threads, timeout: float = 10.0) -> dict:
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
                raw_call(channel, GENERATE, request_bytes(prompt="Hi", max_new_tokens=1), timeout=10)
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
