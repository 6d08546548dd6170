"""The PyTorch side of scripts/compare: GPT-2 prefill and decode speed in PyTorch on the CPU, on the
same HF checkpoint folder (or config) that ltm-bench reads, printed as one JSON line.

The model is GPT2LMHeadModel's computation written with torch ops (fused QKV, tanh GELU, tied head)
and a KV cache, so decode does one token's work per step as ltm does; weights in float32 or
bfloat16 (torch's CPU bf16 matmul). Greedy, prompt of --prompt-tokens ids, --new-tokens decoded.

    /usr/bin/python3 tools/torch_bench.py --model DIR|config.json [--threads 2] [--dtype f32|bf16]
"""
import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from ltm_testing.checkpoint import load_checkpoint, load_config  # noqa: E402


def random_weights(cfg, seed=1, std=0.02):
    g = torch.Generator().manual_seed(seed)
    d, v, p, f = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg.get("n_inner") or 4 * cfg["n_embd"]
    w = {"wte.weight": torch.randn(v, d, generator=g) * std, "wpe.weight": torch.randn(p, d, generator=g) * std,
         "ln_f.weight": torch.ones(d), "ln_f.bias": torch.zeros(d)}
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        w.update({h + "ln_1.weight": torch.ones(d), h + "ln_1.bias": torch.zeros(d),
                  h + "ln_2.weight": torch.ones(d), h + "ln_2.bias": torch.zeros(d),
                  h + "attn.c_attn.weight": torch.randn(d, 3 * d, generator=g) * std,
                  h + "attn.c_attn.bias": torch.zeros(3 * d),
                  h + "attn.c_proj.weight": torch.randn(d, d, generator=g) * std,
                  h + "attn.c_proj.bias": torch.zeros(d),
                  h + "mlp.c_fc.weight": torch.randn(d, f, generator=g) * std,
                  h + "mlp.c_fc.bias": torch.zeros(f),
                  h + "mlp.c_proj.weight": torch.randn(f, d, generator=g) * std,
                  h + "mlp.c_proj.bias": torch.zeros(d)})
    return w


class Gpt2:
    def __init__(self, w, cfg, dtype):
        self.w = {k: v.to(dtype).contiguous() for k, v in w.items()}
        self.cfg, self.dtype = cfg, dtype
        self.d, self.h, self.L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
        self.eps = cfg.get("layer_norm_epsilon", 1e-5)
        self.wte_t = self.w["wte.weight"].t().contiguous()

    def step(self, ids, pos0, cache):
        """Logits of the last position for `ids` at positions pos0..; cache: per layer (K, V)."""
        n, d, hd = len(ids), self.d, self.d // self.h
        x = self.w["wte.weight"][ids] + self.w["wpe.weight"][pos0:pos0 + n]
        for l in range(self.L):
            p = f"h.{l}."
            a = torch.nn.functional.layer_norm(x, (d,), self.w[p + "ln_1.weight"], self.w[p + "ln_1.bias"], self.eps)
            qkv = torch.addmm(self.w[p + "attn.c_attn.bias"], a, self.w[p + "attn.c_attn.weight"])
            q, k, v = qkv.split(d, dim=1)
            k_all = torch.cat([cache[l][0], k]) if cache[l] is not None else k
            v_all = torch.cat([cache[l][1], v]) if cache[l] is not None else v
            cache[l] = (k_all, v_all)
            t = k_all.shape[0]
            qh = q.view(n, self.h, hd).transpose(0, 1)
            kh = k_all.view(t, self.h, hd).transpose(0, 1)
            vh = v_all.view(t, self.h, hd).transpose(0, 1)
            s = torch.bmm(qh, kh.transpose(1, 2)) * (1.0 / math.sqrt(hd))
            if n > 1:
                mask = torch.ones(n, t, dtype=torch.bool).triu(t - n + 1)
                s = s.masked_fill(mask, float("-inf"))
            o = torch.bmm(s.softmax(-1), vh).transpose(0, 1).reshape(n, d)
            x = x + torch.addmm(self.w[p + "attn.c_proj.bias"], o, self.w[p + "attn.c_proj.weight"])
            a = torch.nn.functional.layer_norm(x, (d,), self.w[p + "ln_2.weight"], self.w[p + "ln_2.bias"], self.eps)
            f = torch.nn.functional.gelu(torch.addmm(self.w[p + "mlp.c_fc.bias"], a, self.w[p + "mlp.c_fc.weight"]),
                                         approximate="tanh")
            x = x + torch.addmm(self.w[p + "mlp.c_proj.bias"], f, self.w[p + "mlp.c_proj.weight"])
        x = torch.nn.functional.layer_norm(x[-1:], (d,), self.w["ln_f.weight"], self.w["ln_f.bias"], self.eps)
        return x @ self.wte_t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if os.path.isdir(a.model):
        cfg, w = load_config(a.model), load_checkpoint(a.model)
    else:
        cfg = json.load(open(a.model))
        w = random_weights(cfg)
    model = Gpt2(w, cfg, torch.float32 if a.dtype == "f32" else torch.bfloat16)
    ids = torch.tensor([(i * 7919 + 13) % cfg["vocab_size"] for i in range(a.prompt_tokens)])
    cache = [None] * cfg["n_layer"]
    with torch.inference_mode():
        t0 = time.perf_counter()
        logits = model.step(ids, 0, cache)
        t1 = time.perf_counter()
        pos = a.prompt_tokens
        for _ in range(a.new_tokens):
            nxt = logits.argmax(-1)
            logits = model.step(nxt, pos, cache)
            pos += 1
        t2 = time.perf_counter()
    print(json.dumps({"engine": "pytorch " + torch.__version__, "model": a.model, "dtype": a.dtype,
                      "threads": a.threads, "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens,
                      "prefill_tokens_per_s": a.prompt_tokens / (t1 - t0),
                      "decode_tokens_per_s": a.new_tokens / (t2 - t1)}))


if __name__ == "__main__":
    main()
