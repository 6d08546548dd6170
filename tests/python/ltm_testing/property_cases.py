"""The requests of the property search (test_e2e_property.py): drawn from a seeded generator
over everything validation accepts, for the demo model (models/kjv-small: vocabulary 4096,
context 256, end of text 4095), and rendered as a gRPC GenerateRequest or an HTTP
/v1/completions body. Fields:
  temperature          unset, 0, 1e-45 (the least float) .. 1e-38, ordinary, 1e30 .. 3.4e38
  top_k                unset, 0 (off), 1, small, vocab - 1, vocab, vocab + 1, 2^31 - 1; -1 (HTTP)
  top_p                unset, 1e-45, 1e-38, small .. 1
  repetition_penalty   unset, 1e-45, 1e-40, 1e-38 .. 1 .. 1e20, 3e38, 3.4e38
  seed                 unset, 0 .. 2^64 - 1 (HTTP: negative int64 too)
  stop                 0 .. 16 strings of 1 .. 1024 bytes: single bytes, multi-byte characters,
                       1024-byte strings
  max tokens           unset (16), 1 .. 8, up to exactly the context left by the prompt
  prompt               text (ASCII, Unicode, emoji, near the context) or token ids (the
                       end-of-text id first, last, inside, alone; 0; up to context - 1 ids);
                       HTTP: a string, a list of ids, or a one-element list of either
  logprobs / echo      gRPC return_logprobs; HTTP logprobs 0 .. 20 with and without echo
  adapter              none, or one of the two (HTTP: "model" names it)
  ignore_eos, request_id (up to 256 bytes), HTTP stream_options, user, n/best_of 1, zero
  presence/frequency penalties, empty logit_bias and suffix
and one request in eight is pushed just past one bound (a field one step outside its range,
17 stop strings, a 1025-byte stop, an adapter not loaded, ...), expecting the named error.
"""
from __future__ import annotations

import json
import os
import random
from typing import Dict, List, Optional

from .checkpoint import load_config
from .server import SOURCE_DIR
from ltm.v1 import ltm_pb2  # noqa: E402  (after .server, which puts the stubs on sys.path)

MODEL = os.path.join(SOURCE_DIR, "models", "kjv-small")
MODEL_NAME = "kjv-small"
TP2_SHARE = 0.35
INVALID_SHARE = 0.125

F32_MAX = 3.4028234663852886e38
F32_TINY = 1.401298464324817e-45   # the least positive float (a denormal)
F32_MIN_NORMAL = 1.1754943508222875e-38
F32_ABOVE_ONE = 1.0000001192092896  # the float after 1
INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1

TEMPERATURES = [0.0, F32_TINY, 1e-40, F32_MIN_NORMAL, 1e-30, 1e-6, 0.05, 0.7, 1.0, 1.3, 10.0,
                1e4, 1e30, 3e38, F32_MAX]
TOP_PS = [F32_TINY, 1e-38, 1e-6, 0.05, 0.5, 0.9, 0.999999, 1.0]
PENALTIES = [F32_TINY, 1e-40, 1e-38, 1e-20, 1e-3, 0.5, 0.9, 1.0, 1.1, 1.5, 2.0, 1e3, 1e20, 3e38,
             F32_MAX]
SEEDS = [0, 1, 7, 12345, 2**31, 2**32 + 1, 2**63 - 1, 2**63, UINT64_MAX]
TEXTS = ["And the LORD said unto Moses", "In the beginning", "a", "\n", " ", "LORD",
         "And it came to pass, when the king heard the words of the book of the law,",
         "Grüße aus Köln — naïve café, ünïcödé ✓", "日本語のテキストと中文", "🙂 emoji 🚀",
         " leading space and\ttab", "Line one\n\nLine two: 3.14159 + 2 = ?", "\"quoted\" {json: [1]}",
         "\u0000 nul and \u007f del", "zzzzzzzzzzzzzzzzzzzz", "the the the the the the the the"]
SINGLE_BYTE_STOPS = ["a", "e", " ", "\n", ",", ".", "L", ":", "0"]
STOPS = ["the", " LORD", "And", "é", "🙂", "unto", "\n\n", "x" * 1024, "é" * 512, "🙂" * 256,
         "a" * 1023 + "e", "and the"]


# ---- the model -------------------------------------------------------------------------------

