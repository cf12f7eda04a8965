"""Stage 4: the DFlash draft (the `dflash` package's DFlashDraftModel), trained the DFlash way.

Per sequence (prompt + the target's greedy continuation) several anchors a are drawn at random in
the continuation. Each anchor makes one block of B positions a..a+B-1 holding [x_a, MASK x (B-1)];
the block attends to the target features of positions < a (the context the draft would have after
committing x_0..x_{a-1}) and to its whole own block, not to other blocks. Position k = 1..B-1 of the
block is trained to predict x_{a+k} through the target's frozen embedding and lm_head, with loss
weight exp(-(k-1)/gamma): early positions decide the accepted length, so they count most.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from dflash.model import DFlashDraftModel
from transformers import Qwen3Config


@dataclass
class DraftShape:
    layers: int = 2
    heads: int = 6
    kv_heads: int = 2
    head_dim: int = 64
    ff: int = 1024
    block_size: int = 16
    target_layer_ids: tuple = (1, 3, 5, 6)
    rope_theta: float = 10000.0


@dataclass
class DraftSpec:
    batch: int = 128              # sequences per step
    anchors: int = 8              # blocks per sequence
    gamma: float = 7.0            # loss decay, the paper's value for block size 16
    lr: float = 1e-3
    min_lr_frac: float = 0.05
    warmup_frac: float = 0.03
    weight_decay: float = 0.01
    seconds: float = 150.0
    max_steps: int = 1_000_000
    log_every: int = 100


def build(shape: DraftShape, target_config, mask_id: int, seed: int) -> DFlashDraftModel:
    if max(shape.target_layer_ids) >= target_config.num_hidden_layers - 1:
        # the last layer's hidden_states entry in transformers is taken after the final norm
        raise ValueError("target_layer_ids must leave out the target's last layer")
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=target_config.vocab_size, hidden_size=target_config.hidden_size,
        intermediate_size=shape.ff, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, rms_norm_eps=1e-6,
        max_position_embeddings=8192, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        architectures=["DFlashDraftModel"], num_target_layers=target_config.num_hidden_layers,
        block_size=shape.block_size,
        dflash_config={"mask_token_id": mask_id, "target_layer_ids": list(shape.target_layer_ids)},
    )
    return DFlashDraftModel(config)


def lr_at(spec: DraftSpec, frac: float) -> float:
    if frac < spec.warmup_frac:
        return spec.lr * max(frac, 1e-3) / spec.warmup_frac
    t = min(1.0, (frac - spec.warmup_frac) / (1.0 - spec.warmup_frac))
    return spec.lr * (spec.min_lr_frac + (1 - spec.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def block_batch(tokens: torch.Tensor, plen: int, block: int, anchors: int, mask_id: int,
                gen: torch.Generator):
    """Anchors, block inputs, labels, positions and the attention mask for a batch of sequences.

    tokens: [b, T]. Returns block_ids [b, K*B], labels [b, K, B-1], position_ids [b, T + K*B],
    mask [b, 1, K*B, T + K*B] (True = may attend).
    """
    b, seq_len = tokens.shape
    device = tokens.device
    span = seq_len - block - plen + 1                       # anchors a in [plen, T - B]
    if span < anchors:
        raise ValueError(f"continuations too short for {anchors} anchors of block {block}")
    # K distinct anchors per sequence: the top-K of random scores
    anchor = torch.rand(b, span, generator=gen).topk(anchors, dim=1).indices.sort(dim=1).values + plen
    anchor = anchor.to(device)                              # [b, K]
    offs = torch.arange(block, device=device)
    pos_block = anchor[:, :, None] + offs                   # [b, K, B]
    labels = tokens.gather(1, pos_block[:, :, 1:].flatten(1)).view(b, anchors, block - 1)
    block_ids = torch.full((b, anchors, block), mask_id, dtype=tokens.dtype, device=device)
    block_ids[:, :, 0] = tokens.gather(1, anchor)
    ctx_pos = torch.arange(seq_len, device=device)
    position_ids = torch.cat([ctx_pos.expand(b, -1), pos_block.flatten(1)], 1)
    q_anchor = anchor.repeat_interleave(block, dim=1)       # [b, K*B]: each query's anchor
    sees_ctx = ctx_pos[None, None, :] < q_anchor[:, :, None]          # [b, K*B, T]
    q_block = torch.arange(anchors, device=device).repeat_interleave(block)
    sees_block = (q_block[:, None] == q_block[None, :]).expand(b, -1, -1)
    mask = torch.cat([sees_ctx, sees_block], 2)[:, None]
    return block_ids.flatten(1), labels, position_ids, mask


def position_weights(block: int, gamma: float, device) -> torch.Tensor:
    k = torch.arange(1, block, device=device, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def block_loss(draft, embed, head, tokens, feats, plen, spec: DraftSpec, gen):
    """Position-weighted cross entropy of one batch; also returns per-position top-1 accuracy."""
    block = draft.block_size
    ids, labels, pos, mask = block_batch(tokens, plen, block, spec.anchors, draft.mask_token_id, gen)
    with torch.no_grad():
        noise = F.embedding(ids, embed)
    hidden = draft(position_ids=pos, attention_mask=mask, noise_embedding=noise, target_hidden=feats)
    b = tokens.shape[0]
    hidden = hidden.view(b, spec.anchors, block, -1)[:, :, 1:]
    logits = F.linear(hidden, head).float()                 # [b, K, B-1, V]
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view_as(labels)
    w = position_weights(block, spec.gamma, tokens.device)
    loss = (ce * w).mean(dim=(0, 1)).sum() / w.sum()
    acc = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
    return loss, acc


@torch.no_grad()
def heldout(draft, embed, head, tokens, feats, plen, spec: DraftSpec, seed: int):
    """Loss and per-position accuracy on held-out sequences, with the same anchors every call."""
    was_training = draft.training
    draft.eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.autocast(tokens.device.type, dtype=torch.bfloat16):
        loss, acc = block_loss(draft, embed, head, tokens, feats, plen, spec, gen)
    draft.train(was_training)
    return loss.item(), acc


def train(draft, target, tokens: torch.Tensor, feats: torch.Tensor, plen: int, spec: DraftSpec,
          seed: int, log) -> dict:
    """Train on (tokens [N, T], feats [N, T, F]) held on the training device until the time budget.

    The last sequences are held out; the weights with the best held-out loss are kept, so a short
    generation stage (few sequences, fast overfitting) cannot leave an overfit draft behind.
    """
    device = tokens.device
    draft.to(device).train()
    embed = target.get_input_embeddings().weight.detach()
    head = target.get_output_embeddings().weight.detach()
    decay = [p for p in draft.parameters() if p.ndim >= 2]
    no_decay = [p for p in draft.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=spec.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    n_val = max(1, min(256, tokens.shape[0] // 20))
    train_idx = tokens.shape[0] - n_val
    val = (tokens[train_idx:], feats[train_idx:])
    gen = torch.Generator().manual_seed(seed)
    curve, step, t0 = [], 0, time.perf_counter()
    best, best_state, best_step = float("inf"), None, 0
    while step < spec.max_steps:
        frac = (time.perf_counter() - t0) / spec.seconds
        if frac >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(spec, frac)
        rows = torch.randint(0, train_idx, (spec.batch,), generator=gen).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, acc = block_loss(draft, embed, head, tokens[rows], feats[rows], plen, spec, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        if step % spec.log_every == 0 or step == 1:
            vloss, vacc = heldout(draft, embed, head, *val, plen, spec, seed + 1)
            if vloss < best:
                best, best_step = vloss, step
                best_state = {k: v.detach().clone() for k, v in draft.state_dict().items()}
            elapsed = time.perf_counter() - t0
            curve.append({"step": step, "seconds": round(elapsed, 1), "loss": round(loss.item(), 4),
                          "heldout_loss": round(vloss, 4), "heldout_acc_pos1": round(vacc[0].item(), 4)})
            log(f"draft step {step:5d}  {elapsed:6.1f}s  loss {loss.item():.4f}  acc@1 {acc[0].item():.3f}  "
                f"held-out loss {vloss:.4f}  acc@1 {vacc[0].item():.3f}")
    seconds = time.perf_counter() - t0
    vloss, vacc = heldout(draft, embed, head, *val, plen, spec, seed + 1)
    if best_state is not None and best < vloss:
        draft.load_state_dict(best_state)
        vloss, vacc = heldout(draft, embed, head, *val, plen, spec, seed + 1)
        log(f"draft: kept the weights of step {best_step} (best held-out loss)")
    else:
        best_step = step
    draft.eval()
    log(f"draft done: {step} steps in {seconds:.0f}s, held-out loss {vloss:.4f}, "
        f"acc by position {[round(a, 2) for a in vacc.tolist()]}")
    return {"steps": step, "kept_step": best_step, "seconds": round(seconds, 1), "heldout_sequences": n_val,
            "heldout_loss": round(vloss, 4), "heldout_acc_by_pos": [round(a, 4) for a in vacc.tolist()],
            "curve": curve, "spec": asdict(spec)}


def save(draft, out_dir) -> None:
    """z-lab layout: config.json + model.safetensors, BF16."""
    draft.to(torch.bfloat16).save_pretrained(str(out_dir), safe_serialization=True)
