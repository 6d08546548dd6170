"""A real, private Slurm cluster for a test: Debian's munged, slurmctld and slurmd, run as root
without systemd or cgroups (proctrack/linuxproc, task/none, jobacct_gather/none), with their own
munge key and socket, config, state folders and ports, all under one folder of the test's.

    with SlurmCluster(tmp_path) as cluster:               # one node, named n0, on 127.0.0.1
        job = cluster.sbatch(["launcher/slurm/ltm-serve.sbatch"], env={...}, wait=True)
        assert job.exit_code == 0, cluster.job_log(job)

Several nodes: give `nodes`, one Node per host of ltm_testing.netns (network namespaces behind a
bridge, each entered with nsenter into its own network, UTS, mount and IPC namespaces, so with
its own host name; `ip netns exec` would remount /sys and hide /sys/fs/cgroup, which slurmd
reads). Each slurmd runs inside its host; slurmctld runs in the first node's host and the clients
(sbatch, scontrol) are started there too. TmpFS is per node (<dir>/tmp-<node>): Slurm's PMIx
plugin puts each step's PMIx folder there, and two slurmds of one job on one filesystem would
otherwise share it.

stop() (and leaving the with-block, also on an exception) cancels every job, ends every daemon
it started and then every process left that carries this cluster's SLURM_CONF in its
environment (slurmstepd, job steps, ranks): nothing is left running.

start_slurmd(node) restarts a node whose processes a test killed (a lost node coming back).
skip_reason() says why a cluster cannot start here (not root, a package missing), for
pytest.skip; the namespace hosts have their own (netns.skip_reason()).
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from typing import Dict, List, Optional, Sequence

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "srun")
PACKAGES = "slurmctld slurmd slurm-client munge"


def skip_reason() -> Optional[str]:
    """Why a private Slurm cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "a private Slurm cluster needs root (slurmd runs job steps as their user)"
    missing = [d for d in DAEMONS if shutil.which(d) is None
               and not os.path.exists(os.path.join("/usr/sbin", d))]
    if missing:
        return f"{', '.join(missing)} not installed (Debian packages: {PACKAGES}; scripts/setup)"
    return None


