"""Penalty windows: which tokens (and how often) the penalties see for each sampled row.

A row's window is the last `last_n` tokens before the position it samples: the committed history,
then, for a tree node, the node's own ancestors and the node itself (never its flat predecessors).
The device takes each window as distinct (token, count) pairs, -1 marking an empty slot; it applies
one factor per named token, so the order of the pairs within a row does not change any result.

Everything here is numpy over all rows at once, in as few calls as the layout allows: on the GPU
machine's host each numpy call costs microseconds, and the sampled step builds these windows for
every tree node (23 at the default budget) each step.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def tree_windows(tokens: np.ndarray, parents: np.ndarray, depth: np.ndarray, history: Sequence[int],
                 last_n: int, *, preorder: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """int32 [n_nodes, last_n]: each node's window (unordered), -1 where history runs out.

    preorder: the nodes are in DFS preorder (build_tree's and chain_tree's layout), which finds
    the ancestors in a few numpy calls (_preorder_windows); any parents-first order works without.
    out: an int32 [n_nodes, last_n] array to fill (e.g. the device's pen_tokens rows), else new.
    """
    n = tokens.size
    if out is None:
        out = np.empty((n, last_n), np.int32)
    if last_n == 0:
        return out
    if preorder and n <= last_n:
        _preorder_windows(tokens, depth, history, out)
        return out
    # Column b holds the token b places back from the node: its b-th ancestor while b <= depth,
    # else the committed token (b - depth) places back from the end of `history`.
    # One source array: the history's last last_n tokens (left-padded with -1, "none"), the nodes'
    # tokens, then a -1 that the ancestor table's "past the root" entries point at.
    src = np.full(last_n + n + 1, -1, np.int32)
    tail = history[-last_n:]
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
    np.take(src, np.where(back <= d, from_tree, from_hist), out=out)
    return out


def _preorder_windows(tokens: np.ndarray, depth: np.ndarray, history: Sequence[int], out: np.ndarray) -> None:
    """tree_windows for nodes in DFS preorder, all shallower than out's width L. Column c of a
    node at depth d holds its ancestor at depth c while c <= d (the root is depth 0, the node
    itself depth d), else the history token L - c places back (columns d + 1 .. L - 1 hold the
    last L - 1 - d committed tokens). In preorder the ancestor at depth c is the last node at
    depth c at or before the node: every node between the two lies in its subtree, so deeper."""
    n, width = out.shape
    tail = history[-(width - 1):] if width > 1 else []
    pad = width - 1 - len(tail)
    if pad:
        out[:, 1:pad + 1] = -1
    if len(tail):
        out[:, pad + 1:] = tail
    # last[i, c]: the last node at depth c up to node i (depths are below n, so n columns hold all)
    iota = np.arange(n)
    last = np.zeros((n, n), np.intp)
    last[iota, depth] = iota
    np.maximum.accumulate(last, axis=0, out=last)
    np.copyto(out[:, :n], tokens[last], where=iota <= depth[:, None])


def dedupe_rows(rows: np.ndarray, counts: np.ndarray | None = None) -> None:
    """In place: sort each row, then keep each distinct token once (in the last slot of its run),
    -1 in the other slots. counts: an array of rows' shape that gets each run's length in that
    slot (the other slots get values never read), or None to skip counting."""
    width = rows.shape[1]
    if width < 2:
        if counts is not None:
            counts[...] = 1
        return
    rows.sort(axis=1)
    repeat = rows[:, :-1] == rows[:, 1:]  # slot j holds the token of slot j + 1
    if counts is not None:
        # the length of the run ending at slot j is j + 1 - the slot where it starts, and a run
        # starts at j >= 1 where slot j - 1 does not repeat into it
        cols = np.arange(1, width + 1)
        start = np.where(repeat, 0, cols[:-1])
        np.maximum.accumulate(start, axis=1, out=start)
        counts[:, 0] = 1
        np.subtract(cols[1:], start, out=counts[:, 1:])
    rows[:, :-1][repeat] = -1


def fill_counts(windows: np.ndarray, pen_tokens: np.ndarray, pen_counts: np.ndarray | None) -> None:
    """Write each window row as distinct (token, count) pairs into the first rows of pen_tokens /
    pen_counts; every other slot of those rows becomes -1 (empty). pen_counts None: counts are
    not written (see Sampler: only the frequency penalty reads them)."""
    rows, width = windows.shape
    slots = pen_tokens.shape[1]
    if width == slots:  # the usual case: each row sorted and deduplicated where it lands
        out = pen_tokens[:rows]
        out[...] = windows
        dedupe_rows(out, None if pen_counts is None else pen_counts[:rows])
        return
    if not (pen_tokens.flags.c_contiguous and (pen_counts is None or pen_counts.flags.c_contiguous)):
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
    r, col = np.divmod(first, width)
    if width > slots:  # vocabulary smaller than the window: number each row's named tokens from 0
        named = tok >= 0
        r, tok, counts = r[named], tok[named], counts[named]
        col = np.arange(r.size) - np.searchsorted(r, r)
    slot = r * slots + col
    # a run of -1 (history ran out) lands as an empty slot; its count is never read
    pen_tokens.reshape(-1)[slot] = tok
    if pen_counts is not None:
        pen_counts.reshape(-1)[slot] = counts
