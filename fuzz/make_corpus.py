#!/usr/bin/python3
"""Writes the seed corpus fuzz/corpus/<target>/ (valid inputs of each parser). Run from anywhere;
the output is committed, so run it again only when a format changes.
Needs Debian's python3-protobuf and the stubs of a build (LTM_PYTHON_STUBS or build/python)."""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.environ.get("LTM_PYTHON_STUBS", os.path.join(ROOT, "build", "python")))
from ltm.v1 import ltm_pb2  # noqa: E402


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    header, blobs, off = {}, b"", 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs += data
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blobs


f32 = lambda n: struct.pack(f"<{n}f", *[0.25 * i for i in range(n)])
out("safetensors_header_fuzz", "f32", safetensors([("wte.weight", "F32", [3, 2], f32(6)),
                                                   ("ln_f.bias", "F32", [2], f32(2))]))
out("safetensors_header_fuzz", "mixed", safetensors(
    [("a", "F16", [2, 2], b"\x00\x3c" * 4), ("b", "BF16", [3], b"\x80\x3f" * 3),
     ("c", "I8", [4], b"\x01\x02\x03\x04"), ("s", "F32", [], f32(1))], {"format": "pt"}))
out("safetensors_header_fuzz", "empty", safetensors([]))

names = ["wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight", "ln_f.weight",
         "ln_f.bias"]
shard = "model-00001-of-00001.safetensors"
out("safetensors_index_fuzz", "index", json.dumps(
    {"metadata": {"total_size": 1000}, "weight_map": {n: shard for n in names}}))
out("safetensors_index_fuzz", "prefixed", json.dumps(
    {"weight_map": {"transformer." + n: shard for n in names}}))

# lora_adapter_fuzz: adapter_config.json, a NUL, adapter_model.safetensors, for the fuzz target's
# base model (n_embd 8, 2 layers, n_inner 16).
LORA_SHAPES = {"attn.c_attn": (8, 24), "attn.c_proj": (8, 8), "mlp.c_fc": (8, 16),
               "mlp.c_proj": (16, 8)}


def lora(config, r, dtype, layout, prefix="base_model.model.transformer.", tail=".weight"):
    pack = {"F32": lambda n: f32(n), "F16": lambda n: b"\x00\x34" * n,  # 0.25
            "BF16": lambda n: b"\x80\x3e" * n}[dtype]  # 0.25
    tensors = []
    for layer, modules in layout:
        for m in modules:
            n_in, n_out = LORA_SHAPES[m]
            name = f"{prefix}h.{layer}.{m}"
            tensors.append((name + ".lora_A" + tail, dtype, [r, n_in], pack(r * n_in)))
            tensors.append((name + ".lora_B" + tail, dtype, [n_out, r], pack(n_out * r)))
    return json.dumps(config).encode() + b"\0" + safetensors(tensors, {"format": "pt"})


out("lora_adapter_fuzz", "all-f32", lora(
    {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["c_attn", "c_proj", "c_fc"],
     "fan_in_fan_out": True, "bias": "none", "modules_to_save": None},
    2, "F32", [(0, list(LORA_SHAPES)), (1, list(LORA_SHAPES))]))
out("lora_adapter_fuzz", "qkv-f16-rslora", lora(
    {"r": 1, "lora_alpha": 2.5, "use_rslora": True, "target_modules": ["attn.c_attn"]},
    1, "F16", [(0, ["attn.c_attn"])]))
out("lora_adapter_fuzz", "fc-bf16-default", lora(
    {"peft_type": "LORA", "r": 4, "target_modules": "c_fc", "use_dora": False},
    4, "BF16", [(1, ["mlp.c_fc"])], prefix="base_model.model.", tail=".default.weight"))

for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
    with open(os.path.join(ROOT, "configs", name), "rb") as f:
        out("model_config_fuzz", name, f.read())
out("model_config_fuzz", "hf-gpt2", json.dumps(
    {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_ctx": 1024,
     "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
     "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "bos_token_id": 50256,
     "eos_token_id": 50256, "tie_word_embeddings": True}))
