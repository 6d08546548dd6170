#!/usr/bin/python3
"""Trains ltm's demo model: a small GPT-2 on the King James Bible, on the CPU, from a seed.

    /usr/bin/python3 tools/train_kjv.py --out models/kjv-small [--steps N] [--seed S]

Steps (everything from Debian packages: bible-kjv(-text), python3-torch, python3-regex):
  1. text: tools/kjv_corpus.py (one verse a line; chapter i held out when i % 20 == 19);
  2. vocabulary: tools/bpe_train.py on the training text only (4096 byte-level BPE tokens);
  3. model: GPT-2 (pre-norm blocks, tanh GELU, learned positions, LM head tied to wte), trained
     with AdamW on random windows of the training tokens (order drawn from the seed);
  4. output: an HF GPT-2 folder in float16 - config.json, model.safetensors (written by hand,
     names as HF's GPT2LMHeadModel: transformer.h.0.attn.c_attn.weight in Conv1D [in, out]
     layout), vocab.json, merges.txt - plus train_log.txt with the losses.
Reproducible: the same seed, step count and --threads give the same weights.
"""
import argparse
import json
import math
import os
import struct
import sys
import time
from typing import Dict, List

import numpy as np
import regex
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe_train  # noqa: E402
import kjv_corpus  # noqa: E402


class Encoder:
    """GPT-2 BPE encoding with the merges bpe_train learnt (a cache per pre-token)."""

    def __init__(self, vocab: Dict[str, int], merges: List[tuple]):
        self.vocab = vocab
        self.rank = {m: i for i, m in enumerate(merges)}
        self.b2u = bpe_train.bytes_to_unicode()
        self.pattern = regex.compile(bpe_train.GPT2_PATTERN)
        self.cache: Dict[str, List[int]] = {}

    def _bpe(self, piece: str) -> List[int]:
        w = [self.b2u[b] for b in piece.encode("utf-8")]
        while len(w) > 1:
            pairs = [(self.rank.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(w, w[1:]))]
            r, i = min(pairs)
            if r == 1 << 30:
                break
            a, b = w[i], w[i + 1]
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(a + b)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            w = out
        return [self.vocab[t] for t in w]

    def encode(self, text: str) -> List[int]:
        ids: List[int] = []
        for piece in self.pattern.findall(text):
            got = self.cache.get(piece)
            if got is None:
                got = self.cache[piece] = self._bpe(piece)
            ids.extend(got)
        return ids


