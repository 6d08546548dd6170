"""A search over the request space (issue 19, item 8): requests drawn from everything validation
accepts, with every field at and near its bounds, sent to real servers over both front doors.

Two servers of the demo model (models/kjv-small: vocabulary 4096, context 256, end of text 4095),
each with gRPC and HTTP and a LoRA adapter folder with two small random adapters loaded:
  tp1  one rank                                            (about 2/3 of the requests)
  tp2  mpirun -n 2, tensor parallel 2 (vocab-sharded sampling, gathered logprob rows)
Cases are drawn from a seeded generator (ltm_testing/property_cases.py, which lists the fields
and their values): the seed is printed, LTM_PROPERTY_SEED=N replays a run,
LTM_PROPERTY_REQUESTS sets how many (default 2400; at least 2000 in CI).

Each request, unary or streamed, must get within REQUEST_TIMEOUT seconds either a well-formed
response (tokens in the vocabulary, usage consistent with max tokens and finish reason, a finite
logprob <= 0 for every token when asked, streams ending properly) or a named error: gRPC
INVALID_ARGUMENT / NOT_FOUND whose message names the field (RESOURCE_EXHAUSTED, a full queue,
is also accepted); HTTP 400 with an OpenAI error object whose message names it (or 429); an
extreme repetition_penalty (outside [1e-3, 1e3]) may be refused so, naming it. Never
UNAVAILABLE, INTERNAL, a dropped connection, a 5xx or a hang. After each batch both servers answer GET /health and gRPC health
SERVING, and their processes are alive at the end. Some seeded requests are sent again alone (a
different answer is printed; see Search.replay).

A server that dies is not the end of the search: the requests of the batch that did not get an
answer are sent again one at a time to a fresh server until one kills it, that one is shrunk
(fields dropped while it still kills a fresh server), and the search goes on (at most
MAX_RESTARTS times). The failure report lists each finding with its seed, a reproducer (the
JSON body or request fields) and the server's last log lines.
"""
from __future__ import annotations

import concurrent.futures
import http.client
import json
import math
import os
import random
import threading
import time
from typing import Dict, List, Optional, Tuple

import grpc

from ltm_testing.e2e import health_status, raw_channel
from ltm_testing.http import HttpServer, parse_sse
from ltm_testing.lora import make_adapter
from ltm_testing.property_cases import MODEL, SHAPE, TEXTS, Case, draw_cases, long_texts
from ltm.v1 import ltm_pb2  # noqa: E402  (after ltm_testing.server, which puts the stubs on sys.path)

assert os.environ.get("LTM_WORKER"), "run through ctest (LTM_WORKER)"

REQUESTS = int(os.environ.get("LTM_PROPERTY_REQUESTS", "2400"))
THREADS = 6
BATCH = 120
REQUEST_TIMEOUT = 60.0  # a hang detector, not a speed assertion
MAX_RESTARTS = 6
REPLAY_SHARE = 0.08


# ---- the servers -----------------------------------------------------------------------------

ADAPTERS = ["p", "q"]


def write_adapters(root: str) -> str:
    make_adapter(os.path.join(root, "p"), SHAPE.config, r=4, alpha=8, seed=1, std=0.05)
    make_adapter(os.path.join(root, "q"), SHAPE.config, r=2, alpha=4, seed=2, std=0.05,
                 modules=["attn.c_attn", "mlp.c_proj"])
    return root