out("model_config_fuzz", "sinusoidal", json.dumps(
    {"vocab_size": 101, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4,
     "position_embedding_type": "sinusoidal", "eos_token_id": None}))


def vec(v):
    return struct.pack("<i", len(v)) + struct.pack(f"<{len(v)}i", *v)


def plan(kind, want, token_ids, positions, slots, offsets, ctx, tables, max_blocks, rows, sampling,
         adapters=(), adapter_id=0, max_rank=0, adapter_dir=b""):
    b = struct.pack("<Iii", 0x4c544d34, kind, want)  # "LTM4"

    for v in (token_ids, positions, slots, offsets, ctx, tables):
        b += vec(v)
    b += struct.pack("<i", max_blocks) + vec(rows) + vec(list(adapters))
    b += struct.pack("<iii", adapter_id, max_rank, len(adapter_dir)) + adapter_dir
    b += struct.pack("<i", len(sampling))
    # The optional tail of a row: want_logprob (default 1), target (-1), top_n (-1).
    for t, k, p, r, seed, idx, hist, *tail in sampling:
        want_logprob, target, top_n = (list(tail) + [1, -1, -1][len(tail):])[:3]
        b += struct.pack("<fiffQi", t, k, p, r, seed, idx) + vec(hist)
        b += struct.pack("<iii", want_logprob, target, top_n)
    return b


out("step_plan_fuzz", "prefill", plan(1, 0, [15496, 11, 995], [0, 1, 2], [0, 1, 2], [0, 3], [3],
                                      [0], 1, [2], [(0.0, 0, 1.0, 1.0, 7, 0, [])]))
out("step_plan_fuzz", "decode2", plan(1, 1, [5, 9], [3, 7], [3, 23], [0, 1, 2], [4, 8],
                                      [0, 0, 1, 2], 2, [0, 1],
                                      [(0.8, 40, 0.9, 1.0, 1, 3, []),
                                       (1.0, 0, 1.0, 1.3, 2, 7, [1, 2, 3, 4, 5, 6, 7, 9])]))
out("step_plan_fuzz", "lora-mixed", plan(1, 0, [5, 9], [3, 7], [3, 23], [0, 1, 2], [4, 8],
                                        [0, 0, 1, 2], 2, [0, 1],
                                        [(0.0, 0, 1.0, 1.0, 1, 3, [], 0), (0.0, 0, 1.0, 1.0, 2, 7, [])],
                                        adapters=[0, 3]))
out("step_plan_fuzz", "score-prompt", plan(1, 0, [5, 9, 11], [0, 1, 2], [0, 1, 2], [0, 3], [3],
                                          [0], 1, [0, 1, 2],
                                          [(0.0, 0, 1.0, 1.0, 1, 0, [], 1, 9, 5),
                                           (0.0, 0, 1.0, 1.0, 1, 0, [], 1, 11, 5),
                                           (0.0, 0, 1.0, 1.0, 1, 0, [], 1, -1, 20)]))
out("step_plan_fuzz", "lora-load", plan(4, 0, [], [], [], [0], [], [], 0, [], [], adapter_id=3,
                                        max_rank=64, adapter_dir=b"/srv/lora/sql"))
out("step_plan_fuzz", "shutdown", plan(2, 0, [], [], [], [0], [], [], 0, [], []))
out("step_plan_fuzz", "keepalive", plan(3, 0, [], [], [], [0], [], [], 0, [], []))

for i, text in enumerate(["Hello, world!", "Grüße aus Köln — naïve café ✓", "日本語のテキストと中文",
                          "🙂 emoji 🚀\n\n  spaces\tand tabs 3.14159", "<|endoftext|> it's I'm we'll",
                          "a" * 200]):
    out("tokenizer_fuzz", f"text{i}", text.encode())
out("tokenizer_fuzz", "invalid-utf8", b"ab\xff\xfe\xc3(\xed\xa0\x80z")

