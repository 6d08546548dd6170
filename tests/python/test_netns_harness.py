"""The namespace hosts of ltm_testing.netns (issue 10, item 4): separate hostnames that resolve
everywhere, TCP between hosts, mpirun across them through our rsh agent, a cut link and a
partition that stop traffic, and nothing left behind after close()."""
import os
import subprocess
import sys
import time

import pytest

from ltm_testing import netns

pytestmark = pytest.mark.skipif(netns.skip_reason() is not None,
                                reason=str(netns.skip_reason()))

CONNECT = ("import socket,sys\n"
           "try:\n"
           "    socket.create_connection((sys.argv[1], 5000), timeout=2).close(); print('ok')\n"
           "except OSError as e:\n"
           "    print(type(e).__name__, e.errno)\n")
SERVE = ("import socket\n"
         "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         "s.bind(('0.0.0.0', 5000)); s.listen(8); print('listening', flush=True)\n"
         "while True: s.accept()[0].close()\n")


def _names(tag=""):
    """Our namespace names (others may make and remove theirs meanwhile)."""
    return {n for n in netns._netns_list() if n.startswith(tag + "-")} if tag else \
        set(netns._netns_list())


def test_hosts_have_their_own_names_addresses_and_network():
    with netns.Hosts(3) as hosts:
        made = _names(hosts.tag)
        assert made == {h.netns for h in hosts} | {hosts.switch}
        for h in hosts:
            assert h.run(["hostname"]).stdout.strip() == h.name
            # Every host resolves every other one by name, to its bridge address.
            got = h.run(["getent", "hosts", "h0", "h1", "h2"]).stdout.split()
            assert got == ["10.77.0.1", "h0", "10.77.0.2", "h1", "10.77.0.3", "h2"]
            addrs = h.run(["ip", "-o", "-4", "addr"]).stdout
            assert f"{h.addr}/24" in addrs and addrs.count("inet ") == 2  # lo and eth0 only
        server = hosts[2].popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "listening"

        def reach(src, dst):
            return src.run([sys.executable, "-c", CONNECT, dst.name]).stdout.strip()

        assert reach(hosts[0], hosts[2]) == "ok"
        assert reach(hosts[1], hosts[2]) == "ok"
        # A partition is silence (the connection attempt times out); the same side still talks.
        hosts.partition([hosts[0]], [hosts[1], hosts[2]])
        assert reach(hosts[0], hosts[2]).startswith("TimeoutError")
        assert reach(hosts[1], hosts[2]) == "ok"
        hosts.heal()
        assert reach(hosts[0], hosts[2]) == "ok"
        # A cut link fails at once on the host itself.
        hosts[0].cut_link()
        assert reach(hosts[0], hosts[2]) == "OSError 101"  # ENETUNREACH
        hosts[0].restore_link()
        assert reach(hosts[0], hosts[2]) == "ok"
        # A frozen host answers nothing; thawed, it serves again.
        assert server.pid in hosts[2].freeze()
        time.sleep(0.2)
        assert open(f"/proc/{server.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T"
        hosts[2].thaw()
        assert reach(hosts[0], hosts[2]) == "ok"
        assert [p for p, _ in hosts[2].processes()] == [server.pid]
        # A bind mount inside one host is seen there only.
        os.makedirs(os.path.join(hosts.dir, "spool1"))
        open(os.path.join(hosts.dir, "spool1", "mine"), "w").close()
        os.makedirs(os.path.join(hosts.dir, "spool"))
        hosts[1].bind(os.path.join(hosts.dir, "spool1"), os.path.join(hosts.dir, "spool"))
        assert hosts[1].run(["ls", os.path.join(hosts.dir, "spool")]).stdout.split() == ["mine"]
        assert hosts[0].run(["ls", os.path.join(hosts.dir, "spool")]).stdout.split() == []
        assert os.listdir(os.path.join(hosts.dir, "spool")) == []
        orphan = hosts[1].run(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"])
        orphan_pid = int(orphan.stdout)
        assert orphan_pid in hosts[1].pids()
        folder = hosts.dir
    # Leaving kills every process in every host (also orphans), deletes every namespace.
    assert _names(hosts.tag) == set()
    server.wait(timeout=5)
    assert not netns._alive(orphan_pid) or \
        open(f"/proc/{orphan_pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    assert not os.path.exists(folder)


def test_mpirun_across_hosts_through_the_rsh_agent():
    with netns.Hosts(2) as hosts:
        p = hosts[0].run(["mpirun", *hosts.mpirun_args(slots=2), "-n", "4", "sh", "-c",
                          "echo $OMPI_COMM_WORLD_RANK $(hostname)"], timeout=120)
        assert sorted(p.stdout.split("\n")[:-1]) == ["0 h0", "1 h0", "2 h1", "3 h1"], p.stdout
        assert hosts.wait_empty(10) == {}


def test_cleanup_on_an_exception_and_of_a_killed_creator():
    with pytest.raises(ZeroDivisionError):
        with netns.Hosts(2) as hosts:
            hosts[1].popen(["sleep", "300"])
            1 / 0
    assert _names(hosts.tag) == set()
    # A creator killed with SIGKILL leaves its namespaces; the next Hosts() removes them.
    code = ("import os, sys, signal\nsys.path.insert(0, sys.argv[1])\nfrom ltm_testing import netns\n"
            "h = netns.Hosts(2).start(); h[1].popen(['sleep', '300'])\n"
            "print(h.tag, flush=True); os.kill(os.getpid(), signal.SIGKILL)\n")
    here = os.path.dirname(os.path.abspath(__file__))
    # (Its holders keep the pipe open, so read one line rather than wait for the end.)
    p = subprocess.Popen([sys.executable, "-c", code, here], stdout=subprocess.PIPE, text=True)
    tag = p.stdout.readline().strip()
    assert p.wait(timeout=60) == -9
    p.stdout.close()
    assert tag.startswith("ltmnet-") and _names(tag), tag
    with netns.Hosts(1) as hosts:
        assert _names(tag) == set()
    assert _names(hosts.tag) == set()