def _sbin(name: str) -> str:
    return shutil.which(name) or os.path.join("/usr/sbin", name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Node:
    name: str                     # the Slurm node name (a namespace host's host name)
    addr: str = "127.0.0.1"       # NodeAddr: where slurmctld and srun reach its slurmd
    host: object = None           # a netns.Host to run the node's slurmd in, or None (here)
    cpus: int = 2

    @staticmethod
    def of(host, cpus: int = 2) -> "Node":
        return Node(host.name, host.addr, host, cpus)

    def argv(self, args: Sequence[str]) -> List[str]:
        return self.host.argv(args) if self.host is not None else list(args)


@dataclasses.dataclass
class Job:
    id: int
    output: str                   # the job's output file (stdout and stderr)
    exit_code: Optional[int] = None


class SlurmCluster:
    def __init__(self, workdir, nodes: Optional[Sequence[Node]] = None, *,
                 extra_conf: str = "", env: Optional[Dict[str, str]] = None):
        self.dir = os.path.join(str(workdir), "slurm")
        self.nodes = list(nodes) if nodes else [Node("n0")]
        self.extra_conf = extra_conf
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_socket = os.path.join(self.dir, "munge", "munge.socket")
        self.ctld_port = free_port()
        self.slurmd_port = free_port()
        self.procs: List[subprocess.Popen] = []
        self.slurmd: Dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.env["SLURM_CONF"] = self.conf
        for k in list(self.env):  # a test run inside an allocation must not leak into this one
            if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF":
                del self.env[k]
        self.jobs: List[int] = []

    # ---- start ------------------------------------------------------------------------------

    def __enter__(self) -> "SlurmCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _popen(self, argv: List[str], log: str) -> subprocess.Popen:
        out = open(os.path.join(self.dir, log), "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        self.procs.append(p)
        return p

    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        mdir = os.path.dirname(self.munge_socket)
        os.makedirs(mdir, mode=0o755, exist_ok=True)
        os.chmod(self.dir, 0o755)
        key = os.path.join(mdir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        # munged checks that nobody else may write its folders; --force lets it accept a
        # test's /tmp ancestry (sticky, world-writable).
        self._popen([_sbin("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                     f"--key-file={key}", f"--pid-file={mdir}/munged.pid",
                     f"--log-file={mdir}/munged.log", f"--seed-file={mdir}/munged.seed"],
                    "munged.out")
        self._wait(lambda: os.path.exists(self.munge_socket), 20, "munged's socket")
        self._write_conf()
        head = self.nodes[0]
        self._popen(head.argv([_sbin("slurmctld"), "-D", "-i", "-f", self.conf]), "slurmctld.out")
        for node in self.nodes:
            spool = os.path.join(self.dir, f"spool-{node.name}")
            os.makedirs(spool, exist_ok=True)
            os.makedirs(os.path.join(self.dir, f"tmp-{node.name}"), exist_ok=True)
            self.start_slurmd(node)
        self._wait(self._all_idle, 60, "every node idle in sinfo")

    def start_slurmd(self, node: Node) -> None:
        """Starts (or, after a test killed it, restarts) the slurmd of a node. A restart is a
        rebooted node: its spool and TmpFS folders start empty (a killed step leaves its PMIx
        socket and folder there, and the next step of that job id could not make them)."""
        old = self.slurmd.get(node.name)
        if old is not None:
            assert old.poll() is not None, f"the slurmd of {node.name} still runs"
            self.procs.remove(old)
            for kind in ("spool", "tmp"):
                folder = os.path.join(self.dir, f"{kind}-{node.name}")
                shutil.rmtree(folder, ignore_errors=True)
                os.makedirs(folder)
        self.slurmd[node.name] = self._popen(
            node.argv([_sbin("slurmd"), "-D", "-f", self.conf, "-N", node.name]),
            f"slurmd-{node.name}.out")

    def _write_conf(self) -> None:
        d = self.dir
        head = self.nodes[0]
        lines = [
            "ClusterName=ltmtest",
            f"SlurmctldHost={self._head_hostname()}({head.addr})",
            "MailProg=/bin/true",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire: how long a requeued job waits before it may start again (a rerun
            # sooner is refused with "credential revoked"); 120 s by default, 10 s here.
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d}/ctld-state",
            f"SlurmdSpoolDir={d}/spool-%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd-%n.log",
            # No systemd, no cgroups: processes are tracked by parent pid.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=2",  # a requeued job starts within 2 s (not 30)
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",  # the CPUs declared below, whatever the host has
            "ReturnToService=2",
            "MpiDefault=none",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "MessageTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=600",        # keep finished jobs in scontrol show job
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"TmpFS={d}/tmp-%n",
        ]
        os.makedirs(os.path.join(d, "ctld-state"), exist_ok=True)
        for n in self.nodes:
            lines.append(f"NodeName={n.name} NodeAddr={n.addr} NodeHostname={n.name} "
                         f"CPUs={n.cpus} State=UNKNOWN")
        lines.append(f"PartitionName=ltm Nodes={','.join(n.name for n in self.nodes)} "
                     "Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES")
        if self.extra_conf:
            lines.append(self.extra_conf)
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _head_hostname(self) -> str:
        """The host name slurmctld sees (it must match SlurmctldHost)."""
        if self.nodes[0].host is None:
            return socket.gethostname().split(".")[0]
        return self.nodes[0].host.run(["hostname", "-s"]).stdout.strip()

    def _wait(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited {p.returncode} while waiting for "
                                       f"{what}\n{self.logs()}")
            if cond():
                return
            time.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}\n{self.logs()}")

    def _all_idle(self) -> bool:
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        if r.returncode != 0:
            return False
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(n.name, "").startswith(("idle", "mix", "alloc"))
                   for n in self.nodes)

    # ---- clients ----------------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60,
            env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None
            ) -> subprocess.CompletedProcess:
        """A Slurm client command, in the head node's namespace, against this cluster."""
        e = dict(self.env)
        e.update(env or {})
        p = subprocess.run(self.nodes[0].argv(argv), capture_output=True,
                           text=True, env=e, timeout=timeout, cwd=cwd)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr}")
        return p

    def sbatch(self, args: Sequence[str], *, env: Optional[Dict[str, str]] = None,
               wait: bool = False, timeout: float = 600, cwd: Optional[str] = None) -> Job:
        """Submits a batch job (output to <cluster dir>/job-%j.out unless args say otherwise);
        with wait, returns once it has ended, with its exit code."""
        out = os.path.join(self.dir, "job-%j.out")
        argv = ["sbatch", "--parsable", f"--output={out}"] + (["--wait"] if wait else []) + list(args)
        p = self.run(argv, check=False, env=env, timeout=timeout, cwd=cwd or self.dir)
        m = re.match(r"(\d+)", p.stdout.strip())
        if not m:
            raise RuntimeError(f"sbatch failed ({p.returncode}): {p.stderr}\n{self.logs()}")
        job = Job(int(m.group(1)), out.replace("%j", m.group(1)))
        self.jobs.append(job.id)
        if wait:
            # sbatch --wait returns when the job's tasks have ended, which can be while slurmctld
            # still shows it COMPLETING (its steps being cleaned up): the state the callers check
            # (FAILED, COMPLETED, ...) comes after that.
            self.wait_for(lambda: self.show_job(job.id).get("JobState") != "COMPLETING", 60,
                          f"job {job.id} to leave COMPLETING")
            job.exit_code = self.job_exit_code(job.id)
        return job

    def show_job(self, job_id: int) -> Dict[str, str]:
        """scontrol show job, as a dict (JobState, ExitCode, Restarts, ...)."""
        p = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        fields: Dict[str, str] = {}
        for tok in p.stdout.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                fields.setdefault(k, v)
        return fields

    def job_exit_code(self, job_id: int) -> Optional[int]:
        code = self.show_job(job_id).get("ExitCode")  # "rc:signal"
        if code is None:
            return None
        rc, sig = (int(x) for x in code.split(":"))
        return rc if sig == 0 else 128 + sig

    def wait_for(self, cond, timeout: float, what: str, interval: float = 0.5) -> None:
        """Waits for cond() (checked every interval) or fails naming `what`, with the logs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.logs()}")

    def job_log(self, job: Job) -> str:
        try:
            with open(job.output, errors="replace") as f:
                return f.read()
        except OSError:
            return "(no job output)"

    def job_pids(self, job_id: int) -> Dict[int, Dict[str, str]]:
        """Processes that belong to a job (by SLURM_JOB_ID in their environment), with the
        SLURM_* variables of each."""
        found = {}
        for pid, env in _environments():
            if env.get("SLURM_CONF") == self.conf and env.get("SLURM_JOB_ID") == str(job_id):
                found[pid] = {k: v for k, v in env.items() if k.startswith(("SLURM_", "SLURMD_", "OMPI_", "PMIX_RANK"))}
        return found

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for name in sorted(os.listdir(self.dir)) if os.path.isdir(self.dir) else []:
            if name.endswith((".log", ".out")):
                try:
                    with open(os.path.join(self.dir, name), errors="replace") as f:
                        text = f.read()
                except OSError:
                    continue
                parts.append(f"---- {name}\n{text[-tail:]}")
        mlog = os.path.join(os.path.dirname(self.munge_socket), "munged.log")
        if os.path.exists(mlog):
            with open(mlog, errors="replace") as f:
                parts.append(f"---- munged.log\n{f.read()[-tail:]}")
        return "\n".join(parts)

    # ---- stop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Cancels every job, ends every daemon, then any process left with this SLURM_CONF."""
        if any(p.poll() is None for p in self.procs):
            if self.jobs:
                self.run(["scancel", "--full"] + [str(j) for j in self.jobs], check=False)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and self._job_processes(include_daemons=False):
                    time.sleep(0.3)
                left = self._job_processes(include_daemons=False)
                if left:
                    print(f"slurm cluster: still running 20 s after scancel (killed below): "
                          f"{[(pid, _comm(pid)) for pid in left]}")
        for p in reversed(self.procs):  # slurmd first, munged last
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5  # then SIGKILL: a slurmd may linger on a lost peer
        for p in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        # Whatever is left (a slurmstepd, a rank the daemons lost track of) carries our config.
        for _ in range(3):
            left = self._job_processes(include_daemons=True)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)

    def _job_processes(self, include_daemons: bool) -> List[int]:
        daemons = {p.pid for p in self.procs}
        return [pid for pid, env in _environments()
                if env.get("SLURM_CONF") == self.conf and pid != os.getpid()
                and (include_daemons or pid not in daemons)
                and _comm(pid) not in ("slurmd", "slurmctld", "slurmscriptd", "munged", "nsenter")]


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _environments():
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        env = {}
        for item in raw.split(b"\0"):
            k, sep, v = item.partition(b"=")
            if sep:
                env[k.decode(errors="replace")] = v.decode(errors="replace")
        yield int(name), env
