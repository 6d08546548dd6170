"""launcher/slurm/ltm-serve.sbatch against a real Slurm (a private cluster per test module:
ltm_testing/slurm.py): a one-node job serves a model and answers a gRPC request at the address
the job publishes; a bad flag and a missing model end the job with their own codes and are not
requeued; a killed rank ends the run non-zero and the job is requeued; and a two-node job (two
network-namespace hosts, ltm_testing/netns.py) with tp 2 inside each node and pp 2 across them
answers a client on another host, launched with srun --mpi=pmix and with mpirun; a lost node
(every process of it killed) ends the run non-zero, the job is requeued and serves again once the
node is back; and the benchmark job writes its JSON next to its output.

Needs root and Debian's slurmctld, slurmd, slurm-client and munge (scripts/setup); skipped with
the reason otherwise. The answers are checked against a one-rank `ltm-worker` run of the same
greedy request.
"""
import json
import os
import re
import signal
import time

import pytest

from ltm_testing import netns
from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.slurm import Node, SlurmCluster, free_port, skip_reason
from ltm_testing.worker import WORKER, generate_json

from ltm_testing.server import LtmClient  # (puts clients/python and the stubs on sys.path)

SOURCE_DIR = os.environ.get("LTM_SOURCE_DIR", "")
CLIENT = os.path.join(os.environ.get("LTM_BUILD_DIR", ""), "launcher", "ltm-client")
SCRIPT = os.path.join(SOURCE_DIR, "launcher", "slurm", "ltm-serve.sbatch")
BENCH_SCRIPT = os.path.join(SOURCE_DIR, "launcher", "slurm", "ltm-bench.sbatch")
GPT2_DIR = os.environ.get("LTM_GPT2_DIR", "")
SHAPE = dict(n_positions=128, n_embd=64, n_layer=4, n_head=4)
PROMPT = [464, 2068, 7586, 21831]
NEW = 8
START_S = 180  # a job's queueing, srun start-up and model load, on a busy 2-core machine

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("slurm-model") / "m")
    make_checkpoint(path, copy_vocab_from=GPT2_DIR, std=0.2, seed=31, **SHAPE)
    return path


@pytest.fixture(scope="module")
def expected(model):
    out = generate_json(model, prompt_ids=PROMPT, max_new_tokens=NEW, extra=["--ignore-eos"])
    return out["generated_ids"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with SlurmCluster(tmp_path_factory.mktemp("slurm"),
                      env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}) as c:
        yield c


# Open MPI on the bridge only, and polite to the 2-core machine (ltm_testing/netns.py).
NETNS_MCA = {"OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_btl_tcp_if_include": netns.SUBNET,
             "OMPI_MCA_oob_tcp_if_include": netns.SUBNET, "OMPI_MCA_mpi_yield_when_idle": "1"}


def two_node_cluster(tmp_path, hosts):
    """A cluster of two nodes, h0 and h1, one slurmd in each namespace host."""
    return SlurmCluster(tmp_path, [Node.of(h) for h in hosts],
                        env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **NETNS_MCA})


def job_env(model, **kw):
    env = {"MODEL": model, "LTM": WORKER, "LTM_HOME": SOURCE_DIR, "PORT": str(free_port()),
           "LISTEN_HOST": "127.0.0.1", "COLLECTIVE_TIMEOUT": "60", "DRAIN_TIMEOUT": "5",
           "LTM_EXTRA_FLAGS": "--threads 1 --kv-memory-mb 8"}
    env.update({k: str(v) for k, v in kw.items()})
    return env


def address_file(job):
    return job.output[: -len(".out")] + ".address"  # next to job-N.out: job-N.address


