"""PEFT LoRA adapter folders for GPT-2, written by hand (the peft package is not in Debian).

    from ltm_testing.lora import make_adapter
    lora = make_adapter(dir, config, r=4, alpha=8, modules=["attn.c_attn", "mlp.c_proj"], seed=1)
    lora.scale                     # alpha / r
    lora.pairs["h.0.attn.c_attn"]  # (A [r, in], B [out, r]) float32 torch tensors, as stored

Layout written (what PEFT's save_pretrained writes for a GPT2LMHeadModel with LoraConfig):
  adapter_config.json         peft_type LORA, r, lora_alpha, target_modules, fan_in_fan_out true
                              (GPT-2's Conv1D), bias "none", task_type CAUSAL_LM
  adapter_model.safetensors   base_model.model.transformer.h.<i>.<module>.lora_A.weight [r, in]
                              and .lora_B.weight [out, r] for every (layer, module) given

Values are N(0, std^2) (PEFT initialises B to zero; a trained adapter's B is not, and a zero B
would test nothing). `layout` maps a layer to the modules it adapts when not every layer adapts
the same ones.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ltm_testing.checkpoint import _to_bytes, write_safetensors

MODULES = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
PREFIX = "base_model.model.transformer."


def module_shape(config: dict, module: str) -> Tuple[int, int]:
    d = config["n_embd"]
    d_ff = config.get("n_inner") or 4 * d
    return {"attn.c_attn": (d, 3 * d), "attn.c_proj": (d, d), "mlp.c_fc": (d, d_ff),
            "mlp.c_proj": (d_ff, d)}[module]


class Lora:
    def __init__(self, pairs: Dict[str, Tuple[torch.Tensor, torch.Tensor]], scale: float):
        self.pairs = pairs
        self.scale = scale


def make_adapter(dir: str, config: dict, *, r: int = 4, alpha: float = 8.0,
                 modules: Sequence[str] = MODULES, layers: Optional[Iterable[int]] = None,
                 layout: Optional[Dict[int, Sequence[str]]] = None, seed: int = 0,
                 std: float = 0.2, dtype: str = "F32", target_modules: Optional[List[str]] = None,
                 prefix: str = PREFIX, extra_config: Optional[dict] = None,
                 extra_tensors: Sequence[Tuple[str, Tuple[int, ...]]] = (),
                 poison: Sequence[Tuple[str, int, float]] = ()) -> Lora:
    """`poison`: (tensor, flat index, value) to store in place of a drawn value, the tensor named
    as "h.<i>.<module>.lora_A" / "...lora_B" (a NaN or an Inf, say)."""
    os.makedirs(dir, exist_ok=True)
    if layout is None:
        layers = range(config["n_layer"]) if layers is None else layers
        layout = {l: list(modules) for l in layers}
    g = torch.Generator().manual_seed(seed)
    records, pairs = [], {}
    for l in sorted(layout):
        for m in layout[l]:
            n_in, n_out = module_shape(config, m)
            a = torch.randn((r, n_in), generator=g) * std
            b = torch.randn((n_out, r), generator=g) * std
            for target, index, value in poison:
                for which, t in (("A", a), ("B", b)):
                    if target == f"h.{l}.{m}.lora_{which}":
                        t.view(-1)[index] = value
            raw_a, a = _to_bytes(a, dtype)
            raw_b, b = _to_bytes(b, dtype)
            name = f"{prefix}h.{l}.{m}"
            records.append((name + ".lora_A.weight", dtype, (r, n_in), raw_a))
            records.append((name + ".lora_B.weight", dtype, (n_out, r), raw_b))
            pairs[f"h.{l}.{m}"] = (a, b)
    for name, shape in extra_tensors:
        t = torch.randn(shape, generator=g) * std
        raw, _ = _to_bytes(t, dtype)
        records.append((name, dtype, tuple(shape), raw))
    write_safetensors(os.path.join(dir, "adapter_model.safetensors"), records, {"format": "pt"})
    used = sorted({m.split(".")[-1] for ms in layout.values() for m in ms})
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha,
           "lora_dropout": 0.0, "target_modules": target_modules or used,
           "fan_in_fan_out": True, "bias": "none", "modules_to_save": None,
           "base_model_name_or_path": "gpt2", "inference_mode": True}
    cfg.update(extra_config or {})
    with open(os.path.join(dir, "adapter_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    return Lora(pairs, alpha / r)
