"""tokenizer.json (runtime/text/tokenizer_json.cpp) through ltm-tokenize, against two references.

1. The real GPT-2 vocabulary converted by this test to a tokenizer.json (merges as "a b" strings
   in one file, as ["a", "b"] pairs in another) tokenizes every text of the tokenizer tests
   (test_tokenizer_reference.make_corpus) exactly as vocab.json + merges.txt do.
2. Files made here with small vocabularies trained here on the corpus (no downloads):
   - Llama-3-style: Split with Llama 3's regex (PCRE2 in ltm) + ByteLevel, ignore_merges, special
     and plain added tokens, a TemplateProcessing post-processor adding <|begin_of_text|>; and
     Qwen2-style: the same with Qwen2's regex and an NFC normalizer (ICU in ltm);
   - SentencePiece-style as Llama 2 has it: Prepend + Replace normalizers, no pre-tokenizer,
     byte_fallback, fuse_unk, decoder Replace/ByteFallback/Fuse/Strip, <s> added by the template;
   - SentencePiece-style as Mistral's later files have it: a Metaspace pre-tokenizer
     (prepend_scheme "first") and decoder.
   ltm's ids, with and without the tokens a prompt gets, equal those of Hugging Face's tokenizers
   library on the same file (its Node binding, npm `tokenizers`, tests/node/tokenizers_oracle.mjs)
   on the corpus, on texts with added tokens and on random Unicode (seeded); ltm's decode equals
   the library's and gives the text back.

Needs $LTM_TOKENIZE, $LTM_GPT2_DIR, node and tests/node/node_modules/tokenizers (scripts/setup
installs them); without the npm package the comparisons with the library skip, saying so.
"""

import collections
import json
import os
import random
import shutil
import subprocess

import pytest

from ltm_testing.tokenizer_files import ALPHABET, gpt2_tokenizer_json, spell
from test_tokenizer_reference import make_corpus

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "node")
ORACLE = os.path.join(NODE_DIR, "tokenizers_oracle.mjs")

# Llama 3's pre-tokenizer regex (as its tokenizer.json spells it).
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2's: digits one at a time.
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")


def _env_path(name, hint):
    value = os.environ.get(name)
    if not value or not os.path.exists(value):
        pytest.fail(f"${name} is not set or does not exist: {hint}")
    return value


@pytest.fixture(scope="module")
def tokenize_tool():
    return _env_path("LTM_TOKENIZE", "build the ltm-tokenize target (tests/tools/ltm_tokenize.cpp)")


@pytest.fixture(scope="module")
def gpt2_dir():
    return _env_path("LTM_GPT2_DIR", "run scripts/fetch_gpt2_vocab and point it at the folder")


@pytest.fixture(scope="module")
def oracle():
    node = shutil.which("node")
    if node is None or not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "tokenizers")):
        pytest.skip("node or the npm package `tokenizers` is missing: run scripts/setup_test_npm")
    return node


def run_lines(cmd, lines):
    stdin = "".join(json.dumps(s) + "\n" for s in lines)
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}): {proc.stderr[-2000:]}"
    out = proc.stdout.split("\n")  # not splitlines(): JSON may hold a raw U+2028
    if out and out[-1] == "":
        out.pop()
    assert len(out) == len(lines), f"{cmd[0]}: {len(out)} lines for {len(lines)} inputs"
    return [json.loads(line) for line in out]


def ours(tool, folder, texts, mode=None):
    return run_lines([tool, folder] + ([mode] if mode else []), texts)


def ours_decoded(tool, folder, id_lists):
    return [bytes(b).decode("utf-8") for b in run_lines([tool, folder, "--decode"], id_lists)]


def write_folder(tmp_path, name, tokenizer):
    folder = tmp_path / name
    folder.mkdir()
    with open(folder / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    return str(folder)


# ---- texts ---------------------------------------------------------------------------------------

_RANDOM_RANGES = [
    (0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x530, 0x58F), (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F),
    (0x10A0, 0x10FF), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x20A0, 0x20BF), (0x2100, 0x218F),
    (0x2190, 0x23FF), (0x2460, 0x24FF), (0x3000, 0x303F), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
    (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF),
]


