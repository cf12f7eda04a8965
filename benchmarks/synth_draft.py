#!/usr/bin/env python3
"""Write a Qwen3.5-27B-DFlash-shaped draft with random BF16 weights (config.json + model.safetensors).

The layout is z-lab's: a Qwen3 config with `architectures: [DFlashDraftModel]`, `block_size`,
`num_target_layers` and a `dflash_config` holding `mask_token_id` and `target_layer_ids`; the weights
are the `dflash` package's DFlashDraftModel state dict (layers.N.self_attn/mlp/norms, fc, hidden_norm,
norm; no embeddings or lm_head: the draft uses the target's). Only numpy is needed: BF16 is written as
rounded uint16, the safetensors file by hand. Projections get std 1/sqrt(fan_in), norms 1.

    python benchmarks/synth_draft.py --out /tmp/draft27            # full size, ~3.46 GB
    python benchmarks/synth_draft.py --out d --scale 0.1 --target-layers 4
`--scale` matches synth_target.py's: the same --scale gives a draft whose hidden size and vocabulary
fit that target.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

CHUNK = 8 << 20  # values per generation job


@dataclass(frozen=True)
class DraftShape:
    n_layer: int = 5
    hidden: int = 5120
    n_ff: int = 17408
    n_head: int = 32
    n_head_kv: int = 8
    head_dim: int = 128
    n_target_layers: int = 64
    n_vocab: int = 248320
    block_size: int = 16
    sliding_window: int = 0      # > 0: every layer but the last uses a sliding window (Qwen3.6 drafts)

    @property
    def target_layer_ids(self) -> list[int]:
        # dflash's default spacing: evenly over [1, n_target - 3]; [1, 16, 31, 46, 61] for 64
        if self.n_layer == 1:
            return [self.n_target_layers // 2]
        span = self.n_target_layers - 4
        return [round(1 + i * span / (self.n_layer - 1)) for i in range(self.n_layer)]

    @property
    def mask_token_id(self) -> int:
        return self.n_vocab - 250   # 248070: the first id after Qwen3.5's named special tokens


def round_up(x: float, m: int) -> int:
    return max(m, int(-(-x // m)) * m)


def scaled_shape(scale: float, n_target_layers: int, sliding_window: int) -> DraftShape:
    if not 0 < scale <= 1:
        raise ValueError(f"--scale must be in (0, 1], got {scale}")
    if n_target_layers < 4:
        raise ValueError(f"--target-layers must be >= 4, got {n_target_layers}")
    s = DraftShape(n_target_layers=n_target_layers, sliding_window=sliding_window)
    if scale == 1:
        return s
    kv = max(1, round(s.n_head_kv * scale))
    return replace(s, hidden=round_up(s.hidden * scale, 256), n_ff=round_up(s.n_ff * scale, 256),
                   n_head_kv=kv, n_head=4 * kv, n_vocab=round_up(max(s.n_vocab * scale, 2048), 256))


def config(s: DraftShape) -> dict:
    windowed = s.sliding_window > 0
    return {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": s.block_size,
        "dflash_config": {"mask_token_id": s.mask_token_id, "target_layer_ids": s.target_layer_ids},
        "eos_token_id": s.n_vocab - 274,     # <|im_end|>
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "hidden_size": s.hidden,
        "initializer_range": 0.02,
        "intermediate_size": s.n_ff,
        "layer_types": [("sliding_attention" if windowed else "full_attention")] * (s.n_layer - 1)
                       + ["full_attention"],
        "max_position_embeddings": 262144,
        "max_window_layers": s.n_layer,
        "model_type": "qwen3",
        "num_attention_heads": s.n_head,
        "num_hidden_layers": s.n_layer,
        "num_key_value_heads": s.n_head_kv,
        "num_target_layers": s.n_target_layers,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000000,
        "sliding_window": s.sliding_window if windowed else None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": windowed,
        "vocab_size": s.n_vocab,
    }


def tensors(s: DraftShape) -> list[tuple[str, tuple[int, int] | tuple[int]]]:
    """(name, torch shape [out, in]) of DFlashDraftModel's state dict, sorted by name."""
    e, q, kv = s.hidden, s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    t = [("fc.weight", (e, len(s.target_layer_ids) * e)), ("hidden_norm.weight", (e,)), ("norm.weight", (e,))]
    for i in range(s.n_layer):
        p = f"layers.{i}."
        t += [(p + "input_layernorm.weight", (e,)), (p + "post_attention_layernorm.weight", (e,)),
              (p + "self_attn.q_proj.weight", (q, e)), (p + "self_attn.k_proj.weight", (kv, e)),
              (p + "self_attn.v_proj.weight", (kv, e)), (p + "self_attn.o_proj.weight", (e, q)),
              (p + "self_attn.q_norm.weight", (s.head_dim,)), (p + "self_attn.k_norm.weight", (s.head_dim,)),
              (p + "mlp.gate_proj.weight", (s.n_ff, e)), (p + "mlp.up_proj.weight", (s.n_ff, e)),
              (p + "mlp.down_proj.weight", (e, s.n_ff))]
    return sorted(t)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (values here are finite)."""
    bits = x.view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def chunk(n: int, std: float, seed: tuple[int, ...]) -> np.ndarray:
    if std == 0:  # a norm: ones
        return np.full(n, 0x3F80, dtype=np.uint16)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    return to_bf16(rng.standard_normal(n, dtype=np.float32) * np.float32(std))


def write(out: str, s: DraftShape, seed: int, threads: int, quiet: bool = False, zeros: bool = False) -> int:
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config(s), indent=2) + "\n")
    specs = tensors(s)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in specs:
        nbytes = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)          # data starts 8-byte aligned
    t0 = time.time()
    part = d / "model.safetensors.part"   # renamed when complete
    with open(part, "wb") as f, ThreadPoolExecutor(threads) as pool:
        f.write(struct.pack("<Q", len(blob)) + blob)
        if zeros:               # a sparse file of zero weights: for memory plans, not speed
            f.truncate(f.tell() + offset)
        jobs = []
        for ti, (name, shape) in enumerate([] if zeros else specs):
            n = int(np.prod(shape))
            std = 0.0 if len(shape) == 1 else 1.0 / np.sqrt(shape[1])
            jobs += [(ti, start, min(CHUNK, n - start), std) for start in range(0, n, CHUNK)]
        # pool.map keeps file order and runs ahead by at most the pool's queue (all jobs): bound it
        for lo in range(0, len(jobs), 2 * threads):
            batch = jobs[lo:lo + 2 * threads]
            for arr in pool.map(lambda j: chunk(j[2], j[3], (seed, j[0], j[1])), batch):
                f.write(memoryview(arr).cast("B"))
    os.replace(part, d / "model.safetensors")
    if not quiet:
        dt = time.time() - t0
        print(f"synth_draft: wrote {d}: {len(specs)} tensors, {offset / 2**30:.2f} GiB, {dt:.1f} s",
              file=sys.stderr)
    return offset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (config.json + model.safetensors)")
    ap.add_argument("--scale", type=float, default=1.0, help="width factor in (0, 1], as synth_target.py's")
    ap.add_argument("--target-layers", type=int, default=64, help="target's trunk layers (default 64)")
    ap.add_argument("--sliding-window", type=int, default=0,
                    help="window of the first n-1 layers (Qwen3.6 drafts use 2048; default: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--zeros", action="store_true",
                    help="all-zero weights as a sparse file (instant, no disk): for memory plans, not speed")
    args = ap.parse_args()
    try:
        shape = scaled_shape(args.scale, args.target_layers, max(0, args.sliding_window))
    except ValueError as e:
        ap.error(str(e))
    try:
        write(args.out, shape, args.seed, max(1, args.threads), zeros=args.zeros)
    except OSError as e:
        sys.exit(f"synth_draft: error: cannot write {args.out}: {e.strerror or e}; "
                 "check the path and the free space")


if __name__ == "__main__":
    main()
