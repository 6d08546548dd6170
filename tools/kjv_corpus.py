#!/usr/bin/python3
"""The King James Bible as plain text, split into a training part and a held-out part.

Source: Debian's bible-kjv-text package (public domain), read through its own reader, the `bible`
program of bible-kjv (the data file /usr/lib/bible.data is compressed in that program's format).
`bible gen1:1-rev22:21` prints every chapter as a "Book N" heading followed by numbered verses
wrapped at 80 columns; this module turns that into one verse per line, without the verse numbers,
chapters separated by a blank line.

Split (deterministic, by chapter): the 1189 chapters are numbered 0.. in canonical order; chapter
i is held out when i % 20 == 19 (59 chapters, ~5% of the text, spread over the whole book), all
others are training text.

    /usr/bin/python3 tools/kjv_corpus.py OUT_DIR    writes OUT_DIR/train.txt and OUT_DIR/heldout.txt
"""
import os
import re
import subprocess
import sys
from typing import List, Tuple

HELD_OUT_EVERY = 20  # chapter i is held out when i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1

_HEADING = re.compile(r"^([1-3] )?[A-Z][A-Za-z ]+ \d+$")
_VERSE = re.compile(r"^\s+(\d+) (.*)$")


def chapters() -> List[Tuple[str, List[str]]]:
    """[(heading, [verse text, ...])] for every chapter, in order."""
    try:
        raw = subprocess.run(["bible", "-l0", "gen1:1-rev22:21"], check=True,
                             capture_output=True, text=True).stdout
    except FileNotFoundError:
        sys.exit("kjv_corpus: the `bible` program is missing: apt-get install bible-kjv "
                 "bible-kjv-text (scripts/setup installs both)")
    out: List[Tuple[str, List[str]]] = []
    for line in raw.split("\n"):
        if not line.strip():
            continue
        if _HEADING.match(line):
            out.append((line.strip(), []))
            continue
        m = _VERSE.match(line)
        if m:
            out[-1][1].append(m.group(2).strip())
        else:  # continuation of a wrapped verse
            out[-1][1][-1] += " " + line.strip()
    return out


def split() -> Tuple[str, str]:
    """(training text, held-out text)."""
    train, held = [], []
    for i, (_, verses) in enumerate(chapters()):
        (held if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else train).append("\n".join(verses))
    return "\n\n".join(train) + "\n", "\n\n".join(held) + "\n"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    os.makedirs(sys.argv[1], exist_ok=True)
    train, held = split()
    for name, text in (("train.txt", train), ("heldout.txt", held)):
        with open(os.path.join(sys.argv[1], name), "w", encoding="utf-8") as f:
            f.write(text)
        print(f"kjv_corpus: {name}: {len(text)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
