"""CUDA vs CPU logits on the tiny random test target, per weight type, KV type and micro-batch.

The CPU path is the one the oracle tests pin to transformers; this prints how far the CUDA
kernels land from it, to tell kernel rounding (small, grows with the weight type's error) from a
CUDA-only bug (large at one type or batch size only). Diagnostic output, no pass/fail.
    python benchmarks/device/backend_diff.py [--cache DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import closing
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import tiny_models  # noqa: E402
from lucebox._native import Handle  # noqa: E402

DEVICE = os.environ.get("LUCEBOX_DIFF_DEVICE", "cuda")  # "cpu": a self-check of this script
CASES = [("f32", "f32"), ("f32", "f16"), ("f32", "q8_0"), ("f16", "f16"), ("bf16", "f16"),
         ("q8_0", "f16"), ("q8_0", "q8_0")]


def logits(path: Path, device: str, kv: str, ubatch: int, toks: np.ndarray) -> np.ndarray:
    with closing(Handle(path, device=-1 if device == "cpu" else 0, kv_type=kv, ubatch=ubatch, max_ctx=512, n_threads=2)) as h:
        out = np.zeros((toks.size, h.info()["n_vocab"]), dtype=np.float32)
        h.prefill(toks, out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default="/tmp/lucebox-test-models")
    args = ap.parse_args()
    models = tiny_models.TinyModels(Path(args.cache))
    toks = np.random.default_rng(3).integers(0, 500, 90).astype(np.int32)
    print("| weights | kv | ubatch | max abs cuda-cpu | argmax differs | max abs cpu-f32 model |")
    print("|---|---|---|---|---|---|")
    base = logits(models.gguf("f32"), "cpu", "f32", 16, toks)
    for outtype, kv in CASES:
        path = models.gguf(outtype)
        for ub in (1, 16):
            cpu = logits(path, "cpu", kv, ub, toks)
            cuda = logits(path, DEVICE, kv, ub, toks)
            d = np.abs(cuda - cpu).max()
            flips = int((cuda.argmax(1) != cpu.argmax(1)).sum())
            print(f"| {outtype} | {kv} | {ub} | {d:.4g} | {flips}/{toks.size} | {np.abs(cpu - base).max():.4g} |",
                  flush=True)


if __name__ == "__main__":
    main()