def wait_address(cluster, job):
    """The address the job published, once it has (the job must still be running)."""
    path = address_file(job)

    def ready():
        state = cluster.show_job(job.id).get("JobState")
        assert state not in ("FAILED", "COMPLETED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), \
            f"job {job.id} is {state} before publishing an address\n{cluster.job_log(job)}"
        return os.path.exists(path)
    cluster.wait_for(ready, START_S, f"job {job.id}'s address file {path}", interval=1)
    with open(path) as f:
        return f.read().strip()


def generate(address):
    with LtmClient(address, timeout=60) as c:
        r = c.generate(prompt_token_ids=PROMPT, max_new_tokens=NEW, ignore_eos=True, temperature=0)
    return list(r.token_ids)


def worker_processes(cluster, job):
    """{pid: (world rank, node)} of the job's ltm-worker processes (srun or mpirun ranks)."""
    found = {}
    for pid, env in cluster.job_pids(job.id).items():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "ltm-worker":
                    continue
        except OSError:
            continue
        rank = env.get("OMPI_COMM_WORLD_RANK", env.get("SLURM_PROCID"))
        if rank is not None:
            found[pid] = (int(rank), env.get("SLURMD_NODENAME"))
    return found


def worker_ranks(cluster, job):
    return {rank: node for rank, node in worker_processes(cluster, job).values()}


def test_one_node_job_serves_at_the_published_address(cluster, model, expected):
    job = cluster.sbatch(["--nodes=1", "--ntasks-per-node=2", SCRIPT], env=job_env(model))
    address = wait_address(cluster, job)
    log = cluster.job_log(job)
    assert f"ltm: coordinator at {address}" in log, log
    assert generate(address) == expected, cluster.job_log(job)
    # scancel: rank 0 drains, the job ends without a requeue, and the address file goes away.
    cluster.run(["scancel", str(job.id)])
    cluster.wait_for(lambda: cluster.show_job(job.id).get("JobState") not in
                     ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING"), 60,
                     f"job {job.id} to end after scancel")
    info = cluster.show_job(job.id)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", info
    assert not os.path.exists(address_file(job))
    assert "drained" in cluster.job_log(job), cluster.job_log(job)


@pytest.mark.parametrize("env, code, message", [
    (dict(LTM_EXTRA_FLAGS="--threads 1 --bogus-flag"), 2, "bogus"),
    (dict(LTM_EXTRA_FLAGS="--threads 1 --weight-dtype f8"), 2, "--weight-dtype must be f32, bf16, fp16 or int8, not 'f8'"),
    (dict(TP=4, PP=1), 2, "tp 4 x pp 1 is 4 ranks, but the job has 2 tasks"),
    (dict(MODEL="/nonexistent/model"), 6, "/nonexistent/model"),
    # Nobody gets in by default: the script refuses a public address with neither a key nor TLS,
    # and ltm-worker itself a public --http given past the script's check.
    (dict(LISTEN_HOST="0.0.0.0"), 2, "LISTEN_HOST 0.0.0.0 can be reached from other hosts"),
    (dict(LTM_EXTRA_FLAGS="--threads 1 --http 0.0.0.0:18000"), 2,
     "--http 0.0.0.0:18000 can be reached from other hosts"),
])
def test_operator_errors_end_with_their_code_and_are_not_requeued(cluster, model, env, code,
                                                                   message):
    job = cluster.sbatch(["--nodes=1", "--ntasks-per-node=2", SCRIPT],
                         env=job_env(model, **env), wait=True)
    info = cluster.show_job(job.id)
    log = cluster.job_log(job)
    assert job.exit_code == code, f"{info}\n{log}"
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", f"{info}\n{log}"
    assert message in log and "not requeued" in log, log


def test_worker_missing_model_exits_6_under_srun(cluster, model):
    """The model check of the worker itself (the script's own check skipped: a path that only
    the batch host has)."""
    job = cluster.sbatch(["--nodes=1", "--ntasks-per-node=2", "--wrap",
                          f"srun --mpi=pmix --kill-on-bad-exit=1 {WORKER} --model /nonexistent/m "
                          "--listen 127.0.0.1:1 --tp 2"], wait=True)
    assert job.exit_code == 6, cluster.job_log(job)


def test_benchmark_job_writes_its_json_next_to_the_output(cluster, model):
    job = cluster.sbatch(["--nodes=1", "--ntasks-per-node=2", BENCH_SCRIPT], wait=True, env={
        "MODEL": model, "LTM_HOME": SOURCE_DIR,
        "LTM_BENCH": os.path.join(os.environ.get("LTM_BUILD_DIR", ""), "launcher", "ltm-bench"),
        "BENCH_FLAGS": "--threads 1 --prompt-tokens 8 --new-tokens 4 --skip-limits"})
    assert job.exit_code == 0, cluster.job_log(job)
    with open(job.output[: -len(".out")] + ".json") as f:
        lines = [json.loads(line) for line in f if line.startswith("{")]
    assert [r["measurement"] for r in lines] == ["prefill", "decode"], lines
    for r in lines:
        assert (r["tp"], r["pp"], r["prompt_tokens"], r["new_tokens"]) == (2, 1, 8, 4), r
        assert r["tokens_per_s"] > 0, r


@pytest.mark.parametrize("sig, why", [(signal.SIGKILL, "a rank was killed"),
                                      (signal.SIGSEGV, "a rank crashed (signal 11)")])
def test_killed_rank_ends_the_run_non_zero_and_requeues_the_job(cluster, model, expected, sig,
                                                                why):
    job = cluster.sbatch(["--nodes=1", "--ntasks-per-node=2", SCRIPT],
                         env=job_env(model, LTM_MAX_REQUEUES=1))
    wait_address(cluster, job)
    ranks = {rank: pid for pid, (rank, _) in worker_processes(cluster, job).items()}
    assert sorted(ranks) == [0, 1], ranks
    os.kill(ranks[1], sig)
    # The run ends non-zero (137: a killed rank; 139: a crashed one), the script requeues the
    # job, and the second run serves again (then is cancelled; LTM_MAX_REQUEUES=1 would not
    # requeue it again).
    def requeued():
        info = cluster.show_job(job.id)
        assert info.get("JobState") not in ("FAILED", "COMPLETED", "CANCELLED"), \
            f"job {job.id} ended instead of being requeued: {info}\n{cluster.job_log(job)}"
        return info.get("Restarts") == "1" and info.get("JobState") == "PENDING"
    cluster.wait_for(requeued, START_S, f"job {job.id} to be requeued")
    log = cluster.job_log(job)
    assert f"the group exited {128 + sig} ({why}): requeueing (restart 1 of 1)" in log, log
    # Slurm holds a requeued job for AuthInfo's cred_expire (10 s in the test cluster).
    address = wait_address(cluster, job)
    assert generate(address) == expected, cluster.job_log(job)
    cluster.run(["scancel", str(job.id)])


@pytest.mark.skipif(netns.skip_reason() is not None, reason=netns.skip_reason() or "")
@pytest.mark.parametrize("launch", ["srun", "mpirun"])
def test_two_node_job_tp_inside_pp_across(tmp_path, model, expected, launch):
    key = tmp_path / "api.key"
    key.write_text("slurm-two-node-key-0123456789\n")
    with netns.Hosts(2) as hosts, two_node_cluster(tmp_path, hosts) as cluster:
        job = cluster.sbatch(["--nodes=2", "--ntasks-per-node=2", SCRIPT],
                             env=job_env(model, LISTEN_HOST="0.0.0.0", LAUNCH=launch,
                                         LTM_API_KEY_FILE=key))
        address = wait_address(cluster, job)
        assert address.startswith(hosts[0].addr + ":"), address  # rank 0: the first node
        log = cluster.job_log(job)
        assert "tp 2 x pp 2 on h[0-1]" in log, log
        # Every rank where the layout puts it: ranks 0, 1 (tp group of pp stage 0) on h0, 2, 3
        # on h1 (by the rank and node in each ltm-worker's environment).
        placed = worker_ranks(cluster, job)
        assert placed == {0: "h0", 1: "h0", 2: "h1", 3: "h1"}, placed
        for rank in range(4):
            assert f"rank {rank} (tp {rank % 2}, pp {rank // 2})" in log, log
        # A client on the other host, through the bridge: refused without the key, served with it.
        args = [CLIENT, "--server", address, "--prompt-ids", ",".join(map(str, PROMPT)),
                "--max-new-tokens", str(NEW), "--temperature", "0", "--ignore-eos",
                "--logprobs", "--no-stream", "--timeout-s", "120"]
        p = hosts[1].run(args, check=False)
        assert p.returncode != 0 and "UNAUTHENTICATED" in p.stderr, p.stderr
        p = hosts[1].run([*args, "--api-key-file", str(key)], check=False)
        assert p.returncode == 0, f"{p.stderr}\n{cluster.job_log(job)}"
        ids = [int(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("token ")]
        assert ids == expected, f"{p.stderr}\n{cluster.job_log(job)}"
        cluster.run(["scancel", str(job.id)])
        cluster.wait_for(lambda: cluster.show_job(job.id).get("JobState") == "CANCELLED", 60,
                         f"job {job.id} to end after scancel")
        assert "drained" in cluster.job_log(job), cluster.job_log(job)


@pytest.mark.skipif(netns.skip_reason() is not None, reason=netns.skip_reason() or "")
def test_lost_node_ends_the_run_non_zero_and_the_job_runs_again(tmp_path, model, expected):
    """Every process of the second node killed (its slurmd, slurmstepd and ranks: the node is
    gone): the run on the first node ends non-zero, the job is requeued, and once the node is
    back it serves again. Two requeues: once in some dozens of CI runs the first run on the
    restarted cluster died in MPI start-up (rank 0 SIGSEGV before its first line), which the
    script now requeues too (139)."""
    with netns.Hosts(2) as hosts, two_node_cluster(tmp_path, hosts) as cluster:
        job = cluster.sbatch(["--nodes=2", "--ntasks-per-node=2", SCRIPT],
                             env=job_env(model, LISTEN_HOST="0.0.0.0", LTM_MAX_REQUEUES=2,
                                         COLLECTIVE_TIMEOUT=20, LTM_INSECURE_PUBLIC=1))
        wait_address(cluster, job)
        # Served to anyone, as asked (LTM_INSECURE_PUBLIC=1), and said so.
        cluster.wait_for(lambda: "--insecure-public: the gRPC API on" in cluster.job_log(job), 30,
                         f"job {job.id}'s --insecure-public warning")
        t0 = time.monotonic()
        hosts[1].kill_all()
        state = {}

        def requeued():
            state.update(cluster.show_job(job.id))
            assert state.get("JobState") not in ("FAILED", "COMPLETED", "CANCELLED"), \
                f"job {job.id} ended instead of being requeued: {state}\n{cluster.job_log(job)}"
            return state.get("Restarts") == "1"
        cluster.wait_for(requeued, 120, f"job {job.id} to be requeued")
        print(f"lost node: the job was requeued {time.monotonic() - t0:.1f} s after the kill")
        log = cluster.job_log(job)
        # Rank 0 was sending to h1's ranks: its write fails with EPIPE (no death by SIGPIPE, 141),
        # and the group abort names the lost peer and exits 5 (parallel/watchdog.h).
        assert re.search(r"ltm: h0:0: a connection to a peer broke \(EPIPE, \"Broken pipe\"\) "
                         r"while this rank waited in .*aborting the group \(peer: rank [23] on h1\)",
                         log), log
        assert "the group exited 5 (an MPI call failed (a rank or its link was lost)): requeueing " \
               "(restart 1 of 2)" in log, log
        cluster.start_slurmd(cluster.nodes[1])  # the node comes back (rebooted)
        address = wait_address(cluster, job)
        p = hosts[1].run([CLIENT, "--server", address, "--prompt-ids", ",".join(map(str, PROMPT)),
                          "--max-new-tokens", str(NEW), "--temperature", "0", "--ignore-eos",
                          "--logprobs", "--no-stream", "--timeout-s", "120"], check=False)
        assert p.returncode == 0, f"{p.stderr}\n{cluster.job_log(job)}"
        ids = [int(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("token ")]
        assert ids == expected, f"{p.stderr}\n{cluster.job_log(job)}"
