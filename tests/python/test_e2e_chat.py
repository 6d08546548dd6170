"""End-to-end tests of chat completions (POST /v1/chat/completions, gRPC Chat and ChatStream):
one-rank servers of a small random model with GPT-2's vocabulary, one without a chat template
and one with a template (loops, conditionals, filters, slicing, raise_exception) and a
generation_config.json (runtime/serve/chat_format.h).

  - usage.prompt_tokens equals the length of the template rendered by Python's jinja2 (with
    transformers' settings) and tokenized by the server's Tokenize RPC, <|endoftext|> matched as
    one token: for one turn and for a system + three-turn conversation; the greedy reply equals a
    completion of exactly those ids;
  - the stream: a first delta with the role, content deltas, a last chunk with finish_reason, the
    usage chunk, data: [DONE]; its text equals the whole reply's;
  - 400s: a message without a role, an unknown role, the template's raise_exception; a model
    without a template says so;
  - generation_config.json's eos_token_id ends the reply (finish_reason "stop", its text absent);
  - gRPC Chat and ChatStream give the HTTP reply; their errors;
  - the official `openai` client for Node (tests/node, installed by scripts/setup) completes a
    chat, whole and streamed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import grpc
import jinja2
import jinja2.sandbox
import pytest

from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.e2e import GPT2_DIR, SMALL
from ltm_testing.http import HttpServer, parse_sse

assert os.environ.get("LTM_WORKER") and GPT2_DIR, "run through ctest (LTM_WORKER, LTM_GPT2_DIR)"

EOT = "<|endoftext|>"
EOT_ID = 50256
NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "node")

# A system-first template in the style of the common families: a default system prompt when the
# conversation has none, alternation checked with raise_exception, roles written with filters.
TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] | trim %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set system = 'You are a helpful assistant.' %}
    {%- set turns = messages %}
{%- endif %}
{{- '<|system|>\\n' ~ system ~ eos_token }}
{%- for m in turns %}
    {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {{- '<|' ~ m['role'] | upper ~ '|>\\n' ~ m['content'] | trim ~ eos_token }}
    {%- if loop.last and turns | length > 2 %}{{ '\\n' }}{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|ASSISTANT|>\\n' }}
{%- endif %}
"""

ONE_TURN = [{"role": "user", "content": "  Who made the light?  "}]
FOUR = [{"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Who made the light?"},
        {"role": "assistant", "content": "God made it, on the first day."},
        {"role": "user", "content": "And the firmament? Ünïcödé ✓"}]


def render_reference(messages) -> str:
    """The template as transformers renders it (its jinja2 environment's settings)."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(TEMPLATE).render(messages=messages, add_generation_prompt=True,
                                            bos_token=EOT, eos_token=EOT)


def reference_ids(client, text: str):
    """Token ids of rendered text: <|endoftext|> as one token, the rest by the Tokenize RPC."""
    ids = []
    for i, part in enumerate(text.split(EOT)):
        if i > 0:
            ids.append(EOT_ID)
        if part:
            ids.extend(client.tokenize(part))
    return ids


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A server of a model with no chat template."""
    path = str(tmp_path_factory.mktemp("chat") / "plain")
    make_checkpoint(path, copy_vocab_from=GPT2_DIR, std=0.2, seed=11, **SMALL)
    with HttpServer(path, ranks=1, tp=1, pp=1, log_dir=str(tmp_path_factory.mktemp("logs")),
                    name="plain") as srv:
        yield srv


@pytest.fixture(scope="module")
def eos_plan(plain):
    """The plain model's greedy reply to FOUR (no end token) and the first token T after the
    second position that is new in it: the chat model's generation_config makes T an eos."""
    with plain.client() as c:
        prompt = reference_ids(c, render_reference(FOUR))
        r = c.generate(prompt_token_ids=prompt, max_new_tokens=12, temperature=0.0,
                       ignore_eos=True)
    tokens = list(r.token_ids)
    k = next(i for i in range(2, len(tokens))
             if tokens[i] not in tokens[:i] and EOT_ID not in tokens[:i + 1])
    return tokens, k


@pytest.fixture(scope="module")
def chat(plain, eos_plan, tmp_path_factory):
    """The same weights with the template and generation_config.json's eos ids [EOT, T]."""
    path = str(tmp_path_factory.mktemp("chat") / "chatty")
    shutil.copytree(plain.model, path)
    tokens, k = eos_plan
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": EOT, "eos_token": EOT, "chat_template": TEMPLATE}, f)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [EOT_ID, tokens[k]]}, f)
    with HttpServer(path, ranks=1, tp=1, pp=1, log_dir=str(tmp_path_factory.mktemp("logs")),
                    name="chat") as srv:
        yield srv


def post_chat(srv, body):
    status, _, data = srv.request("POST", "/v1/chat/completions", body)
    return status, json.loads(data)


def chat_ok(srv, **body):
    status, out = post_chat(srv, body)
    assert status == 200, f"HTTP {status}: {out}\n{srv.log_tail()}"
    return out


