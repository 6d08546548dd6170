"""An independent PyTorch implementation of the Llama family's forward pass (as HF's
LlamaForCausalLM, MistralForCausalLM without a sliding window, and Qwen2ForCausalLM compute it),
the reference that ltm's logits and generations are compared with.

Written from the models' equations, not from ltm's code (transformers is not imported: Debian
does not ship it). For tokens x_0..x_{n-1}:

  h = embed[x]
  per layer:  a = RMSNorm(h) * w_in                 RMSNorm(v) = v / sqrt(mean(v^2) + eps)
              q = a Wq^T (+ bq), k = a Wk^T (+ bk), v = a Wv^T (+ bv)      [n, heads, head_dim]
              q, k = RoPE(q), RoPE(k)                rotate-half: v cos + rotate_half(v) sin,
                                                     rotate_half([v1, v2]) = [-v2, v1],
                                                     angle of pair i at position p: p * inv_freq_i,
                                                     inv_freq_i = theta^(-2i / head_dim), then
                                                     rope_scaling (linear: / factor; llama3: by
                                                     wavelength, below)
              query head j reads KV head j // (n_head / n_kv_head)      (HF repeat_kv)
              o = softmax(q k^T / sqrt(head_dim) + causal mask) v
              h = h + o Wo^T (+ bo)
              m = RMSNorm(h) * w_post
              h = h + (silu(m Wg^T) * (m Wu^T)) Wd^T
  logits = (RMSNorm(h) * w_norm) W_head^T, W_head = lm_head, or embed when tied

Computes in float64 by default, so the reference's own rounding does not eat into the tolerance.
"""
import math
from typing import Dict, List, Optional

import torch

from .reference import _int8_groups, _quantize_groups

from .llama_checkpoint import has_o_bias, has_qkv_bias, head_dim_of
from .reference import greedy


def rope_inv_freq(config: dict) -> torch.Tensor:
    """inv_freq [head_dim / 2] in float64, after rope_scaling (none, "linear", "llama3")."""
    hd = head_dim_of(config)
    theta = float(config.get("rope_theta", 10000.0))
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    scaling = config.get("rope_scaling")
    if scaling is None:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor  # the same as dividing the positions by factor
    if kind == "llama3":
        # Frequencies whose wavelength exceeds original_max_position / low_freq_factor are
        # divided by factor; those shorter than original_max_position / high_freq_factor kept;
        # in between, interpolated linearly in original_max_position / wavelength.
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_scaling type {kind!r} is not in the reference")


def rotate_half(v: torch.Tensor) -> torch.Tensor:
    half = v.shape[-1] // 2
    return torch.cat((-v[..., half:], v[..., :half]), dim=-1)


