"""DDTree: the draft tree (step 2) and the acceptance walk (step 4) of one decode step.

The draft gives, for block positions j = 1..L, its top-K tokens `ids[L, K]` and their log-probs
`logp[L, K]` (best first). Its positions are independent (a factorized distribution), so a
continuation that picks rank r_j at each depth j has log-prob sum_j logp[j, r_j]. The tree holds the
`budget` most probable prefixes, found best-first: pop the best candidate prefix from a max-heap,
add it, push its first child (rank 0 one level deeper) and its next sibling (next rank, same
parent). Both successors score no better than the popped prefix, so pops come out in non-increasing
score order and every prefix enters after its parent: the result is prefix-closed and is exactly
the top-`budget` prefixes. Each pop costs O(log budget).

With `chain_seed` the draft's whole top-1 chain goes in first (so the accepted length is never
below chain mode's) and best-first fills the rest of the budget.

Output layout (what lb_verify takes): node 0 is the root (`last`), every parent precedes its
children, in DFS preorder with children best first, so the top-1 chain sits at indices 0..c and
committing it moves no KV rows. Node sets are tiny (budget ~22), so plain Python lists beat numpy
in the loops; numpy only holds the results.
"""
from __future__ import annotations

import heapq
from operator import itemgetter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .config import DEFAULT_BUDGET, MAX_BUDGET  # MAX_BUDGET: draft nodes of the largest tree max_tree allows


@dataclass(eq=False)
class Tree:
    """A verify tree of N draft nodes plus the root; every array has N + 1 entries."""

    tokens: np.ndarray     # int32: tokens[0] = last (the root), then the draft nodes
    parents: np.ndarray    # int32: parents[0] = -1, else 0 <= parents[i] < i
    depth: np.ndarray      # int32: 0 for the root; depth d = block position d after `last`
    # rank, pop_index, logp_cum (properties below) are diagnostics the decode step never reads:
    # kept as given (build_tree gives sequences) and made arrays on first read
    _rank: Sequence[int] | np.ndarray
    _pop_index: Sequence[int] | np.ndarray
    _logp_cum: Sequence[float] | np.ndarray | None = None
    preorder: bool = False  # nodes in DFS preorder (build_tree, chain_tree)
    _children: dict | None = field(default=None, repr=False)  # (parent, token) -> child
    _lists: tuple | None = field(default=None, repr=False)  # (tokens, parents, depth) as Python ints

    @property
    def rank(self) -> np.ndarray:
        """int32: draft rank of each token at its depth (root: -1)."""
        self._rank = np.asarray(self._rank, np.int32)
        return self._rank

    @property
    def pop_index(self) -> np.ndarray:
        """int32: when each node entered (root 0, then chain, then best-first)."""
        self._pop_index = np.asarray(self._pop_index, np.int32)
        return self._pop_index

    @property
    def logp_cum(self) -> np.ndarray | None:
        """float64: path log-prob under the draft (root 0), or None."""
        if self._logp_cum is not None:
            self._logp_cum = np.asarray(self._logp_cum, np.float64)
        return self._logp_cum

    def as_lists(self) -> tuple:
        """(tokens, parents, depth) as sequences of Python ints: what the step's Python loops index."""
        if self._lists is None:
            self._lists = (self.tokens.tolist(), self.parents.tolist(), self.depth.tolist())
        return self._lists

    @property
    def n_nodes(self) -> int:
        """Nodes including the root (what lb_verify's n is)."""
        return len(self.tokens)

    def children_by_token(self) -> dict:
        """(parent index, token) -> child index; the best child wins if siblings share a token."""
        if self._children is None:
            self._children = _children_map(self.parents.tolist(), self.tokens.tolist())
        return self._children