class Shape:
    def __init__(self, model: str):
        cfg = load_config(model)
        self.config = cfg
        self.context = cfg["n_positions"]
        self.vocab = cfg["vocab_size"]
        self.eos = cfg["eos_token_id"]


SHAPE = Shape(MODEL)


# ---- drawing cases -----------------------------------------------------------------------------

def maybe(rng: random.Random, p: float, values):
    """A value from `values` with probability p, else None (the field unset)."""
    return rng.choice(values) if rng.random() < p else None


def draw_ids(rng: random.Random, n: int) -> List[int]:
    ids = [rng.randrange(SHAPE.vocab) for _ in range(n)]
    kind = rng.random()
    if kind < 0.15:
        ids[0] = SHAPE.eos
    elif kind < 0.3:
        ids[-1] = SHAPE.eos
    elif kind < 0.45:
        for _ in range(rng.randint(1, 4)):
            ids[rng.randrange(n)] = SHAPE.eos
    elif kind < 0.5:
        ids = [SHAPE.eos] * n
    elif kind < 0.55:
        ids[rng.randrange(n)] = 0
        ids[rng.randrange(n)] = SHAPE.vocab - 1
    return ids


def draw_stops(rng: random.Random) -> List[str]:
    r = rng.random()
    if r < 0.6:
        return []
    if r < 0.75:
        return [rng.choice(SINGLE_BYTE_STOPS)]
    n = rng.choice([1, 2, 3, 16]) if r < 0.97 else 16
    return [rng.choice(SINGLE_BYTE_STOPS + STOPS) for _ in range(n)]


def draw_max_new(rng: random.Random, room: int) -> Optional[int]:
    """max new tokens for a prompt leaving `room` tokens of context: mostly small, sometimes the
    whole room."""
    r = rng.random()
    if r < 0.15 and room >= 16:
        return None  # the default, 16
    if r < 0.88:
        return rng.randint(1, min(8, room))
    if r < 0.95:
        return rng.randint(1, room)
    return room


class Case:
    """One request: `door` (grpc, grpc_stream, http, http_stream), `target` (tp1, tp2), the
    abstract fields, and `expect`: None (valid) or the field a named error must name."""

    def __init__(self, index: int, door: str, target: str):
        self.index, self.door, self.target = index, door, target
        self.f: Dict[str, object] = {}
        self.expect: Optional[str] = None
        self.expect_code = "INVALID_ARGUMENT"
        self.n_prompt: Optional[int] = None  # known prompt length in tokens (id prompts)
        self.http_extra: Dict[str, object] = {}
        self.http_prompt_form = "plain"

    @property
    def grpc(self) -> bool:
        return self.door.startswith("grpc")

    @property
    def stream(self) -> bool:
        return self.door.endswith("stream")

    def copy(self) -> "Case":
        c = Case(self.index, self.door, self.target)
        c.f = dict(self.f)
        c.expect, c.expect_code, c.n_prompt = self.expect, self.expect_code, self.n_prompt
        c.http_extra = dict(self.http_extra)
        c.http_prompt_form = self.http_prompt_form
        return c

    # ---- rendering ----

    def grpc_request(self) -> ltm_pb2.GenerateRequest:
        f = self.f
        req = ltm_pb2.GenerateRequest(stop=list(f.get("stop", [])),
                                      return_logprobs=bool(f.get("logprobs") is not None),
                                      request_id=f.get("request_id", ""),
                                      ignore_eos=bool(f.get("ignore_eos", False)),
                                      adapter=f.get("adapter", ""))
        if "prompt" in f:
            req.prompt = f["prompt"]
        if "ids" in f:
            req.prompt_token_ids.extend(f["ids"])
        for name, key in (("max_new_tokens", "max_new"), ("temperature", "temperature"),
                          ("top_k", "top_k"), ("top_p", "top_p"),
                          ("repetition_penalty", "repetition_penalty"), ("seed", "seed")):
            if f.get(key) is not None:
                setattr(req, name, f[key])
        return req

    def http_body(self) -> dict:
        f = self.f
        body: Dict[str, object] = {}
        if f.get("adapter"):
            body["model"] = f["adapter"]
        elif self.http_prompt_form != "no-model":
            body["model"] = MODEL_NAME
        prompt = f["prompt"] if "prompt" in f else f["ids"]
        body["prompt"] = [prompt] if self.http_prompt_form == "list" else prompt
        for name, key in (("max_tokens", "max_new"), ("temperature", "temperature"),
                          ("top_k", "top_k"), ("top_p", "top_p"),
                          ("repetition_penalty", "repetition_penalty"), ("seed", "seed"),
                          ("logprobs", "logprobs")):
            if f.get(key) is not None:
                body[name] = f[key]
        stop = f.get("stop", [])
        if len(stop) == 1 and self.index % 2 == 0:
            body["stop"] = stop[0]
        elif stop:
            body["stop"] = list(stop)
        if f.get("ignore_eos"):
            body["ignore_eos"] = True
        if f.get("echo"):
            body["echo"] = True
        if self.stream:
            body["stream"] = True
        body.update(self.http_extra)
        return body

    def describe(self) -> str:
        if self.grpc:
            from google.protobuf import json_format
            msg = json_format.MessageToJson(self.grpc_request(), indent=None)
            return f"{self.target} {self.door} GenerateRequest {msg}"
        return f"{self.target} {self.door} POST /v1/completions {json.dumps(self.http_body())}"


