"""A long-context prompt suite for the shipped pair: held-out stdlib files (never trained on), each
cut to its first N tokens at a line end, as `lucebox bench --prompts` JSONL (raw prompts).

    PYTHONPATH=. python -m benchmarks.tiny_pair.long_prompts --tokens 4000 --n 10 --out /tmp/long.jsonl

The draft context window (--draft-window W) only matters once prompt + reply exceed W: the default
suites (~100-200-token prompts) cannot tell W = 1024 from the whole context; this suite can.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.tiny_pair import data
from lucebox import defaults
from lucebox.tokenizer import Tokenizer


def prefix_lines(text: str, tokenizer: Tokenizer, n_tokens: int) -> str | None:
    """The longest run of whole lines of `text` that stays within n_tokens (None if text is shorter)."""
    if len(tokenizer.encode(text)) < n_tokens:
        return None
    lines = text.splitlines(keepends=True)
    lo, hi = 0, len(lines)  # bisect on the number of lines
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode("".join(lines[:mid]))) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return "".join(lines[:lo])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4000, help="prompt length in tokens (at most)")
    ap.add_argument("--n", type=int, default=10, help="prompts (the longest held-out files first)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    target, _ = defaults.embedded()
    tokenizer = Tokenizer.from_gguf(target)
    corpus = data.load_corpus()
    files = sorted(corpus.heldout, key=lambda f: -len(f[1]))
    written = 0
    with args.out.open("w", encoding="utf-8") as out:
        for rel, text in files:
            prompt = prefix_lines(text, tokenizer, args.tokens)
            if prompt is None:
                continue
            out.write(json.dumps({"prompt": prompt, "file": rel, "suite": "stdlib-long"}) + "\n")
            written += 1
            if written == args.n:
                break
    print(f"{written} prompts of <= {args.tokens} tokens -> {args.out}")


if __name__ == "__main__":
    main()