def check_params(budget: int, draft_top_k: int) -> None:
    """Raise ValueError when the tree budget or the draft's top-k is out of range."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise ValueError(f"budget must be an integer number of draft nodes, got {budget!r}")
    if not 1 <= budget <= MAX_BUDGET:
        raise ValueError(f"budget must be in [1, {MAX_BUDGET}] draft nodes, got {budget}")
    if isinstance(draft_top_k, bool) or not isinstance(draft_top_k, (int, np.integer)) or draft_top_k < 1:
        raise ValueError(f"draft_top_k must be an integer >= 1 (draft candidates per position), got {draft_top_k!r}")


def build_tree(ids: np.ndarray, logp: np.ndarray, last: int, budget: int = DEFAULT_BUDGET,
               chain_seed: bool = True) -> Tree:
    """The DDTree over the draft's top-K: at most `budget` draft nodes below the root `last`.

    ids: int [L, K] draft candidates per block position, best first; logp: float [L, K] their
    log-probs (log-softmax values, so each row is non-increasing and <= 0).
    """
    _check_draft(ids, logp)
    n_pos, top_k = ids.shape
    check_params(budget, top_k)
    idl = ids.tolist()
    lpl = logp.tolist()  # Python floats: scores are float64 sums, one add per depth

    # nodes in the order they enter; index 0 is the root
    tok, par, dep, rnk, score = [int(last)], [-1], [0], [-1], [0.0]
    heap = []  # (-score, depth - 1, rank, parent): ties go to the shallower, then better-ranked
    if chain_seed:
        for d in range(min(n_pos, budget)):
            s = score[d] + lpl[d][0]
            tok.append(idl[d][0]); par.append(d); dep.append(d + 1); rnk.append(0); score.append(s)
            if top_k > 1:
                heap.append((-(score[d] + lpl[d][1]), d, 1, d))
        if len(tok) - 1 < n_pos:
            heap.append((-(score[-1] + lpl[len(tok) - 1][0]), len(tok) - 1, 0, len(tok) - 1))
        heapq.heapify(heap)
    else:
        heap.append((-lpl[0][0], 0, 0, 0))
    pop, push = heapq.heappop, heapq.heappush
    n = len(tok)
    while n <= budget and heap:
        neg, d, r, p = pop(heap)
        tok.append(idl[d][r]); par.append(p); dep.append(d + 1); rnk.append(r); score.append(-neg)
        if d + 1 < n_pos:
            push(heap, (neg - lpl[d + 1][0], d + 1, 0, n))
        if r + 1 < top_k:
            push(heap, (-(score[p] + lpl[d][r + 1]), d, r + 1, p))
        n += 1
    return _preorder(tok, par, dep, rnk, score)


def chain_tree(ids: np.ndarray, last: int, n: int, logp: np.ndarray | None = None) -> Tree:
    """Chain mode: the draft's top-1 chain, min(n, L) nodes below the root `last`."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
        raise ValueError(f"ids must be a 2-D [positions, top_k] array with both sizes >= 1, got shape {ids.shape}")
    check_params(n, ids.shape[1])
    m = min(int(n), ids.shape[0])
    tokens = np.empty(m + 1, np.int32)
    tokens[0] = last
    tokens[1:] = ids[:m, 0]
    steps = np.arange(m + 1, dtype=np.int32)
    cum = None
    if logp is not None:
        cum = np.zeros(m + 1)
        np.cumsum(np.asarray(logp, np.float64)[:m, 0], out=cum[1:])
    rank = np.zeros(m + 1, np.int32)
    rank[0] = -1
    return Tree(tokens, steps - 1, steps.copy(), rank, steps.copy(), cum, preorder=True)


def walk(tree: Tree, target_choice) -> tuple[np.ndarray, int]:
    """Acceptance: follow the target's choice from the root while a child carries it.

    target_choice: the target's token after each node, either a sequence (greedy: the argmax of
    every node) or a callable node -> token (sample-and-match: the token drawn from the target's
    processed distribution at that node; called only for the nodes on the path, root first).
    Returns (path, bonus): path = node indices from the root (path[0] = 0), len(path) - 1 accepted
    draft tokens; bonus = the target's choice after the last path node.
    """
    if callable(target_choice):
        choose = target_choice
    else:
        am = target_choice.tolist() if isinstance(target_choice, np.ndarray) else list(target_choice)
        if len(am) != len(tree.tokens):
            raise ValueError(f"target_argmax has {len(am)} entries but the tree has {len(tree.tokens)} nodes; "
                             "pass the verify output for exactly this tree")
        choose = am.__getitem__
    path, bonus = walk_list(tree, choose)
    return np.array(path, np.int32), bonus


def walk_list(tree: Tree, choose) -> tuple[list[int], int]:
    """`walk` with `choose` a callable node -> token, the path as a list (the decode step's form)."""
    child = tree.children_by_token().get
    path = [0]
    cur = 0
    while True:
        tok = int(choose(cur))
        nxt = child((cur, tok))
        if nxt is None:
            return path, tok
        path.append(nxt)
        cur = nxt


