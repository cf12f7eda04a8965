"""Child process of the fuzz tests: load each case of a manifest, and run it if it loads.

Usage: fuzz_load.py MANIFEST SECONDS_PER_CASE. Prints `START i` before case i, then `ok i`,
`error i <message>` (a one-line NativeError) or `bad i <what>`; a crash or hang (SIGALRM after
SECONDS_PER_CASE) shows as a START with no result (tests/fuzz_files.py).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

from lucebox._native import Handle, NativeError


def exercise(h: Handle) -> None:
    """Every kind of call once: a prefill, an AR step, and with a draft a draft/verify/commit step."""
    info = h.info()
    toks = np.arange(1, 9, dtype=np.int32) % info["n_vocab"]
    last = h.prefill(toks)
    last = h.step(last)
    if info["has_draft"]:
        ids = np.zeros((info["block_size"] - 1, 2), np.int32)
        logp = np.zeros(ids.shape, np.float32)
        h.draft(last, ids, logp)
        tree = np.array([last, ids[0, 0], ids[0, 1]], np.int32)
        out = np.zeros(3, np.int32)
        h.verify(tree, np.array([-1, 0, 0], np.int32), out)
        h.commit(np.array([0, 1], np.int32))


def tokenize(path: str) -> None:
    """What `lucebox run` does with the file before loading it: build the tokenizer, use it."""
    from lucebox.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(path)
    ids = tok.encode("Hello, wörld <|im_end|> 123")
    tok.decode(ids)
    if tok.chat_template:
        tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)


def main(manifest: str, seconds_per_case: str) -> None:
    cases = json.loads(open(manifest).read())
    for i, case in enumerate(cases):
        print(f"START {i}", flush=True)
        # a case still running after this is a hang: SIGALRM's default action ends the child
        signal.alarm(max(1, round(float(seconds_per_case))))
        if case.get("selftest") == "crash":  # the harness's own test: a case that kills the child
            os.abort()
        if case.get("selftest") == "hang":
            time.sleep(3600)
        if case.get("tokenizer"):
            try:
                tokenize(case["target"])
            except (ValueError, OSError) as e:  # TokenizerError / GGUFError / a template error
                if "\n" in str(e) or not str(e):
                    print(f"bad {i} tokenizer: {type(e).__name__}: {str(e)!r}", flush=True)
                    continue
            except Exception as e:  # noqa: BLE001
                print(f"bad {i} tokenizer: {type(e).__name__}: {str(e)!r}", flush=True)
                continue
        try:
            with Handle(case["target"], case.get("draft"), max_ctx=64, max_tree=8, n_threads=1,
                        log_level="quiet") as h:
                exercise(h)
        except NativeError as e:
            msg = str(e)
            ok = msg and "\n" not in msg
            print(f"{'error' if ok else 'bad'} {i} {msg!r}", flush=True)
        except Exception as e:  # noqa: BLE001 (reported as a failure by the parent)
            print(f"bad {i} {type(e).__name__}: {str(e)!r}", flush=True)
        else:
            print(f"ok {i}", flush=True)
    signal.alarm(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
