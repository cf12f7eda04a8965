"""Penalty windows for every tree node at once (lucebox/penalty_window.py).

Oracle: the definition written as the plain loop it replaced: each node's path from the root
(parents), appended to the history, last `last_n` tokens, counted with collections.Counter.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from lucebox import ddtree
from lucebox.penalty_window import TreeWindows, dedupe_rows, fill_counts, tree_windows


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
        windows = tree_windows(tree, history, last_n)
        slots = max(last_n, 1)
        pen_tokens = np.full((64, slots), 7, np.int32)  # stale values must be overwritten
        pen_counts = np.zeros((64, slots), np.int32)
        fill_counts(windows, pen_tokens, pen_counts)
        want = reference_windows(tree.tokens.tolist(), tree.parents.tolist(), history, last_n)
        assert rows_as_counters(pen_tokens, pen_counts, tree.n_nodes) == want, trial


def test_chain_deeper_than_the_window():
    tokens = list(range(10, 30))
    tree = ddtree.tree_from_parents(tokens, [-1] + list(range(19)))
    windows = tree_windows(tree, [1, 2, 3], 4)
    assert sorted(windows[19].tolist()) == [26, 27, 28, 29]
    assert sorted(windows[1].tolist()) == [2, 3, 10, 11]
    assert sorted(windows[0].tolist()) == [1, 2, 3, 10]


@pytest.mark.parametrize("n_nodes", [2, 3, 5, 17, 40])
def test_chains_of_every_depth_against_the_path_definition(n_nodes):
    """Chains of every length: all rows come from the one gather by depth, none from the walk."""
    rng = np.random.default_rng(n_nodes)
    tokens = rng.integers(0, 6, n_nodes).tolist()
    tree = ddtree.tree_from_parents(tokens, [-1] + list(range(n_nodes - 1)))
    history = rng.integers(0, 6, 30).tolist()
    pen_tokens, pen_counts = np.zeros((n_nodes, 64), np.int32), np.zeros((n_nodes, 64), np.int32)
    fill_counts(tree_windows(tree, history, 64), pen_tokens, pen_counts)
    want = reference_windows(tokens, tree.parents.tolist(), history, 64)
    assert rows_as_counters(pen_tokens, pen_counts, n_nodes) == want


def test_vocabulary_smaller_than_the_window():
    """Fewer slots (n_vocab) than window tokens: the distinct tokens still fit, packed per row."""
    rng = np.random.default_rng(5)
    tree = random_tree(rng, 12, n_vocab=5)
    history = rng.integers(0, 5, 20).tolist()
    pen_tokens, pen_counts = np.zeros((12, 5), np.int32), np.zeros((12, 5), np.int32)
    fill_counts(tree_windows(tree, history, 16), pen_tokens, pen_counts)
    want = reference_windows(tree.tokens.tolist(), tree.parents.tolist(), history, 16)
    assert rows_as_counters(pen_tokens, pen_counts, 12) == want


# --- preorder trees and in-place deduplication (what the decode step runs) ------------------------
def random_preorder_tree(rng, n_nodes: int, n_vocab: int):
    """A random tree laid out in DFS preorder: each node's parent is on the root path of the node
    before it (any depth, any number of children)."""
    parents, path = [-1], [0]
    for i in range(1, n_nodes):
        k = int(rng.integers(0, len(path)))
        parents.append(path[k])
        del path[k + 1:]
        path.append(i)
    return ddtree.tree_from_parents(rng.integers(0, n_vocab, n_nodes).tolist(), parents)


def device_rows(tree, history, last_n, counts: bool):
    """The rows Sampler.set_tree_windows writes: windows straight into pen_tokens, deduplicated."""
    pen_tokens = np.full((tree.n_nodes + 2, last_n), 7, np.int32)  # stale values must be overwritten
    pen_counts = np.zeros_like(pen_tokens)
    rows = tree_windows(tree, history, last_n, out=pen_tokens[:tree.n_nodes])
    dedupe_rows(rows, pen_counts[:tree.n_nodes] if counts else None)
    assert (pen_tokens[tree.n_nodes:] == 7).all(), "rows past the tree were written"
    return pen_tokens, pen_counts


@pytest.mark.parametrize("last_n", [1, 2, 5, 16, 64])
@pytest.mark.parametrize("n_hist", [0, 3, 100])
def test_preorder_windows_match_the_path_definition(last_n, n_hist):
    rng = np.random.default_rng(1000 + last_n * 10 + n_hist)
    for trial in range(40):
        # trees up to 70 nodes: paths deeper than last_n, off-chain branches deeper than last_n
        tree = random_preorder_tree(rng, int(rng.integers(1, 70)), n_vocab=int(rng.integers(2, 40)))
        assert tree.preorder
        history = rng.integers(0, 40, n_hist).tolist()
        want = reference_windows(tree.tokens.tolist(), tree.parents.tolist(), history, last_n)
        pen_tokens, pen_counts = device_rows(tree, history, last_n, counts=True)
        assert rows_as_counters(pen_tokens, pen_counts, tree.n_nodes) == want, trial
        # without counts (no frequency penalty): the same distinct tokens
        pen_tokens, _ = device_rows(tree, history, last_n, counts=False)
        got = [set(t for t in row if t >= 0) for row in pen_tokens[:tree.n_nodes].tolist()]
        assert got == [set(c) for c in want], trial


def test_draft_trees_match():
    """build_tree's and chain_tree's layouts, as the decode step sees them."""
    rng = np.random.default_rng(9)
    for trial in range(30):
        n_pos, top_k = int(rng.integers(1, 16)), int(rng.integers(1, 9))
        ids = rng.integers(0, 30, (n_pos, top_k)).astype(np.int32)
        logp = np.sort(np.log(rng.dirichlet(np.ones(top_k), n_pos)), axis=1)[:, ::-1].astype(np.float32)
        for tree in (ddtree.build_tree(ids, logp, 3, int(rng.integers(1, 40)), chain_seed=bool(trial % 2)),
                     ddtree.chain_tree(ids, 3, 22)):
            assert tree.preorder
            history = rng.integers(0, 30, int(rng.integers(0, 80))).tolist()
            pen_tokens, pen_counts = device_rows(tree, history, 64, counts=True)
            want = reference_windows(tree.tokens.tolist(), tree.parents.tolist(), history, 64)
            assert rows_as_counters(pen_tokens, pen_counts, tree.n_nodes) == want, trial


def test_one_window_builder_across_steps():
    """The Sampler's TreeWindows is reused every step: nothing of an earlier tree or history (a
    longer one included) may leak into the next rows. Trees in any parents-first order."""
    rng = np.random.default_rng(77)
    for last_n in (1, 4, 64):
        windows = TreeWindows(last_n, 64)
        for trial in range(60):
            make = random_preorder_tree if trial % 3 else random_tree
            tree = make(rng, int(rng.integers(1, 65)), n_vocab=int(rng.integers(2, 20)))
            history = rng.integers(0, 20, int(rng.integers(0, 90))).tolist()
            out = np.full((70, last_n), 7, np.int32)
            windows.fill(tree, history, out[:tree.n_nodes])
            assert (out[tree.n_nodes:] == 7).all(), "rows past the tree were written"
            got = [Counter(t for t in row if t >= 0) for row in out[:tree.n_nodes].tolist()]
            assert got == reference_windows(tree.tokens.tolist(), tree.parents.tolist(), history, last_n), trial
        with pytest.raises(ValueError, match="at most 64"):
            windows.fill(random_tree(rng, 65, 5), [], np.zeros((65, last_n), np.int32))


def test_tree_from_parents_tells_preorder():
    assert ddtree.tree_from_parents([5, 6, 7, 8], [-1, 0, 1, 0]).preorder
    assert ddtree.tree_from_parents([5, 6, 7, 8], [-1, 0, 1, 1]).preorder
    assert not ddtree.tree_from_parents([5, 6, 7, 8], [-1, 0, 0, 1]).preorder  # 3's parent is 1, after 2
    assert ddtree.tree_from_parents([5], [-1]).preorder
    # a preorder-only method on a tree in another order would be wrong: check the flag's meaning
    rng = np.random.default_rng(3)
    for _ in range(200):
        tree = random_tree(rng, int(rng.integers(1, 12)), 5)
        par = tree.parents.tolist()
        order, stack = [], [0]  # DFS from the root, children in index order
        while stack:
            i = stack.pop()
            order.append(i)
            stack.extend(reversed([j for j in range(len(par)) if par[j] == i]))
        assert tree.preorder == (order == list(range(len(par))))


@pytest.mark.parametrize("n_vocab", [50, 1000])  # fewer slots than the window; one slot per token
@pytest.mark.parametrize("n_hist", [0, 5, 63, 64, 200])
def test_sampler_rows_match_the_path_definition(n_hist, n_vocab):
    """Sampler.set_window / set_tree_windows end to end, with and without the frequency penalty
    (without it the counts are not computed and stay 1, which the device then ignores)."""
    from lucebox.sampling import Processing, Sampler

    rng = np.random.default_rng(n_hist)
    history = rng.integers(0, 50, n_hist).tolist()
    for freq in (0.0, 0.5):
        s = Sampler(Processing(temperature=1.0, repeat_penalty=1.2, frequency_penalty=freq), 0,
                    n_candidates=8, penalty_last_n=64, max_rows=64, n_vocab=n_vocab)
        for trial in range(10):
            tree = (random_preorder_tree if trial % 2 else random_tree)(rng, int(rng.integers(1, 60)), 50)
            s.set_tree_windows(tree, history)
            want = reference_windows(tree.tokens.tolist(), tree.parents.tolist(), history, 64)
            got = rows_as_counters(s.io.pen_tokens, s.io.pen_counts, tree.n_nodes)
            if freq == 0.0:
                assert (s.io.pen_counts == 1).all()
                want = [Counter(dict.fromkeys(c, 1)) for c in want]
            assert got == want, (freq, trial)
        s.set_window(3, history + [7])
        want = Counter((history + [7])[-64:])
        got = rows_as_counters(s.io.pen_tokens[3:4], s.io.pen_counts[3:4], 1)[0]
        assert got == (want if freq else Counter(dict.fromkeys(want, 1)))