class Target:
    """One server under test, restartable: `srv` is the live HttpServer."""

    def __init__(self, name: str, ranks: int, tp: int, lora_dir: str, log_dir: str):
        self.name, self.ranks, self.tp = name, ranks, tp
        self.lora_dir, self.log_dir = lora_dir, log_dir
        self.srv: Optional[HttpServer] = None
        self.starts = 0
        self.dead_logs: List[str] = []

    def start(self) -> "Target":
        self.starts += 1
        srv = HttpServer(MODEL, ranks=self.ranks, tp=self.tp, pp=1, log_dir=self.log_dir,
                         name=f"{self.name}-{self.starts}",
                         extra=["--kv-memory-mb", 24, "--lora-dir", self.lora_dir,
                                "--lora-max-rank", 8])
        srv.start()
        with srv.client(timeout=60) as c:
            for a in ADAPTERS:
                info = c.load_adapter(a)
                assert info.loaded, info
        self.srv = srv
        return self

    def stop(self) -> None:
        if self.srv is not None:
            self.srv.stop()

    def restart(self) -> None:
        if self.srv is not None:
            self.dead_logs.append(self.srv.log_tail(4000))
            self.srv.stop()
            self.srv = None
        self.start()

    def preemptions(self) -> float:
        try:
            return self.srv.sample("ltm_preemptions_total")
        except (OSError, KeyError, AssertionError):
            return float("nan")

    def healthy(self) -> Tuple[bool, str]:
        """(alive and answering GET /health 200 and gRPC health SERVING, why not)."""
        srv = self.srv
        if srv is None or not srv.running():
            return False, "the server process has exited"
        try:
            status, _, body = srv.request("GET", "/health", timeout=10)
        except OSError as e:
            return False, f"GET /health: {e!r}"
        if status != 200:
            return False, f"GET /health: {status} {body[:200]!r}"
        channel = raw_channel(srv.address)
        try:
            h = health_status(channel)
        except grpc.RpcError as e:
            return False, f"gRPC health: {e.code().name}: {e.details()}"
        finally:
            channel.close()
        if h != 1:
            return False, f"gRPC health: status {h}, not SERVING"
        return True, ""


# ---- sending and judging -------------------------------------------------------------------

class Outcome:
    def __init__(self, case: Case):
        self.case = case
        self.ok = False          # a well-formed response
        self.named = ""          # a named error: "CODE: message" / "400: message"
        self.failure = ""        # what was wrong (empty: nothing)
        self.transport = False   # no answer at all (the server may be gone)
        self.tokens: Optional[list] = None  # gRPC token ids or HTTP text, for replays
        self.seconds = 0.0


def names_field(message: str, field: str) -> bool:
    return field in message


def judge_named(case: Case, code: str, message: str, out: Outcome) -> None:
    if case.expect is None:
        if code in ("RESOURCE_EXHAUSTED", "429"):
            out.named = f"{code}: {message}"  # a full queue: named, allowed
            return
        rp = case.f.get("repetition_penalty")
        if (code in ("INVALID_ARGUMENT", "400") and "repetition_penalty" in message
                and rp is not None and not (1e-3 <= rp <= 1e3)):
            # Issue 19 lets the server either saturate an extreme penalty or bound it by
            # validation (with the bounds documented); a refusal naming the field is the latter.
            out.named = f"{code}: {message}"
            return
        out.failure = f"a valid request got {code}: {message}"
        return
    want_code = case.expect_code if case.grpc else "400"
    if code != want_code:
        out.failure = f"expected {want_code} naming {case.expect}, got {code}: {message}"
    elif not names_field(message, case.expect):
        out.failure = f"the error does not name {case.expect}: {code}: {message}"
    else:
        out.named = f"{code}: {message}"


def check_tokens(case: Case, ids: List[int], logprobs: List[float], finish: int,
                 completion_tokens: int, prompt_tokens: int) -> str:
    f = case.f
    max_new = f.get("max_new") or 16
    if any(not (0 <= t < SHAPE.vocab) for t in ids):
        return f"token id outside the vocabulary: {ids}"
    if completion_tokens != len(ids):
        return f"usage.completion_tokens {completion_tokens} != {len(ids)} tokens"
    if len(ids) > max_new:
        return f"{len(ids)} tokens for max_new_tokens {max_new}"
    if case.n_prompt is not None and "ids" in f and prompt_tokens != case.n_prompt:
        return f"usage.prompt_tokens {prompt_tokens} != {case.n_prompt}"
    if finish == ltm_pb2.FINISH_REASON_LENGTH and len(ids) != max_new:
        return f"finish LENGTH after {len(ids)} of {max_new} tokens"
    if finish == ltm_pb2.FINISH_REASON_EOS and f.get("ignore_eos"):
        return "finish EOS with ignore_eos"
    if finish == ltm_pb2.FINISH_REASON_STOP and not f.get("stop"):
        return "finish STOP without stop strings"
    if finish not in (ltm_pb2.FINISH_REASON_LENGTH, ltm_pb2.FINISH_REASON_EOS,
                      ltm_pb2.FINISH_REASON_STOP):
        return f"finish reason {ltm_pb2.FinishReason.Name(finish)}"
    if f.get("logprobs") is not None:
        if len(logprobs) != len(ids):
            return f"{len(logprobs)} logprobs for {len(ids)} tokens"
        bad = [x for x in logprobs if not (math.isfinite(x) and x <= 1e-4)]
        if bad:
            return f"logprobs not finite and <= 0: {bad[:5]}"
    elif logprobs:
        return "logprobs without return_logprobs"
    return ""


