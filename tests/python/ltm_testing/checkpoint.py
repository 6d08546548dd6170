"""Random HF GPT-2 checkpoints, written by hand (no transformers / safetensors packages).

    from ltm_testing.checkpoint import make_checkpoint, load_checkpoint
    weights = make_checkpoint(tmp_path, n_layer=2, n_embd=64, n_head=4, dtype="BF16", shards=3)
    weights["h.0.attn.c_attn.weight"]      # float32 torch tensor [64, 192], exactly as stored

Layout written (what HF `save_pretrained` produces for GPT2LMHeadModel):
  config.json                       GPT2Config keys (n_inner null unless given)
  model.safetensors                 when shards == 1, else
  model.safetensors.index.json      {"metadata": {"total_size": N}, "weight_map": {name: file}}
  model-0000k-of-0000n.safetensors  contiguous groups of tensors in model order
  vocab.json, merges.txt            copied from `copy_vocab_from` when given

Tensor names in returned dicts never carry the "transformer." prefix ("wte.weight",
"h.3.mlp.c_fc.weight", ...); Conv1D weights are [in, out] as in HF. Values: weights and biases
N(0, std^2), LayerNorm weights 1 + N(0, std^2), LayerNorm biases N(0, std^2), all drawn in model
order from torch.Generator(seed), then rounded to the checkpoint dtype; the returned float32
tensors are the rounded values, so a reference model computes with exactly what ltm reads.

CLI:  python3 -m ltm_testing.checkpoint DIR --n-layer 2 --n-embd 64 --n-head 4 --std 0.02 ...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_NUMPY_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "U8": "u1",
                 "I8": "i1", "BOOL": "u1", "I32": "<i4", "I64": "<i8"}
_ELEMENT_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "U8": 1, "I8": 1, "BOOL": 1, "I16": 2,
                 "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
PREFIX = "transformer."
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def tensor_shapes(vocab_size: int, n_positions: int, n_embd: int, n_layer: int,
                  n_inner: Optional[int] = None,
                  sinusoidal: bool = False) -> List[Tuple[str, Tuple[int, ...]]]:
    """(name, shape) of every GPT-2 tensor in model order (same list as ltm's gpt2_tensor_specs)."""
    d = n_embd
    d_ff = n_inner if n_inner is not None else 4 * d
    shapes = [("wte.weight", (vocab_size, d))]
    if not sinusoidal:
        shapes.append(("wpe.weight", (n_positions, d)))
    for i in range(n_layer):
        h = f"h.{i}."
        shapes += [
            (h + "ln_1.weight", (d,)), (h + "ln_1.bias", (d,)),
            (h + "attn.c_attn.weight", (d, 3 * d)), (h + "attn.c_attn.bias", (3 * d,)),
            (h + "attn.c_proj.weight", (d, d)), (h + "attn.c_proj.bias", (d,)),
            (h + "ln_2.weight", (d,)), (h + "ln_2.bias", (d,)),
            (h + "mlp.c_fc.weight", (d, d_ff)), (h + "mlp.c_fc.bias", (d_ff,)),
            (h + "mlp.c_proj.weight", (d_ff, d)), (h + "mlp.c_proj.bias", (d,)),
        ]
    shapes += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    return shapes


def _to_bytes(t: torch.Tensor, dtype: str) -> Tuple[bytes, torch.Tensor]:
    """Rounds a float32 tensor to `dtype`; returns (little-endian bytes, rounded float32)."""
    stored = t.to(DTYPES[dtype])
    if dtype == "BF16":
        raw = stored.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
    else:
        raw = stored.contiguous().numpy().astype(_NUMPY_DTYPES[dtype]).tobytes()
    return raw, stored.to(torch.float32)


def write_safetensors(path: str, tensors: List[Tuple[str, str, Tuple[int, ...], bytes]],
                      metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes (name, dtype, shape, bytes) tuples in the given order; header padded with spaces
    to 8-byte alignment, as the reference implementation does."""
    header: Dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, raw in tensors:
        numel = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
        assert numel * _ELEMENT_SIZE[dtype] == len(raw), (name, dtype, shape, len(raw))
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, raw in tensors:
            f.write(raw)


def _split(sizes: List[int], shards: int) -> List[int]:
    """Shard index of each tensor: contiguous groups of about equal bytes, none empty."""
    total = sum(sizes)
    result, shard, acc = [], 0, 0
    for i, size in enumerate(sizes):
        remaining_tensors = len(sizes) - i
        remaining_shards = shards - shard
        # Move on when this shard has its share, or when every later shard needs a tensor.
        if acc > 0 and shard < shards - 1 and (
                acc + size / 2 > total * (shard + 1) / shards
                or remaining_tensors < remaining_shards):
            shard, acc = shard + 1, 0
        result.append(shard)
        acc += size
    assert result[-1] == shards - 1, "more shards than tensors"
    return result


def write_model_files(dir: str, records: List[Tuple[str, str, Tuple[int, ...], bytes]],
                      shards: int = 1) -> None:
    """Writes (stored name, dtype, shape, bytes) records as HF does: model.safetensors, or
    `shards` files model-0000k-of-0000n.safetensors and model.safetensors.index.json. Removes
    the weight files of an earlier run first, so a rerun into the same folder cannot mix layouts."""
    if shards < 1:
        raise ValueError("shards must be >= 1")
    for old in os.listdir(dir):
        if old == SINGLE_FILE or old == INDEX_FILE or (
                old.startswith("model-") and old.endswith(".safetensors")):
            os.remove(os.path.join(dir, old))
    metadata = {"format": "pt"}
    if shards == 1:
        write_safetensors(os.path.join(dir, SINGLE_FILE), records, metadata)
    else:
        assignment = _split([len(r[3]) for r in records], shards)
        weight_map = {}
        for k in range(shards):
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            group = [r for r, s in zip(records, assignment) if s == k]
            write_safetensors(os.path.join(dir, file), group, metadata)
            weight_map.update({r[0]: file for r in group})
        index = {"metadata": {"total_size": sum(len(r[3]) for r in records)},
                 "weight_map": weight_map}
        with open(os.path.join(dir, INDEX_FILE), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)


def make_checkpoint(dir: str, *, vocab_size: Optional[int] = None, n_positions: int = 64,
                    n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                    n_inner: Optional[int] = None, std: float = 0.02, seed: int = 0,
                    dtype: str = "F32", shards: int = 1, prefix: str = PREFIX,
                    sinusoidal: bool = False, copy_vocab_from: Optional[str] = None,
                    layer_norm_epsilon: float = 1e-5, lm_head: bool = False,
                    mask_buffers: bool = False,
                    qk_std: Optional[float] = None) -> Dict[str, torch.Tensor]:
    """Writes a random GPT-2 checkpoint into `dir` (created if needed) and returns
    {name without prefix: float32 tensor as stored}.

    vocab_size: default 512, or the size of copy_vocab_from/vocab.json when that is given.
    prefix: "transformer." (as HF saves GPT2LMHeadModel) or "" (as HF saves GPT2Model).
    lm_head: also store "lm_head.weight" (a copy of wte, as tied checkpoints sometimes do).
    qk_std: the std of the W^Q and W^K columns of every c_attn.weight (default: std). About 0.2
            makes the attention scores large enough that softmax is far from uniform, so a
            wrong scale or mask moves the logits by far more than a test's tolerance.
    mask_buffers: also store the old HF causal-mask buffers h.<i>.attn.bias (U8 tril) and
                  h.<i>.attn.masked_bias (F32 scalar), which readers must ignore.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    if shards < 1:
        raise ValueError("shards must be >= 1")
    if n_embd % n_head != 0:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
    os.makedirs(dir, exist_ok=True)
    if copy_vocab_from is not None:
        with open(os.path.join(copy_vocab_from, "vocab.json"), encoding="utf-8") as f:
            n_vocab_file = len(json.load(f))
        if vocab_size is None:
            vocab_size = n_vocab_file
        elif vocab_size < n_vocab_file:
            raise ValueError(f"vocab_size={vocab_size} is smaller than the {n_vocab_file} tokens "
                             f"of {copy_vocab_from}/vocab.json")
        for name in ("vocab.json", "merges.txt"):
            shutil.copyfile(os.path.join(copy_vocab_from, name), os.path.join(dir, name))
    if vocab_size is None:
        vocab_size = 512

    generator = torch.Generator().manual_seed(seed)
    weights: Dict[str, torch.Tensor] = {}
    records = []  # (stored name, dtype, shape, bytes)
    for name, shape in tensor_shapes(vocab_size, n_positions, n_embd, n_layer, n_inner,
                                     sinusoidal):
        values = torch.randn(shape, generator=generator, dtype=torch.float32) * std
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            values += 1.0
        if qk_std is not None and name.endswith("attn.c_attn.weight"):
            values[:, : 2 * n_embd] *= qk_std / std  # the Q and K columns
        raw, stored = _to_bytes(values, dtype)
        weights[name] = stored
        records.append((prefix + name, dtype, shape, raw))
    if lm_head:
        records.append(("lm_head.weight", dtype, (vocab_size, n_embd), records[0][3]))
    if mask_buffers:
        masked_bias = struct.pack("<f", -1e4)
        tril = np.tril(np.ones((n_positions, n_positions), dtype=np.uint8)).tobytes()
        for i in range(n_layer):
            records.append((f"{prefix}h.{i}.attn.masked_bias", "F32", (), masked_bias))
        for i in range(n_layer):  # 1-byte elements last, so every F32/F16 tensor stays aligned
            records.append((f"{prefix}h.{i}.attn.bias", "U8",
                            (1, 1, n_positions, n_positions), tril))

    write_model_files(dir, records, shards)

    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab_size,
        "n_positions": n_positions,
        "n_ctx": n_positions,
        "n_embd": n_embd,
        "n_layer": n_layer,
        "n_head": n_head,
        "n_inner": n_inner,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": layer_norm_epsilon,
        "bos_token_id": vocab_size - 1,
        "eos_token_id": vocab_size - 1,
        "tie_word_embeddings": True,
        "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype],
    }
    if sinusoidal:
        config["position_embedding_type"] = "sinusoidal"
    with open(os.path.join(dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return weights


def load_config(dir: str) -> dict:
    """config.json as a dict, with n_inner resolved (4 n_embd when null or absent) and
    n_positions filled from n_ctx when needed."""
    with open(os.path.join(dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if config.get("n_inner") is None:
        config["n_inner"] = 4 * config["n_embd"]
    if "n_positions" not in config:
        config["n_positions"] = config["n_ctx"]
    return config


def read_safetensors(path: str) -> Dict[str, Tuple[str, Tuple[int, ...], np.ndarray]]:
    """{stored name: (dtype, shape, numpy array of the raw elements)}; BF16 comes as uint16."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    result = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        array = np.frombuffer(data[base + begin:base + end], dtype=_NUMPY_DTYPES[entry["dtype"]])
        result[name] = (entry["dtype"], shape, array.reshape(shape))
    return result


def load_checkpoint(dir: str) -> Dict[str, torch.Tensor]:
    """Reads an HF GPT-2 checkpoint folder back: {name without prefix: float32 tensor}.
    Skips lm_head.weight and the attn.bias / attn.masked_bias buffers (as ltm does)."""
    weights: Dict[str, torch.Tensor] = {}
    for name, values in read_folder(dir, PREFIX):
        if name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        weights[name] = values
    return weights


def read_folder(dir: str, prefix: str):
    """Yields (stored name less `prefix`, float32 tensor) for every tensor of an HF folder's
    model.safetensors, or of the files its model.safetensors.index.json names."""
    if os.path.exists(os.path.join(dir, SINGLE_FILE)):
        files = [SINGLE_FILE]
    else:
        with open(os.path.join(dir, INDEX_FILE), encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    for file in files:
        for name, (dtype, shape, array) in read_safetensors(os.path.join(dir, file)).items():
            if name.startswith(prefix):
                name = name[len(prefix):]
            if dtype == "BF16":
                values = (array.astype(np.uint32) << 16).view(np.float32)
            else:
                values = array.astype(np.float32)
            yield name, torch.from_numpy(values.copy()).reshape(shape)


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a random HF GPT-2 checkpoint.")
    parser.add_argument("dir")
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--n-positions", type=int, default=64)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-inner", type=int, default=None)
    parser.add_argument("--std", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="F32")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--prefix", default=PREFIX, help='tensor name prefix ("" for none)')
    parser.add_argument("--sinusoidal", action="store_true")
    parser.add_argument("--copy-vocab-from", default=None,
                        help="folder with vocab.json and merges.txt to copy")
    parser.add_argument("--lm-head", action="store_true", help="also store lm_head.weight")
    parser.add_argument("--mask-buffers", action="store_true",
                        help="also store the attn.bias / attn.masked_bias buffers")
    args = parser.parse_args()
    weights = make_checkpoint(
        args.dir, vocab_size=args.vocab_size, n_positions=args.n_positions, n_embd=args.n_embd,
        n_layer=args.n_layer, n_head=args.n_head, n_inner=args.n_inner, std=args.std,
        seed=args.seed, dtype=args.dtype, shards=args.shards, prefix=args.prefix,
        sinusoidal=args.sinusoidal, copy_vocab_from=args.copy_vocab_from,
        lm_head=args.lm_head, mask_buffers=args.mask_buffers)
    n_params = sum(t.numel() for t in weights.values())
    print(f"wrote {args.dir}: {len(weights)} tensors, {n_params} parameters, {args.dtype}, "
          f"{args.shards} file(s)")


if __name__ == "__main__":
    main()
