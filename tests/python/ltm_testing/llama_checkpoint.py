"""Random HF Llama-family folders (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM),
written by hand (no transformers / safetensors packages).

    from ltm_testing.llama_checkpoint import make_llama_checkpoint, load_llama_checkpoint
    w = make_llama_checkpoint(tmp_path, family="llama", hidden_size=96, n_head=12, n_kv_head=4,
                              rope_theta=500000.0, dtype="F32", shards=2)
    w["layers.0.self_attn.k_proj.weight"]   # float32 torch tensor [4 * 8, 96], as stored

Layout written (what HF `save_pretrained` produces for these classes):
  config.json             the family's config keys (LlamaConfig / Qwen2Config / MistralConfig)
  model.safetensors       or model-0000k-of-0000n.safetensors + model.safetensors.index.json
  tokenizer.json          when `tokenizer_from` names a folder with GPT-2's vocab.json and
                          merges.txt: that vocabulary in tokenizer.json form (ids < 50257)
  generation_config.json  bos/eos ids

Stored names: "model.embed_tokens.weight", "model.layers.<i>.input_layernorm.weight",
"model.layers.<i>.self_attn.{q,k,v,o}_proj.{weight,bias}", "model.layers.<i>.post_attention_
layernorm.weight", "model.layers.<i>.mlp.{gate,up,down}_proj.weight", "model.norm.weight",
"lm_head.weight" (absent when the head is tied, as HF saves tied models). Linear weights are
[out, in] (torch.nn.Linear). Returned dicts drop the "model." prefix and keep "lm_head.weight".

Values: matrices and biases N(0, std^2), RMSNorm weights 1 + N(0, std^2), drawn in model order
from torch.Generator(seed), rounded to the checkpoint dtype; the returned float32 tensors are the
rounded values, so a reference model computes with exactly what ltm reads. qk_std: the std of
q_proj and k_proj (about 0.2 gives peaked attention, so a wrong RoPE or head mapping shows).

Biases: Qwen2 always has q/k/v biases (no o bias); Llama and Mistral have q/k/v/o biases only
with attention_bias=True.

CLI:  python3 -m ltm_testing.llama_checkpoint DIR --family qwen2 --preset qwen2-0.5b --dtype BF16
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from .checkpoint import DTYPES, _to_bytes, read_folder, write_model_files
from .tokenizer_files import gpt2_tokenizer_json

FAMILIES = {"llama": ("LlamaForCausalLM", "llama"),
            "qwen2": ("Qwen2ForCausalLM", "qwen2"),
            "mistral": ("MistralForCausalLM", "mistral")}
PREFIX = "model."
GPT2_EOS = 50256

# Shapes of real models (random weights): the speed comparison with llama.cpp uses qwen2-0.5b.
PRESETS = {
    "qwen2-0.5b": dict(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       n_layer=24, n_head=14, n_kv_head=2, rope_theta=1000000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=True,
                       max_position_embeddings=32768),
}


def head_dim_of(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def has_qkv_bias(config: dict) -> bool:
    return config["model_type"] == "qwen2" or bool(config.get("attention_bias", False))


def has_o_bias(config: dict) -> bool:
    return config["model_type"] != "qwen2" and bool(config.get("attention_bias", False))


def tensor_shapes(config: dict) -> List[Tuple[str, Tuple[int, ...]]]:
    """(name without "model.", shape) of every tensor in model order."""
    d, f = config["hidden_size"], config["intermediate_size"]
    hd = head_dim_of(config)
    nq, nkv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    shapes = [("embed_tokens.weight", (config["vocab_size"], d))]
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.append((p + "input_layernorm.weight", (d,)))
        for name, out in (("q_proj", nq), ("k_proj", nkv), ("v_proj", nkv)):
            shapes.append((p + f"self_attn.{name}.weight", (out, d)))
            if has_qkv_bias(config):
                shapes.append((p + f"self_attn.{name}.bias", (out,)))
        shapes.append((p + "self_attn.o_proj.weight", (d, nq)))
        if has_o_bias(config):
            shapes.append((p + "self_attn.o_proj.bias", (d,)))
        shapes += [(p + "post_attention_layernorm.weight", (d,)),
                   (p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
                   (p + "mlp.down_proj.weight", (d, f))]
    shapes.append(("norm.weight", (d,)))
    if not config.get("tie_word_embeddings", False):
        shapes.append(("lm_head.weight", (config["vocab_size"], d)))
    return shapes


def llama_config(family: str = "llama", *, vocab_size: int = 512, hidden_size: int = 96,
                 intermediate_size: int = 160, n_layer: int = 2, n_head: int = 12,
                 n_kv_head: Optional[int] = None, head_dim: Optional[int] = None,
                 rope_theta: float = 10000.0, rope_scaling: Optional[dict] = None,
                 rms_norm_eps: float = 1e-5, tie_word_embeddings: bool = False,
                 attention_bias: bool = False, max_position_embeddings: int = 128,
                 sliding_window: Optional[int] = None, dtype: str = "F32",
                 bos_token_id: Optional[int] = None,
                 eos_token_id: Optional[int] = None) -> dict:
    """config.json of a family, with the keys its HF config class writes."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, not {family!r}")
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    if n_head % n_kv_head != 0:
        raise ValueError(f"n_head={n_head} is not a multiple of n_kv_head={n_kv_head}")
    if head_dim is None and hidden_size % n_head != 0:
        raise ValueError(f"hidden_size={hidden_size} is not divisible by n_head={n_head}")
    arch, model_type = FAMILIES[family]
    last = vocab_size - 1
    config = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "initializer_range": 0.02,
        "rms_norm_eps": rms_norm_eps,
        "use_cache": True,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "attention_dropout": 0.0,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": last if bos_token_id is None else bos_token_id,
        "eos_token_id": last if eos_token_id is None else eos_token_id,
        "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype],
        "transformers_version": "4.45.0",
    }
    if head_dim is not None:
        config["head_dim"] = head_dim
    if family == "llama":
        config.update(attention_bias=attention_bias, mlp_bias=False, pretraining_tp=1)
    elif family == "qwen2":
        # Qwen2's configs carry a window that is off unless use_sliding_window is true.
        config.update(use_sliding_window=False, sliding_window=sliding_window or 32768,
                      max_window_layers=n_layer)
    else:
        config["sliding_window"] = sliding_window  # null: full attention
        if attention_bias:
            config["attention_bias"] = True
    return config


