"""Bounded memory under hostile requests (issue 12): 32 clients at once send the amplification
request (a 4 MiB GenerateRequest of 1.4 M one-byte stop strings) and its variants (many stop
strings within the message limit, huge prompts, huge id lists), while a well-behaved client keeps
generating. Every bad request gets INVALID_ARGUMENT or RESOURCE_EXHAUSTED, the normal requests
succeed, and the peak RSS of rank 0 (VmHWM) grows by less than RSS_BOUND_MB over its value
before the attack. Before the fix one such request cost ~185 MB of heap in the parse alone, so 32
in flight would have cost several GB.

Also: the automatic message limit (no --max-message-bytes) still admits the largest valid request.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time

import grpc
import pytest

from ltm_testing.e2e import (GENERATE, GENERATE_STREAM, GPT2_DIR, SMALL, encode_varint,  # noqa: F401
                             raw_call, raw_channel, raw_stream, wire_bytes, wire_varint)
from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.server import Server
from ltm_client import make_request

CLIENTS = 32
ROUNDS = 3
RSS_BOUND_MB = 96
CONTEXT = SMALL["n_positions"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("hardening") / "small")
    make_checkpoint(path, copy_vocab_from=GPT2_DIR, std=0.2, seed=21, **SMALL)
    return path


def vm_hwm_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmHWM for pid {pid}")


def hostile_requests():
    """(what, payload, the codes it may get)."""
    ie, re_ = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED
    amp = wire_bytes(1, b"Hi") + b"".join(wire_bytes(9, b"x") for _ in range(1_400_000))
    assert len(amp) > 4_000_000
    # Within the automatic message limit (~54 KB here): as many one-byte stops as fit.
    many_stops = wire_bytes(1, b"Hi") + b"".join(wire_bytes(9, b"x") for _ in range(15_000))
    huge_prompt = wire_bytes(1, b"a" * (4 << 20))
    long_prompt = wire_bytes(1, b"hello " * 8_000)  # 48 KB: fits the message, not the context
    packed_ids = b"".join(encode_varint(7) for _ in range(2_000_000))
    huge_ids = wire_bytes(2, packed_ids)
    many_ids = wire_bytes(2, b"".join(encode_varint(7) for _ in range(20_000)))
    unpacked_ids = b"".join(wire_varint(2, 7) for _ in range(15_000))
    return [("1.4 M one-byte stop strings (4 MiB)", amp, {re_}),
            ("15 000 stop strings", many_stops, {ie}),
            ("4 MiB prompt", huge_prompt, {re_}),
            ("48 KB prompt", long_prompt, {ie}),
            ("2 M packed ids", huge_ids, {re_}),
            ("20 000 packed ids", many_ids, {ie}),
            ("15 000 unpacked ids", unpacked_ids, {ie})]


def test_hostile_requests_from_32_clients_keep_memory_bounded(model, tmp_path):
    with Server(model, ranks=1, tp=1, pp=1, extra=["--kv-memory-mb", 16],
                log_dir=str(tmp_path), name="hardening") as srv:
        pid = srv.rank_pids()[0]
        client = srv.client(timeout=60)
        for _ in range(3):  # warm up: allocator pools, gRPC buffers, the step thread's arrays
            r = client.generate("Hello, my name is", max_new_tokens=8, temperature=0, ignore_eos=True)
            assert len(r.token_ids) == 8
        baseline = vm_hwm_kb(pid)

        requests = hostile_requests()
        stop = threading.Event()
        normal = {"ok": 0, "errors": []}

        def well_behaved():
            c = srv.client(timeout=60)
            while not stop.is_set():
                try:
                    r = c.generate("The quick brown fox", max_new_tokens=4, temperature=0,
                                   ignore_eos=True)
                    assert len(r.token_ids) == 4
                    normal["ok"] += 1
                except grpc.RpcError as e:
                    normal["errors"].append(f"{e.code().name}: {e.details()}")

        def attacker(i: int):
            channel = raw_channel(srv.address)
            codes = []
            try:
                for k in range(ROUNDS):
                    what, payload, allowed = requests[(i + k) % len(requests)]
                    method = GENERATE if (i + k) % 2 == 0 else GENERATE_STREAM
                    try:
                        if method == GENERATE:
                            raw_call(channel, GENERATE, payload, timeout=60)
                        else:
                            raw_stream(channel, payload, timeout=60)
                        codes.append((what, grpc.StatusCode.OK, ""))
                    except grpc.RpcError as e:
                        codes.append((what, e.code(), e.details()))
                    assert codes[-1][1] in allowed, codes[-1]
            finally:
                channel.close()
            return codes

        bg = threading.Thread(target=well_behaved)
        bg.start()
        t0 = time.monotonic()
        try:
            with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                results = list(pool.map(attacker, range(CLIENTS)))
        finally:
            stop.set()
            bg.join(timeout=120)
        took = time.monotonic() - t0
        peak = vm_hwm_kb(pid)
        seen = {}
        for codes in results:
            for what, code, details in codes:
                seen.setdefault(what, set()).add(f"{code.name}: {details[:90]}")
        for what, answers in sorted(seen.items()):
            print(f"{what}: {sorted(answers)}")
        grown_mb = (peak - baseline) / 1024
        print(f"rank 0 peak RSS: {baseline / 1024:.1f} MB before, {peak / 1024:.1f} MB after "
              f"{CLIENTS} x {ROUNDS} hostile requests in {took:.1f} s (+{grown_mb:.1f} MB, bound "
              f"{RSS_BOUND_MB} MB); {normal['ok']} normal requests served meanwhile")
        assert not normal["errors"], normal["errors"][:5]
        assert normal["ok"] >= 1
        assert len(seen) == len(requests)
        assert grown_mb < RSS_BOUND_MB, srv.log_tail()
        # Still serving.
        r = client.generate("Hello", max_new_tokens=2, temperature=0, ignore_eos=True)
        assert len(r.token_ids) == 2


def test_automatic_message_limit_admits_the_largest_valid_request(model, tmp_path):
    with Server(model, ranks=1, tp=1, pp=1, extra=["--kv-memory-mb", 16],
                log_dir=str(tmp_path), name="limit") as srv:
        client = srv.client(timeout=120)
        r = client.generate(prompt_token_ids=[262] * (CONTEXT - 1), max_new_tokens=1,
                            stop=["z" * 1024] * 16, request_id="r" * 256, temperature=0,
                            ignore_eos=True)
        assert len(r.token_ids) == 1
        # A text prompt of the full context: 255 tokens of " the" (4 bytes each) fits.
        r = client.generate(prompt=" the" * (CONTEXT - 1), max_new_tokens=1, temperature=0,
                            ignore_eos=True)
        assert r.usage.prompt_tokens == CONTEXT - 1
        assert "requests up to" in srv.log()


def test_max_message_bytes_is_validated(model, tmp_path):
    for bad in ["100", str(1 << 31), "-5"]:
        srv = Server(model, ranks=1, tp=1, pp=1, extra=["--max-message-bytes", bad],
                     log_dir=str(tmp_path), name=f"bad-{bad}", start_timeout=30)
        with pytest.raises(AssertionError):
            srv.start()
        srv.stop()
        # The whole log: the usage printed after the message outgrows the error's log tail.
        assert "--max-message-bytes must be 0 (automatic) or in [1024, 1073741824]" in srv.log()
