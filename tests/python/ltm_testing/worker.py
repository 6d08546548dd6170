"""Runs ltm-worker (alone or under mpirun) from tests and returns what it printed."""
import json
import os
import subprocess
from typing import List, Optional, Sequence

WORKER = os.environ.get("LTM_WORKER", "")
MPIEXEC = os.environ.get("LTM_MPIEXEC", "mpirun")


def run_worker(args: Sequence[str], *, ranks: int = 1, timeout: float = 600,
               check: bool = True, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    assert WORKER, "LTM_WORKER is not set (run the tests through ctest)"
    cmd: List[str] = [WORKER, *map(str, args)]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root",
               "--mca", "btl", "self,vader,tcp", *cmd]
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    if env:
        e.update(env)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout}\n"
                             f"stderr:\n{p.stderr}")
    return p


def generate_json(model: str, *, prompt_ids=None, prompt=None, max_new_tokens=8,
                  extra: Sequence[str] = (), ranks: int = 1, **kw) -> dict:
    args = ["--model", model, "--max-new-tokens", max_new_tokens, "--output", "json", *extra]
    if prompt_ids is not None:
        args += ["--prompt-ids", ",".join(map(str, prompt_ids))]
    if prompt is not None:
        args += ["--prompt", prompt]
    p = run_worker(args, ranks=ranks, **kw)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    assert lines, f"no JSON in output:\n{p.stdout}\n{p.stderr}"
    return json.loads(lines[-1])
