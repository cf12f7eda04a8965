"""Stage 3: the draft's training data, the target's own greedy continuations and its layer features.

Prompts are fixed-length windows of the training stream (all one length, so a batch needs no
padding and the hybrid cache stays simple); a share of them end right where a chat reply starts.
Greedy decoding runs on a KV/recurrent cache with large batches, on a bf16 copy of the target (no
per-step weight casts, as autocast would add; float32 on a CPU, where bf16 matmuls gain little). The features are the outputs of the draft's
`target_layer_ids` decoder layers (dflash's `hidden_states[i + 1]`), taken by hooks on one
teacher-forced pass over prompt + continuation.
"""
from __future__ import annotations

import copy
import time

import torch
from transformers import DynamicCache

FEATURE_CHUNK = 512     # sequences per teacher-forced features pass (bounds its activations)


@torch.no_grad()
def greedy(model, prompts: torch.Tensor, n_new: int) -> torch.Tensor:
    """[B, P] prompts -> [B, P + n_new]: argmax decoding on the model's cache."""
    batch, plen = prompts.shape
    cache = DynamicCache(config=model.config)
    pos = torch.arange(plen + n_new, device=prompts.device)
    out = model(input_ids=prompts, position_ids=pos[:plen].expand(batch, -1), past_key_values=cache,
                use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1)
    new = [nxt]
    for i in range(n_new - 1):
        out = model(input_ids=nxt[:, None], position_ids=pos[plen + i:plen + i + 1].expand(batch, -1),
                    past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1)
        new.append(nxt)
    return torch.cat([prompts, torch.stack(new, 1)], 1)


@torch.no_grad()
def layer_features(model, ids: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
    """[B, T] -> [B, T, len(layer_ids) * hidden]: the chosen decoder layers' outputs, concatenated."""
    captured = {}
    hooks = [model.model.layers[i].register_forward_hook(
        lambda _m, _a, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        for i in layer_ids]
    try:
        model.model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    return torch.cat([captured[i] for i in layer_ids], -1)


def reply_starts(stream: torch.Tensor, im_start: int, assistant: list[int]) -> torch.Tensor:
    """Stream offsets just after each `<|im_start|>assistant\\n`."""
    hits = (stream[:-len(assistant) - 1] == im_start).nonzero().flatten()
    for j, tok in enumerate(assistant):
        hits = hits[stream[hits + 1 + j] == tok]
    return hits + 1 + len(assistant)


def sample_prompts(stream: torch.Tensor, starts: torch.Tensor, n: int, plen: int, chat_share: float,
                   gen: torch.Generator) -> torch.Tensor:
    n_chat = int(n * chat_share) if starts.numel() else 0
    ends = torch.randint(plen, stream.numel() - 1, (n - n_chat,), generator=gen)
    if n_chat:
        ok = starts[starts >= plen]
        ends = torch.cat([ends, ok[torch.randint(0, ok.numel(), (n_chat,), generator=gen)].cpu()])
    idx = ends[:, None] - plen + torch.arange(plen)
    return stream[idx.to(stream.device)]


def feature_capacity(n_max: int, seq_len: int, width: int, device) -> int:
    """Sequences whose bf16 features fit in half the free GPU memory (all of n_max on the CPU)."""
    if device.type != "cuda":
        return n_max
    torch.cuda.empty_cache()      # blocks cached from target training count as used
    free, _ = torch.cuda.mem_get_info(device)
    return max(1, min(n_max, int(0.5 * free) // (seq_len * width * 2)))


def make_draft_data(model, stream: torch.Tensor, starts: torch.Tensor, layer_ids: list[int], *,
                    n_max: int, batch: int, plen: int, n_new: int, chat_share: float, seconds: float,
                    seed: int, log, dtype=torch.bfloat16) -> dict:
    """Generate until n_max sequences or the time budget; returns tokens, features and stats.

    Results go straight into preallocated buffers: concatenating at the end would briefly need
    twice the features' memory (tens of GB at the full preset).
    """
    device = stream.device
    seq_len = plen + n_new
    width = len(layer_ids) * model.config.hidden_size
    n_max = feature_capacity(n_max, seq_len, width, device) // batch * batch or batch
    tokens = torch.empty(n_max, seq_len, dtype=torch.long, device=device)
    features = torch.empty(n_max, seq_len, width, dtype=torch.bfloat16, device=device)
    model = copy.deepcopy(model).to(dtype).eval()
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    n, last = 0, 0.0
    while n + batch <= n_max:
        t1 = time.perf_counter()
        if n and t1 - t0 + last > seconds:   # the last batch's time predicts the next one's
            break
        prompts = sample_prompts(stream, starts, batch, plen, chat_share, gen)
        tokens[n:n + batch] = greedy(model, prompts, n_new)
        for i in range(n, n + batch, FEATURE_CHUNK):
            j = min(i + FEATURE_CHUNK, n + batch)
            features[i:j] = layer_features(model, tokens[i:j], layer_ids)
        n += batch
        if device.type == "cuda":
            torch.cuda.synchronize()
        last = time.perf_counter() - t1
        log(f"draft data: {n} sequences, {time.perf_counter() - t0:.1f}s (last batch {last:.1f}s)")
    del model
    stats = {"sequences": n, "capacity": n_max, "prompt_len": plen, "new_tokens": n_new,
             "seconds": round(time.perf_counter() - t0, 1)}
    return {"tokens": tokens[:n], "features": features[:n], "stats": stats}
