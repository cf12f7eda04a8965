#!/usr/bin/env python3
"""Per-step timings of the decode loop on one model pair; prints one markdown table + JSON.

    python benchmarks/step_bench.py --target T.gguf [--draft DIR] [--ctx 8192,32768] [--n-gen 128]

AR: tok/s of lb_step after warm-up, and the fraction of the memory roofline (weight bytes one token
reads over the measured copy bandwidth, passed as --copy-gbs). Speculative (with a draft): median
ms of draft, verify at --budget, commit and Python host work per step, at each context length.
Synthetic random models give meaningless acceptance: this measures speed only.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import numpy as np

from lucebox import ddtree
from lucebox._native import Handle
from lucebox.gguf_meta import read_metadata


def weight_bytes_per_token(gguf_path: str) -> int:
    """Bytes of tensor data one decode step reads: every weight except the embedding table
    (one row is read) and an MTP/nextn block (not used for decoding)."""
    import gguf  # reads tensor infos only (no data)
    reader = gguf.GGUFReader(gguf_path)
    meta = read_metadata(gguf_path)
    arch = meta.get("general.architecture", "qwen35")
    n_nextn = int(meta.get(f"{arch}.nextn_predict_layers", 0) or 0)
    n_blocks = int(meta[f"{arch}.block_count"])
    first_nextn = n_blocks - n_nextn
    total = 0
    for t in reader.tensors:
        name = t.name
        if name.startswith("token_embd"):
            continue
        if name.startswith("blk.") and int(name.split(".")[1]) >= first_nextn:
            continue
        total += int(t.n_bytes)
    return total


def gpu_memory_used_mib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return float(out.strip().splitlines()[0])
    except Exception:
        return None


def bench_ar(h: Handle, n_vocab: int, n_gen: int, prompt_len: int, rng) -> dict:
    prompt = rng.integers(0, min(n_vocab, 150000), prompt_len).astype(np.int32)
    h.reset()
    t0 = time.perf_counter()
    last = h.prefill(prompt)
    prefill_s = time.perf_counter() - t0
    for _ in range(8):  # warm-up: graph build, CUDA graph capture
        last = h.step(last)
    t0 = time.perf_counter()
    for _ in range(n_gen):
        last = h.step(last)
    dt = time.perf_counter() - t0
    return {"prefill_tokens": prompt_len, "prefill_s": prefill_s, "tok_s": n_gen / dt, "ms_per_tok": 1e3 * dt / n_gen}


def bench_spec(h: Handle, info: dict, ctx: int, budget: int, draft_top_k: int, steps: int, rng) -> dict:
    h.reset()
    n_prompt = ctx - 2 * (budget + 2) * (steps + 8)
    prompt = rng.integers(0, min(info["n_vocab"], 150000), n_prompt).astype(np.int32)
    t0 = time.perf_counter()
    last = h.prefill(prompt)
    prefill_s = time.perf_counter() - t0
    rows = info["block_size"] - 1
    ids = np.empty((rows, draft_top_k), np.int32)
    logp = np.empty((rows, draft_top_k), np.float32)
    argmax = np.empty(info["max_tree"], np.int32)
    t_draft, t_verify, t_commit, t_host, t_ar = [], [], [], [], []
    for i in range(steps + 4):
        a = time.perf_counter()
        h.draft(last, ids, logp)
        b = time.perf_counter()
        tree = ddtree.build_tree(ids, logp, last, budget)
        c = time.perf_counter()
        n = tree.n_nodes
        h.verify(tree.tokens, tree.parents, argmax[:n])
        d = time.perf_counter()
        path, bonus = ddtree.walk(tree, argmax[:n])
        e = time.perf_counter()
        h.commit(path)
        f = time.perf_counter()
        last = bonus
        g = time.perf_counter()
        last = h.step(last)  # one AR step at the same context, for the verify/AR ratio
        k = time.perf_counter()
        if i >= 4:
            t_draft.append(b - a); t_verify.append(d - c); t_commit.append(f - e)
            t_host.append((c - b) + (e - d)); t_ar.append(k - g)
    med = lambda xs: 1e3 * statistics.median(xs)
    return {"ctx": ctx, "prefill_tokens": n_prompt, "prefill_s": prefill_s, "budget": budget,
            "draft_ms": med(t_draft), "verify_ms": med(t_verify), "commit_ms": med(t_commit),
            "host_ms": med(t_host), "ar_step_ms": med(t_ar), "gpu_mem_mib": gpu_memory_used_mib()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--ctx", default="8192,32768")
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--budget", type=int, default=22)
    ap.add_argument("--draft-top-k", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--copy-gbs", type=float, default=0.0, help="measured copy bandwidth (GB/s)")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    ctxs = [int(c) for c in args.ctx.split(",") if c]
    results: dict = {"target": args.target, "draft": args.draft}

    h = Handle(args.target, None, max_ctx=4096, kv_type=args.kv, device=args.device)
    info = h.info()
    ar = bench_ar(h, info["n_vocab"], args.n_gen, 32, rng)
    h.close()
    wb = weight_bytes_per_token(args.target)
    ar["weight_bytes"] = wb
    if args.copy_gbs > 0:
        roofline = args.copy_gbs * 1e9 / wb
        ar["roofline_tok_s"] = roofline
        ar["roofline_fraction"] = ar["tok_s"] / roofline
    results["ar"] = ar
    print(f"| AR decode | {ar['tok_s']:.1f} tok/s | {ar['ms_per_tok']:.2f} ms/tok | weights {wb / 1e9:.2f} GB/token"
          + (f" | roofline {ar['roofline_tok_s']:.1f} tok/s | {100 * ar['roofline_fraction']:.0f}% of roofline |"
             if args.copy_gbs > 0 else " |"))

    if args.draft:
        results["spec"] = []
        print("\n| ctx | draft ms | verify(%d) ms | commit ms | host ms | AR step ms | verify/AR | draft/verify | GPU MiB |"
              % args.budget)
        print("|---|---|---|---|---|---|---|---|---|")
        for ctx in ctxs:
            h = Handle(args.target, args.draft, max_ctx=ctx, kv_type=args.kv, device=args.device,
                       max_tree=max(64, args.budget + 1))
            r = bench_spec(h, h.info(), ctx, args.budget, args.draft_top_k, args.steps, rng)
            h.close()
            results["spec"].append(r)
            print(f"| {ctx} | {r['draft_ms']:.2f} | {r['verify_ms']:.2f} | {r['commit_ms']:.2f} | {r['host_ms']:.3f} | "
                  f"{r['ar_step_ms']:.2f} | {r['verify_ms'] / r['ar_step_ms']:.2f} | "
                  f"{r['draft_ms'] / r['verify_ms']:.2f} | {r['gpu_mem_mib']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
