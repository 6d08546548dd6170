"""Serving through the emulated device (--device devsim, runtime/backend/devsim_backend.h): a
tp 2 x pp 2 server with 2 micro-batches in flight and a KV budget that holds about two contexts,
under 12 concurrent requests, preempts and recomputes sequences while prefill chunks and decodes
share steps; every request must get the tokens the plain CPU backend gives it alone. (The layout
matrix of one-shot runs is test_devsim_layouts.py.)"""
import os

from ltm_testing.e2e import *  # noqa: F401,F403  (fixtures, clients)
from ltm_testing.e2e import GPT2_DIR, Server, ids_of, run_all

assert os.environ.get("LTM_WORKER") and GPT2_DIR, "run through ctest (LTM_WORKER, LTM_GPT2_DIR)"


def test_preempted_micro_batched_requests_through_devsim_equal_cpu(preempt_model, tmp_path):
    n = 12
    reqs = [dict(prompt_token_ids=ids_of(8 + (i * 5) % 17, 900 + i),
                 max_new_tokens=30 + (i * 13) % 41, temperature=0.0, ignore_eos=True)
            for i in range(n)]
    common = ["--kv-memory-mb", 1, "--block-size", 8, "--max-batch-tokens", 32,
              "--micro-batches", 2]
    with Server(preempt_model, extra=["--device", "cpu", *common], log_dir=str(tmp_path),
                name="cpu") as srv:
        client = srv.client(timeout=300)
        alone = [list(client.generate(**r).token_ids) for r in reqs]
    with Server(preempt_model, extra=["--device", "devsim", *common], log_dir=str(tmp_path),
                name="devsim") as srv:
        info = srv.model_info()
        most = max(-(-(len(r["prompt_token_ids"]) + r["max_new_tokens"]) // 8) for r in reqs)
        need = sum(-(-(len(r["prompt_token_ids"]) + r["max_new_tokens"]) // 8) for r in reqs)
        print(f"{info.kv_blocks_total} blocks of 8; a request needs up to {most}, all {need}")
        assert need > info.kv_blocks_total, "the budget must be too small for all requests"
        client = srv.client(timeout=300)
        with srv.peak_running() as peak:
            together = run_all(lambda r: client.generate(**r), reqs, workers=n, timeout=300)
        fit = info.kv_blocks_total // most
        print(f"peak running {peak['running']}; {fit} fit at full length")
        for i, (a, t) in enumerate(zip(alone, together)):
            assert not isinstance(t, Exception), f"request {i}: {t}\n{srv.log_tail()}"
            assert list(t.token_ids) == a, f"request {i}: devsim (batched, preempted) != cpu alone"
        assert peak["running"] > fit, "more sequences ran together than fit: preemption happened"
        srv.wait_idle()
