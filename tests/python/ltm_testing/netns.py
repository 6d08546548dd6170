"""Several "hosts" on this one machine: network namespaces joined by a bridge, for multi-host tests.

    from ltm_testing import netns

    reason = netns.skip_reason()          # None, or why hosts cannot be made here (not root, ...)
    with netns.Hosts(2) as hosts:         # h0, h1 on 10.77.0.0/24
        h0, h1 = hosts
        h0.run(["hostname"])              # -> CompletedProcess, stdout "h0\\n"
        p = h1.popen(["ltm-worker", ...], stdout=subprocess.PIPE)
        mpirun = ["mpirun", *hosts.mpirun_args(slots=2), "-n", "4", ...]
        h0.popen(mpirun)                  # mpirun runs in h0, starts h1's ranks via hosts.rsh
        h1.cut_link(); h1.restore_link()  # ip link set down/up on h1's own interface
        hosts.partition([h0], [h1]); hosts.heal()
        h1.freeze(); h1.thaw()            # SIGSTOP/SIGCONT of every process in h1
        h1.processes()                    # [(pid, cmdline)] still running in h1
        hosts.wait_empty(10)              # {} once no host has a process left (bounded wait)
        h1.bind("/tmp/x/h1-spool", "/var/spool/slurmd")   # a mount seen only inside h1
    # on leaving (also on an exception, Ctrl-C or SIGTERM): every process in every host is
    # killed, the namespaces are deleted and the run folder removed.

Layout of one Hosts(n):
  - a switch namespace `<tag>-sw` holding a bridge `br0` (no address);
  - per host i a network namespace `<tag>-h<i>` whose `eth0` is one end of a veth pair, the other
    end (`p<i>`) being a port of br0 in the switch namespace; eth0 has 10.77.0.<i+1>/24 and
    IPv6 is off. Nothing is created in the caller's own network namespace, so the subnet cannot
    clash with the machine's networks or with another Hosts() running at the same time.
  - per host a holder process (`sleep infinity`) in that network namespace and in its own UTS
    (hostname h<i>), mount and IPC namespaces. Its mount namespace has /etc/hosts naming every
    host (so h0, h1 resolve inside any host) and a private /dev/shm. Commands enter a host with
    `nsenter -t <holder> -n -u -m -i` (host.argv()), with TMPDIR set to a folder of that host's
    own, so that Open MPI's session folders of two hosts never meet.
  - `hosts.rsh`: an executable that Open MPI uses as its plm_rsh_agent (`rsh HOST COMMAND...`,
    like ssh): it enters HOST (a name or an address) and runs COMMAND with /bin/sh.

The PID namespace is shared with the caller: host.processes() finds a host's processes by their
network namespace (what `ip netns pids` does), also ones that were orphaned or daemonised.
`<tag>` is `ltmnet-<pid of the creator>-<n>`; Hosts() first removes what an earlier creator left
behind when it was killed (its pid no longer runs), so even SIGKILL leaves nothing for long.
"""
import atexit
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

SUBNET_PREFIX = "10.77.0"
SUBNET = SUBNET_PREFIX + ".0/24"
_TAG_RE = re.compile(r"^ltmnet-(\d+)-(\d+)-(sw|h\d+)$")
_counter = itertools.count()
_live: Dict[str, "Hosts"] = {}
_skip: Optional[Tuple[Optional[str]]] = None
_lock = threading.Lock()


def _sh(args: Sequence[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} exited {p.returncode}: "
                           f"{p.stderr.strip() or p.stdout.strip()}")
    return p


