#!/usr/bin/python3
"""Trains a byte-level BPE vocabulary in GPT-2's format (vocab.json + merges.txt).

The same scheme as OpenAI's GPT-2 encoder, so that any GPT-2 tokenizer (ltm's runtime/text
tokenizer, HF's GPT2Tokenizer) reads the result unchanged:
  - text is split into pre-tokens with GPT-2's regex (Debian's python3-regex for \\p{L}/\\p{N});
  - each pre-token's UTF-8 bytes are spelled with GPT-2's byte-to-unicode alphabet (printable
    Latin-1 bytes stand for themselves, the other 68 bytes map to U+0100..);
  - merges are learnt inside pre-tokens only: repeatedly the most frequent adjacent pair (counted
    over pre-tokens weighted by their frequency) becomes one token. Ties go to the pair that sorts
    first (by its two token strings), so the result depends on the text alone: deterministic.
Ids: the 256 byte tokens first (in byte order), then the merged tokens in merge order, then
"<|endoftext|>" last, as GPT-2 has it. merges.txt starts with "#version: 0.2".

    /usr/bin/python3 tools/bpe_train.py --vocab-size 4096 --out DIR TEXT_FILE...
"""
import argparse
import collections
import heapq
import json
import os
import sys
from typing import Dict, List, Tuple

import regex

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
END_OF_TEXT = "<|endoftext|>"


def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def pretoken_counts(texts: List[str]) -> collections.Counter:
    pattern = regex.compile(GPT2_PATTERN)
    counts: collections.Counter = collections.Counter()
    for text in texts:
        counts.update(pattern.findall(text))
    return counts


def train(texts: List[str], vocab_size: int) -> Tuple[Dict[str, int], List[Tuple[str, str]]]:
    n_merges = vocab_size - 256 - 1
    if n_merges < 0:
        raise ValueError(f"vocab size {vocab_size} is below 257 (256 bytes + {END_OF_TEXT})")
    b2u = bytes_to_unicode()
    words: List[List[str]] = []
    freqs: List[int] = []
    for piece, n in sorted(pretoken_counts(texts).items()):
        words.append([b2u[b] for b in piece.encode("utf-8")])
        freqs.append(n)

    pair_count: Dict[Tuple[str, str], int] = collections.defaultdict(int)
    pair_words: Dict[Tuple[str, str], set] = collections.defaultdict(set)
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += freqs[wi]
            pair_words[(a, b)].add(wi)
    # Max-heap of (-count, pair); entries whose count is stale are skipped when popped.
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)

    merges: List[Tuple[str, str]] = []
    while len(merges) < n_merges and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg or neg == 0:
            continue
        merges.append(pair)
        a, b = pair
        merged = a + b
        touched = set()
        for wi in sorted(pair_words.pop(pair, ())):
            w = words[wi]
            f = freqs[wi]
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= f
                touched.add((x, y))
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] += f
                pair_words[(x, y)].add(wi)
                touched.add((x, y))
        pair_count.pop(pair, None)
        for p in touched:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                pair_count.pop(p, None)
    if len(merges) < n_merges:
        print(f"bpe_train: the text allows only {len(merges)} merges; the vocabulary has "
              f"{256 + len(merges) + 1} tokens", file=sys.stderr)

    vocab = {b2u[b]: b for b in range(256)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab[END_OF_TEXT] = len(vocab)
    return vocab, merges


def write(out_dir: str, vocab: Dict[str, int], merges: List[Tuple[str, str]]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--out", required=True, help="folder for vocab.json and merges.txt")
    ap.add_argument("text", nargs="+", help="UTF-8 text files to learn from")
    args = ap.parse_args()
    texts = []
    for path in args.text:
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    vocab, merges = train(texts, args.vocab_size)
    write(args.out, vocab, merges)
    print(f"bpe_train: {len(vocab)} tokens, {len(merges)} merges -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