def make_llama_checkpoint(dir: str, family: str = "llama", *, std: float = 0.02,
                          qk_std: Optional[float] = None, seed: int = 0, dtype: str = "F32",
                          shards: int = 1, tokenizer_from: Optional[str] = None,
                          return_weights: bool = True,
                          **config_kwargs) -> Optional[Dict[str, torch.Tensor]]:
    """Writes a random folder into `dir` (created if needed); returns {name without "model.":
    float32 tensor as stored} (None with return_weights=False, for big models).
    config_kwargs: those of llama_config. tokenizer_from: a folder with GPT-2's vocab.json and
    merges.txt; the vocabulary then must be >= 50257 and bos/eos default to <|endoftext|>."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    if tokenizer_from is not None:
        config_kwargs.setdefault("bos_token_id", GPT2_EOS)
        config_kwargs.setdefault("eos_token_id", GPT2_EOS)
    config = llama_config(family, dtype=dtype, **config_kwargs)
    if tokenizer_from is not None and config["vocab_size"] < GPT2_EOS + 1:
        raise ValueError(f"vocab_size={config['vocab_size']} is smaller than GPT-2's 50257")
    os.makedirs(dir, exist_ok=True)

    generator = torch.Generator().manual_seed(seed)
    weights: Dict[str, torch.Tensor] = {}
    records = []
    for name, shape in tensor_shapes(config):
        values = torch.randn(shape, generator=generator, dtype=torch.float32) * std
        if name.endswith("norm.weight"):
            values += 1.0
        if qk_std is not None and name.endswith(("q_proj.weight", "k_proj.weight")):
            values *= qk_std / std
        raw, stored = _to_bytes(values, dtype)
        if return_weights:
            weights[name] = stored
        stored_name = name if name == "lm_head.weight" else PREFIX + name
        records.append((stored_name, dtype, shape, raw))
    write_model_files(dir, records, shards)
    del records

    with open(os.path.join(dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
                  "transformers_version": config["transformers_version"]}
    with open(os.path.join(dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(generation, f, indent=2)
    if tokenizer_from is not None:
        with open(os.path.join(dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(gpt2_tokenizer_json(tokenizer_from), f, ensure_ascii=False)
    return weights if return_weights else None


def load_llama_config(dir: str) -> dict:
    with open(os.path.join(dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def load_llama_checkpoint(dir: str) -> Dict[str, torch.Tensor]:
    """Reads a folder back: {name without "model.": float32 tensor}, "lm_head.weight" included
    when stored."""
    return dict(read_folder(dir, PREFIX))


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a random HF Llama-family folder.")
    parser.add_argument("dir")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="a real model's shape (overrides the shape flags and --family)")
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--hidden-size", type=int, default=96)
    parser.add_argument("--intermediate-size", type=int, default=160)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=12)
    parser.add_argument("--n-kv-head", type=int, default=None)
    parser.add_argument("--rope-theta", type=float, default=10000.0)
    parser.add_argument("--tie", action="store_true", help="tie_word_embeddings")
    parser.add_argument("--std", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="F32")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--tokenizer-from", default=None,
                        help="folder with GPT-2's vocab.json and merges.txt: write tokenizer.json")
    args = parser.parse_args()
    if args.preset is not None:
        shape = dict(PRESETS[args.preset])
    else:
        shape = dict(family=args.family, vocab_size=args.vocab_size,
                     hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
                     n_layer=args.n_layer, n_head=args.n_head, n_kv_head=args.n_kv_head,
                     rope_theta=args.rope_theta, tie_word_embeddings=args.tie)
    family = shape.pop("family")
    make_llama_checkpoint(args.dir, family, std=args.std, seed=args.seed, dtype=args.dtype,
                          shards=args.shards, tokenizer_from=args.tokenizer_from,
                          return_weights=False, **shape)
    config = load_llama_config(args.dir)
    n_params = sum(int(np.prod(s)) for _, s in tensor_shapes(config))
    print(f"wrote {args.dir}: {config['architectures'][0]}, {n_params} parameters, {args.dtype}, "
          f"{args.shards} file(s)")


if __name__ == "__main__":
    main()
