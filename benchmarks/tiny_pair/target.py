"""Stage 2: the target, transformers' Qwen3_5ForCausalLM with the 27B's structure at ~15M params.

Structure kept from Qwen3.5-27B: 3 Gated DeltaNet layers then 1 full-attention layer, repeated;
gated attention with q/k norm and GQA; interleaved M-RoPE on a quarter of the head dims; DeltaNet
with 3x more value heads than key heads and a width-4 conv; untied embedding and output.
Trained as a plain next-token model on random windows of the packed token stream, with a
time-based learning-rate schedule so it stops on its budget wherever the step count lands.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig


@dataclass
class TargetShape:
    hidden: int = 384
    layers: int = 8              # multiple of 4: [DeltaNet x3, attention] repeated
    ff: int = 768
    heads: int = 6               # attention: query heads (each with its own output gate)
    kv_heads: int = 2
    head_dim: int = 64           # rope on head_dim / 4 = 16 dims
    lin_k_heads: int = 2         # DeltaNet: key heads ...
    lin_v_heads: int = 6         # ... and 3x as many value heads, as in the 27B (16 / 48)
    lin_head_dim: int = 64
    rope_theta: float = 10000.0
    mrope_section: tuple = (3, 3, 2)   # sums to rope dims / 2, like the 27B's [11, 11, 10]


@dataclass
class TrainSpec:
    seq_len: int = 512
    batch: int = 64
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup_frac: float = 0.03
    weight_decay: float = 0.1
    seconds: float = 240.0
    max_steps: int = 1_000_000
    log_every: int = 50


def make_config(shape: TargetShape, vocab_size: int, eos_id: int, pad_id: int) -> Qwen3_5TextConfig:
    if shape.layers % 4:
        raise ValueError(f"layers must be a multiple of 4 (3 DeltaNet + 1 attention), got {shape.layers}")
    rope_dims = shape.head_dim // 4
    if 2 * sum(shape.mrope_section) != rope_dims:
        raise ValueError(f"mrope_section {shape.mrope_section} must sum to rope dims / 2 = {rope_dims // 2}")
    return Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.ff,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
        linear_conv_kernel_dim=4, linear_key_head_dim=shape.lin_head_dim,
        linear_value_head_dim=shape.lin_head_dim, linear_num_key_heads=shape.lin_k_heads,
        linear_num_value_heads=shape.lin_v_heads,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(shape.layers)],
        full_attention_interval=4,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta,
                         "partial_rotary_factor": 0.25, "mrope_section": list(shape.mrope_section),
                         "mrope_interleaved": True},
        max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=False,
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None,
        architectures=["Qwen3_5ForCausalLM"],
    )


def build(shape: TargetShape, vocab_size: int, eos_id: int, pad_id: int, seed: int) -> Qwen3_5ForCausalLM:
    torch.manual_seed(seed)
    config = make_config(shape, vocab_size, eos_id, pad_id)
    return Qwen3_5ForCausalLM(config)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def lr_at(spec: TrainSpec, frac: float) -> float:
    """Linear warm-up, then cosine down to min_lr_frac, over the fraction of the time budget spent."""
    if frac < spec.warmup_frac:
        return spec.lr * max(frac, 1e-3) / spec.warmup_frac
    t = min(1.0, (frac - spec.warmup_frac) / (1.0 - spec.warmup_frac))
    return spec.lr * (spec.min_lr_frac + (1 - spec.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def random_windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, length + 1] windows of `stream` (kept on the training device) at random starts."""
    starts = torch.randint(0, stream.numel() - length - 1, (batch, 1), generator=gen)
    return stream[(starts + torch.arange(length + 1)).to(stream.device)]


def lm_loss(model, windows: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=windows[:, :-1]).logits
    return F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())


@torch.no_grad()
def eval_loss(model, stream: torch.Tensor, spec: TrainSpec, device, n_batches: int, seed: int) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(n_batches):
        w = random_windows(stream, spec.batch, spec.seq_len, gen)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            total += lm_loss(model, w).item()
    model.train()
    return total / n_batches


def train(model, train_stream: torch.Tensor, val_stream: torch.Tensor, spec: TrainSpec, device,
          seed: int, log) -> dict:
    """Train until spec.seconds (or max_steps); returns the loss curve and throughput."""
    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "conv1d" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "conv1d" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=spec.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(seed)
    curve, step, t0 = [], 0, time.perf_counter()
    smooth = None
    while step < spec.max_steps:
        frac = (time.perf_counter() - t0) / spec.seconds
        if frac >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(spec, frac)
        w = random_windows(train_stream, spec.batch, spec.seq_len, gen)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = lm_loss(model, w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % spec.log_every == 0 or step == 1:
            value = loss.item()
            smooth = value if smooth is None else 0.9 * smooth + 0.1 * value
            elapsed = time.perf_counter() - t0
            curve.append({"step": step, "seconds": round(elapsed, 1), "loss": round(value, 4),
                          "lr": round(opt.param_groups[0]["lr"], 6)})
            log(f"target step {step:5d}  {elapsed:6.1f}s  loss {value:.4f}  "
                f"tok/s {step * spec.batch * spec.seq_len / elapsed:,.0f}")
    seconds = time.perf_counter() - t0
    final_train = curve[-1]["loss"] if curve else float("nan")
    val = eval_loss(model, val_stream, spec, device, n_batches=4, seed=seed + 7)
    log(f"target done: {step} steps in {seconds:.0f}s, held-out loss {val:.4f}")
    return {"steps": step, "seconds": round(seconds, 1), "tokens": step * spec.batch * spec.seq_len,
            "final_train_loss": final_train, "heldout_loss": round(val, 4), "curve": curve,
            "spec": asdict(spec)}
