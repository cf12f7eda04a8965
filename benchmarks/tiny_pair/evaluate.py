"""Stage 5: acceptance lengths on the held-out prompts, measured in PyTorch before any export.

Greedy speculative decoding commits exactly the AR greedy tokens S, so one AR run per prompt
determines every step's outcome: at committed length P with `last` = S[P], the draft sees the
target features of S[:P] and proposes; a path is accepted as long as it spells S[P+1:]. Chain
mode accepts the top-1 prefix that matches; DDTree accepts the deepest tree path that matches
(the tree is lucebox's own builder, so the numbers are what the engine should see up to numerics).
AL = tokens committed per target verify, as in dflash's acceptance_lengths (accepted + bonus).
dflash's own `dflash_generate` is no oracle for this target: transformers' cache `crop()` rolls back
the DeltaNet conv window but not the recurrent state, so after a partly rejected block its target
state holds the rejected tokens and its output drifts from AR.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from lucebox.ddtree import build_tree

from .generate import greedy, layer_features


@torch.no_grad()
def draft_topk(draft, embed, head, feats, last: int, start: int, top_k: int):
    """The draft's top-k ids and log-probs for block positions 1..B-1 after committing `start` tokens."""
    block = draft.block_size
    device = feats.device
    ids = torch.full((1, block), draft.mask_token_id, dtype=torch.long, device=device)
    ids[0, 0] = last
    pos = torch.arange(start + block, device=device)[None]
    hidden = draft(position_ids=pos, noise_embedding=F.embedding(ids, embed),
                   target_hidden=feats[:, :start])
    logp = F.log_softmax(F.linear(hidden[0, 1:], head).float(), -1)
    lp, ix = logp.topk(top_k, -1)
    return ix.cpu().numpy(), lp.cpu().numpy()


def _deepest_match(tree, seq: list[int]) -> int:
    """Depth of the deepest tree node whose path spells seq[0:depth]."""
    children = tree.children_by_token()
    node, depth = 0, 0
    while depth < len(seq):
        nxt = children.get((node, seq[depth]))
        if nxt is None:
            break
        node, depth = nxt, depth + 1
    return depth


def simulate(draft, embed, head, seq: list[int], feats, plen: int, n_gen: int, mode: str,
             budget: int, top_k: int) -> list[int]:
    """Committed tokens per verify step, dflash_generate's accounting (first token from prefill)."""
    block = draft.block_size
    max_length = plen + n_gen
    start, steps = plen, []
    while start + 1 < max_length:
        verify = min(block, max_length - start)
        ids, logp = draft_topk(draft, embed, head, feats, seq[start], start, top_k)
        truth = seq[start + 1:start + verify]
        if mode == "chain":
            k = 0
            while k < len(truth) and ids[k, 0] == truth[k]:
                k += 1
        else:
            tree = build_tree(ids[:verify - 1].astype(np.int64), logp[:verify - 1].astype(np.float64),
                              seq[start], budget=budget, chain_seed=True)
            k = _deepest_match(tree, truth)
        produced = min(k + 1, max_length - start - 1)
        steps.append(produced)
        start += produced
    return steps


def evaluate(target, draft, tok, prompts: list[dict], n_gen: int, budget: int, top_k: int,
             seconds: float, log) -> dict:
    t0 = time.perf_counter()
    device = next(target.parameters()).device
    target.eval()
    draft.eval()
    embed = target.get_input_embeddings().weight
    head = target.get_output_embeddings().weight
    rows = []
    for p in prompts:
        if time.perf_counter() - t0 > seconds:
            log(f"eval: time budget reached after {len(rows)} prompts")
            break
        ids = torch.tensor([tok.encode(p["prompt"], add_special_tokens=False).ids], device=device)
        seq = greedy(target, ids, n_gen)
        feats = layer_features(target, seq, draft.target_layer_ids)
        # the cached greedy run must agree with a teacher-forced pass (the AR oracle is consistent)
        tf_argmax = target(input_ids=seq[:, :-1]).logits[0, ids.shape[1] - 1:].argmax(-1)
        agree = (tf_argmax == seq[0, ids.shape[1]:]).float().mean().item()
        s = seq[0].tolist()
        plen = ids.shape[1]
        chain = simulate(draft, embed, head, s, feats, plen, n_gen, "chain", budget, top_k)
        tree = simulate(draft, embed, head, s, feats, plen, n_gen, "ddtree", budget, top_k)
        rows.append({"id": p["id"], "prompt_tokens": plen, "chain_al": float(np.mean(chain)),
                     "ddtree_al": float(np.mean(tree)), "ar_teacher_forced_agree": round(agree, 4),
                     "continuation": tok.decode(s[plen:], skip_special_tokens=False)})
    chain_al = float(np.mean([r["chain_al"] for r in rows])) if rows else float("nan")
    tree_al = float(np.mean([r["ddtree_al"] for r in rows])) if rows else float("nan")
    log(f"eval on {len(rows)} held-out prompts, n_gen {n_gen}: chain AL {chain_al:.2f}, "
        f"DDTree(budget {budget}) AL {tree_al:.2f} ({tree_al / chain_al:.2f}x)")
    return {"n_prompts": len(rows), "n_gen": n_gen, "budget": budget, "top_k": top_k,
            "chain_al": round(chain_al, 3), "ddtree_al": round(tree_al, 3),
            "ddtree_over_chain": round(tree_al / chain_al, 3), "seconds": round(time.perf_counter() - t0, 1),
            "per_prompt": rows}
