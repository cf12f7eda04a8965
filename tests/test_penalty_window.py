"""Penalty windows (native/src/penalty_window.cpp), built by the sampled calls themselves.

Oracle: the definition written as a plain loop: each row's path (a verify node's root path from
parents; every token of a prefill up to its last; a step's one token), appended to the history, last
`last_n` tokens, counted with collections.Counter. The native windows are read back through the
processed rows: the tiny target's raw logits (lb_verify / lb_prefill with logits) penalised by the
oracle's counts in float32 (test_sampling.penalised, the device's arithmetic) must equal them bit for
bit, and under these penalties every count gives other bits.
"""
from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest

from lucebox import ddtree
from lucebox._native import Handle, SampleBuffers
from lucebox.sampling import Processing
from test_sampling import penalised

DEVICE = -1 if os.environ.get("LUCEBOX_TEST_BACKEND") != "cuda" else 0
MAX_TREE = 40
P = Processing(temperature=1.0, repeat_penalty=1.3, presence_penalty=0.25, frequency_penalty=0.5)


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


@pytest.fixture(scope="module")
def handle(tiny_gguf):
    h = Handle(tiny_gguf["f32"], max_ctx=512, kv_type="f32", device=DEVICE, n_threads=1, max_tree=MAX_TREE)
    yield h
    h.close()


def buffers(rows: int, last_n: int) -> SampleBuffers:
    return SampleBuffers(rows, temperature=P.temperature, repeat_penalty=P.repeat_penalty,
                         presence_penalty=P.presence_penalty, frequency_penalty=P.frequency_penalty,
                         n_candidates=4, penalty_last_n=last_n)


def assert_rows_penalised_by(handle, raw: np.ndarray, windows: list[Counter], what) -> None:
    row = np.empty(raw.shape[1], np.float32)
    for r, window in enumerate(windows):
        np.testing.assert_array_equal(handle.processed_row(r, row), penalised(raw[r], window, P),
                                      err_msg=f"{what} row {r}")


def verify_windows(handle, tree, prefix, history, last_n) -> None:
    """The windows of one sampled verify of `tree` after `prefix`, given `history`, against the oracle."""
    n_vocab = handle.info()["n_vocab"]
    raw = np.zeros((tree.n_nodes, n_vocab), np.float32)
    handle.reset()
    handle.prefill(prefix)
    handle.verify(tree.tokens, tree.parents, np.zeros(tree.n_nodes, np.int32), raw)
    handle.reset()
    handle.prefill(prefix)
    io = buffers(MAX_TREE, last_n)
    io.set_history(history)
    handle.verify_sampled(tree.tokens, tree.parents, np.zeros(tree.n_nodes, np.int32), io)
    want = reference_windows(tree.tokens.tolist(), tree.parents.tolist(), history, last_n)
    assert_rows_penalised_by(handle, raw, want, (last_n, len(history), tree.parents.tolist()))


@pytest.mark.parametrize("last_n", [1, 2, 5, 16, 64])
@pytest.mark.parametrize("n_hist", [0, 3, 100])
def test_verify_windows_match_the_path_definition(handle, last_n, n_hist):
    rng = np.random.default_rng(1000 + last_n * 10 + n_hist)
    prefix = np.arange(30, 40, dtype=np.int32)
    for trial in range(6):
        # small vocabularies force repeats; random parents reach deeper than last_n; both layouts
        make = random_preorder_tree if trial % 2 else random_tree
        tree = make(rng, int(rng.integers(1, MAX_TREE + 1)), n_vocab=int(rng.integers(2, 12)))
        history = rng.integers(0, 12, n_hist).tolist()
        verify_windows(handle, tree, prefix, history, last_n)


def test_draft_trees_match(handle):
    """build_tree's and chain_tree's layouts, as the decode step passes them."""
    rng = np.random.default_rng(9)
    for trial in range(6):
        n_pos, top_k = int(rng.integers(1, 16)), int(rng.integers(1, 9))
        ids = rng.integers(0, 30, (n_pos, top_k)).astype(np.int32)
        logp = np.sort(np.log(rng.dirichlet(np.ones(top_k), n_pos)), axis=1)[:, ::-1].astype(np.float32)
        for tree in (ddtree.build_tree(ids, logp, 3, int(rng.integers(1, MAX_TREE)), chain_seed=bool(trial % 2)),
                     ddtree.chain_tree(ids, 3, 22)):
            history = rng.integers(0, 30, int(rng.integers(0, 80))).tolist()
            verify_windows(handle, tree, np.arange(5, 9, dtype=np.int32), history, 64)


def test_window_longer_than_the_vocabulary(handle):
    """A window of more tokens than the vocabulary has (slots = n_vocab): every token of the
    vocabulary can be named, each once with its count."""
    n_vocab = handle.info()["n_vocab"]
    rng = np.random.default_rng(4)
    history = rng.permutation(np.concatenate([np.arange(n_vocab), rng.integers(0, n_vocab, 300)])).tolist()
    tree = random_tree(rng, 12, n_vocab)
    verify_windows(handle, tree, np.arange(3, dtype=np.int32), history, 1024)


@pytest.mark.parametrize("last_n", [1, 4, 64])
def test_prefill_and_step_windows(handle, last_n):
    """prefill_sampled: the last token's window runs over the history, then the whole call (all
    micro-batches); step_sampled: the history, then the fed token."""
    n_vocab = handle.info()["n_vocab"]
    rng = np.random.default_rng(last_n)
    history = rng.integers(0, 8, 50).tolist()
    for n in (1, 3, 40):
        toks = rng.integers(0, 8, n).astype(np.int32)
        raw = np.zeros((n, n_vocab), np.float32)
        handle.reset()
        handle.prefill(toks, raw)
        handle.reset()
        io = buffers(1, last_n)
        io.set_history(history)
        handle.prefill_sampled(toks, io)
        assert_rows_penalised_by(handle, raw[-1:], [Counter((history + toks.tolist())[-last_n:])], ("prefill", n))
    step_raw = np.zeros((1, n_vocab), np.float32)
    handle.reset()
    handle.prefill(toks)
    handle.verify(np.array([6], np.int32), np.array([-1], np.int32), np.zeros(1, np.int32), step_raw)
    handle.reset()
    handle.prefill(toks)
    io.set_history(history)
    handle.step_sampled(6, io)
    assert_rows_penalised_by(handle, step_raw, [Counter((history + [6])[-last_n:])], "step")