def _netns_list() -> List[str]:
    p = _sh(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _netns_pids(ns: str) -> List[int]:
    p = _sh(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_netns_processes(ns: str, deadline_s: float = 10.0) -> None:
    """SIGKILL every process in network namespace ns (stopped ones too) until none is left."""
    end = time.monotonic() + deadline_s
    while True:
        pids = _netns_pids(ns)
        if not pids or time.monotonic() > end:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _remove_netns(ns: str) -> None:
    _kill_netns_processes(ns)
    _sh(["ip", "netns", "delete", ns], check=False)


def remove_stale() -> List[str]:
    """Deletes the namespaces (and their processes) of Hosts() whose creator no longer runs."""
    removed = []
    for ns in _netns_list():
        m = _TAG_RE.match(ns)
        if m and not _alive(int(m.group(1))):
            _remove_netns(ns)
            removed.append(ns)
    for d in os.listdir(tempfile.gettempdir()):
        m = re.match(r"^ltmnet-(\d+)-\d+$", d)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(tempfile.gettempdir(), d), ignore_errors=True)
    return removed


def skip_reason() -> Optional[str]:
    """None when Hosts() can be made here; otherwise why not (for pytest.skip)."""
    global _skip
    with _lock:
        if _skip is None:
            _skip = (_probe(),)
        return _skip[0]


def _probe() -> Optional[str]:
    if os.geteuid() != 0:
        return "network namespaces need root (run the tests as root, as CI does)"
    for tool in ("ip", "nsenter", "unshare", "mount", "hostname"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup installs iproute2 and util-linux)"
    ns = f"ltmnet-{os.getpid()}-probe"
    try:
        _sh(["ip", "netns", "add", ns])
    except RuntimeError as e:
        return f"cannot make a network namespace here: {e}"
    try:
        _sh(["ip", "-n", ns, "link", "add", "br0", "type", "bridge"])
        _sh(["ip", "-n", ns, "link", "add", "va", "type", "veth", "peer", "name", "vb"])
        _sh(["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "--ipc",
             "sh", "-c", "hostname probe && mount -t tmpfs tmpfs /dev/shm"])
    except RuntimeError as e:
        return f"cannot make bridges, veth pairs or UTS/mount namespaces here: {e}"
    finally:
        _remove_netns(ns)
    return None


class Host:
    """One host: a network namespace with its own hostname, /etc/hosts, /dev/shm and TMPDIR."""

    def __init__(self, hosts: "Hosts", index: int):
        self.hosts = hosts
        self.index = index
        self.name = f"h{index}"                      # its hostname inside the namespace
        self.addr = f"{SUBNET_PREFIX}.{index + 1}"   # eth0's address
        self.netns = f"{hosts.tag}-h{index}"         # `ip netns` name (/run/netns/<netns>)
        self.port = f"p{index}"                      # its bridge port in the switch namespace
        self.tmpdir = os.path.join(hosts.dir, self.name, "tmp")
        self.holder: Optional[subprocess.Popen] = None

    def __repr__(self):
        return f"Host({self.name}, {self.addr}, netns={self.netns})"

    # -- running commands ------------------------------------------------------------------

    def argv(self, args: Sequence, cwd: Optional[str] = None) -> List[str]:
        """The command line that runs args inside this host (cwd: working folder, default ours)."""
        assert self.holder is not None, "host not started"
        return ["nsenter", "-t", str(self.holder.pid), "-n", "-u", "-m", "-i",
                f"--wd={cwd or os.getcwd()}", "--", "env", f"TMPDIR={self.tmpdir}",
                *map(str, args)]

    def popen(self, args: Sequence, cwd: Optional[str] = None, **kw) -> subprocess.Popen:
        """subprocess.Popen of args inside this host (the Popen's pid is the command's own)."""
        kw.setdefault("start_new_session", True)
        return subprocess.Popen(self.argv(args, cwd), **kw)

    def run(self, args: Sequence, cwd: Optional[str] = None, check: bool = True,
            timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        """subprocess.run of args inside this host, text output captured."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        p = subprocess.run(self.argv(args, cwd), timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise AssertionError(f"[{self.name}] {' '.join(map(str, args))} exited "
                                 f"{p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def bind(self, src: str, dst: str) -> None:
        """Bind-mounts src on dst inside this host only (e.g. a per-host spool folder on a path
        every host's daemon expects); undone when the host goes."""
        assert self.holder is not None, "host not started"
        _sh(["nsenter", "-t", str(self.holder.pid), "-m", "mount", "--bind", src, dst])

    # -- what runs there -------------------------------------------------------------------

    def pids(self) -> List[int]:
        """Every process in this host's network namespace but the holder."""
        holder = self.holder.pid if self.holder else -1
        return [p for p in _netns_pids(self.netns) if p != holder]

    def processes(self) -> List[Tuple[int, str]]:
        """(pid, command line) of every process still in this host (zombies included)."""
        out = []
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            out.append((pid, f"[{state}] {cmd}"))
        return out

    def signal_all(self, sig: int) -> List[int]:
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def freeze(self) -> List[int]:
        """SIGSTOP to every process in the host (as if the machine hung); returns their pids."""
        return self.signal_all(signal.SIGSTOP)

    def thaw(self) -> List[int]:
        return self.signal_all(signal.SIGCONT)

    def kill_all(self) -> None:
        """SIGKILL to every process in the host (not the holder) until none is left."""
        end = time.monotonic() + 10
        while self.pids() and time.monotonic() < end:
            self.signal_all(signal.SIGKILL)
            time.sleep(0.05)

    # -- the network -----------------------------------------------------------------------

    def cut_link(self) -> None:
        """`ip link set eth0 down` inside the host: it loses its only link (its own sends fail at
        once; the others hear nothing more from it)."""
        _sh(["ip", "-n", self.netns, "link", "set", "eth0", "down"])

    def restore_link(self) -> None:
        _sh(["ip", "-n", self.netns, "link", "set", "eth0", "up"])


class Hosts:
    """n hosts h0..h<n-1> on 10.77.0.0/24 behind one bridge. A context manager (see module doc).

    Raises RuntimeError when they cannot be made; check skip_reason() first in tests."""

    def __init__(self, n: int = 2):
        assert 1 <= n <= 200
        self.n = n
        self.tag = f"ltmnet-{os.getpid()}-{next(_counter)}"
        self.switch = f"{self.tag}-sw"
        self.dir = os.path.join(tempfile.gettempdir(), self.tag)
        self.hosts = [Host(self, i) for i in range(n)]
        self.subnet = SUBNET
        self.rsh = os.path.join(self.dir, "rsh")
        self.hosts_file = os.path.join(self.dir, "etc-hosts")
        self._bridges = ["br0"]
        self._old_term = None
        self._up = False

    # sequence protocol: hosts[0], for h in hosts, len(hosts)
    def __getitem__(self, i) -> Host:
        return self.hosts[i]

    def __iter__(self):
        return iter(self.hosts)

    def __len__(self):
        return self.n

    def by_name(self, name: str) -> Host:
        for h in self.hosts:
            if name in (h.name, h.addr):
                return h
        raise KeyError(name)

    # -- life cycle ------------------------------------------------------------------------

    def __enter__(self) -> "Hosts":
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def start(self) -> "Hosts":
        reason = skip_reason()
        if reason:
            raise RuntimeError(reason)
        remove_stale()
        _live[self.tag] = self
        self._up = True
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (a test runner's timeout) would end Python without running `finally`.
            self._old_term = signal.getsignal(signal.SIGTERM)
            if self._old_term in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, _raise_on_term)
            else:
                self._old_term = None
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        os.makedirs(self.dir)
        with open(self.hosts_file, "w") as f:
            f.write("127.0.0.1\tlocalhost\n")
            for h in self.hosts:
                f.write(f"{h.addr}\t{h.name}\n")
        sw = self.switch
        _sh(["ip", "netns", "add", sw])
        _sh(["ip", "-n", sw, "link", "set", "lo", "up"])
        _sh(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _sh(["ip", "-n", sw, "link", "set", "br0", "up"])
        for h in self.hosts:
            os.makedirs(h.tmpdir)
            _sh(["ip", "netns", "add", h.netns])
            _sh(["ip", "-n", sw, "link", "add", h.port, "type", "veth",
                 "peer", "name", "eth0", "netns", h.netns])
            _sh(["ip", "-n", sw, "link", "set", h.port, "master", "br0", "up"])
            for key in ("all", "default", "lo"):
                _sh(["nsenter", f"--net=/run/netns/{h.netns}", "sysctl", "-qw",
                     f"net.ipv6.conf.{key}.disable_ipv6=1"], check=False)
            _sh(["ip", "-n", h.netns, "link", "set", "lo", "up"])
            _sh(["ip", "-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", "eth0"])
            _sh(["ip", "-n", h.netns, "link", "set", "eth0", "up"])
            script = (f"hostname {h.name} && mount --bind {shlex.quote(self.hosts_file)} /etc/hosts"
                      " && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && echo ready"
                      " && exec sleep infinity")
            h.holder = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{h.netns}", "unshare", "--uts", "--mount",
                 "--ipc", "--propagation", "private", "sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True)
            line = h.holder.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"host {h.name} did not start: {h.holder.stderr.read()}")
        self._write_rsh()

    def _write_rsh(self) -> None:
        cases = []
        for h in self.hosts:
            cases.append(f"  {h.name}|{h.addr}) pid={h.holder.pid}; tmp={shlex.quote(h.tmpdir)} ;;")
        script = "\n".join([
            "#!/bin/sh",
            "# Open MPI's plm_rsh_agent for the namespace hosts of " + self.tag + ":",
            "#   rsh [ssh-style options] HOST COMMAND...  runs COMMAND with /bin/sh inside HOST.",
            'while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done',
            'host=$1; shift',
            'case "$host" in',
            *cases,
            '  *) echo "rsh: no host $host in ' + self.tag + '" >&2; exit 255;;',
            'esac',
            'exec nsenter -t "$pid" -n -u -m -i --wd=/ -- env TMPDIR="$tmp" /bin/sh -c "$*"',
            ""])
        with open(self.rsh, "w") as f:
            f.write(script)
        os.chmod(self.rsh, 0o755)

    def close(self) -> None:
        """Kills every process in every host, deletes the namespaces and the run folder."""
        if not self._up:
            return
        self._up = False
        try:
            for h in self.hosts:
                _kill_netns_processes(h.netns)
                if h.holder is not None:
                    try:
                        h.holder.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                    for s in (h.holder.stdout, h.holder.stderr):
                        if s:
                            s.close()
                _sh(["ip", "netns", "delete", h.netns], check=False)
            _sh(["ip", "netns", "delete", self.switch], check=False)
            shutil.rmtree(self.dir, ignore_errors=True)
        finally:
            _live.pop(self.tag, None)
            if self._old_term is not None:
                signal.signal(signal.SIGTERM, self._old_term)
                self._old_term = None

    # -- Open MPI across the hosts -------------------------------------------------------------

    def hostfile(self, slots: int = 1, hosts: Optional[Iterable[Host]] = None) -> str:
        """Writes an Open MPI hostfile naming the hosts (by hostname) with `slots` each."""
        hosts = list(hosts) if hosts is not None else self.hosts
        path = os.path.join(self.dir, f"hostfile-{'-'.join(h.name for h in hosts)}-{slots}")
        with open(path, "w") as f:
            for h in hosts:
                f.write(f"{h.name} slots={slots}\n")
        return path

    def mca(self) -> List[str]:
        """--mca flags that keep Open MPI on the bridge and polite to the 2-core machine."""
        pairs = [
            ("plm_rsh_agent", self.rsh),         # start remote orteds by entering the namespace
            ("plm_rsh_no_tree_spawn", "1"),      # only mpirun's host knows the rsh agent's table
            ("btl", "self,vader,tcp"),
            ("btl_tcp_if_include", self.subnet),
            ("oob_tcp_if_include", self.subnet),
            ("mpi_yield_when_idle", "1"),        # busy-polling ranks would starve the veth links
        ]
        return [x for k, v in pairs for x in ("--mca", k, v)]

    def mpirun_args(self, slots: int = 1, hosts: Optional[Iterable[Host]] = None) -> List[str]:
        """mpirun flags for a job over these hosts: hostfile, MCA pinning, root, no binding."""
        flags = ["--hostfile", self.hostfile(slots, hosts), *self.mca(), "--bind-to", "none"]
        if os.geteuid() == 0:
            flags.append("--allow-run-as-root")
        return flags

    # -- partitions --------------------------------------------------------------------------

    def partition(self, *groups: Sequence[Host]) -> None:
        """Splits the switch: each group gets a bridge of its own, so hosts in different groups
        no longer hear each other, while every link stays up (silence, not an error). Hosts named
        in no group stay on the first bridge with the first group."""
        self.heal()
        for gi, group in enumerate(groups[1:], start=1):
            br = f"br{gi}"
            _sh(["ip", "-n", self.switch, "link", "add", br, "type", "bridge"])
            _sh(["ip", "-n", self.switch, "link", "set", br, "up"])
            self._bridges.append(br)
            for h in group:
                _sh(["ip", "-n", self.switch, "link", "set", h.port, "master", br])

    def heal(self) -> None:
        """Undoes partition(): every host back on br0."""
        for h in self.hosts:
            _sh(["ip", "-n", self.switch, "link", "set", h.port, "master", "br0"], check=False)
        for br in self._bridges[1:]:
            _sh(["ip", "-n", self.switch, "link", "delete", br], check=False)
        self._bridges = ["br0"]

    def leftovers(self) -> Dict[str, List[Tuple[int, str]]]:
        """{host name: processes} for every host that still has a process running."""
        return {h.name: procs for h in self.hosts if (procs := h.processes())}

    def wait_empty(self, timeout: float = 10.0) -> Dict[str, List[Tuple[int, str]]]:
        """Polls until no host has a process (a process that has just exited may stay a zombie
        for a moment, until its parent or init reaps it), at most `timeout` seconds; returns
        leftovers() at the end: {} when every host is empty."""
        end = time.monotonic() + timeout
        while True:
            left = self.leftovers()
            if not left or time.monotonic() > end:
                return left
            time.sleep(0.1)


def _raise_on_term(signum, frame):
    raise SystemExit(128 + signum)


@atexit.register
def _close_all():
    for hosts in list(_live.values()):
        hosts.close()
