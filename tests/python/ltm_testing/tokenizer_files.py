"""HF tokenizer.json files made from vocabularies the tests have (no downloads).

    from ltm_testing.tokenizer_files import gpt2_tokenizer_json
    tok = gpt2_tokenizer_json(os.environ["LTM_GPT2_DIR"], pair_merges=False)

gpt2_tokenizer_json: the real GPT-2 vocabulary (vocab.json + merges.txt, scripts/fetch_gpt2_vocab)
as the tokenizers library writes it: BPE with the ByteLevel pre-tokenizer, post-processor and
decoder, <|endoftext|> (50256) as a special added token; merges as "a b" strings or, with
pair_merges, as ["a", "b"] pairs (the newer files' spelling).
"""
import json
import os


def byte_alphabet():
    """GPT-2's byte-to-character map: printable Latin-1 bytes stand for themselves, the others
    for U+0100 upwards in byte order."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + extra)
            extra += 1
    return out


ALPHABET = byte_alphabet()


def spell(bs):
    return "".join(ALPHABET[b] for b in bs)


def gpt2_tokenizer_json(gpt2_dir, pair_merges=False):
    with open(os.path.join(gpt2_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(gpt2_dir, "merges.txt"), encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n") if line and not line.startswith("#version")]
    merges = [line.split(" ") for line in lines] if pair_merges else lines
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": True, "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "vocab": vocab, "merges": merges},
    }