def validate_tree(parents, tokens=None, max_nodes: int | None = None) -> None:
    """Raise ValueError unless `parents` (and `tokens`) form a tree lb_verify accepts."""
    p = np.asarray(parents)
    if p.ndim != 1 or p.size < 1:
        raise ValueError(f"parents must be a non-empty 1-D array, got shape {p.shape}")
    if p.dtype.kind not in "iu":
        raise ValueError(f"parents must hold integers, got dtype {p.dtype}")
    if p[0] != -1:
        raise ValueError(f"parents[0] must be -1 (node 0 is the root), got {p[0]}")
    bad = np.flatnonzero((p[1:] < 0) | (p[1:] >= np.arange(1, p.size)))
    if bad.size:
        i = int(bad[0]) + 1
        raise ValueError(f"parents[{i}] = {p[i]} but every non-root node needs 0 <= parent < its index {i}; "
                         "order nodes so parents come first")
    if max_nodes is not None and p.size > max_nodes:
        raise ValueError(f"tree has {p.size} nodes (root included) but at most {max_nodes} fit one verify; "
                         "lower the budget or raise max_tree")
    if tokens is not None:
        t = np.asarray(tokens)
        if t.shape != p.shape:
            raise ValueError(f"tokens has shape {t.shape} but parents has {p.shape}; they must match")
        if t.dtype.kind not in "iu":
            raise ValueError(f"tokens must hold integers, got dtype {t.dtype}")
        if t.size and t.min() < 0:
            raise ValueError(f"tokens must be >= 0, got {int(t.min())} at index {int(np.argmin(t))}")


def tree_from_parents(tokens, parents) -> Tree:
    """A Tree from hand-made arrays (tests, other drafters); validates, derives depth."""
    validate_tree(parents, tokens)
    par = np.asarray(parents, np.int32)
    plist = par.tolist()
    depth = [0] * len(plist)
    path = [0]  # root path of the node before; in DFS preorder each node's parent is on it
    preorder = True
    for i in range(1, len(plist)):
        p = plist[i]
        d = depth[i] = depth[p] + 1
        if preorder and d - 1 < len(path) and path[d - 1] == p:
            del path[d:]
            path.append(i)
        else:
            preorder = False
    rank = np.full(par.size, -1, np.int32)
    return Tree(np.asarray(tokens, np.int32).copy(), par.copy(), np.array(depth, np.int32), rank,
                np.arange(par.size, dtype=np.int32), preorder=preorder)


def _check_draft(ids: np.ndarray, logp: np.ndarray) -> None:
    if not isinstance(ids, np.ndarray) or not isinstance(logp, np.ndarray):
        raise ValueError("ids and logp must be numpy arrays")
    if ids.ndim != 2 or ids.shape != logp.shape:
        raise ValueError(f"ids and logp must both be 2-D [positions, top_k] of one shape, "
                         f"got {ids.shape} and {logp.shape}")
    if ids.shape[0] < 1:
        raise ValueError("the draft gave no block positions (ids has 0 rows); the block size must be >= 2")
    if ids.shape[1] < 1:
        raise ValueError("draft_top_k must be >= 1, but ids has 0 columns")
    if ids.dtype.kind not in "iu" or logp.dtype.kind != "f":
        raise ValueError(f"ids must be integer and logp floating point, got {ids.dtype} and {logp.dtype}")


def _preorder(tok: list, par: list, dep: list, rnk: list, score: list) -> Tree:
    """Lay out nodes given in entry order (parents first, siblings best first) in DFS preorder.

    A node's preorder slot is its parent's slot + 1 + the subtree sizes of its better siblings,
    so two flat passes do it: subtree sizes bottom-up, then slots top-down. The fields are then
    permuted by one itemgetter each (C loops, not Python ones).
    """
    m = len(tok)
    size = [1] * m
    for i in range(m - 1, 0, -1):
        size[par[i]] += size[i]
    slot = [0] * m
    free = [1] * m  # next free slot for a node's next child
    for i in range(1, m):
        p = par[i]
        s = slot[i] = free[p]
        free[p] = s + size[i]
        free[i] = s + 1
    order = [0] * m  # order[s] = the entry index of the node in preorder slot s
    for i, s in enumerate(slot):
        order[s] = i
    in_preorder = itemgetter(*order) if m > 1 else lambda seq: (seq[0],)
    parent_slot = [slot[p] for p in par]
    parent_slot[0] = -1
    tokens_l, parents_l, depth_l = in_preorder(tok), in_preorder(parent_slot), in_preorder(dep)
    # (parent, token) -> child; fed last slot first so the best (earliest) sibling is the one kept
    children = dict(zip(zip(parents_l[:0:-1], tokens_l[:0:-1]), range(m - 1, 0, -1)))
    tokens, parents, depth = np.array([tokens_l, parents_l, depth_l], np.int32)  # one conversion
    return Tree(tokens, parents, depth, in_preorder(rnk), order, in_preorder(score), preorder=True,
                _children=children, _lists=(tokens_l, parents_l, depth_l))


def _children_map(parents: list, tokens: list) -> dict:
    children = {}
    for i in range(1, len(parents)):
        key = (parents[i], tokens[i])
        if key not in children:
            children[key] = i
    return children
