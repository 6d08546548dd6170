"""An independent PyTorch implementation of GPT-2's forward pass (as HF GPT2LMHeadModel computes
it), used as the reference that ltm's logits and generations are compared with.

Written from the model's definition, not from ltm's code: pre-norm blocks, fused c_attn (Conv1D:
[in, out] weights), causal softmax attention, tanh GELU, tied LM head. Computes in float64 by
default, so the reference's own rounding does not eat into the 1e-4 tolerance.
"""
import math
from typing import Dict, List, Optional

import torch


def _quantize_groups(x: torch.Tensor, scale_f16: bool):
    """Rows of x [r, k] in groups of 32 along k (zero-padded): int8 values q [r, g, 32] and the
    groups' scales s [r, g, 1] (max |x| / 127, rounded to fp16 if scale_f16), q = round(x / s)."""
    r, k = x.shape
    kp = (k + 31) // 32 * 32
    xp = torch.zeros(r, kp, dtype=torch.float64)
    xp[:, :k] = x.to(torch.float64)
    g = xp.view(r, kp // 32, 32)
    s = g.abs().amax(dim=2, keepdim=True) / 127.0
    if scale_f16:
        s = s.to(torch.float16).to(torch.float64)
    q = torch.where(s > 0, torch.round(g / torch.where(s > 0, s, torch.ones_like(s))),
                    torch.zeros_like(g)).clamp(-127, 127)
    return q, s


def _int8_groups(w: torch.Tensor) -> torch.Tensor:
    """w [out, k] quantized per row and group of 32 along k, fp16 scales, dequantized."""
    q, s = _quantize_groups(w, scale_f16=True)
    return (q * s).reshape(w.shape[0], -1)[:, : w.shape[1]]


class Gpt2Reference:
    def __init__(self, weights: Dict[str, torch.Tensor], config: dict,
                 dtype: torch.dtype = torch.float64, attn_scale: Optional[float] = None,
                 weight_round=None,
                 kv_round: Optional[torch.dtype] = None, lora=None):
        """attn_scale: the factor on q k^T (default 1 / sqrt(d_k), as GPT-2); another value
        builds a deliberately wrong model, to show that a test would see the difference.
        weight_round: round the weight matrices and the tied embedding to this dtype first (what
        a runtime holding 16-bit weights computes with; biases, norms and positions stay), or
        "int8": quantize them symmetrically in groups of 32 along the reduction dimension with an
        fp16 scale per group (max |w| / 127), and quantize the activations each of them multiplies
        the same way, per row and group of 32 (scale kept exact): what --weight-dtype int8 computes.
        kv_round: round K and V to this dtype before attention (a 16-bit KV cache).
        lora: a LoRA adapter in PEFT's layout (ltm_testing.lora.Lora: {"h.<i>.<module>":
        (A [r, in], B [out, r])} and its scale alpha / r): each adapted linear layer computes
        h = x W + b + scale * x A^T B^T."""
        def rounded(name, v):
            matrix = name == "wte.weight" or (name.endswith(".weight") and v.dim() == 2
                                              and name != "wpe.weight")
            if weight_round == "int8" and matrix:
                # Conv1D weights are [in, out] (reduce over rows); the embedding [vocab, d] is
                # used as E^T (reduce over its columns).
                v = v.to(torch.float64)
                return (_int8_groups(v.T).T if name != "wte.weight" else _int8_groups(v)).to(dtype)
            if weight_round is not None and matrix:
                v = v.to(weight_round)
            return v.to(dtype)
        self.act_int8 = weight_round == "int8"
        self.w = {k: rounded(k, v) for k, v in weights.items()}
        self.kv_round = kv_round
        self.n_layer = config["n_layer"]
        self.n_head = config["n_head"]
        self.d = config["n_embd"]
        self.eps = config.get("layer_norm_epsilon", 1e-5)
        self.sinusoidal = config.get("position_embedding_type") == "sinusoidal"
        self.dtype = dtype
        self.attn_scale = attn_scale
        self.lora = {} if lora is None else {
            k: (a.to(dtype), b.to(dtype)) for k, (a, b) in lora.pairs.items()}
        self.lora_scale = 1.0 if lora is None else lora.scale

    def _linear(self, x, name):
        """x W + b for the Conv1D `name` ("h.0.attn.c_attn"), plus its LoRA update if any."""
        y = self._act(x) @ self.w[name + ".weight"] + self.w[name + ".bias"]
        if name in self.lora:
            a, b = self.lora[name]
            y = y + self.lora_scale * ((x @ a.T) @ b.T)
        return y

    def _positions(self, n: int) -> torch.Tensor:
        if not self.sinusoidal:
            return self.w["wpe.weight"][:n]
        pos = torch.arange(n, dtype=torch.float64)[:, None]
        i2 = torch.arange(0, self.d, 2, dtype=torch.float64)[None, :]
        angle = pos / torch.pow(10000.0, i2 / self.d)
        pe = torch.zeros(n, self.d, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(angle)
        pe[:, 1::2] = torch.cos(angle)[:, : pe[:, 1::2].shape[1]]
        return pe.to(self.dtype)

    def _ln(self, x, name):
        return torch.nn.functional.layer_norm(x, (self.d,), self.w[name + ".weight"],
                                              self.w[name + ".bias"], self.eps)

    @staticmethod
    def _gelu(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    def logits(self, ids: List[int]) -> torch.Tensor:
        """Logits [len(ids), vocab] of every position (full recompute, no cache)."""
        n = len(ids)
        x = self.w["wte.weight"][torch.tensor(ids)] + self._positions(n)
        hd = self.d // self.n_head
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        for l in range(self.n_layer):
            p = f"h.{l}."
            h = self._ln(x, p + "ln_1")
            qkv = self._linear(h, p + "attn.c_attn")
            q, k, v = qkv.split(self.d, dim=1)
            q = q.view(n, self.n_head, hd).transpose(0, 1)
            k = k.view(n, self.n_head, hd).transpose(0, 1)
            v = v.view(n, self.n_head, hd).transpose(0, 1)
            if self.kv_round is not None:
                k = k.to(self.kv_round).to(self.dtype)
                v = v.to(self.kv_round).to(self.dtype)
            scale = self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(hd)
            att = (q @ k.transpose(1, 2)) * scale
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            o = (att @ v).transpose(0, 1).reshape(n, self.d)
            x = x + self._linear(o, p + "attn.c_proj")
            h = self._ln(x, p + "ln_2")
            f = self._gelu(self._linear(h, p + "mlp.c_fc"))
            x = x + self._linear(f, p + "mlp.c_proj")
        x = self._ln(x, "ln_f")
        return self._act(x) @ self.w["wte.weight"].T

    def _act(self, x):
        """A matrix's input as the weights' kernel takes it: int8 groups with int8 weights."""
        if not self.act_int8:
            return x
        q, s = _quantize_groups(x, scale_f16=False)
        return (q * s).reshape(x.shape[0], -1)[:, : x.shape[1]].to(self.dtype)

    def greedy(self, ids: List[int], n_new: int, eos: Optional[int] = None) -> List[int]:
        return greedy(self.logits, ids, n_new, eos)


def greedy(logits, ids: List[int], n_new: int, eos: Optional[int] = None) -> List[int]:
    """n_new greedy tokens after ids (fewer when eos comes), each from logits(context)[-1]."""
    seq = list(ids)
    out = []
    for _ in range(n_new):
        tok = int(torch.argmax(logits(seq)[-1]))
        out.append(tok)
        seq.append(tok)
        if eos is not None and tok == eos:
            break
    return out
