"""The binaries' --help and --version, and what log lines look like (common/logging.h) and where
colour and load progress go (runtime/model/load_progress.h).

- every binary (ltm-worker, ltm-client, ltm-loadgen, ltm-bench, ltm-plan, launcher/ltm-mpirun) answers
  --help with its usage and exit 0, and --version with "NAME VERSION", VERSION being
  `git describe --always --dirty` of the source tree (the build configures it) - the same for all;
- logs written to a file carry no ESC byte, while the same command on a terminal (a pty, TERM set)
  gets coloured level names and the load progress line (bytes, rate, time left);
- every log line names the host and the MPI rank (r0 and r1 under mpirun -n 2), and a served
  request's line names its request id.
"""
import os
import pty
import re
import select
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ltm_testing.checkpoint import make_checkpoint  # noqa: E402
from ltm_testing.worker import run_worker  # noqa: E402

BUILD = os.environ.get("LTM_BUILD_DIR", "")
SOURCE = os.environ.get("LTM_SOURCE_DIR", "")
BINARIES = {
    "ltm-worker": os.path.join(BUILD, "launcher", "ltm-worker"),
    "ltm-client": os.path.join(BUILD, "launcher", "ltm-client"),
    "ltm-loadgen": os.path.join(BUILD, "launcher", "ltm-loadgen"),
    "ltm-bench": os.path.join(BUILD, "launcher", "ltm-bench"),
    "ltm-plan": os.path.join(BUILD, "launcher", "ltm-plan"),
    "ltm-mpirun": os.path.join(SOURCE, "launcher", "ltm-mpirun"),
}
# A log line: "[date time] [HOST rN] [level] message" (with " req ID" after the rank).
LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] \[(\S+) r(\d+)( req [^\]]+)?\] "
                      r"\[(\w+)\] ")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("polish-model"))
    make_checkpoint(d, n_layer=2, n_embd=64, n_head=4, n_positions=64, dtype="F16",
                    copy_vocab_from=os.environ.get("LTM_GPT2_DIR"))
    return d


def git_version():
    try:
        return subprocess.run(["git", "-C", SOURCE, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


@pytest.mark.parametrize("name", sorted(BINARIES))
def test_help_exits_zero_and_prints_usage(name):
    p = subprocess.run([BINARIES[name], "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert re.search(r"(?i)usage|options", p.stdout), p.stdout
    assert "--version" in p.stdout, f"{name} --help does not list --version:\n{p.stdout}"


def test_version_is_the_git_version_in_every_binary():
    versions = {}
    for name, path in BINARIES.items():
        p = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, (name, p.stdout, p.stderr)
        m = re.fullmatch(rf"{re.escape(name)} (\S+)\n", p.stdout)
        assert m, f"{name} --version printed {p.stdout!r}"
        versions[name] = m.group(1)
    assert len(set(versions.values())) == 1, versions
    expected = git_version()
    if expected is None:
        assert all(v.endswith("-nogit") for v in versions.values()), versions
    else:
        # The build takes git describe when it configures; scripts/build configures every time.
        assert versions["ltm-worker"] == expected, (
            f"built version {versions['ltm-worker']} != git describe {expected} "
            f"(a build older than the checkout? run scripts/build)")


def test_log_file_has_no_escape_bytes_and_names_host_and_rank(model, tmp_path):
    log = tmp_path / "worker.log"
    with open(log, "wb") as err:
        p = subprocess.run([BINARIES["ltm-worker"], "--model", model, "--prompt-ids", "1,2,3",
                            "--max-new-tokens", "2", "--verbose"], stdout=subprocess.PIPE,
                           stderr=err, timeout=120, env={**os.environ, "TERM": "xterm"})
    assert p.returncode == 0
    data = log.read_bytes()
    assert b"\x1b" not in data, data[:2000]
    assert b"\r" not in data, "a progress line went to a file"
    lines = [l for l in data.decode().splitlines() if l.startswith("[")]
    assert lines, data
    host = socket.gethostname()
    for line in lines:
        m = LOG_LINE.match(line)
        assert m, f"log line without host and rank: {line!r}"
        assert m.group(1) == host and m.group(2) == "0", line
    # One line per load stage, not a progress bar.
    assert sum("loaded weights:" in l for l in lines) == 1, lines
    assert any("opened checkpoint" in l for l in lines), lines


def run_on_pty(cmd, timeout=120.0):
    """Runs cmd with stderr (and stdout) on a pseudo-terminal; returns (exit code, bytes)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                         env={**os.environ, "TERM": "xterm", "NO_COLOR": ""})
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    return p.wait(timeout=30), out


def test_terminal_gets_colour_and_load_progress(model):
    rc, out = run_on_pty([BINARIES["ltm-worker"], "--model", model, "--prompt-ids", "1,2,3",
                          "--max-new-tokens", "2"])
    assert rc == 0, out
    assert b"\x1b[" in out, f"no colour on a terminal: {out[:2000]!r}"
    m = re.search(rb"\rloading weights: [\d.]+ \w?i?B / [\d.]+ \w?i?B \(\d+%\), [\d.]+ \w?i?B/s, "
                  rb"[\d.]+ s left", out)
    assert m, f"no progress line on a terminal: {out[:3000]!r}"
    assert b"loaded weights:" in out


def test_no_colour_with_no_color_set(model):
    master, slave = pty.openpty()
    p = subprocess.run([BINARIES["ltm-worker"], "--model", model, "--prompt-ids", "1,2",
                        "--max-new-tokens", "1"], stdout=subprocess.PIPE, stderr=slave,
                       timeout=120, env={**os.environ, "TERM": "xterm", "NO_COLOR": "1"})
    os.close(slave)
    out = b""
    while select.select([master], [], [], 0.2)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert p.returncode == 0
    assert b"\x1b" not in out, out[:2000]


def test_every_rank_names_itself_under_mpirun(model):
    p = run_worker(["--model", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "2",
                    "--tp", "2", "--verbose"], ranks=2)
    ranks = set()
    for line in p.stderr.splitlines():
        m = LOG_LINE.match(line)
        if m:
            assert m.group(1) == socket.gethostname(), line
            ranks.add(m.group(2))
    assert ranks == {"0", "1"}, p.stderr


def test_request_lines_carry_the_request_id(model):
    from ltm_testing.server import Server
    with Server(model, ranks=1, tp=1, pp=1, extra=["--verbose"], name="polish") as srv:
        p = subprocess.run([BINARIES["ltm-client"], "--server", srv.address, "--prompt-ids",
                            "1,2,3", "--max-new-tokens", "2", "--request-id", "polish-req-7"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert srv.terminate() == 0
        log = srv.log()
    lines = [l for l in log.splitlines() if "polish-req-7" in l]
    assert lines, log[-3000:]
    m = LOG_LINE.match(lines[0])
    assert m and m.group(3) == " req polish-req-7", lines
    assert "finished: LENGTH" in lines[0], lines
    assert "\x1b" not in log