# tokenizer_json_fuzz: a small tokenizer.json, a NUL, a text. Byte-level (GPT-2's alphabet: bytes
# '!'..'~', 0xA1..0xAC, 0xAE..0xFF as themselves, the others from U+0100 in order) with a Llama-3
# style Split, and SentencePiece-style with byte fallback.
_printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
_spell, _extra = {}, 0
for _b in range(256):
    if _b in _printable:
        _spell[_b] = chr(_b)
    else:
        _spell[_b] = chr(0x100 + _extra)
        _extra += 1
_bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
_vocab = {_spell[b]: b for b in range(256)}
_vocab.update({"he": 256, "ll": 257, "hell": 258, "\u0120w": 259})
byte_level_json = {
    "added_tokens": [{"id": 260, "content": "<|bos|>", "special": True, "normalized": False},
                     {"id": 261, "content": "[M]", "lstrip": True, "rstrip": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                                               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
         "behavior": "Isolated", "invert": False}, _bl]},
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<|bos|>"}}, {"Sequence": {"id": "A"}}],
                       "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [260]}}},
    "decoder": _bl,
    "model": {"type": "BPE", "ignore_merges": True, "vocab": _vocab,
              "merges": ["h e", "l l", ["he", "ll"], "\u0120 w"]}}
out("tokenizer_json_fuzz", "byte-level",
    json.dumps(byte_level_json).encode() + b"\0<|bos|>hello world [M] 123 \xc3\xa9\n")
_sp = "\u2581"
_sp_vocab = {"<unk>": 0, "<s>": 1}
_sp_vocab.update({f"<0x{b:02X}>": 2 + b for b in range(256)})
_sp_vocab.update({_sp: 258, "a": 259, "b": 260, _sp + "a": 261, _sp + "ab": 262})
sentencepiece_json = {
    "added_tokens": [{"id": 1, "content": "<s>", "special": True, "normalized": False}],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": _sp},
        {"type": "Replace", "pattern": {"String": " "}, "content": _sp}]},
    "pre_tokenizer": None,
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
                       "special_tokens": {"<s>": {"id": "<s>", "ids": [1]}}},
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": _sp}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
              "vocab": _sp_vocab, "merges": [[_sp, "a"], [_sp + "a", "b"]]}}
out("tokenizer_json_fuzz", "sentencepiece",
    json.dumps(sentencepiece_json).encode() + b"\0ab a \xc3\xa9<s>b")
sentencepiece_json["normalizer"] = None
sentencepiece_json["pre_tokenizer"] = {"type": "Metaspace", "replacement": _sp,
                                       "prepend_scheme": "first", "split": True}
sentencepiece_json["decoder"] = {"type": "Metaspace", "replacement": _sp, "prepend_scheme": "first"}
out("tokenizer_json_fuzz", "metaspace",
    json.dumps(sentencepiece_json).encode() + b"\0<s>ab ab\xff")

reqs = [ltm_pb2.GenerateRequest(prompt="Hello, my name is", max_new_tokens=8),
        ltm_pb2.GenerateRequest(prompt_token_ids=[15496, 11, 995], max_new_tokens=4,
                                temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.2,
                                seed=42, stop=["\n", "."], return_logprobs=True,
                                request_id="req-1", ignore_eos=True),
        ltm_pb2.GenerateRequest(prompt="Grüße 🙂", stop=["x" * 1024] * 16, request_id="r" * 256),
        ltm_pb2.GenerateRequest(prompt="Hello", max_new_tokens=4, adapter="sql-lora")]
for i, r in enumerate(reqs):
    out("request_fuzz", f"req{i}", r.SerializeToString())
out("request_fuzz", "many-stops", b"".join(b"\x4a\x01x" for _ in range(100)))
# Known fields of the wrong wire type (temperature as a varint, max_new_tokens as fixed32, stop
# as fixed64): protobuf keeps them as unknown fields, the precheck counts them so.
out("request_fuzz", "wrong-wire-types", b"\x20\x01" * 40 + b"\x1d\x01\x02\x03\x04" * 20
    + b"\x49" + bytes(8) + b"\x0a\x02hi")