def send_grpc(case: Case, channel: grpc.Channel, out: Outcome) -> None:
    req = case.grpc_request()
    try:
        if not case.stream:
            stub = channel.unary_unary("/ltm.v1.Generation/Generate",
                                       request_serializer=ltm_pb2.GenerateRequest.SerializeToString,
                                       response_deserializer=ltm_pb2.GenerateResponse.FromString)
            r = stub(req, timeout=REQUEST_TIMEOUT)
            ids, lps = list(r.token_ids), list(r.logprobs)
            err = check_tokens(case, ids, lps, r.finish_reason, r.usage.completion_tokens,
                               r.usage.prompt_tokens)
        else:
            stub = channel.unary_stream("/ltm.v1.Generation/GenerateStream",
                                        request_serializer=ltm_pb2.GenerateRequest.SerializeToString,
                                        response_deserializer=ltm_pb2.GenerateResponse.FromString)
            msgs = list(stub(req, timeout=REQUEST_TIMEOUT))
            if not msgs:
                out.failure = "an empty stream"
                return
            ids = [t for m in msgs for t in m.token_ids]
            lps = [x for m in msgs for x in m.logprobs]
            last = msgs[-1]
            err = ""
            for m in msgs[:-1]:
                if m.finish_reason != ltm_pb2.FINISH_REASON_UNSPECIFIED:
                    err = "a finish reason before the last message"
            err = err or check_tokens(case, ids, lps, last.finish_reason,
                                      last.usage.completion_tokens, last.usage.prompt_tokens)
        if err:
            out.failure = err
            return
        if case.expect is not None:
            out.failure = f"expected an error naming {case.expect}, got a response"
            return
        out.ok, out.tokens = True, ids
    except grpc.RpcError as e:
        code = e.code()
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.RESOURCE_EXHAUSTED):
            judge_named(case, code.name, e.details() or "", out)
        else:
            out.failure = f"{code.name}: {e.details()}"
            out.transport = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN,
                                     grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED,
                                     grpc.StatusCode.CANCELLED)


def check_http_choice(case: Case, out_json: dict, text: str, finish: Optional[str],
                      logprobs: Optional[dict], usage: Optional[dict]) -> str:
    f = case.f
    max_new = f.get("max_new") or 16
    if finish not in ("length", "stop"):
        return f"finish_reason {finish!r}"
    if f.get("echo") and "prompt" in f and not text.startswith(f["prompt"]):
        return "echo: the text does not start with the prompt"
    if usage is not None:
        c = usage.get("completion_tokens")
        if not isinstance(c, int) or c > max_new or c < 0:
            return f"usage {usage} for max_tokens {max_new}"
        if finish == "length" and c != max_new:
            return f"finish length after {c} of {max_new} tokens"
        if case.n_prompt is not None and "ids" in f and usage.get("prompt_tokens") != case.n_prompt:
            return f"usage.prompt_tokens {usage.get('prompt_tokens')} != {case.n_prompt}"
    if f.get("logprobs") is None:
        if logprobs is not None:
            return "logprobs without logprobs asked"
        return ""
    if logprobs is None:
        return "no logprobs object"
    toks, lps, tops, offs = (logprobs.get(k) for k in ("tokens", "token_logprobs", "top_logprobs",
                                                       "text_offset"))
    if not (isinstance(toks, list) and len(toks) == len(lps) == len(tops) == len(offs)):
        return f"logprobs lists of different lengths: {logprobs}"
    if usage is not None:
        want = usage["completion_tokens"] + (usage["prompt_tokens"] if f.get("echo") else 0)
        if len(toks) != want:
            return f"{len(toks)} logprob entries for {want} tokens"
    for i, (lp, top) in enumerate(zip(lps, tops)):
        if lp is None and top is None and f.get("echo") and i == 0:
            continue  # the first prompt token: nothing predicts it
        if not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > 1e-4:
            return f"token_logprobs[{i}] = {lp!r}"
        if not isinstance(top, dict) or len(top) > f["logprobs"]:
            return f"top_logprobs[{i}] = {top!r} for logprobs {f['logprobs']}"
        if any(not isinstance(v, (int, float)) or v > 1e-4 for v in top.values()):
            return f"top_logprobs[{i}] = {top!r}"
    return ""