def draw_valid(rng: random.Random, case: Case, texts: Dict[str, int]) -> None:
    f = case.f
    if rng.random() < 0.45:
        text = rng.choice(list(texts))
        f["prompt"] = text
        n = texts[text]
    else:
        r = rng.random()
        n = (rng.randint(1, 8) if r < 0.6 else rng.randint(9, 100) if r < 0.85
             else rng.choice([SHAPE.context - 2, SHAPE.context - 1]) if r < 0.93
             else rng.randint(101, SHAPE.context - 1))
        f["ids"] = draw_ids(rng, n)
    case.n_prompt = n
    f["max_new"] = draw_max_new(rng, SHAPE.context - n)
    f["temperature"] = maybe(rng, 0.8, TEMPERATURES)
    f["top_k"] = maybe(rng, 0.5, [0, 1, 2, 5, 40, SHAPE.vocab - 1, SHAPE.vocab, SHAPE.vocab + 1,
                                  INT32_MAX] + ([-1] if not case.grpc else []))
    f["top_p"] = maybe(rng, 0.5, TOP_PS)
    f["repetition_penalty"] = maybe(rng, 0.55, PENALTIES)
    f["seed"] = maybe(rng, 0.6, SEEDS + ([-1, -(2**63)] if not case.grpc else []))
    f["stop"] = draw_stops(rng)
    f["ignore_eos"] = rng.random() < 0.5
    f["adapter"] = rng.choice(["", "", "", "p", "q"])
    if case.grpc:
        f["logprobs"] = 1 if rng.random() < 0.4 else None
        r = rng.random()
        f["request_id"] = ("" if r < 0.7 else "r" * rng.randint(1, 256) if r < 0.9
                           else "é" * 128 if r < 0.95 else "req-" + str(case.index))
    else:
        f["logprobs"] = rng.choice([0, 1, 5, 20]) if rng.random() < 0.45 else None
        f["echo"] = rng.random() < 0.35
        r = rng.random()
        case.http_prompt_form = "list" if r < 0.2 else "no-model" if r < 0.3 else "plain"
        extra = case.http_extra
        if case.stream and rng.random() < 0.4:
            extra["stream_options"] = {"include_usage": rng.random() < 0.7}
        for key, values in (("n", [1]), ("best_of", [1]), ("presence_penalty", [0, 0.0]),
                            ("frequency_penalty", [0]), ("logit_bias", [{}]), ("suffix", [""]),
                            ("user", ["", "u" * 300, "ünï"])):
            if rng.random() < 0.08:
                extra[key] = rng.choice(values)
        for key in ("temperature", "top_p", "repetition_penalty", "top_k", "max_new", "seed",
                    "logprobs"):
            if f.get(key) is None and rng.random() < 0.05:
                extra[{"max_new": "max_tokens"}.get(key, key)] = None  # null = unset (OpenAI)


