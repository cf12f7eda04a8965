"""Penalty windows: which tokens (and how often) the penalties see for each sampled row.

A row's window is the last `last_n` tokens before the position it samples: the committed history,
then, for a tree node, the node's own ancestors and the node itself (never its flat predecessors).
The device takes each window as distinct (token, count) pairs, -1 marking an empty slot; it applies
one factor per named token, so the order of the pairs within a row does not change any result.

Everything here works on all rows at once in as few numpy calls as the layout allows: on the GPU
machine's host each numpy call costs microseconds, and the sampled step builds these windows for
every tree node (23 at the default budget) each step.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class TreeWindows:
    """Every tree node's window, written into caller rows; made once per request, reused each step.

    A node's window is the last `last_n` tokens of history + its root path. The tree's leading
    chain (nodes 0..c, each the parent of the next; in any parents-first order these are the nodes
    whose depth equals their index, and they come first: build_tree's and chain_tree's top-1
    chain) makes most of them slices of one array: with src = (the last last_n - 1 committed
    tokens, then the tree's tokens), a node at depth d whose parent is on the chain has the window
    src[d : d + last_n], but for its own token in the last column. So one gather by depth fills
    every row; then each node past the chain gets its own token and its off-chain ancestors'
    tokens written over the chain tokens that the gather put in those columns (a Python walk up
    from each: a few nodes, a few writes). Numpy calls per step: four whatever the tree (five
    while the history is shorter than the window), where an ancestor table took a dozen.
    """

    def __init__(self, last_n: int, max_nodes: int):
        if last_n < 1:
            raise ValueError(f"last_n must be >= 1 (tokens per penalty window), got {last_n}")
        self.last_n = last_n
        self._src = np.full(last_n - 1 + max_nodes, -1, np.int32)
        self._by_depth = sliding_window_view(self._src, last_n)  # [max_nodes, last_n]: src[d : d + last_n]

    def fill(self, tree, history: Sequence[int], out: np.ndarray) -> np.ndarray:
        """Rows [tree.n_nodes, last_n] of `out` get the windows (unordered), -1 where history runs out.

        tree: a ddtree.Tree (parents first); history: the committed tokens before the root.
        """
        width = self.last_n
        tokens, parents, depth = tree.as_lists()
        n, max_nodes = len(tokens), self._by_depth.shape[0]
        if n > max_nodes:
            raise ValueError(f"the tree has {n} nodes but these windows were made for at most {max_nodes}")
        src = self._src
        if width > 1:
            tail = history[-(width - 1):]
            pad = width - 1 - len(tail)
            if pad:
                src[:pad] = -1
            src[pad:width - 1] = tail
        src[width - 1:width - 1 + n] = tree.tokens
        self._by_depth.take(tree.depth, axis=0, out=out)
        first_off = 1
        while first_off < n and depth[first_off] == first_off:
            first_off += 1
        if first_off < n:
            at, value = [], []  # flat positions in out, tokens to write there
            for i in range(first_off, n):
                node, row = i, i * width
                col = row + width - 1  # the node's own token, then its ancestors leftwards
                while col >= row and depth[node] != node:
                    at.append(col)
                    value.append(tokens[node])
                    node, col = parents[node], col - 1
            out.put(at, value)
        return out


def tree_windows(tree, history: Sequence[int], last_n: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """int32 [n_nodes, last_n]: each node's window (unordered), -1 where history runs out.

    out: an int32 [n_nodes, last_n] array to fill (e.g. the device's pen_tokens rows), else new.
    """
    if out is None:
        out = np.empty((tree.n_nodes, last_n), np.int32)
    if last_n:
        TreeWindows(last_n, tree.n_nodes).fill(tree, history, out)
    return out


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
