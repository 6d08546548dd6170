"""ltm over a real network (issue 10, items 4 and 5): hosts are network namespaces behind a bridge
(ltm_testing.netns), mpirun runs in h0 and starts h1's ranks through our rsh agent, with Open MPI
pinned to the bridge subnet.

- tp 2 inside each host and pp 2 across them give the one-rank greedy output, and the traffic
  between the stages really crossed h1's link.
- Failures while clients stream (the client on a third host, h2): a rank killed, h1's link cut,
  a partition between h0 and h1, h1 frozen (SIGSTOP of every process in it). Each must end every
  in-flight call UNAVAILABLE, end the coordinator, every surviving rank and mpirun non-zero with a
  message naming what was lost, within the bound stated in BOUNDS_S, and leave no process on any
  host. The bound is asserted with a margin of 2x as a hang guard, not as a speed test; the
  measured times are printed (docs/operations.md, "When a node fails").
"""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

from ltm_testing import netns
from ltm_testing.checkpoint import make_checkpoint

pytestmark = pytest.mark.skipif(netns.skip_reason() is not None,
                                reason=str(netns.skip_reason()))

WORKER = os.environ.get("LTM_WORKER", "")
SOURCE_DIR = os.environ.get("LTM_SOURCE_DIR", os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")))
LAUNCHER = os.path.join(SOURCE_DIR, "launcher", "ltm-mpirun")
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ltm_testing", "stream_probe.py")
GPT2_DIR = os.environ.get("LTM_GPT2_DIR", "")
assert WORKER, "run through ctest (LTM_WORKER)"

SHAPE = dict(vocab_size=997, n_positions=128, n_embd=64, n_layer=5, n_head=4)

# Failure detection settings of the failure tests.
COLLECTIVE_TIMEOUT_S = 6.0     # --collective-timeout
KEEPALIVE_S = 1.0              # --keepalive-s
# Open MPI's out-of-band (mpirun <-> orted) TCP keepalive: idle 2 s, then 3 probes 1 s apart, so a
# silent peer is declared lost ~5 s after the last traffic (the default is 300 + 9 x 20 s).
OOB_KEEPALIVE = dict(oob_tcp_keepalive_time=2, oob_tcp_keepalive_intvl=1,
                     oob_tcp_keepalive_probes=3)


def _env() -> dict:
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
             OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", LTM_MPIRUN_FLAGS="")
    return e


def _link_bytes(host: netns.Host) -> int:
    """Bytes sent plus received on the host's eth0 so far."""
    out = subprocess.run(["ip", "-n", host.netns, "-s", "-j", "link", "show", "eth0"],
                         capture_output=True, text=True, check=True).stdout
    stats = json.loads(out)[0]["stats64"]
    return stats["rx"]["bytes"] + stats["tx"]["bytes"]


# ---- item 4: one model, two hosts --------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("multihost") / "m")
    make_checkpoint(path, std=0.2, seed=21, **SHAPE)
    return path


def test_tp_inside_hosts_pp_across_them_matches_one_rank(model, tmp_path):
    args = [WORKER, "--model", model, "--prompt-ids", "5,17,300,2,9,41,8,700,12,3,66",
            "--max-new-tokens", "32", "--ignore-eos", "--output", "json", "--threads", "1"]

    def parse(stdout):
        lines = [l for l in stdout.splitlines() if l.startswith("{")]
        assert lines, stdout
        return json.loads(lines[-1])

    one = subprocess.run([*args, "--dump-logits", tmp_path / "one.npy"], capture_output=True,
                         text=True, timeout=120, env=_env())
    assert one.returncode == 0, one.stderr
    base = parse(one.stdout)
    assert len(set(base["generated_ids"])) > 4
    with netns.Hosts(2) as hosts:
        h0, h1 = hosts
        mpirun = ["mpirun", *hosts.mpirun_args(slots=2), "-n", "4"]
        # The mapping: ranks 0, 1 (stage 0's TP group) in h0, ranks 2, 3 (stage 1) in h1.
        where = h0.run([*mpirun, "sh", "-c", "echo $OMPI_COMM_WORLD_RANK $(hostname)"],
                       env=_env(), timeout=120).stdout
        assert sorted(where.split("\n")[:-1]) == ["0 h0", "1 h0", "2 h1", "3 h1"], where
        before = _link_bytes(h1)
        p = h0.run([*mpirun, *args, "--tp", "2", "--pp", "2", "--dump-logits", tmp_path / "4.npy"],
                   env=_env(), timeout=300, check=False)
        crossed = _link_bytes(h1) - before
        assert p.returncode == 0, p.stdout + p.stderr
        assert hosts.wait_empty(10) == {}
    got = parse(p.stdout)
    diff = np.abs(np.load(tmp_path / "4.npy") - np.load(tmp_path / "one.npy")).max()
    print(f"2 hosts, tp 2 x pp 2: {crossed} bytes over h1's link, max |logits - 1 rank| = {diff:.3g}, "
          f"decode {got['timings']['decode_tokens_per_s']:.0f} tokens/s")
    assert got["generated_ids"] == base["generated_ids"]
    assert diff < 1e-4
    # 32 steps of stage-0 activations (64 floats a token) and samples crossed the bridge.
    assert crossed > 32 * 64 * 4


# ---- item 5: failures ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def serve_model(tmp_path_factory):
    """Random weights with GPT-2's vocabulary, a 4096-token context: streams that run for tens of
    seconds across the hosts, so that they are surely in flight when the failure comes."""
    assert GPT2_DIR, "run through ctest (LTM_GPT2_DIR; scripts/setup fetches the vocab)"
    path = str(tmp_path_factory.mktemp("multihost") / "serve")
    make_checkpoint(path, copy_vocab_from=GPT2_DIR, std=0.2, seed=31, n_positions=4096,
                    n_embd=64, n_layer=4, n_head=4)
    return path


def _rank_pids(hosts) -> Dict[int, Tuple[str, int]]:
    """{world rank: (host name, pid)} of the ltm-worker processes in the hosts."""
    found = {}
    for h in hosts:
        for pid in h.pids():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"ltm-worker" not in f.read().split(b"\0")[0]:
                        continue
            except OSError:
                continue
            for kv in env:
                if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                    found[int(kv.split(b"=", 1)[1])] = (h.name, pid)
    return found


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


class _Lines:
    """Lines of a pipe, read by a thread; next(timeout) gives one, or None after timeout."""

    def __init__(self, pipe):
        self.q: "queue.Queue[Optional[str]]" = queue.Queue()
        self.all: List[str] = []
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe):
        for line in pipe:
            self.q.put(line)
        self.q.put(None)

    def next(self, timeout: float) -> Optional[dict]:
        try:
            line = self.q.get(timeout=max(timeout, 0.01))
        except queue.Empty:
            return None
        if line is None:
            return {"event": "eof"}
        self.all.append(line)
        return json.loads(line)


