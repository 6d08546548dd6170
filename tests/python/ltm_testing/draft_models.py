"""Draft models for speculative decoding tests and benchmarks (--speculative draft):

  truncated_copy(src, dst, n_layer)  an HF GPT-2 folder cut to its first n_layer blocks (the
                                     embeddings, final LayerNorm and tokenizer files as they are):
                                     a cheaper draft that agrees with the full model often;
  random_draft(dst, vocab_size)      a random-weight GPT-2 of that vocabulary: its greedy guesses
                                     are mostly rejected.

CLI:  python3 -m ltm_testing.draft_models truncate SRC DST --n-layer 1
      python3 -m ltm_testing.draft_models random DST --vocab-size 4096
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil

from ltm_testing.checkpoint import SINGLE_FILE, make_checkpoint, read_safetensors, write_model_files

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json")
_BLOCK = re.compile(r"^(transformer\.)?h\.(\d+)\.")


def truncated_copy(src: str, dst: str, n_layer: int) -> str:
    with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if not 1 <= n_layer <= config["n_layer"]:
        raise ValueError(f"n_layer {n_layer} not in [1, {config['n_layer']}]")
    os.makedirs(dst, exist_ok=True)
    records = []
    for name, (dtype, shape, array) in read_safetensors(os.path.join(src, SINGLE_FILE)).items():
        m = _BLOCK.match(name)
        if m and int(m.group(2)) >= n_layer:
            continue
        records.append((name, dtype, shape, array.tobytes()))
    write_model_files(dst, records)
    config["n_layer"] = n_layer
    config.pop("ltm_training", None)
    with open(os.path.join(dst, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    for file in TOKENIZER_FILES:
        if os.path.exists(os.path.join(src, file)):
            shutil.copy(os.path.join(src, file), os.path.join(dst, file))
    return dst


def random_draft(dst: str, vocab_size: int, n_layer: int = 1, n_embd: int = 64,
                 n_positions: int = 256, seed: int = 3) -> str:
    make_checkpoint(dst, vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd,
                    n_layer=n_layer, n_head=4, seed=seed, std=0.2)
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description="Make a draft model folder.")
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("truncate")
    t.add_argument("src")
    t.add_argument("dst")
    t.add_argument("--n-layer", type=int, default=1)
    r = sub.add_parser("random")
    r.add_argument("dst")
    r.add_argument("--vocab-size", type=int, required=True)
    args = parser.parse_args()
    if args.what == "truncate":
        print(truncated_copy(args.src, args.dst, args.n_layer))
    else:
        print(random_draft(args.dst, args.vocab_size))


if __name__ == "__main__":
    main()
