"""End-to-end tests of the server's lifecycle and limits (see test_e2e_server.py for the request
path): a full queue answers RESOURCE_EXHAUSTED; a KV budget too small for the batch preempts and
still gives every request its solo output; SIGTERM drains (running calls finish, or are cut after
--drain-timeout; new calls get UNAVAILABLE; exit 0); a killed rank ends in-flight calls with
UNAVAILABLE and the group exits non-zero; keep-alives hold an idle group together, and a rank 0
that stops sending (SIGSTOP) is noticed by the others, which end the group. All addresses are loopback and every wait is bounded.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
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

        with srv.peak_running() as peak:
            together = run_all(lambda r: client.generate(**r), reqs, workers=n, timeout=300)
        fit = info.kv_blocks_total // most
        print(f"peak running {peak['running']}; {fit} fit at full length")
        for i, (a, t) in enumerate(zip(alone, together)):
            assert not isinstance(t, Exception), f"request {i}: {t}\n{srv.log_tail()}"
            assert list(t.token_ids) == list(a.token_ids), f"request {i}: preempted != alone"
            assert t.text == a.text, i
            assert t.finish_reason == ltm_pb2.FINISH_REASON_LENGTH, i
        assert peak["running"] > fit, "more sequences ran together than fit: preemption happened"
        srv.wait_idle()


# ---- 8. SIGTERM and 9. a killed rank ---

@pytest.mark.parametrize("target", ["launcher", "rank0"])
def test_sigterm_finishes_running_calls_and_exits_0(small_long_model, tmp_path, target):
    """SIGTERM to the launcher (launcher/ltm-mpirun, as scripts/demo, an operator or a service
    manager stopping the job does) or to the coordinator: running calls finish, new ones get
    UNAVAILABLE, exit 0. Streams of 2032 tokens, so that they still run when the probe calls."""
    n, new = 8, SMALL_LONG_CONTEXT - 16
    reqs = [dict(prompt_token_ids=ids_of(16, 1100 + i), max_new_tokens=new, temperature=0.0,
                 ignore_eos=True) for i in range(n)]
    with Server(small_long_model, extra=["--kv-memory-mb", 16, "--drain-timeout", 120],
                log_dir=str(tmp_path), name=f"sigterm-{target}") as srv:
        client = srv.client(timeout=120)
        want = [list(x.token_ids) for x in run_all(lambda r: client.generate(**r), reqs, n)]
        threads, results = stream_until_first_token(srv, reqs)
        pid = srv.proc.pid if target == "launcher" else srv.rank_pids()[0]
        os.kill(pid, signal.SIGTERM)
        try:
            seen = refused_while_draining(srv, threads)
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


def test_drain_timeout_cancels_what_is_left(small_long_model, tmp_path):
    n = 16
    new = SMALL_LONG_CONTEXT - 16
    reqs = [dict(prompt_token_ids=ids_of(16, 1200 + i), max_new_tokens=new, temperature=0.0,
                 ignore_eos=True) for i in range(n)]
    drain = 0.5
    with Server(small_long_model, extra=["--kv-memory-mb", 32, "--drain-timeout", drain],
                log_dir=str(tmp_path), name="drain-timeout") as srv:
        threads, results = stream_until_first_token(srv, reqs)
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
            assert len(r[1]) == new
    assert t_calls < drain + 15, "the calls outlived --drain-timeout by far"
    assert code == 0, f"exit {code} after a drain that timed out (want 0)\n{log}"


# ---- 9. a dead rank --------------------------------------------------------------------------

def test_killed_rank_ends_streams_with_unavailable(small_long_model, tmp_path):
    n = 16
    new = SMALL_LONG_CONTEXT - 16
    reqs = [dict(prompt_token_ids=ids_of(16, 1300 + i), max_new_tokens=new, temperature=0.0,
                 ignore_eos=True) for i in range(n)]
    with Server(small_long_model, extra=["--kv-memory-mb", 32, "--collective-timeout", 10],
                log_dir=str(tmp_path), name="kill-rank") as srv:
        pids = srv.rank_pids()
        assert sorted(pids) == [0, 1, 2, 3], pids
        threads, results = stream_until_first_token(srv, reqs)
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


# ---- 10. a stuck coordinator -----------------------------------------------------------------

def test_keepalives_hold_an_idle_group_and_a_stuck_rank_0_ends_it(small_model, tmp_path):
    # The other ranks give rank 0 --collective-timeout + 3 x --keepalive-s = 3.5 s of silence.
    req = dict(prompt_token_ids=ids_of(8, 1500), max_new_tokens=8, temperature=0.0,
               ignore_eos=True)
    with Server(small_model, ranks=2, tp=1, pp=2,
                extra=["--collective-timeout", 2, "--keepalive-s", 0.5],
                log_dir=str(tmp_path), name="stuck-rank0") as srv:
        client = srv.client(timeout=30)
        before = list(client.generate(**req).token_ids)
        time.sleep(8)  # idle for over twice the idle timeout: only the keep-alives hold the group
        assert srv.running(), f"an idle server went down:\n{srv.log_tail()}"
        after = list(client.generate(**req).token_ids)
        assert after == before and len(after) == 8
        pids = srv.rank_pids()
        t0 = time.monotonic()
        os.kill(pids[0], signal.SIGSTOP)  # alive, holding its sockets, sending nothing
        code = srv.wait(timeout=60)
        if code is None:
            os.kill(pids[0], signal.SIGCONT)  # let the server's stop() take it down
        t_exit = time.monotonic() - t0
        log = srv.log_tail()
    print(f"group exit {code} {t_exit:.2f} s after rank 0 stopped\n{log}")
    assert code is not None, "the group did not notice a stuck rank 0"
    assert code != 0
    # Rank 1's watchdog: "ltm: <host>:1: collective recv_wait(src=0,tag=105) on group world ...
    # did not finish within 3.5 s; ..."
    assert "recv_wait(src=0" in log and "did not finish within 3.5 s" in log, log