def random_unicode(n=200, seed=20261202):
    """Strings of code points drawn from many blocks (assigned and unassigned ones, controls,
    spaces of every kind, marks), seeded."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 40)):
            first, last = rng.choice(_RANDOM_RANGES)
            chars.append(chr(rng.randint(first, last)))
        out.append("".join(chars))
    return out


def texts_with(added, seed):
    """Corpus sentences with added tokens put in at random places, glued or spaced."""
    rng = random.Random(seed)
    base = make_corpus(60, seed=seed)
    out = []
    for s in base:
        parts = [s[:len(s) // 2], rng.choice(added), s[len(s) // 2:]]
        if rng.random() < 0.5:
            parts.insert(0, rng.choice(added))
        if rng.random() < 0.3:
            parts.append(" " + rng.choice(added) + " ")
        out.append("".join(parts))
    return out + [a for a in added] + [added[0] + added[0], " " + added[-1]]


# ---- small BPE trainers (the test's own vocabularies) --------------------------------------------

def train_merges(words, n_merges):
    """Classic BPE: `words` maps a tuple of symbols to its count; returns the merge pairs in
    order (most frequent pair first, ties by the pair itself for determinism)."""
    words = {tuple(w): c for w, c in words.items()}
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        merged = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        words = merged
    return merges


def training_words():
    counts = collections.Counter()
    for s in make_corpus(300, seed=7):
        for i, w in enumerate(s.split(" ")):
            if w:
                counts[(" " if i else "") + w] += 1
    return counts


def llama3_style_json(qwen2=False):
    """Llama 3's layout; qwen2: Qwen2's (NFC normalizer, its regex, merges not ignored)."""
    counts = training_words()
    words = {tuple(spell(bytes([b])) for b in w.encode("utf-8")): c for w, c in counts.items()}
    merges = train_merges(words, 400)
    vocab = {ALPHABET[b]: i for i, b in enumerate(range(256))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    n = len(vocab)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>"]
    added = [{"id": n + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(specials)]
    added.append({"id": n + len(specials), "content": "<think>", "single_word": False,
                  "lstrip": False, "rstrip": False, "normalized": False, "special": False})
    added.append({"id": n + len(specials) + 1, "content": "[MASK]", "single_word": False,
                  "lstrip": True, "rstrip": True, "normalized": False, "special": True})
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"} if qwen2 else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX if qwen2 else LLAMA3_REGEX},
             "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [n],
                                                      "tokens": ["<|begin_of_text|>"]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": not qwen2,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }, specials + ["<think>", "[MASK]"]


def sentencepiece_style_json(metaspace):
    """Llama 2's layout (metaspace False) or Mistral's later one (True). The vocabulary has the
    code points seen at least 3 times in training: the others go through byte fallback."""
    counts = training_words()
    chars = collections.Counter()
    for w, c in counts.items():
        for ch in w.replace(" ", "\u2581"):
            chars[ch] += c
    alphabet = sorted(ch for ch, c in chars.items() if c >= 3)
    alphabet_set = set(alphabet) | {"\u2581"}
    words = {}
    for w, c in counts.items():
        word = "\u2581" + w.lstrip(" ")
        if all(ch in alphabet_set for ch in word):
            words[tuple(word)] = words.get(tuple(word), 0) + c
    merges = train_merges(words, 400)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in ["\u2581"] + alphabet:
        vocab.setdefault(ch, len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(["<unk>", "<s>", "</s>"])]
    added.append({"id": len(vocab), "content": "[INST]", "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": False, "special": True})
    bos = {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
    template = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": "<s>", "type_id": 1}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": bos}
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>",
             "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
             "byte_fallback": True, "ignore_merges": False, "vocab": vocab,
             "merges": [f"{a} {b}" for a, b in merges]}
    if metaspace:
        metaspace_step = {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "first", "split": False}
        return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                "normalizer": None, "pre_tokenizer": metaspace_step,
                "post_processor": template, "decoder": metaspace_step,
                "model": model}, ["<s>", "</s>", "[INST]"]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None, "post_processor": template,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": model,
    }, ["<s>", "</s>", "[INST]"]


# ---- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("pair_merges", [False, True], ids=["merges_strings", "merges_pairs"])
def test_gpt2_tokenizer_json_matches_vocab_and_merges(tokenize_tool, gpt2_dir, tmp_path,
                                                      pair_merges):
    folder = write_folder(tmp_path, "gpt2_json", gpt2_tokenizer_json(gpt2_dir, pair_merges))
    corpus = make_corpus()
    want = ours(tokenize_tool, gpt2_dir, corpus)
    got = ours(tokenize_tool, folder, corpus)
    bad = [(s, a, b) for s, a, b in zip(corpus, got, want) if a != b]
    for s, a, b in bad[:5]:
        print(f"  {s!r}\n    json   {a}\n    merges {b}")
    assert not bad, f"{len(bad)} of {len(corpus)} texts tokenize differently"
    # The added token is matched whole (vocab.json + merges.txt spell it out).
    assert ours(tokenize_tool, folder, ["<|endoftext|>", "a<|endoftext|>b"]) == [
        [50256], [64, 50256, 65]]


def test_both_formats_tokenizer_json_wins(tokenize_tool, gpt2_dir, tmp_path):
    folder = write_folder(tmp_path, "both", gpt2_tokenizer_json(gpt2_dir, False))
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(gpt2_dir, f), folder)
    assert ours(tokenize_tool, folder, ["<|endoftext|>"]) == [[50256]]
    os.remove(os.path.join(folder, "tokenizer.json"))
    assert ours(tokenize_tool, folder, ["<|endoftext|>"]) == [[27, 91, 437, 1659, 5239, 91, 29]]


def compare_with_library(tokenize_tool, oracle, folder, texts, round_trip):
    path = os.path.join(folder, "tokenizer.json")
    ref = run_lines([oracle, ORACLE, path], texts)
    got = ours(tokenize_tool, folder, texts)
    got_prompt = ours(tokenize_tool, folder, texts, "--prompt")
    bad = [(s, a, r["ids"]) for s, a, r in zip(texts, got, ref) if a != r["ids"]]
    for s, a, b in bad[:5]:
        print(f"  {s!r}\n    ltm {a}\n    hf  {b}")
    assert not bad, f"{len(bad)} of {len(texts)} texts tokenize differently from the library"
    bad = [(s, a, r["prompt_ids"]) for s, a, r in zip(texts, got_prompt, ref)
           if a != r["prompt_ids"]]
    assert not bad, f"with special tokens: {bad[:3]}"
    decoded = ours_decoded(tokenize_tool, folder, [r["ids"] for r in ref])
    bad = [(s, d, r["decoded"]) for s, d, r in zip(texts, decoded, ref) if d != r["decoded"]]
    for s, d, h in bad[:5]:
        print(f"  {s!r}\n    ltm {d!r}\n    hf  {h!r}")
    assert not bad, f"{len(bad)} of {len(texts)} decode differently from the library"
    if round_trip:
        bad = [(s, d) for s, d in zip(texts, decoded) if d != s]
        assert not bad, f"decode(encode(s)) != s for {len(bad)} texts, e.g. {bad[:3]}"
    print(f"compared {len(texts)} texts, {sum(len(r['ids']) for r in ref)} tokens")


@pytest.mark.parametrize("style", ["llama3", "qwen2", "llama2", "metaspace"])
def test_matches_hf_tokenizers(tokenize_tool, oracle, tmp_path, style):
    if style in ("llama3", "qwen2"):
        tokenizer, added = llama3_style_json(qwen2=style == "qwen2")
    else:
        tokenizer, added = sentencepiece_style_json(metaspace=style == "metaspace")
    folder = write_folder(tmp_path, style, tokenizer)
    corpus = make_corpus(300, seed=99)
    # The Metaspace decoder has no ByteFallback: byte tokens decode as their spelling there;
    # NFC changes the text.
    round_trip = style not in ("metaspace", "qwen2")
    compare_with_library(tokenize_tool, oracle, folder, corpus, round_trip)
    compare_with_library(tokenize_tool, oracle, folder, random_unicode(), round_trip)
    # Added tokens (lstrip/rstrip ones too) in the text: decoded, they come back with the
    # whitespace they took, so no round trip is asked of them.
    compare_with_library(tokenize_tool, oracle, folder, texts_with(added, seed=5), False)