def send_http(case: Case, port: int, out: Outcome) -> None:
    body = json.dumps(case.http_body())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    try:
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            data = resp.read()
            try:
                err = json.loads(data)["error"]
                message = err["message"]
                assert isinstance(message, str) and isinstance(err["type"], str)
            except (ValueError, KeyError, TypeError, AssertionError):
                out.failure = f"HTTP {resp.status} without an OpenAI error object: {data[:300]!r}"
                out.transport = resp.status >= 500
                return
            if 400 <= resp.status < 500:
                judge_named(case, str(resp.status), message, out)
            else:
                out.failure = f"HTTP {resp.status}: {message}"
                out.transport = True
            return
        if not case.stream:
            j = json.loads(resp.read())
            choice = j["choices"][0]
            err = check_http_choice(case, j, choice["text"], choice["finish_reason"],
                                    choice["logprobs"], j["usage"])
            text = choice["text"]
        else:
            if resp.getheader("Content-Type") != "text/event-stream":
                out.failure = f"stream Content-Type {resp.getheader('Content-Type')}"
                return
            events = parse_sse(resp)
            errors = [e for e in events if "error" in e]
            if errors:
                out.failure = f"an error event in the stream: {errors[0]}"
                out.transport = True
                return
            text = "".join(c["text"] for e in events for c in e.get("choices", []))
            finishes = [c["finish_reason"] for e in events for c in e.get("choices", [])
                        if c.get("finish_reason")]
            usage = [e["usage"] for e in events if e.get("usage")]
            lp = None
            if case.f.get("logprobs") is not None:
                lp = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                for e in events:
                    for c in e.get("choices", []):
                        for k in lp:
                            lp[k] += (c.get("logprobs") or {}).get(k, [])
            elif any(c.get("logprobs") for e in events for c in e.get("choices", [])):
                out.failure = "logprobs in a stream without logprobs asked"
                return
            include_usage = (case.http_extra.get("stream_options") or {}).get("include_usage")
            if bool(usage) != bool(include_usage):
                out.failure = f"usage chunks {usage} with stream_options {include_usage}"
                return
            if len(finishes) != 1:
                out.failure = f"finish reasons in the stream: {finishes}"
                return
            err = check_http_choice(case, {}, text, finishes[0], lp, usage[0] if usage else None)
        if err:
            out.failure = err
            return
        if case.expect is not None:
            out.failure = f"expected an error naming {case.expect}, got a response"
            return
        out.ok, out.tokens = True, text
    except (OSError, http.client.HTTPException, ValueError, AssertionError) as e:
        # A connection that breaks or a stream cut short: no answer (the server may be gone).
        out.failure = f"{type(e).__name__}: {e}"
        out.transport = True
    finally:
        conn.close()


def send(case: Case, target: Target, channel: Optional[grpc.Channel]) -> Outcome:
    out = Outcome(case)
    t0 = time.monotonic()
    if case.grpc:
        send_grpc(case, channel, out)
    else:
        send_http(case, target.srv.http_port, out)
    out.seconds = time.monotonic() - t0
    if out.seconds > REQUEST_TIMEOUT and not out.failure:
        out.failure = f"took {out.seconds:.0f} s"
    return out


