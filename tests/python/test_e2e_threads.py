"""ltm-worker and ltm-bench bound the idle spin of their OpenMP threads (common/openmp_wait.h),
and ltm-bench measures batches (it once queued only one request of a batch)."""
import json
import os
import subprocess

import pytest

from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.e2e import GPT2_DIR
from ltm_testing.worker import generate_json

BENCH = os.path.join(os.environ.get("LTM_BUILD_DIR", "build"), "launcher", "ltm-bench")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("threads") / "m")
    make_checkpoint(path, seed=5, copy_vocab_from=GPT2_DIR)  # a vocabulary: it can serve
    return path


def clean_env(**extra):
    e = {k: v for k, v in os.environ.items()
         if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "LTM_OMP_SPIN")}
    e.update(extra)
    return e


def backend_of_worker(model, env):
    out = generate_json(model, prompt_ids=[1, 2, 3], max_new_tokens=2,
                        extra=["--threads", "2"], env=env)
    return out["layout"]["backend"]


def test_worker_bounds_the_spin_by_default(model):
    # Without the exec in main() libgomp would run with its default and this would say "default".
    assert "OpenMP spin 2000)" in backend_of_worker(model, clean_env())


def test_worker_spin_count_from_ltm_omp_spin(model):
    assert "OpenMP spin 50)" in backend_of_worker(model, clean_env(LTM_OMP_SPIN="50"))


def test_worker_keeps_the_users_openmp_policy(model):
    assert "OpenMP spin OMP_WAIT_POLICY=passive)" in backend_of_worker(
        model, clean_env(OMP_WAIT_POLICY="passive"))
    assert "OpenMP spin 123)" in backend_of_worker(model, clean_env(GOMP_SPINCOUNT="123"))
    assert "OpenMP spin default)" in backend_of_worker(model, clean_env(LTM_OMP_SPIN="keep"))


def run_bench(args, env, stderr=None):
    p = subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, f"ltm-bench exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    if stderr is not None:
        stderr.extend(p.stderr.splitlines())
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def test_bench_measures_a_batch(model):
    lines = run_bench(["--model", model, "--threads", "2", "--batch", "3", "--prompt-tokens", "8",
                       "--new-tokens", "4", "--skip-limits", "--json"], clean_env())
    kinds = {l["measurement"]: l for l in lines}
    assert set(kinds) == {"prefill", "decode"}, lines
    for l in kinds.values():
        assert l["batch"] == 3 and l["tokens_per_s"] > 0, l
        assert "OpenMP spin 2000)" in l["backend"], l


def test_bench_warmup_passes_run_uncounted(model):
    """--warmup N runs N passes before the measured rounds and reports them only on stderr (a cold
    first pass on a GPU times module loads and graph captures); the CPU's default is none."""
    args = ["--model", model, "--threads", "2", "--prompt-tokens", "8", "--new-tokens", "4",
            "--skip-limits", "--json", "--rounds", "2"]
    for warmup, expect in (([], 0), (["--warmup", "2"], 2)):
        err = []
        lines = run_bench(args + warmup, clean_env(), stderr=err)
        rounds = [l for l in lines if l["measurement"] == "round"]
        assert len(rounds) == 2, lines
        assert all(l["warmup_passes"] == expect for l in lines), lines
        warm = [l for l in err if "warm-up pass" in l]
        assert len(warm) == expect, err
        if expect:
            want = "ltm-bench: warm-up pass 2 of 2 (not counted): prefill "
            assert warm[-1].startswith(want), err
    p = subprocess.run([BENCH, "--model", model, "--warmup", "11"], capture_output=True, text=True,
                       timeout=60, env=clean_env())
    assert p.returncode == 2 and "--warmup must be in [0, 10]" in p.stderr, p.stderr


def test_the_exec_keeps_the_process_name(model):
    """After the exec (which sets GOMP_SPINCOUNT) the process is still called ltm-worker, as
    ps, pgrep and the Slurm tests find it (exec'ing /proc/self/exe would rename it "exe")."""
    import time
    from ltm_testing.server import free_port
    proc = subprocess.Popen([os.environ["LTM_WORKER"], "--model", model, "--listen",
                             f"127.0.0.1:{free_port()}", "--threads", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=clean_env())
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "the worker exited"
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                if b"GOMP_SPINCOUNT=2000\0" in f.read():
                    break
            assert time.monotonic() < deadline, "GOMP_SPINCOUNT never set"
            time.sleep(0.05)
        with open(f"/proc/{proc.pid}/comm") as f:
            assert f.read().strip() == "ltm-worker"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
