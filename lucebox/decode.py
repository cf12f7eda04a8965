"""One decode step: draft -> tree -> verify -> accept -> commit.

`Step.run` advances the caches by one step and says what it committed. Greedy (`sampler` None)
accepts along the target's argmax per node; sampling accepts by sample-and-match: at each node on
the path the target's token is drawn from its processed distribution (the sampled verify draws one
for every node, lucebox/sampling.py), the walk moves to the child carrying it, else that token is
the bonus. AR is the same step with a one-node tree (lb_step, with the sampling tail when sampling)
and no draft.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import ddtree


@dataclass
class StepResult:
    committed: list[int]   # tokens now in the caches, the old root first
    bonus: int             # the target's token after them: the next root (not in the caches)
    argmax_after: int      # the raw greedy argmax after the committed tokens
    draft_s: float = 0.0
    verify_s: float = 0.0
    commit_s: float = 0.0
    host_s: float = 0.0


class Step:
    """The decode step of one request: its mode, drafter, options and sampler, on buffers made once."""

    def __init__(self, handle, info: dict, mode: str, drafter, gen, sampler=None):
        self.h = handle
        self.max_ctx = info["max_ctx"]
        self.max_tree = info["max_tree"]
        self.mode = mode
        self.drafter = drafter
        self.gen = gen
        self.sampler = sampler
        self._argmax = np.empty(self.max_tree, np.int32)

    def run(self, last: int, history: list[int], remaining: int, stop_ids) -> StepResult | None:
        """One step after the committed `history` with root `last`; commits at most `remaining`
        tokens after the root and never past a stop token. None when the context is full."""
        n_past = len(history)
        room = self.max_ctx - n_past  # nodes this verify may write, root included
        if room < 1:
            return None
        t0 = time.perf_counter()
        if self.mode == "ar" or room < 2:
            return self._ar(last, history)
        ids, logp = self.drafter.propose(last, n_past, self.gen.draft_top_k)
        t1 = time.perf_counter()
        budget = min(self.gen.budget, room - 1, self.max_tree - 1)
        if self.mode == "chain":
            tree = ddtree.chain_tree(ids, last, budget)
        else:
            tree = ddtree.build_tree(ids, logp, last, budget, chain_seed=self.gen.chain_seed)
        n = len(tree.tokens)
        argmax = self._argmax[:n]
        if self.sampler is not None:
            self.sampler.set_history(history)  # the verify builds each node's penalty window from it
        t2 = time.perf_counter()
        if self.sampler is None:
            self.h.verify(tree.tokens, tree.parents, argmax)
            t3 = time.perf_counter()
            choice = argmax.tolist()
            path, bonus = ddtree.walk_list(tree, choice.__getitem__)
        else:
            self.h.verify_sampled(tree.tokens, tree.parents, argmax, self.sampler.io)
            t3 = time.perf_counter()
            path, bonus = ddtree.walk_list(tree, self.sampler.chooser(n, self.h.processed_row))
        tokens = tree.as_lists()[0]
        # never commit more than the request still needs, nor past a stop token
        emits = [tokens[i] for i in path[1:]] + [bonus]
        for i, t in enumerate(emits):
            if t in stop_ids:
                remaining = min(remaining, i + 1)
                break
        if len(path) > remaining:
            path, bonus = path[:remaining], emits[remaining - 1]
        t4 = time.perf_counter()
        self.h.commit(path)
        t5 = time.perf_counter()
        return StepResult([tokens[i] for i in path], bonus, int(argmax[path[-1]]),
                          draft_s=t1 - t0, verify_s=t3 - t2, commit_s=t5 - t4, host_s=(t2 - t1) + (t4 - t3))

    def _ar(self, last: int, history: list[int]) -> StepResult:
        """AR: feed `last`, commit it, and take the target's token after it (argmax or drawn)."""
        t0 = time.perf_counter()
        if self.sampler is None:
            nxt = self.h.step(last)
            return StepResult([last], nxt, nxt, verify_s=time.perf_counter() - t0)
        s = self.sampler
        s.set_history(history)
        t1 = time.perf_counter()
        argmax = self.h.step_sampled(last, s.io)
        t2 = time.perf_counter()
        nxt = s.pick(0, self.h.processed_row)
        return StepResult([last], nxt, argmax, verify_s=t2 - t1, host_s=(t1 - t0) + time.perf_counter() - t2)