def _log_excerpt(path) -> str:
    """The group log's warnings and errors, then its last 3000 characters."""
    text = path.read_text(errors="replace")
    bad = [ln for ln in text.splitlines() if "[warning]" in ln or "[error]" in ln
           or "[critical]" in ln or "rror" in ln]
    return "\n".join(bad[:40]) + "\n--- tail ---\n" + text[-3000:]


# Each failure: what ends it, and the bound (seconds from the failure) within which every call has
# ended and every process on h0 (mpirun, the coordinator, its TP peer) has exited. With the settings
# above: a killed rank is seen by its orted at once (mpirun then SIGTERMs every rank and SIGKILLs
# it a second later: 2-5 s measured); a cut link or a partition by the out-of-band
# keepalive (2 + 3 x 1 s) or the collective watchdog (6 s), whichever comes first; a frozen host
# only by the watchdog (6 s), after which h0's ranks are gone within MPI_Abort's 5 s grace and
# mpirun, waiting for h1's frozen daemon, is killed by ltm-mpirun 10 s (+ 1 s poll) later.
BOUNDS_S = {
    "kill-rank": 8.0,
    "cut-link": 2 + 3 * 1 + 3.0,
    "partition": 2 + 3 * 1 + 3.0,
    "freeze": COLLECTIVE_TIMEOUT_S + 5 + 10 + 2.0,
}
# What the group's output must say was lost (the host, and the rank where the failure has one).
LOST_MESSAGE = {
    "kill-rank": ["process rank 2 with PID", "on node h1 exited on signal 9"],
    "cut-link": ["ORTE has lost communication with a remote daemon", "on node h1",
                 "ltm-mpirun: mpirun lost contact with a node's daemon (its exit 205"],
    "partition": ["ORTE has lost communication with a remote daemon", "on node h1",
                  "ltm-mpirun: mpirun lost contact with a node's daemon (its exit 205"],
    "freeze": ["aborting the group (peer: rank 2 on h1)",
               "ltm-mpirun: every rank on h0 has ended"],
}
# How ltm-mpirun (and so the job) exits (docs/operations.md, "What is requeued": every one is
# requeued): a
# killed rank 128 + SIGKILL; a lost node's daemon, mpirun's own 205, as 5; the watchdog's abort
# of a frozen host, and ltm-mpirun's kill of the mpirun left waiting for it, 5.
EXIT_CODE = {"kill-rank": 137, "cut-link": 5, "partition": 5, "freeze": 5}
# After the failure is undone (link up, partition healed, SIGCONT), h1 must be empty within this.
CLEANUP_BOUND_S = 5.0
MARGIN = 2  # the asserted limit is MARGIN x the bound: a hang guard, not a speed test


