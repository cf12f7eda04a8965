"""Reference speculative decoding for tests: transformers' Qwen3.5 target + the `dflash` package's draft.

What the engine must reproduce, step by step:
- `DraftReference`: the DFlash draft driven like the engine's draft module (append committed
  tokens' features, propose a block), holding its K/V cache exactly as `dflash_generate` does
  (context rows kept, the block's rows cropped after each proposal).
- `TargetReference`: the target with EXACT rollback. `dflash_generate` crops its DynamicCache after
  verify, which rewinds attention K/V and the conv window but not the Gated DeltaNet recurrent state;
  here verify runs on a copy of the cache and commit re-feeds the accepted tokens to the original.
- `chain_generate`: greedy chain-mode speculative decoding; per step the draft chain, the number of
  accepted draft tokens and the bonus token (AL = accepted + 1, dflash's convention).
- `tree_accept`: the expected DDTree acceptance under greedy verify: the longest prefix of the AR
  greedy continuation that is a root-to-node path of the tree.

Features: dflash's target_layer_ids index the decoder layers 0-based and take each layer's OUTPUT
(transformers' hidden_states[i + 1]; hidden_states[0] is the embedding output).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from dflash.model import DFlashDraftModel, _crop_to, _make_cache, extract_context_feature


def load_draft(path: str | Path, dtype: torch.dtype = torch.float32) -> DFlashDraftModel:
    return DFlashDraftModel.from_pretrained(str(path), dtype=dtype).eval()


def load_target(path: str | Path, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


class DraftReference:
    """dflash's draft with its context cache. `embed` [V, E] and `lm_head` [V, E] are the target's
    token embedding and output matrix (the draft has neither)."""

    def __init__(self, draft: DFlashDraftModel, embed: torch.Tensor, lm_head: torch.Tensor):
        self.draft = draft
        self.embed = embed.float()
        self.head = torch.nn.Linear(lm_head.shape[1], lm_head.shape[0], bias=False)
        self.head.weight.data = lm_head.float()
        self.block_size = int(draft.block_size)
        self.mask_token_id = int(draft.mask_token_id)
        self.n_feat = len(draft.target_layer_ids) * draft.config.hidden_size
        self.cache = _make_cache(draft.config)
        self.n_past = 0                      # committed tokens (features given)
        self._pending: list[torch.Tensor] = []  # features not yet projected into the cache

    def append(self, features) -> None:
        """Features [n, n_feat] of the next n committed tokens (layers concatenated in order)."""
        f = torch.as_tensor(np.asarray(features, dtype=np.float32)).reshape(-1, self.n_feat)
        self._pending.append(f)
        self.n_past += f.shape[0]

    @torch.inference_mode()
    def propose(self, last: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
        """Block [last, MASK x (B-1)] at positions n_past..; returns ids, logp [(B-1), top_k], best first."""
        B = self.block_size
        ctx = torch.cat(self._pending)[None] if self._pending else torch.zeros(1, 0, self.n_feat)
        ids = torch.tensor([[last] + [self.mask_token_id] * (B - 1)])
        scale = float(self.draft.config.dflash_config.get("input_embedding_scale", 1.0))
        noise = torch.nn.functional.embedding(ids, self.embed) * scale
        pos = torch.arange(self.n_past - ctx.shape[1], self.n_past + B)[None]
        hidden = self.draft(target_hidden=ctx, noise_embedding=noise, position_ids=pos,
                            past_key_values=self.cache, use_cache=True)[:, 1 - B:, :]
        _crop_to(self.cache, self.n_past)  # keep the context rows, drop the block's
        self._pending = []
        logp = torch.log_softmax(self.draft.compute_logits(hidden, self.head).float(), dim=-1)[0]
        vals, idx = torch.topk(logp, top_k, dim=-1)
        return idx.numpy().astype(np.int32), vals.numpy().astype(np.float32)


class TargetReference:
    """A transformers causal LM whose committed state is only ever advanced by exact forwards."""

    def __init__(self, model, layer_ids: list[int]):
        from transformers import DynamicCache

        self.model = model
        self.layer_ids = list(layer_ids)
        self.cache = DynamicCache(config=model.config)
        self.n_past = 0

    @torch.inference_mode()
    def _forward(self, cache, tokens: list[int]):
        ids = torch.tensor([tokens])
        pos = torch.arange(self.n_past, self.n_past + len(tokens))[None]
        out = self.model(ids, position_ids=pos, past_key_values=cache, use_cache=True, output_hidden_states=True)
        argmax = out.logits[0].argmax(-1).tolist()
        feats = extract_context_feature(out.hidden_states, self.layer_ids)[0]
        return argmax, feats, out.logits[0]

    def prefill(self, tokens: list[int]) -> tuple[int, torch.Tensor]:
        """Commit the prompt; returns (next greedy token, features [n, n_feat])."""
        argmax, feats, _ = self._forward(self.cache, tokens)
        self.n_past += len(tokens)
        return argmax[-1], feats

    def verify(self, tokens: list[int]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Forward `tokens` after the committed prefix WITHOUT committing them.
        Returns (greedy choice after each token, features [n, n_feat], logits [n, V])."""
        return self._forward(copy.deepcopy(self.cache), tokens)

    def commit(self, tokens: list[int]) -> None:
        """Advance the committed state by `tokens` (re-fed: the DeltaNet state cannot be cropped)."""
        self._forward(self.cache, tokens)
        self.n_past += len(tokens)


