"""Throughput of each GPU stage at the full preset's shapes (random weights), to size batches.

    python -m benchmarks.tiny_pair.speed [--compile]

Prints one table: stage, shape, ms per call, tokens/s. Warm-up calls are excluded.
"""
from __future__ import annotations

import argparse
import time

import torch

from . import draft as draft_mod, generate, target as target_mod
from .presets import FULL


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the train step")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a CPU check of this script)")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    q = 8 if args.quick else 1       # divides the batch sizes
    torch.backends.cuda.matmul.allow_tf32 = True
    vocab = 4096
    model = target_mod.build(FULL.target, vocab, vocab - 2, vocab - 4, 0).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    rows = []

    def train_step(batch, seq):
        w = torch.randint(0, vocab - 4, (batch, seq + 1), device=dev)

        def step():
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = target_mod.lm_loss(model, w)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step

    for batch, seq in [(64, 512), (128, 512), (256, 256), (32, 1024)]:
        batch //= q
        s = timed(train_step(batch, seq), 2, 4)
        rows.append(("target train", f"{batch}x{seq}", s, batch * seq / s))

    model.eval()
    for batch, n_new in [(1024, 32), (2048, 32), (4096, 32)]:
        batch //= q * 8
        prompts = torch.randint(0, vocab - 4, (batch, 96), device=dev)

        def gen():
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                generate.greedy(model, prompts, n_new)
        s = timed(gen, 1, 2)
        rows.append(("greedy (96 + n_new)", f"{batch}x{n_new}", s, batch * n_new / s))
    ids = torch.randint(0, vocab - 4, (2048 // q, 288), device=dev)

    def feats():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            generate.layer_features(model, ids, list(FULL.draft.target_layer_ids))
    s = timed(feats, 1, 2)
    rows.append(("features pass", f"{2048 // q}x288", s, 2048 // q * 288 / s))

    draft = draft_mod.build(FULL.draft, model.config, vocab - 1, 0).to(dev).train()
    dopt = torch.optim.AdamW(draft.parameters(), lr=1e-4, fused=dev.type == "cuda")
    embed = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings().weight.detach()
    n_feat = len(FULL.draft.target_layer_ids) * FULL.target.hidden
    gen = torch.Generator().manual_seed(0)
    for batch, anchors in [(128, 8), (256, 8), (256, 16), (512, 8)]:
        batch //= q
        toks = torch.randint(0, vocab - 4, (batch, 288), device=dev)
        fts = torch.randn(batch, 288, n_feat, device=dev, dtype=torch.bfloat16)
        spec = draft_mod.DraftSpec(batch=batch, anchors=anchors)

        def dstep():
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss, _ = draft_mod.block_loss(draft, embed, head, toks, fts, 96, spec, gen)
            dopt.zero_grad(set_to_none=True)
            loss.backward()
            dopt.step()
        s = timed(dstep, 2, 5)
        rows.append(("draft train", f"{batch} seq x {anchors} blocks", s, batch * anchors * 15 / s))

    if args.compile:
        model.train()
        t0 = time.perf_counter()
        model.forward = torch.compile(model.forward)
        step = train_step(64, 512)
        step()
        torch.cuda.synchronize()
        rows.append(("compile (first step)", "64x512", time.perf_counter() - t0, 0.0))
        s = timed(step, 1, 4)
        rows.append(("target train, compiled", "64x512", s, 64 * 512 / s))

    print(f"{'stage':26s} {'shape':22s} {'ms':>9s} {'tokens/s':>12s}")
    for name, shape, s, tps in rows:
        print(f"{name:26s} {shape:22s} {s * 1e3:9.1f} {tps:12,.0f}")


if __name__ == "__main__":
    main()