class Gpt2(torch.nn.Module):
    def __init__(self, vocab: int, n_pos: int, d: int, n_layer: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.wte = torch.nn.Embedding(vocab, d)
        self.wpe = torch.nn.Embedding(n_pos, d)
        self.blocks = torch.nn.ModuleList()
        for _ in range(n_layer):
            b = torch.nn.Module()
            b.ln_1 = torch.nn.LayerNorm(d, eps=1e-5)
            b.c_attn = torch.nn.Linear(d, 3 * d)
            b.attn_proj = torch.nn.Linear(d, d)
            b.ln_2 = torch.nn.LayerNorm(d, eps=1e-5)
            b.c_fc = torch.nn.Linear(d, 4 * d)
            b.mlp_proj = torch.nn.Linear(4 * d, d)
            self.blocks.append(b)
        self.ln_f = torch.nn.LayerNorm(d, eps=1e-5)
        # GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer).
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.zeros_(p)
            elif "ln_" in name:
                torch.nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                torch.nn.init.normal_(p, 0.0, std)
        self.register_buffer("mask", torch.ones(n_pos, n_pos, dtype=torch.bool).triu(1),
                             persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        d = self.wte.weight.shape[1]
        hd = d // self.n_head
        x = self.wte(idx) + self.wpe.weight[:T]
        for b in self.blocks:
            q, k, v = b.c_attn(b.ln_1(x)).split(d, dim=2)
            q = q.view(B, T, self.n_head, hd).transpose(1, 2)
            k = k.view(B, T, self.n_head, hd).transpose(1, 2)
            v = v.view(B, T, self.n_head, hd).transpose(1, 2)
            att = (q @ k.transpose(2, 3)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(dim=-1)
            o = (att @ v).transpose(1, 2).reshape(B, T, d)
            x = x + b.attn_proj(o)
            x = x + b.mlp_proj(F.gelu(b.c_fc(b.ln_2(x)), approximate="tanh"))
        return self.ln_f(x) @ self.wte.weight.T

    def hf_tensors(self) -> Dict[str, torch.Tensor]:
        """The weights under HF GPT2LMHeadModel's names; Linear [out, in] -> Conv1D [in, out]."""
        t = {"transformer.wte.weight": self.wte.weight, "transformer.wpe.weight": self.wpe.weight}
        for i, b in enumerate(self.blocks):
            h = f"transformer.h.{i}."
            t[h + "ln_1.weight"], t[h + "ln_1.bias"] = b.ln_1.weight, b.ln_1.bias
            t[h + "attn.c_attn.weight"], t[h + "attn.c_attn.bias"] = b.c_attn.weight.T, b.c_attn.bias
            t[h + "attn.c_proj.weight"] = b.attn_proj.weight.T
            t[h + "attn.c_proj.bias"] = b.attn_proj.bias
            t[h + "ln_2.weight"], t[h + "ln_2.bias"] = b.ln_2.weight, b.ln_2.bias
            t[h + "mlp.c_fc.weight"], t[h + "mlp.c_fc.bias"] = b.c_fc.weight.T, b.c_fc.bias
            t[h + "mlp.c_proj.weight"] = b.mlp_proj.weight.T
            t[h + "mlp.c_proj.bias"] = b.mlp_proj.bias
        t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = self.ln_f.weight, self.ln_f.bias
        return t


def write_safetensors_f16(path: str, tensors: Dict[str, torch.Tensor]) -> None:
    """safetensors by hand: u64 header length, JSON header, then the raw little-endian F16 data."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        raw = t.detach().to(torch.float16).contiguous().numpy().astype("<f2").tobytes()
        header[name] = {"dtype": "F16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


@torch.no_grad()
def mean_loss(model: Gpt2, tokens: torch.Tensor, ctx: int, max_windows: int) -> float:
    """Mean next-token loss over non-overlapping ctx-token windows (the first max_windows)."""
    n = min((len(tokens) - 1) // ctx, max_windows)
    x = tokens[: n * ctx].view(n, ctx)
    y = tokens[1: n * ctx + 1].view(n, ctx)
    total = 0.0
    for i in range(0, n, 16):
        logits = model(x[i:i + 16])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i:i + 16].reshape(-1),
                                 reduction="sum").item()
    return total / (n * ctx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16, help="windows per step")
    ap.add_argument("--ctx", type=int, default=256, help="training window = n_positions")
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--torch-state", help="also save the fp32 state dict here (torch.save)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "train_log.txt"), "w")

    def say(msg: str) -> None:
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    train_text, held_text = kjv_corpus.split()
    vocab, merges = bpe_train.train([train_text], args.vocab_size)
    bpe_train.write(args.out, vocab, merges)
    enc = Encoder(vocab, merges)
    train_ids = torch.tensor(enc.encode(train_text), dtype=torch.long)
    held_ids = torch.tensor(enc.encode(held_text), dtype=torch.long)
    say(f"text: {len(train_text)} training bytes -> {len(train_ids)} tokens; "
        f"{len(held_text)} held-out bytes -> {len(held_ids)} tokens; vocab {len(vocab)}")

    model = Gpt2(len(vocab), args.ctx, args.n_embd, args.n_layer, args.n_head)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model: n_layer={args.n_layer} n_embd={args.n_embd} n_head={args.n_head} "
        f"n_positions={args.ctx}: {n_params} parameters ({2 * n_params / 1e6:.1f} MB in fp16)")
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    start = time.time()
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / args.warmup)
        progress = max(0.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_ids) - args.ctx - 1, (args.batch,), generator=gen)
        x = torch.stack([train_ids[s:s + args.ctx] for s in starts])
        y = torch.stack([train_ids[s + 1:s + args.ctx + 1] for s in starts])
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step == 1:
            el = time.time() - start
            say(f"step {step}/{args.steps} loss {loss.item():.4f} lr {lr:.2e} "
                f"{el:.0f}s elapsed, {el / step * (args.steps - step):.0f}s left")
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            hl = mean_loss(model, held_ids, args.ctx, 32)
            model.train()
            say(f"eval step {step}: held-out loss {hl:.4f} (perplexity {math.exp(hl):.2f}, "
                f"first 32 windows)")

    model.eval()
    hl = mean_loss(model, held_ids, args.ctx, 1 << 30)
    say(f"final: held-out loss {hl:.4f}, perplexity {math.exp(hl):.2f} (all non-overlapping "
        f"{args.ctx}-token windows, fp32 weights); {time.time() - start:.0f}s of training")
    if args.torch_state:
        torch.save(model.state_dict(), args.torch_state)
    write_safetensors_f16(os.path.join(args.out, "model.safetensors"), model.hf_tensors())
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": len(vocab), "n_positions": args.ctx, "n_ctx": args.ctx,
        "n_embd": args.n_embd, "n_layer": args.n_layer, "n_head": args.n_head, "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
        "bos_token_id": len(vocab) - 1, "eos_token_id": len(vocab) - 1,
        "tie_word_embeddings": True, "torch_dtype": "float16",
        "ltm_training": {"tool": "tools/train_kjv.py", "seed": args.seed, "steps": args.steps,
                         "batch": args.batch, "lr": args.lr, "threads": args.threads,
                         "held_out": "chapters i % 20 == 19 of bible-kjv-text"},
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