# ---- the search ------------------------------------------------------------------------------

class Search:
    def __init__(self, seed: int, targets: Dict[str, Target]):
        self.seed = seed
        self.targets = targets
        self.findings: List[str] = []
        self.counts: Dict[str, int] = {}
        self.restarts = 0
        self.sent = 0
        self.replays = 0
        self.diverged = 0
        self._local = threading.local()

    def channel(self, target: Target) -> grpc.Channel:
        """One channel per thread and server start (a channel to a dead server stays broken)."""
        key = (target.name, target.starts)
        chans = getattr(self._local, "chans", None)
        if chans is None:
            chans = self._local.chans = {}
        if key not in chans:
            chans[key] = raw_channel(target.srv.address)
        return chans[key]

    def run_one(self, case: Case) -> Outcome:
        t = self.targets[case.target]
        return send(case, t, self.channel(t) if case.grpc else None)

    def count(self, out: Outcome) -> None:
        kind = ("ok" if out.ok else f"named {out.named.split(':')[0]}" if out.named
                else "failure")
        key = f"{out.case.target} {out.case.door} {kind}"
        self.counts[key] = self.counts.get(key, 0) + 1

    def finding(self, what: str, case: Optional[Case], target: Optional[Target] = None) -> None:
        text = f"[seed {self.seed}] {what}"
        if case is not None:
            text += f"\n    reproducer: {case.describe()}"
        if target is not None and target.srv is not None:
            log = "\n".join(l for l in target.srv.log().splitlines()
                            if "error" in l.lower() or "assert" in l.lower() or "check" in l)[-1500:]
            text += f"\n    server log ({target.name}):\n{log}"
        print(text)
        self.findings.append(text)

    def run_batch(self, cases: List[Case]) -> List[Outcome]:
        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            futures = [pool.submit(self.run_one, c) for c in cases]
            done, not_done = concurrent.futures.wait(futures, timeout=REQUEST_TIMEOUT * 4)
            assert not not_done, f"{len(not_done)} requests still running after the bound"
            return [f.result() for f in futures]

    def search(self, cases: List[Case]) -> None:
        for start in range(0, len(cases), BATCH):
            batch = cases[start:start + BATCH]
            outs = self.run_batch(batch)
            self.sent += len(batch)
            for o in outs:
                self.count(o)
            for o in outs:
                if o.failure and not o.transport:
                    self.finding(o.failure, o.case)
            health = {name: t.healthy() for name, t in self.targets.items()}
            self.replay([o for o in outs if o.ok and health[o.case.target][0]],
                        batch_index=start // BATCH)
            for name, target in self.targets.items():
                alive, why = health[name]
                lost = [o for o in outs if o.case.target == name and o.transport]
                if alive:
                    for o in lost:
                        self.finding(f"no answer ({o.failure}), yet the server stays up", o.case)
                    continue
                self.finding(f"{name} stopped serving after batch {start // BATCH} ({why}); "
                             f"{len(lost)} requests got no answer", None, target)
                if self.restarts >= MAX_RESTARTS:
                    return
                self.restarts += 1
                self.isolate(target, [o.case for o in lost])
            if self.restarts >= MAX_RESTARTS:
                return

    def replay(self, outs: List[Outcome], batch_index: int) -> None:
        """Seeded requests once more, alone. A different answer is printed, not failed: without
        preemption, a seeded request was seen to give other tokens alone than in its batch
        (LTM_PROPERTY_SEED=3: from token 71 of 87), reported on issue 19; until that is settled
        it is not this test's assertion. A replay that fails is."""
        rng = random.Random(self.seed * 1000 + batch_index)
        picked = [o for o in outs if o.case.f.get("seed") is not None and rng.random() < REPLAY_SHARE * 4]
        for o in picked[: max(1, int(len(outs) * REPLAY_SHARE))]:
            again = self.run_one(o.case)
            self.replays += 1
            if again.failure:
                self.finding(f"replayed alone: {again.failure}", o.case)
            elif again.ok and again.tokens != o.tokens:
                a, b = o.tokens, again.tokens
                k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                self.diverged += 1
                print(f"note: a seeded request replayed alone differs from position {k} of "
                      f"{len(a)}: {o.case.describe()}")

    def isolate(self, target: Target, suspects: List[Case]) -> None:
        """Which of `suspects` (the requests that got no answer) stops a fresh server: sent one at
        a time; the first that does is shrunk and reported."""
        target.restart()
        for case in suspects:
            out = self.run_one(case)
            alive, why = target.healthy()
            if alive:
                continue
            shrunk = self.shrink(target, case)
            self.finding(f"this request alone stops a fresh {target.name} server ({why}; the "
                         f"client saw: {out.failure or 'a response'})", shrunk, target)
            target.restart()
            return
        self.finding(f"none of the {len(suspects)} unanswered requests alone stops a fresh "
                     f"{target.name} server (a combination, or load)", None)

    def shrink(self, target: Target, case: Case, trials: int = 10) -> Case:
        """Drops optional fields one at a time while the request still stops a fresh server."""
        best = case.copy()
        droppable = [k for k in ("stop", "top_k", "top_p", "seed", "logprobs", "echo", "adapter",
                                 "request_id", "ignore_eos", "max_new", "temperature")
                     if best.f.get(k) is not None and best.f.get(k) != [] and best.f.get(k) != ""]
        droppable += [f"extra:{k}" for k in best.http_extra]
        if len(best.f.get("ids", [])) > 1:
            droppable.insert(0, "ids")
        for key in droppable[:trials]:
            trial = best.copy()
            if key == "ids":  # a quarter of the prompt
                trial.f["ids"] = trial.f["ids"][: max(1, len(trial.f["ids"]) // 4)]
                trial.n_prompt = len(trial.f["ids"])
            elif key.startswith("extra:"):
                trial.http_extra.pop(key[len("extra:"):])
            else:
                trial.f.pop(key)
            target.restart()
            self.run_one(trial)
            if not target.healthy()[0]:
                best = trial
        return best


def test_requests_from_the_whole_accepted_space(tmp_path):
    seed = int(os.environ.get("LTM_PROPERTY_SEED") or random.SystemRandom().randrange(2**32))
    print(f"LTM_PROPERTY_SEED={seed} LTM_PROPERTY_REQUESTS={REQUESTS}")
    lora_dir = write_adapters(str(tmp_path / "lora"))
    targets = {"tp1": Target("tp1", 1, 1, lora_dir, str(tmp_path)),
               "tp2": Target("tp2", 2, 2, lora_dir, str(tmp_path))}
    t0 = time.monotonic()
    try:
        for t in targets.values():
            t.start()
        # Text prompts with their token counts (the tokenizer is the server's).
        texts: Dict[str, int] = {}
        with targets["tp1"].srv.client(timeout=30) as c:
            for text in TEXTS + long_texts():
                n = len(c.tokenize(text))
                if 0 < n < SHAPE.context:
                    texts[text] = n
        cases = draw_cases(seed, REQUESTS, texts)
        search = Search(seed, targets)
        search.search(cases)
        took = time.monotonic() - t0
        for key in sorted(search.counts):
            print(f"  {key}: {search.counts[key]}")
        for t in targets.values():
            print(f"  {t.name}: {t.starts} starts, {t.preemptions():.0f} preemptions (last start)")
        print(f"{search.sent} requests (+{search.replays} replays, {search.diverged} different) "
              f"in {took:.1f} s, "
              f"{search.restarts} restarts, {len(search.findings)} findings")
        for t in targets.values():
            assert t.srv.running(), f"{t.name} is not running at the end\n{t.srv.log_tail()}"
        assert not search.findings, (
            f"{len(search.findings)} findings (replay with LTM_PROPERTY_SEED={seed}):\n"
            + "\n".join(sorted(search.findings, key=lambda f: "alone stops" not in f)[:12]))
        assert search.sent >= min(REQUESTS, 2000)
    finally:
        for t in targets.values():
            t.stop()