completions = [
    {"prompt": "Hello, my name is", "max_tokens": 8},
    {"model": "gpt2", "prompt": [15496, 11, 995], "max_tokens": 4, "temperature": 0.7,
     "top_p": 0.9, "top_k": 40, "n": 1, "stop": ["\n", "."], "seed": 42, "stream": True,
     "stream_options": {"include_usage": True}, "logprobs": 5, "echo": True,
     "presence_penalty": 0, "frequency_penalty": 0, "user": "u", "repetition_penalty": 1.1,
     "ignore_eos": True, "logit_bias": {}},
    {"prompt": ["Grüße 🙂"], "stop": "x", "max_tokens": None, "suffix": None},
    {"prompt": [[1, 2, 3]], "top_k": -1, "seed": -5},
]
for i, c in enumerate(completions):
    out("completion_json_fuzz", f"body{i}", json.dumps(c, ensure_ascii=(i % 2 == 0)))
out("completion_json_fuzz", "nested", "[" * 40 + "]" * 40)
# What common/json_parse.h refuses, naming the field: a duplicate key, a number past a double,
# past a float, a lone surrogate, nesting past 64 levels; and many keys, which it reads.
out("completion_json_fuzz", "duplicate-key", '{"prompt": "hi", "stop": ["a"], "stop": "b"}')
out("completion_json_fuzz", "number-range",
    '{"prompt": [1, 2], "temperature": 1e400, "top_p": 1e39, "seed": 123456789012345678901234}')
out("completion_json_fuzz", "lone-surrogate", '{"prompt": "a\\ud800", "user": "\\udc00b"}')
out("completion_json_fuzz", "deep-field", '{"prompt": "x", "extra": ' + "[" * 65 + "]" * 65 + "}")
out("completion_json_fuzz", "many-keys",
    '{"prompt": "x"' + "".join(f', "k{i}": {i}' for i in range(200)) + "}")


def sampler_input(t, top_p, penalty, top_k, seed, flags, cut, row):
    return struct.pack("<fffiQBH", t, top_p, penalty, top_k, seed, flags, cut) + struct.pack(
        f"<{len(row)}f", *row)


nan, inf = float("nan"), float("inf")
out("sampler_fuzz", "greedy", sampler_input(0.0, 1.0, 1.0, 0, 1, 0, 2, [1.0, 3.0, -2.0, 0.5]))
out("sampler_fuzz", "penalty-tiny", sampler_input(0.0, 1.0, 1e-40, 0, 2, 7, 1, [3.0, -2.0, 1.0]))
out("sampler_fuzz", "top-k-p", sampler_input(0.8, 0.9, 1.3, 3, 3, 9, 5,
                                            [float(i % 7) - 3.0 for i in range(64)]))
out("sampler_fuzz", "nan-row", sampler_input(1.0, 0.5, 1.0, 0, 4, 1, 1, [1.0, nan, 2.0]))
out("sampler_fuzz", "inf-row", sampler_input(1.0, 1.0, 1.0, 2, 5, 1, 2, [1.0, inf, -inf]))
out("sampler_fuzz", "all-neg-inf", sampler_input(0.7, 1.0, 1.0, 0, 6, 0, 1, [-inf] * 5))
out("sampler_fuzz", "extremes", sampler_input(1e-38, 1e-45, 3e38, 1 << 30, 7, 41, 3,
                                             [1e-45, -1e-45, 3e38, -3e38, 0.0, -0.0, 1.0]))

# Chat templates: the differential test's family-style templates, and its one-line features.
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import test_chat_template_reference as chat  # noqa: E402

for name, source in chat.FAMILIES.items():
    out("chat_template_fuzz", name, source)
out("chat_template_fuzz", "features",
    "\n".join(f if isinstance(f, str) else f[0] for f in chat.FEATURES))

print("corpus written to", os.path.join(HERE, "corpus"))
