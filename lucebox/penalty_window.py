"""Penalty windows: which tokens (and how often) the penalties see for each sampled row.

A row's window is the last `last_n` tokens before the position it samples: the committed history,
then, for a tree node, the node's own ancestors and the node itself (never its flat predecessors).
The device takes each window as distinct (token, count) pairs, -1 marking an empty slot; it applies
one factor per named token, so the order of the pairs within a row does not change any result.

Everything here is numpy over all rows at once: a per-node Python loop (list slices plus a Counter
per node, 23 nodes per step) was most of the sampled step's host time.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def tree_windows(tokens: np.ndarray, parents: np.ndarray, depth: np.ndarray, history: Sequence[int],
                 last_n: int) -> np.ndarray:
    """int32 [n_nodes, last_n]: each node's window (unordered), -1 where history runs out.

    Column b holds the token b places back from the node: its b-th ancestor while b <= depth, else
    the committed token (b - depth) places back from the end of `history`.
    """
    n = tokens.size
    back = np.arange(last_n)
    # pad the history on the left so every "places back" index lands in the array (-1 = none)
    hist = np.full(last_n, -1, np.int32)
    tail = np.asarray(history[-last_n:], np.int32) if last_n else hist[:0]
    hist[last_n - tail.size:] = tail
    n_anc = min(int(depth.max()) + 1, last_n)
    # anc[:, b] = the b-th ancestor of each node; -1 past the root (index -1 hits the -1 sentinel)
    par = np.append(parents.astype(np.intp), -1)
    anc = np.empty((n, n_anc), np.intp)
    anc[:, 0] = np.arange(n)
    for b in range(1, n_anc):  # at most the tree's depth (a draft block), not its node count
        anc[:, b] = par[anc[:, b - 1]]
    tok = np.append(tokens.astype(np.int32), -1)
    d = depth.astype(np.intp)[:, None]
    in_tree = back[None, :] <= d
    from_tree = tok[anc[:, np.minimum(back, n_anc - 1)]]
    from_hist = hist[np.clip(last_n - (back[None, :] - d), 0, last_n - 1)]
    return np.where(in_tree, from_tree, from_hist)


def fill_counts(windows: np.ndarray, pen_tokens: np.ndarray, pen_counts: np.ndarray) -> None:
    """Write each window row as distinct (token, count) pairs into the first rows of pen_tokens /
    pen_counts (sorted by token; the other slots of those rows become -1)."""
    rows, width = windows.shape
    s = np.sort(windows, axis=1)
    new = np.ones((rows, width), bool)
    new[:, 1:] = s[:, 1:] != s[:, :-1]          # first of a run of equal tokens
    last = np.ones((rows, width), bool)
    last[:, :-1] = new[:, 1:]                   # last of a run
    valid = s >= 0
    r, c = np.nonzero(new & valid)              # row-major: runs in order, one per distinct token
    ends = np.nonzero((last & valid).ravel())[0]
    counts = ends - (r * width + c) + 1
    slot = np.cumsum(new & valid, axis=1)[r, c] - 1
    pen_tokens[:rows] = -1
    pen_tokens[r, slot] = s[r, c]
    pen_counts[r, slot] = counts