@pytest.mark.parametrize("messages", [ONE_TURN, FOUR], ids=["one-turn", "system+3-turns"])
def test_prompt_is_the_template_rendered_by_jinja2(chat, messages):
    with chat.client() as c:
        want = reference_ids(c, render_reference(messages))
    assert want.count(EOT_ID) >= 2 and want[0] == EOT_ID  # bos once, special tokens whole
    out = chat_ok(chat, messages=messages, max_tokens=4, temperature=0, ignore_eos=True)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    assert out["usage"]["prompt_tokens"] == len(want)
    assert out["choices"][0]["message"]["role"] == "assistant"
    # The same ids, not just as many: the greedy reply is the completion of exactly those ids.
    ref = chat.complete(prompt=want, max_tokens=4, temperature=0, ignore_eos=True)
    assert out["choices"][0]["message"]["content"] == ref["choices"][0]["text"]
    assert out["choices"][0]["finish_reason"] == "length"


def test_stream_carries_deltas_and_ends_with_done(chat):
    whole = chat_ok(chat, messages=FOUR, max_tokens=6, temperature=0, ignore_eos=True,
                    logprobs=True, top_logprobs=2)
    conn = chat.connection()
    try:
        body = dict(messages=FOUR, max_completion_tokens=6, temperature=0, ignore_eos=True,
                    stream=True, stream_options={"include_usage": True})
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers=chat.headers())
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
        events = parse_sse(resp)  # checks the stream ends with data: [DONE]
    finally:
        conn.close()
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert len({e["id"] for e in events}) == 1 and events[0]["id"].startswith("chatcmpl-")
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1])
    assert text == whole["choices"][0]["message"]["content"] and text
    assert any(e["choices"][0]["delta"].get("content") for e in events[1:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"] == whole["usage"]
    # logprobs in the chat shape: one entry per token, its bytes, two alternatives.
    lp = whole["choices"][0]["logprobs"]["content"]
    assert len(lp) == 6
    assert b"".join(bytes(e["bytes"]) for e in lp).decode("utf-8", "replace") == text
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in lp)


def test_bad_conversations_are_400s_naming_the_field(chat, plain):
    status, out = post_chat(chat, {"messages": [{"content": "hi"}]})
    assert status == 400 and out["error"]["param"] == "messages[0].role", out
    status, out = post_chat(chat, {"messages": [{"role": "wizard", "content": "hi"}]})
    assert status == 400 and out["error"]["param"] == "messages[0].role", out
    assert "wizard" in out["error"]["message"]
    status, out = post_chat(chat, {"messages": [{"role": "assistant", "content": "hi"}]})
    assert status == 400 and "roles must alternate" in out["error"]["message"], out
    status, out = post_chat(plain, {"messages": ONE_TURN})
    assert status == 400 and "has no chat template" in out["error"]["message"], out
    # Both servers go on serving.
    chat_ok(chat, messages=ONE_TURN, max_tokens=1)


def test_generation_config_eos_ends_the_reply(chat, eos_plan):
    tokens, k = eos_plan
    out = chat_ok(chat, messages=FOUR, max_tokens=12, temperature=0)
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == k + 1
    with chat.client() as c:
        assert out["choices"][0]["message"]["content"] == c.detokenize(tokens[:k])
        # gRPC: the same reply, ended as EOS.
        r = c.chat(FOUR, max_new_tokens=12, temperature=0.0)
        assert list(r.token_ids) == tokens[:k + 1]
        assert r.text == c.detokenize(tokens[:k])
        assert r.finish_reason == 3  # FINISH_REASON_EOS


def test_grpc_chat(chat, plain):
    http = chat_ok(chat, messages=FOUR, max_tokens=5, temperature=0, ignore_eos=True)
    with chat.client() as c:
        r = c.chat(FOUR, max_new_tokens=5, temperature=0.0, ignore_eos=True)
        assert r.text == http["choices"][0]["message"]["content"]
        assert r.usage.prompt_tokens == http["usage"]["prompt_tokens"]
        streamed = list(c.chat_stream(FOUR, max_new_tokens=5, temperature=0.0, ignore_eos=True))
        assert "".join(m.text for m in streamed) == r.text
        assert streamed[-1].finish_reason == 1  # FINISH_REASON_LENGTH
        with pytest.raises(grpc.RpcError) as e:
            c.chat([("", "hi")])
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "messages[0].role is missing" in e.value.details()
    with plain.client() as c:
        with pytest.raises(grpc.RpcError) as e:
            c.chat([("user", "hi")])
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no chat template" in e.value.details()


def test_openai_node_client(chat):
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "openai")):
        pytest.fail("tests/node/node_modules/openai is missing: run scripts/setup "
                    "(scripts/setup_test_npm installs it)")
    model = os.path.basename(chat.model)
    run = subprocess.run(["node", os.path.join(NODE_DIR, "openai_chat.mjs"),
                          f"http://{chat.http_address}/v1", model],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr + chat.log_tail()
    out = json.loads(run.stdout)
    assert out["object"] == "chat.completion" and out["role"] == "assistant"
    assert out["content"] and out["finish_reason"] in ("stop", "length")
    s = out["stream"]
    assert s["role"] == "assistant" and s["text"] == out["content"]
    assert s["finish_reason"] == out["finish_reason"] and s["usage"] == out["usage"]
    with chat.client() as c:
        want = reference_ids(c, render_reference([
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Who made the light?"}]))
    assert out["usage"]["prompt_tokens"] == len(want)
