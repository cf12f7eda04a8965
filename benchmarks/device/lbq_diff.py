"""Logits of the 27B-shaped synthetic Q4_K_M target with and without the small-batch K-quant kernel.

Each GGML_CUDA_LBQ mode runs in its own process (ggml reads the variable once). A 23-token prefill in one
micro-batch is a verify-sized batch: mode 0 runs it through ggml's mmq, modes 1 and 2 through the
small-batch kernel; ubatch 1 runs the same tokens as one-token steps (mmvq in modes 0 and 1, the
small-batch kernel in mode 2). Prints relative distances and argmax agreement against mode 0, ubatch 23.
    python benchmarks/device/lbq_diff.py --target synth-27b-q4_k_m.gguf
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

import numpy as np

N_TOKENS = 23


def child(target: str, ubatch: int, out: str) -> None:
    from lucebox._native import Handle
    toks = np.random.default_rng(5).integers(1000, 100000, N_TOKENS).astype(np.int32)
    with closing(Handle(target, device=0, ubatch=ubatch, max_ctx=256)) as h:
        logits = np.zeros((N_TOKENS, h.info()["n_vocab"]), np.float32)
        h.prefill(toks, logits)
    np.save(out, logits)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--child", nargs=2, metavar=("UBATCH", "OUT"))
    args = ap.parse_args()
    if args.child:
        child(args.target, int(args.child[0]), args.child[1])
        return
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, ubatch in ((0, N_TOKENS), (0, 1), (1, N_TOKENS), (2, N_TOKENS), (2, 1)):
            out = str(Path(tmp) / f"m{mode}u{ubatch}.npy")
            env = dict(os.environ, GGML_CUDA_LBQ=str(mode))
            subprocess.run([sys.executable, __file__, "--target", args.target, "--child", str(ubatch), out],
                           env=env, check=True)
            runs[(mode, ubatch)] = np.load(out)
    ref = runs[(0, N_TOKENS)]
    print("| GGML_CUDA_LBQ | ubatch | finite | rel L2 vs mode 0 ubatch 23 | argmax equal | bitwise equal to mode 2 ubatch 23 |")
    print("|---|---|---|---|---|---|")
    for (mode, ubatch), x in runs.items():
        rel = np.linalg.norm(x - ref) / np.linalg.norm(ref)
        same = int((x.argmax(1) == ref.argmax(1)).sum())
        bitwise = bool(np.array_equal(x, runs[(2, N_TOKENS)]))
        print(f"| {mode} | {ubatch} | {bool(np.isfinite(x).all())} | {rel:.2e} | {same}/{N_TOKENS} | {bitwise} |")


if __name__ == "__main__":
    main()
