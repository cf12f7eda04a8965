"""Penalty windows for every tree node at once (lucebox/penalty_window.py).

Oracle: the definition written as the plain loop it replaced: each node's path from the root
(parents), appended to the history, last `last_n` tokens, counted with collections.Counter.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from lucebox import ddtree
from lucebox.penalty_window import fill_counts, tree_windows


def reference_windows(tokens, parents, history, last_n) -> list[Counter]:
    paths, out = [], []
    for tok, par in zip(tokens, parents):
        path = (paths[par] if par >= 0 else list(history)) + [tok]
        paths.append(path)
        out.append(Counter(path[-last_n:]))
    return out


def random_tree(rng, n_nodes: int, n_vocab: int):
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n_nodes)]
    tokens = rng.integers(0, n_vocab, n_nodes).tolist()
    return ddtree.tree_from_parents(tokens, parents)


def rows_as_counters(pen_tokens, pen_counts, n) -> list[Counter]:
    out = []
    for toks, cnts in zip(pen_tokens[:n].tolist(), pen_counts[:n].tolist()):
        named = [(t, c) for t, c in zip(toks, cnts) if t >= 0]
        assert len({t for t, _ in named}) == len(named), "a token named twice"
        out.append(Counter(dict(named)))
    return out


@pytest.mark.parametrize("last_n", [1, 3, 8, 64])
@pytest.mark.parametrize("n_hist", [0, 2, 70])
def test_tree_windows_match_the_path_definition(last_n, n_hist):
    rng = np.random.default_rng(last_n * 100 + n_hist)
    for trial in range(20):
        # small vocabularies force repeats; deep chains (random parents) reach past last_n
        tree = random_tree(rng, int(rng.integers(1, 40)), n_vocab=int(rng.integers(2, 12)))
        history = rng.integers(0, 12, n_hist).tolist()
        windows = tree_windows(tree.tokens, tree.parents, tree.depth, history, last_n)
        slots = max(last_n, 1)
        pen_tokens = np.full((64, slots), 7, np.int32)  # stale values must be overwritten
        pen_counts = np.zeros((64, slots), np.int32)
        fill_counts(windows, pen_tokens, pen_counts)
        want = reference_windows(tree.tokens.tolist(), tree.parents.tolist(), history, last_n)
        assert rows_as_counters(pen_tokens, pen_counts, tree.n_nodes) == want, trial


def test_chain_deeper_than_the_window():
    tokens = list(range(10, 30))
    tree = ddtree.tree_from_parents(tokens, [-1] + list(range(19)))
    windows = tree_windows(tree.tokens, tree.parents, tree.depth, [1, 2, 3], 4)
    assert sorted(windows[19].tolist()) == [26, 27, 28, 29]
    assert sorted(windows[1].tolist()) == [2, 3, 10, 11]
    assert sorted(windows[0].tolist()) == [1, 2, 3, 10]


@pytest.mark.parametrize("n_nodes", [2, 3, 5, 17, 40])
def test_chains_of_every_depth_against_the_path_definition(n_nodes):
    """Deep chains exercise every doubling pass of the ancestor table."""
    rng = np.random.default_rng(n_nodes)
    tokens = rng.integers(0, 6, n_nodes).tolist()
    tree = ddtree.tree_from_parents(tokens, [-1] + list(range(n_nodes - 1)))
    history = rng.integers(0, 6, 30).tolist()
    pen_tokens, pen_counts = np.zeros((n_nodes, 64), np.int32), np.zeros((n_nodes, 64), np.int32)
    fill_counts(tree_windows(tree.tokens, tree.parents, tree.depth, history, 64), pen_tokens, pen_counts)
    want = reference_windows(tokens, tree.parents.tolist(), history, 64)
    assert rows_as_counters(pen_tokens, pen_counts, n_nodes) == want


def test_vocabulary_smaller_than_the_window():
    """Fewer slots (n_vocab) than window tokens: the distinct tokens still fit, packed per row."""
    rng = np.random.default_rng(5)
    tree = random_tree(rng, 12, n_vocab=5)
    history = rng.integers(0, 5, 20).tolist()
    pen_tokens, pen_counts = np.zeros((12, 5), np.int32), np.zeros((12, 5), np.int32)
    fill_counts(tree_windows(tree.tokens, tree.parents, tree.depth, history, 16), pen_tokens, pen_counts)
    want = reference_windows(tree.tokens.tolist(), tree.parents.tolist(), history, 16)
    assert rows_as_counters(pen_tokens, pen_counts, 12) == want