@pytest.mark.parametrize("failure", list(BOUNDS_S))
def test_a_failure_ends_everything_within_its_bound(serve_model, tmp_path, failure):
    bound = BOUNDS_S[failure]
    with netns.Hosts(3) as hosts:
        h0, h1, h2 = hosts
        mca = [x for k, v in OOB_KEEPALIVE.items() for x in ("--mca", k, str(v))]
        cmd = [LAUNCHER, *hosts.mpirun_args(slots=2, hosts=[h0, h1]), *mca,
               "-x", "OMP_NUM_THREADS=1", "-x", "OPENBLAS_NUM_THREADS=1", "-n", "4",
               WORKER, "--model", serve_model, "--tp", "2", "--pp", "2",
               "--listen", f"{h0.addr}:50051", "--insecure-public", "--threads", "1",
               "--kv-memory-mb", "64",
               "--collective-timeout", str(COLLECTIVE_TIMEOUT_S), "--keepalive-s", str(KEEPALIVE_S)]
        log_path = tmp_path / "group.log"
        with open(log_path, "wb") as log:
            group = h0.popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             env=_env())
        # The client runs on a third host, which no failure touches.
        probe = h2.popen([sys.executable, PROBE, "--server", "h0:50051", "--streams", "4",
                          "--max-new-tokens", "4000"], stdout=subprocess.PIPE, text=True,
                         env=_env())
        lines = _Lines(probe.stdout)
        ev = lines.next(180)
        # Messages as strings: pytest cuts a tuple's repr to a few hundred characters, which once
        # left only mpirun's trailer of a group that exited 1 while starting.
        assert ev and ev["event"] == "ready", f"{ev}\n{_log_excerpt(log_path)}"
        ev = lines.next(60)
        assert ev and ev["event"] == "streaming", f"{ev}\n{_log_excerpt(log_path)}"
        ranks = _rank_pids(hosts)
        assert sorted(ranks) == [0, 1, 2, 3] and [ranks[r][0] for r in range(4)] == \
            ["h0", "h0", "h1", "h1"], ranks
        time.sleep(1.0)
        assert group.poll() is None and probe.poll() is None, _log_excerpt(log_path)
        assert lines.q.empty(), "a stream ended before the failure: the test would cover nothing"

        t0 = time.monotonic()
        if failure == "kill-rank":
            os.kill(ranks[2][1], signal.SIGKILL)
        elif failure == "cut-link":
            h1.cut_link()
        elif failure == "partition":
            hosts.partition([h0, h2], [h1])
        elif failure == "freeze":
            assert ranks[2][1] in h1.freeze()

        calls: Dict[int, tuple] = {}
        ended: Dict[str, float] = {}   # rank / mpirun -> seconds after the failure
        clean: Dict[str, float] = {}   # host -> seconds after the failure when it had no process
        watched = {f"rank {r}": pid for r, (_, pid) in ranks.items()}

        def poll(now):
            for name, pid in watched.items():
                if name not in ended and _gone(pid):
                    ended[name] = now
            if "mpirun" not in ended and group.poll() is not None:
                ended["mpirun"] = now
            for h in (h0, h1):
                if h.name not in clean and not h.pids():
                    clean[h.name] = now
                if h.name in clean:
                    # A host with no process left has no rank left either, whatever /proc says
                    # of the pid noted for it: in one CI run (2026-12-05) both hosts were empty
                    # at 5.9 s and _gone never saw ranks 0 and 3 end, which failed the bound.
                    for r, (host, _) in ranks.items():
                        if host == h.name:
                            ended.setdefault(f"rank {r}", clean[h.name])

        guard = MARGIN * bound + 10  # how long we wait at most before calling it a hang
        while time.monotonic() - t0 < guard:
            ev = lines.next(0.05)
            now = time.monotonic() - t0
            if ev and ev["event"] == "end":
                calls[ev["stream"]] = (ev["code"], round(now, 2), ev["details"])
            poll(now)
            if len(calls) == 4 and "h0" in clean and (failure == "freeze" or "h1" in clean):
                break
        t_undo = time.monotonic() - t0
        if failure == "cut-link":
            h1.restore_link()
        elif failure == "partition":
            hosts.heal()
        elif failure == "freeze":
            h1.thaw()
        while time.monotonic() - t0 < t_undo + MARGIN * CLEANUP_BOUND_S + 10:
            poll(time.monotonic() - t0)
            if "h0" in clean and "h1" in clean:
                break
            time.sleep(0.1)
        try:  # the client on h2 exits once its calls have ended
            probe.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        left = hosts.wait_empty(10)
        code = group.poll()
        log = log_path.read_text(errors="replace")
        print(f"\n{failure} (bound {bound:.0f} s): calls ended at "
              f"{sorted(c[1] for c in calls.values())} s with {sorted({c[0] for c in calls.values()})}; "
              f"exits {dict(sorted(ended.items()))}; hosts empty at {clean} (failure undone at "
              f"{t_undo:.1f} s); ltm-mpirun exit {code}; left {left}\n"
              f"details: {sorted({c[2] for c in calls.values()})}\n--- log tail ---\n{log[-2500:]}")

    assert left == {}, "processes left behind"
    assert code == EXIT_CODE[failure], f"the group exited {code}, not {EXIT_CODE[failure]}"
    assert sorted(calls) == [0, 1, 2, 3], "a call did not end"
    assert all(c[0] == "UNAVAILABLE" for c in calls.values()), calls
    for text in LOST_MESSAGE[failure]:
        assert text in log, (text, log[-3000:])
    # Hang guards: within MARGIN x the stated bound.
    assert max(c[1] for c in calls.values()) < MARGIN * bound, calls
    assert clean.get("h0", 1e9) < MARGIN * bound, clean
    assert all(ended.get(n, 1e9) < MARGIN * bound for n in ("rank 0", "rank 1", "mpirun")), ended
    if failure == "kill-rank":
        assert clean.get("h1", 1e9) < MARGIN * bound, clean
    else:  # h1 may have to wait until it can hear again (a frozen host cannot do anything)
        assert clean.get("h1", 1e9) < t_undo + MARGIN * CLEANUP_BOUND_S, (clean, t_undo)
