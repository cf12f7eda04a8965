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
    # one source array: the history's last last_n tokens (left-padded with -1, "none"), the nodes'
    # tokens, then a -1 that the ancestor table's "past the root" entries point at
    src = np.full(last_n + n + 1, -1, np.int32)
    tail = history[-last_n:] if last_n else []
    src[last_n - len(tail):last_n] = tail
    src[last_n:last_n + n] = tokens
    n_anc = min(int(depth.max()) + 1, last_n)
    # anc[i, b] = the b-th ancestor of node i; row n (which index -1 reaches) is "past the root".
    # Doubling: the (m - 1 + j)-th ancestor is the j-th ancestor of the (m - 1)-th, so with columns
    # 0..m-1 known one pass fills m - 1 more (4 passes for a 16-deep draft block, not 15).
    anc = np.full((n + 1, n_anc), n, np.intp)
    anc[:n, 0] = np.arange(n)
    if n_anc > 1:
        anc[:n, 1] = np.where(parents >= 0, parents, n)
    m = 2
    while m < n_anc:
        k = min(m - 1, n_anc - m)
        anc[:, m:m + k] = anc[anc[:, m - 1], 1:k + 1]
        m += k
    back = np.arange(last_n)
    d = depth.astype(np.intp)[:, None]
    from_tree = anc[:n, np.minimum(back, n_anc - 1)] + last_n
    from_hist = last_n + d - back  # b - depth places back from the end of the history
    return src[np.where(back <= d, from_tree, from_hist)]


def fill_counts(windows: np.ndarray, pen_tokens: np.ndarray, pen_counts: np.ndarray) -> None:
    """Write each window row as distinct (token, count) pairs into the first rows of pen_tokens /
    pen_counts; every other slot of those rows becomes -1 (empty)."""
    rows, width = windows.shape
    slots = pen_tokens.shape[1]
    if not (pen_tokens.flags.c_contiguous and pen_counts.flags.c_contiguous):
        raise ValueError("fill_counts writes through flat views: pen_tokens and pen_counts must be C-contiguous")
    pen_tokens[:rows] = -1
    if width == 0:
        return
    s = np.sort(windows, axis=1)
    start = np.empty((rows, width), bool)  # first of a run of equal tokens; every row starts one
    start[:, 0] = True
    np.not_equal(s[:, 1:], s[:, :-1], out=start[:, 1:])
    first = np.flatnonzero(start)
    counts = np.empty_like(first)  # run length: up to the next run's start (runs end at row ends)
    counts[:-1] = first[1:] - first[:-1]
    counts[-1] = rows * width - first[-1]
    tok = s.reshape(-1)[first]
    if width == slots:  # the usual case: a run's slot is where it starts in its sorted row
        slot = first
    else:
        r, col = np.divmod(first, width)
        if width > slots:  # vocabulary smaller than the window: number each row's named tokens from 0
            named = tok >= 0
            r, tok, counts = r[named], tok[named], counts[named]
            col = np.arange(r.size) - np.searchsorted(r, r)
        slot = r * slots + col
    # a run of -1 (history ran out) lands as an empty slot; its count is never read
    pen_tokens.reshape(-1)[slot] = tok
    pen_counts.reshape(-1)[slot] = counts
