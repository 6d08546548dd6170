"""launcher/ltm-mpirun against a stand-in mpirun (a shell script first on PATH): it passes mpirun's
exit status through at once, turns SIGTERM into SIGUSR1 for mpirun, and kills an mpirun that
stays after every rank of its own node has ended (a frozen remote node), exiting 5 with a
message; mpirun's own code for a lost node (205) becomes 5. The real thing across namespace
hosts: test_mpi_multihost.py (freeze, cut link, partition)."""
import os
import signal
import subprocess
import time

import pytest

SOURCE_DIR = os.environ.get("LTM_SOURCE_DIR", os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")))
LAUNCHER = os.path.join(SOURCE_DIR, "launcher", "ltm-mpirun")

FAKE = """#!/bin/bash
# A stand-in mpirun: MODE=exit<N> | usr1 | orphan (its children keep no pipe of ours open)
trap 'echo got-usr1; exit 7' USR1
case "$MODE" in
  exit*) sleep 0.2; exit "${MODE#exit}";;
  usr1) sleep 30 >/dev/null 2>&1 & wait $!;;
  orphan) OMPI_COMM_WORLD_RANK=0 sleep 3 >/dev/null 2>&1 &  # the node's only rank, which ends
          sleep 60 >/dev/null 2>&1 & wait $!;;   # mpirun waiting for a remote daemon
esac
"""


def _run(tmp_path, mode, grace="2", after=None):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "mpirun").write_text(FAKE)
    (bindir / "mpirun").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", LTM_MPIRUN_FLAGS="", MODE=mode,
               LTM_MPIRUN_ORPHAN_GRACE_S=grace)
    t0 = time.monotonic()
    p = subprocess.Popen([LAUNCHER, "-n", "1", "true"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if after:
            after(p)
        out, err = p.communicate(timeout=60)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the stand-in's own sleeps
        except ProcessLookupError:
            pass
    return p.returncode, out, err, time.monotonic() - t0


def test_exit_status_passes_through_without_waiting(tmp_path):
    code, _, _, seconds = _run(tmp_path, "exit3")
    assert code == 3
    assert seconds < 5  # not held for a polling period or a grace (hang guard; 0.3 s here)


@pytest.mark.parametrize("mpirun_code", [1, 2, 4, 5, 6, 137, 141, 255])
def test_every_other_status_passes_through(tmp_path, mpirun_code):
    code, _, err, _ = _run(tmp_path, f"exit{mpirun_code}")
    assert code == mpirun_code, err


def test_mpiruns_own_code_for_a_lost_node_becomes_5(tmp_path):
    # 205: ORTE lost communication with a remote daemon (a cut link, a partition, a dead node);
    # the job scripts requeue 5 (docs/operations.md, "What is requeued").
    code, _, err, _ = _run(tmp_path, "exit205")
    assert code == 5, err
    assert "mpirun lost contact with a node's daemon (its exit 205" in err, err


def test_sigterm_becomes_sigusr1_for_mpirun(tmp_path):
    def term(p):
        time.sleep(1.0)
        p.send_signal(signal.SIGTERM)

    code, out, _, _ = _run(tmp_path, "usr1", after=term)
    assert "got-usr1" in out
    assert code == 7


def test_mpirun_left_waiting_after_the_local_ranks_is_killed(tmp_path):
    code, _, err, seconds = _run(tmp_path, "orphan", grace="2")
    print(f"killed after {seconds:.1f} s: {err.strip()}")
    assert code == 5
    assert "every rank on" in err and "mpirun is still waiting after 2 s" in err
    assert seconds < 30  # the stand-in would wait 60 s


def test_no_grace_when_turned_off(tmp_path):
    def stop_later(p):
        time.sleep(8)  # past the rank's end (3 s) + the 2 s grace that is not applied
        assert p.poll() is None, "ltm-mpirun ended mpirun although LTM_MPIRUN_ORPHAN_GRACE_S=0"
        p.send_signal(signal.SIGTERM)

    code, out, _, _ = _run(tmp_path, "orphan", grace="0", after=stop_later)
    assert "got-usr1" in out and code == 7
