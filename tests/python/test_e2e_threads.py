"""ltm-worker and ltm-bench bound the idle spin of their OpenMP threads (common/openmp_wait.h),
and ltm-bench measures batches (it once queued only one request of a batch)."""
import json
import os
import subprocess

import pytest

from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.worker import generate_json

BENCH = os.path.join(os.environ.get("LTM_BUILD_DIR", "build"), "launcher", "ltm-bench")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("threads") / "m")
    make_checkpoint(path, seed=5)
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


def run_bench(args, env):
    p = subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, f"ltm-bench exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def test_bench_measures_a_batch(model):
    lines = run_bench(["--model", model, "--threads", "2", "--batch", "3", "--prompt-tokens", "8",
                       "--new-tokens", "4", "--skip-limits", "--json"], clean_env())
    kinds = {l["measurement"]: l for l in lines}
    assert set(kinds) == {"prefill", "decode"}, lines
    for l in kinds.values():
        assert l["batch"] == 3 and l["tokens_per_s"] > 0, l
        assert "OpenMP spin 2000)" in l["backend"], l
