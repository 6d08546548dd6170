"""A running ltm server for end-to-end tests: `mpirun -n 4 ltm-worker --listen 127.0.0.1:PORT`.

    from ltm_testing.server import Server
    with Server(model_dir, extra=["--max-queue", "1"]) as srv:
        srv.address                 # "127.0.0.1:PORT"
        srv.client()                # an LtmClient (clients/python/ltm_client.py) to it
        srv.model_info()            # GetModelInfo, bounded by a timeout
        srv.wait_idle()             # until every KV block is free and nothing runs or waits
        srv.rank_pids()             # {world rank: pid} of the ltm-worker processes
        srv.terminate()             # SIGTERM to mpirun, returns its exit code (bounded wait)
        srv.log()                   # what mpirun and the ranks printed (stdout + stderr)

Start: a free loopback port is picked (bind to 127.0.0.1:0, then released; a start that loses
the port to another process is retried with a new one, at most 3 times), mpirun is started in its
own session (so its whole process group can be killed), and GetModelInfo is polled until it
answers, at most `start_timeout` seconds. Stop (on leaving the `with` block, or stop()): SIGTERM to
mpirun, which forwards it to the ranks, then SIGKILL of the process group after `stop_timeout`
seconds. Everything the group prints goes to a log file; failures quote its tail.

Needs the environment ctest sets: LTM_WORKER, LTM_MPIEXEC, LTM_PYTHON_STUBS, LTM_SOURCE_DIR.
Only loopback addresses are used; every wait is bounded in count and time.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence

WORKER = os.environ.get("LTM_WORKER", "")
MPIEXEC = os.environ.get("LTM_MPIEXEC", "") or "mpirun"
LAUNCHER = os.path.join(os.environ.get("LTM_SOURCE_DIR", ""), "launcher", "ltm-mpirun")
SOURCE_DIR = os.environ.get(
    "LTM_SOURCE_DIR",
    os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")))

_client_dir = os.path.join(SOURCE_DIR, "clients", "python")
if _client_dir not in sys.path:
    sys.path.insert(0, _client_dir)

import grpc  # noqa: E402
import ltm_client  # noqa: E402  (also puts $LTM_PYTHON_STUBS on sys.path)
from ltm_client import LtmClient  # noqa: E402


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerError(AssertionError):
    pass


class Server:
    """`mpirun -n ranks ltm-worker --model MODEL --tp TP --pp PP --listen 127.0.0.1:PORT
    --threads 1 EXTRA...`, started on __enter__ (or start()) and stopped on __exit__."""

    def __init__(self, model: str, *, ranks: int = 4, tp: int = 2, pp: int = 2,
                 extra: Sequence[str] = (), start_timeout: float = 120.0,
                 stop_timeout: float = 30.0, log_dir: Optional[str] = None,
                 name: str = "server", client_options: Optional[dict] = None):
        assert WORKER, "LTM_WORKER is not set (run the tests through ctest)"
        self.model = model
        self.ranks = ranks
        self.tp = tp
        self.pp = pp
        self.extra = [str(x) for x in extra]
        # LtmClient keyword arguments (tls, root_certificates, api_key, ...) for a server started
        # with TLS or an API key: used by the readiness poll and every client made here.
        self.client_options = dict(client_options or {})
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="ltm-e2e-")
        self.name = name
        self.port = 0
        self.address = ""
        self.proc: Optional[subprocess.Popen] = None
        self.log_path = ""
        self.returncode: Optional[int] = None
        self._log_file = None
        self._clients: List[LtmClient] = []

    # ---- lifecycle ----------------------------------------------------------------------------

    def command(self, port: int) -> List[str]:
        # launcher/ltm-mpirun: mpirun whose SIGTERM drains the server (see that script).
        return [LAUNCHER, "-n", str(self.ranks), "--oversubscribe", "--allow-run-as-root",
                "--mca", "btl", "self,vader,tcp", WORKER, "--model", self.model,
                "--tp", str(self.tp), "--pp", str(self.pp), "--listen", f"127.0.0.1:{port}",
                "--threads", "1", *self.extra]

    def start(self) -> "Server":
        last_error = ""
        for attempt in range(3):
            port = free_port()
            self.log_path = os.path.join(self.log_dir, f"{self.name}-{port}.log")
            self._log_file = open(self.log_path, "wb")
            env = dict(os.environ)
            env.setdefault("OMP_NUM_THREADS", "1")
            env.setdefault("OPENBLAS_NUM_THREADS", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            env["LTM_MPIRUN_FLAGS"] = ""  # the command line above has the flags
            self.proc = subprocess.Popen(self.command(port), stdin=subprocess.DEVNULL,
                                         stdout=self._log_file, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
            self.port = port
            self.address = f"127.0.0.1:{port}"
            self.returncode = None
            if self._wait_ready():
                return self
            # It exited (or never answered): kill what is left, and retry only a lost port.
            self.kill()
            last_error = self.log_tail()
            if "cannot listen" not in last_error and "cannot serve" not in last_error:
                break
        raise ServerError(f"{self.name}: the server did not start: {' '.join(self.command(self.port))}"
                          f"\n--- log ---\n{last_error}")

    def _wait_ready(self) -> bool:
        # A fresh channel per try: a channel that failed to connect backs off (1 s, 1.6 s, ...)
        # before it tries again, which would delay the start by seconds.
        deadline = time.monotonic() + self.start_timeout
        for _ in range(int(self.start_timeout / 0.2) + 1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            c = LtmClient(self.address, **self.client_options)
            try:
                c.model_info(timeout=1.0)
                return True
            except grpc.RpcError:
                time.sleep(0.2)
            finally:
                c.close()
        return False

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float) -> Optional[int]:
        """The exit code of mpirun, or None if it is still running after `timeout` seconds."""
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.returncode

    def signal(self, sig: int) -> None:
        if self.running():
            os.kill(self.proc.pid, sig)

    def terminate(self, timeout: Optional[float] = None) -> Optional[int]:
        """SIGTERM to mpirun (as a job scheduler would), then waits up to `timeout` seconds (default
        stop_timeout) for it to exit; returns its exit code, or None if it did not exit (it is
        then still running: call kill())."""
        self.signal(signal.SIGTERM)
        return self.wait(self.stop_timeout if timeout is None else timeout)

    def kill(self) -> None:
        """SIGKILL to the whole process group (mpirun and the ranks), bounded wait."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.returncode = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> Optional[int]:
        """SIGTERM, then SIGKILL of the process group after stop_timeout. Returns mpirun's exit
        code from the SIGTERM, or None if it had to be killed."""
        for c in self._clients:
            c.close()
        self._clients.clear()
        code = None
        if self.proc is not None:
            if self.proc.poll() is not None:
                code = self.proc.returncode
            else:
                code = self.terminate()
            # Ranks that outlived mpirun (should not happen) go with the group.
            self.kill()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return code

    # ---- inspection ---------------------------------------------------------------------------

    def log(self) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def log_tail(self, n: int = 6000) -> str:
        return self.log()[-n:]

    def client(self, timeout: Optional[float] = 60.0) -> LtmClient:
        """An LtmClient whose calls have `timeout` seconds each unless told otherwise; closed when
        the server stops."""
        c = LtmClient(self.address, timeout=timeout, **self.client_options)
        self._clients.append(c)
        return c

    def model_info(self, timeout: float = 10.0):
        with LtmClient(self.address, **self.client_options) as c:
            return c.model_info(timeout=timeout)

    @contextmanager
    def peak_running(self, period_s: float = 0.02) -> Iterator[Dict[str, int]]:
        """While the block runs, GetModelInfo every period_s on a thread of its own; yields a dict
        whose "running" is the largest running-sequence count seen (read it after the block)."""
        peak = {"running": 0}
        stop = threading.Event()

        def watch():
            with self.client() as c:
                while not stop.wait(period_s):
                    peak["running"] = max(peak["running"], c.model_info(timeout=5).running)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            yield peak
        finally:
            stop.set()
            watcher.join(timeout=30)

    def wait_idle(self, timeout: float = 20.0, poll_s: float = 0.1):
        """Polls GetModelInfo until every KV block is free and nothing runs or waits; returns the
        last ModelInfo. Raises ServerError with the last numbers (and the log) after `timeout`."""
        deadline = time.monotonic() + timeout
        info = None
        with LtmClient(self.address, **self.client_options) as c:
            for _ in range(int(timeout / poll_s) + 1):
                info = c.model_info(timeout=5.0)
                if (info.kv_blocks_free == info.kv_blocks_total and info.running == 0
                        and info.queue_depth == 0):
                    return info
                if time.monotonic() > deadline:
                    break
                time.sleep(poll_s)
        raise ServerError(f"{self.name}: not idle after {timeout} s: kv_blocks_free "
                          f"{info.kv_blocks_free} of {info.kv_blocks_total}, running "
                          f"{info.running}, queue_depth {info.queue_depth}\n--- log ---\n"
                          f"{self.log_tail()}")

    def rank_pids(self, timeout: float = 10.0) -> Dict[int, int]:
        """{world rank: pid} of the ltm-worker processes (children of mpirun), read from their
        OMPI_COMM_WORLD_RANK."""
        deadline = time.monotonic() + timeout
        found: Dict[int, int] = {}
        for _ in range(int(timeout / 0.1) + 1):
            found = {}
            # The ranks are children of mpirun, itself the child of the ltm-mpirun wrapper.
            out = ""
            for parent in subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                                         text=True).stdout.split():
                out += subprocess.run(["pgrep", "-P", parent], capture_output=True,
                                      text=True).stdout
            for pid in (int(p) for p in out.split()):
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = f.read().split(b"\0")
                except OSError:
                    continue
                for kv in env:
                    if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                        found[int(kv.split(b"=", 1)[1])] = pid
            if len(found) == self.ranks or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        return found