class LlamaReference:
    def __init__(self, weights: Dict[str, torch.Tensor], config: dict,
                 dtype: torch.dtype = torch.float64, weight_round: Optional[torch.dtype] = None,
                 kv_round: Optional[torch.dtype] = None, rope: bool = True,
                 kv_map: Optional[str] = None, act_round: Optional[torch.dtype] = None,
                 int8_tp: int = 1):
        """weights: names without "model." (ltm_testing.llama_checkpoint.load_llama_checkpoint).
        weight_round: round the weight matrices (and embedding / head) to this dtype first, what a
        runtime holding 16-bit weights computes with; norms and biases stay. Or "int8": every
        matrix quantized symmetrically per output row and group of 32 along its input with an
        fp16 scale (max |w| / 127), and the input of each projection and of the head per row and
        group of 32 (scale kept exact): what --weight-dtype int8 computes (reference.py's rule).
        int8_tp: with "int8", the tensor-parallel degree whose slices are quantized: the
        row-parallel o_proj and down_proj (and their inputs) in int8_tp equal slices of their
        input, each slice in groups of its own, as each rank quantizes its own.
        kv_round: round K and V to this dtype before attention (a 16-bit KV cache).
        act_round: round the inputs of the projections and the head to this dtype when 16 or
        more positions are computed together (a CPU's bf16 dot-product GEMMs in prefill).
        rope=False and kv_map="modulo" (query head j reads KV head j % n_kv_head) build
        deliberately wrong models, to show that a test would see the difference."""
        if config.get("model_type") == "mistral" and config.get("sliding_window") is not None:
            raise ValueError("sliding_window is not in the reference")

        self.int8_tp = int8_tp

        def rounded(name, v):
            if weight_round == "int8" and v.dim() == 2:
                # Linear weights [out, in] and the embedding [vocab, d] both reduce over dim 1.
                parts = self._slices(name, v)
                return torch.cat([_int8_groups(p.to(torch.float64)) for p in parts], 1).to(dtype)
            if weight_round is not None and v.dim() == 2:
                v = v.to(weight_round)
            return v.to(dtype)
        self.w = {k: rounded(k, v) for k, v in weights.items()}
        self.act_int8 = weight_round == "int8"
        self.config = config
        self.dtype = dtype
        self.kv_round = kv_round
        self.n_layer = config["num_hidden_layers"]
        self.n_head = config["num_attention_heads"]
        self.n_kv = config.get("num_key_value_heads") or self.n_head
        self.hd = head_dim_of(config)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.qkv_bias = has_qkv_bias(config)
        self.o_bias = has_o_bias(config)
        self.inv_freq = rope_inv_freq(config) if rope else None
        self.kv_map = kv_map
        self.act_round = act_round
        head = "lm_head.weight"
        self.head = self.w[head] if head in self.w and not config.get(
            "tie_word_embeddings", False) else self.w["embed_tokens.weight"]

    def _norm(self, x, name):
        # HF computes RMSNorm in fp32 whatever the activations' dtype; float64 here.
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.w[name + ".weight"]

    def _slices(self, name, v):
        """v [rows, in] as the slices of `in` whose groups are quantized apart."""
        if self.int8_tp > 1 and ("o_proj" in name or "down_proj" in name):
            return torch.chunk(v, self.int8_tp, dim=1)
        return [v]

    def _round_rows(self, x, name=""):
        if self.act_int8:
            out = []
            for part in self._slices(name, x):
                q, s = _quantize_groups(part, scale_f16=False)
                out.append((q * s).reshape(part.shape[0], -1)[:, : part.shape[1]])
            return torch.cat(out, 1).to(self.dtype)
        if self.act_round is not None and x.shape[0] >= 16:
            return x.to(self.act_round).to(self.dtype)
        return x

    def _linear(self, x, name, bias):
        y = self._round_rows(x, name) @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if bias else y

    def _rope(self, v, n):
        """v [heads, n, head_dim] at positions 0..n-1."""
        if self.inv_freq is None:
            return v
        angle = torch.arange(n, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        angle = torch.cat((angle, angle), dim=-1)  # [n, head_dim]
        cos, sin = angle.cos().to(self.dtype), angle.sin().to(self.dtype)
        return v * cos + rotate_half(v) * sin

    def kv_head_of(self, j: int) -> int:
        if self.kv_map == "modulo":
            return j % self.n_kv
        return j // (self.n_head // self.n_kv)

    def logits(self, ids: List[int]) -> torch.Tensor:
        """Logits [len(ids), vocab] of every position (full recompute, no cache)."""
        n, hd = len(ids), self.hd
        x = self.w["embed_tokens.weight"][torch.tensor(ids)]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        kv_index = torch.tensor([self.kv_head_of(j) for j in range(self.n_head)])
        for l in range(self.n_layer):
            p = f"layers.{l}."
            a = self._norm(x, p + "input_layernorm")
            q = self._linear(a, p + "self_attn.q_proj", self.qkv_bias)
            k = self._linear(a, p + "self_attn.k_proj", self.qkv_bias)
            v = self._linear(a, p + "self_attn.v_proj", self.qkv_bias)
            q = self._rope(q.view(n, self.n_head, hd).transpose(0, 1), n)
            k = self._rope(k.view(n, self.n_kv, hd).transpose(0, 1), n)
            v = v.view(n, self.n_kv, hd).transpose(0, 1)
            if self.kv_round is not None:
                k = k.to(self.kv_round).to(self.dtype)
                v = v.to(self.kv_round).to(self.dtype)
            k, v = k[kv_index], v[kv_index]  # [n_head, n, hd]
            att = (q @ k.transpose(1, 2)) / math.sqrt(hd)
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            o = (att @ v).transpose(0, 1).reshape(n, self.n_head * hd)
            x = x + self._linear(o, p + "self_attn.o_proj", self.o_bias)
            m = self._norm(x, p + "post_attention_layernorm")
            gate = self._linear(m, p + "mlp.gate_proj", False)
            up = self._linear(m, p + "mlp.up_proj", False)
            x = x + self._linear(torch.nn.functional.silu(gate) * up, p + "mlp.down_proj", False)
        return self._round_rows(self._norm(x, "norm")) @ self.head.T

    def greedy(self, ids: List[int], n_new: int, eos: Optional[int] = None) -> List[int]:
        return greedy(self.logits, ids, n_new, eos)