@dataclass
class RefStep:
    last: int               # root of the step (the previous bonus)
    draft: list[int]        # proposed chain after `last`
    accepted: int           # k: draft tokens the target agreed with
    bonus: int              # the target's token after the accepted prefix

    @property
    def acceptance_length(self) -> int:  # tokens produced by the step (dflash's convention)
        return self.accepted + 1


@dataclass
class RefResult:
    tokens: list[int]                       # generated tokens after the prompt (== AR greedy)
    steps: list[RefStep] = field(default_factory=list)

    @property
    def acceptance_lengths(self) -> list[int]:
        return [s.acceptance_length for s in self.steps]


def chain_generate(target, draft: DFlashDraftModel, prompt: list[int], max_new_tokens: int,
                   chain_len: int | None = None, stop_ids: tuple[int, ...] = ()) -> RefResult:
    """Greedy chain-mode speculative decoding with exact rollback.

    Each step: the draft proposes its top-1 chain (first `chain_len` of the B-1 positions), the
    target verifies [last] + chain, k = the matching prefix, the target state advances by
    [last] + chain[:k] and the draft context by those tokens' features; bonus = next `last`."""
    embed = target.get_input_embeddings().weight.detach()
    head = target.get_output_embeddings().weight.detach()
    dref = DraftReference(draft, embed, head)
    chain_len = dref.block_size - 1 if chain_len is None else chain_len
    if not 1 <= chain_len <= dref.block_size - 1:
        raise ValueError(f"chain_len must be in [1, {dref.block_size - 1}]")
    tref = TargetReference(target, draft.target_layer_ids)
    last, feats = tref.prefill(list(prompt))
    dref.append(feats)
    result = RefResult(tokens=[last])
    stopped = last in stop_ids
    while len(result.tokens) < max_new_tokens and not stopped:
        ids, _ = dref.propose(last, 1)
        chain = ids[:chain_len, 0].tolist()
        argmax, vfeats, _ = tref.verify([last] + chain)
        k = 0
        while k < len(chain) and chain[k] == argmax[k]:
            k += 1
        bonus = argmax[k]
        result.steps.append(RefStep(last=last, draft=chain, accepted=k, bonus=bonus))
        tref.commit([last] + chain[:k])
        dref.append(vfeats[:k + 1])
        for t in chain[:k] + [bonus]:
            result.tokens.append(t)
            if t in stop_ids:
                stopped = True
                break
        last = bonus
    del result.tokens[max_new_tokens:]
    return result


@torch.inference_mode()
def ar_greedy(target, prompt: list[int], n: int) -> list[int]:
    """Plain greedy continuation of `prompt`, n tokens (the lossless oracle)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=target.config)
    out: list[int] = []
    ids, pos = list(prompt), 0
    while len(out) < n:
        logits = target(torch.tensor([ids]), position_ids=torch.arange(pos, pos + len(ids))[None],
                        past_key_values=cache, use_cache=True).logits
        pos += len(ids)
        ids = [int(logits[0, -1].argmax())]
        out.append(ids[0])
    return out


def tree_accept(tokens, parents, greedy) -> tuple[list[int], int]:
    """Greedy DDTree acceptance. tokens[0] is the root (`last`), parents[0] = -1, parents[i] < i;
    greedy = the AR greedy continuation after `last`. Returns (accepted path of node indices from
    the root, bonus token): the path is the longest prefix of `greedy` spelled by a root-to-node
    path (k = len(path) - 1 accepted draft tokens) and the bonus is greedy[k]."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if i == 0:
            if p != -1:
                raise ValueError("node 0 must be the root (parent -1)")
            continue
        if not 0 <= p < i:
            raise ValueError(f"parents[{i}] = {p} must be in [0, {i})")
        children.setdefault(int(p), []).append(i)
    path = [0]
    while len(path) - 1 < len(greedy):
        want = greedy[len(path) - 1]
        nxt = next((c for c in children.get(path[-1], []) if tokens[c] == want), None)
        if nxt is None:
            break
        path.append(nxt)
    k = len(path) - 1
    if k >= len(greedy):
        raise ValueError("greedy continuation is shorter than the accepted path + bonus")
    return path, int(greedy[k])
