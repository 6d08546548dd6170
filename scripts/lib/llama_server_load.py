#!/usr/bin/python3
"""Closed-loop load on llama.cpp's llama-server, the shape of ltm-loadgen's (launcher/loadgen_main.cpp):
CONCURRENCY threads each send one request after another until DURATION seconds have passed
(calls in flight then finish), each a prompt of PROMPT random token ids (uniform over the
vocabulary, seeded per thread), MAX_NEW tokens with EOS ignored, greedy, no prompt cache. Prints
one JSON line: generated_tokens_per_s = every generated token / wall time (as ltm-loadgen counts),
requests, errors, wall_s.

  llama_server_load.py --server 127.0.0.1:8080 --concurrency 32 --duration-s 20 \
      [--prompt-tokens 32] [--max-new-tokens 64] [--vocab 50257] [--seed 1]
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time


def post(conn, body):
    conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
    return json.loads(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--duration-s", type=float, default=10)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=600)
    a = ap.parse_args()
    if a.concurrency < 1 or a.duration_s <= 0 or a.prompt_tokens < 1 or a.max_new_tokens < 1:
        sys.exit("llama_server_load.py: --concurrency, --duration-s, --prompt-tokens and "
                 "--max-new-tokens must be positive")
    host, _, port = a.server.rpartition(":")
    lock = threading.Lock()
    totals = {"generated": 0, "requests": 0, "errors": 0, "first_error": None}
    t0 = time.monotonic()
    stop_at = t0 + a.duration_s

    def worker(t):
        # One kept-alive connection per thread, as ltm-loadgen keeps one channel: llama-server's
        # listen backlog (5) resets some of 32 simultaneous new connections.
        rng = random.Random(a.seed * 1000003 + t)
        conn = http.client.HTTPConnection(host, int(port), timeout=a.timeout_s)
        while time.monotonic() < stop_at:
            body = {"prompt": [rng.randrange(a.vocab) for _ in range(a.prompt_tokens)],
                    "n_predict": a.max_new_tokens, "ignore_eos": True, "temperature": 0,
                    "cache_prompt": False, "stream": False}
            try:
                r = post(conn, body)
                with lock:
                    totals["generated"] += int(r.get("tokens_predicted", 0))
                    totals["requests"] += 1
            except Exception as e:  # counted and reported, not fatal; a fresh connection
                with lock:
                    totals["errors"] += 1
                    totals["first_error"] = totals["first_error"] or str(e)
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=a.timeout_s)
                time.sleep(0.01 * (t + 1))
        conn.close()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(a.concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.monotonic() - t0
    print(json.dumps({"concurrency": a.concurrency, "wall_s": wall, "requests": totals["requests"],
                      "errors": totals["errors"], "first_error": totals["first_error"],
                      "generated_tokens": totals["generated"],
                      "generated_tokens_per_s": totals["generated"] / wall}))
    return 0 if totals["requests"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