def push_past_a_bound(rng: random.Random, case: Case) -> None:
    """Moves one field just outside what validation accepts; sets case.expect to its name."""
    f = case.f
    n = case.n_prompt
    grpc_ = case.grpc
    choices = [
        ("max_new", lambda: SHAPE.context - n + 1, "max_new"),
        ("max_new", lambda: 0, "max_new"),
        ("temperature", lambda: -F32_TINY, "temperature"),
        ("top_p", lambda: 0.0, "top_p"),
        ("top_p", lambda: F32_ABOVE_ONE, "top_p"),
        ("repetition_penalty", lambda: 0.0, "repetition_penalty"),
        ("repetition_penalty", lambda: -1.0, "repetition_penalty"),
        ("top_k", lambda: -2 if not grpc_ else -1, "top_k"),
        ("stop", lambda: ["x"] * 17, "stop"),
        ("stop", lambda: ["y" * 1025], "stop"),
        ("stop", lambda: ["a", ""], "stop"),
        ("ids", lambda: [1] * SHAPE.context, "ids"),
        ("ids", lambda: [3, SHAPE.vocab, 5], "ids"),
        ("adapter", lambda: "not-loaded", "adapter"),
    ]
    if grpc_:
        choices += [("request_id", lambda: "r" * 257, "request_id"),
                     ("adapter", lambda: "a" * 129, "adapter-long")]
    else:
        choices += [("temperature", lambda: 1e39, "temperature"),       # a finite double, inf as float
                    ("top_p", lambda: 1e-46, "top_p"),                  # > 0 as a double, 0 as float
                    ("repetition_penalty", lambda: 1e-46, "repetition_penalty"),
                    ("repetition_penalty", lambda: 1e39, "repetition_penalty"),
                    ("logprobs", lambda: 21, "logprobs"),
                    ("logprobs", lambda: -1, "logprobs"),
                    ("max_new", lambda: INT32_MAX + 1, "max_new"),
                    ("ids", lambda: [-1], "ids"),
                    ("ids", lambda: [], "ids"),
                    ("extra:n", lambda: 2, "n"),
                    ("extra:best_of", lambda: 3, "best_of"),
                    ("extra:presence_penalty", lambda: 0.5, "presence_penalty"),
                    ("extra:frequency_penalty", lambda: 2.5, "frequency_penalty"),
                    ("extra:logit_bias", lambda: {"1": 5}, "logit_bias"),
                    ("extra:suffix", lambda: "x", "suffix"),
                    ("extra:temperature", lambda: "hot", "temperature"),
                    ("extra:seed", lambda: 1.5, "seed")]
        if not case.stream:
            choices.append(("extra:stream_options", lambda: {"include_usage": True},
                            "stream_options"))
    key, value, what = rng.choice(choices)
    v = value()
    if key.startswith("extra:"):
        case.http_extra[key[len("extra:"):]] = v
    elif key == "ids":
        f.pop("prompt", None)
        f["ids"] = v
        case.n_prompt = len(v)
        if f.get("max_new") is not None and len(v) + f["max_new"] > SHAPE.context:
            f["max_new"] = 1
    else:
        f[key] = v
        case.http_extra.pop({"max_new": "max_tokens"}.get(key, key), None)  # no null override
    grpc_names = {"max_new": "max_new_tokens", "ids": "prompt_token_ids", "adapter-long": "adapter"}
    http_names = {"max_new": "max_tokens", "ids": "prompt", "adapter": "model",
                  "adapter-long": "model"}
    case.expect = (grpc_names if grpc_ else http_names).get(what, what)
    if what == "adapter":
        case.expect_code = "NOT_FOUND"
    if key == "adapter" and not grpc_:
        case.http_prompt_form = "plain"


def draw_cases(seed: int, count: int, texts: Dict[str, int]) -> List[Case]:
    rng = random.Random(seed)
    doors = ["grpc", "grpc_stream", "http", "http_stream"]
    cases = []
    for i in range(count):
        case = Case(i, rng.choice(doors), "tp2" if rng.random() < TP2_SHARE else "tp1")
        draw_valid(rng, case, texts)
        if rng.random() < INVALID_SHARE:
            push_past_a_bound(rng, case)
        cases.append(case)
    # The boundary corners once each, whatever the draw: the request first.
    corners = []
    for door in doors:
        for target in ("tp1", "tp2"):
            c = Case(len(cases) + len(corners), door, target)
            c.f = dict(prompt="And the LORD said unto Moses", max_new=4, temperature=0.0,
                       repetition_penalty=1e-40, stop=[])
            c.n_prompt = None
            corners.append(c)
    return corners + cases


def long_texts() -> List[str]:
    """Text prompts near the context: their token counts are asked of the server."""
    return [" the" * (SHAPE.context - 2), " the" * (SHAPE.context // 2),
            "And the LORD spake unto Moses, saying, " * 20, "é" * 200, "🙂" * 60]
