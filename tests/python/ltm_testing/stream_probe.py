"""A gRPC client to run inside a namespace host (ltm_testing.netns), driven through its stdout.

    /usr/bin/python3 stream_probe.py --server h0:50051 --streams 4 --max-new-tokens 2000 \
        [--ready-timeout 120] [--call-timeout 300]

Waits (bounded) until GetModelInfo answers, prints {"event": "ready"}; starts --streams greedy
GenerateStream calls (prompt ids 1..8 shifted per stream, ignore_eos) and, once every one has
streamed a token, prints {"event": "streaming"}; then, as each call ends, one line
{"event": "end", "stream": i, "code": "OK"|"UNAVAILABLE"|..., "details": "...", "tokens": n,
"t": seconds since "streaming"}; last {"event": "done"}. Exits 0 when it got that far, 1 when the
server never answered, 2 when a stream never started. Every line is flushed at once.
"""
import argparse
import json
import os
import sys
import threading
import time

_here = os.path.dirname(os.path.abspath(__file__))
_source = os.environ.get("LTM_SOURCE_DIR", os.path.normpath(os.path.join(_here, "..", "..", "..")))
sys.path.insert(0, os.path.join(_source, "clients", "python"))

import grpc  # noqa: E402
from ltm_client import LtmClient  # noqa: E402


def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=1000)
    ap.add_argument("--ready-timeout", type=float, default=120)
    ap.add_argument("--call-timeout", type=float, default=300)
    a = ap.parse_args()

    deadline = time.monotonic() + a.ready_timeout
    while True:
        c = LtmClient(a.server)  # a fresh channel per try: a failed one backs off for seconds
        try:
            c.model_info(timeout=1.0)
            break
        except grpc.RpcError:
            if time.monotonic() > deadline:
                say(event="not-ready")
                return 1
            time.sleep(0.2)
        finally:
            c.close()
    say(event="ready")

    client = LtmClient(a.server, timeout=a.call_timeout)
    started = [threading.Event() for _ in range(a.streams)]
    t0 = [0.0]

    def run(i):
        n, code, details = 0, "OK", ""
        try:
            for m in client.generate_stream(prompt_token_ids=[(j + 7 * i) % 50 + 1 for j in range(8)],
                                            max_new_tokens=a.max_new_tokens, temperature=0.0,
                                            ignore_eos=True):
                n += len(m.token_ids)
                started[i].set()
        except grpc.RpcError as e:
            code, details = e.code().name, e.details() or ""
        finally:
            started[i].set()
        say(event="end", stream=i, code=code, details=details[:300], tokens=n,
            t=round(time.monotonic() - t0[0], 3) if t0[0] else None)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(a.streams)]
    for t in threads:
        t.start()
    for ev in started:
        if not ev.wait(60):
            say(event="not-streaming")
            return 2
    t0[0] = time.monotonic()
    say(event="streaming")
    for t in threads:
        t.join()
    say(event="done")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
