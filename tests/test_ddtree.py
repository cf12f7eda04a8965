"""DDTree build and acceptance walk, against brute force on small drafts and hand-made examples."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucebox import ddtree

SETTINGS = settings(deadline=None, max_examples=150)
TIED_LOGP = [0.0, -0.25, -0.5, -1.0, -2.0, -4.0]  # few values, so equal scores are common


@st.composite
def drafts(draw, max_pos=15, max_k=8, vocab=12, unique_rows=False):
    """(ids [L, K] int32, logp [L, K] float32 rows non-increasing and <= 0)."""
    n_pos = draw(st.integers(1, max_pos))
    top_k = draw(st.integers(1, max_k))
    if unique_rows:
        top_k = min(top_k, vocab)
    row_ids = st.lists(st.integers(0, vocab - 1), min_size=top_k, max_size=top_k, unique=unique_rows)
    ids = np.array([draw(row_ids) for _ in range(n_pos)], np.int32).reshape(n_pos, top_k)
    value = st.sampled_from(TIED_LOGP) | st.floats(-30.0, 0.0, width=32)
    rows = [sorted(draw(st.lists(value, min_size=top_k, max_size=top_k)), reverse=True) for _ in range(n_pos)]
    return ids, np.array(rows, np.float32).reshape(n_pos, top_k)


def rank_paths(tree):
    """Each node's ranks from the root down, derived from parents only."""
    paths = [()]
    for i in range(1, len(tree.parents)):
        paths.append(paths[tree.parents[i]] + (int(tree.rank[i]),))
    return paths


def all_prefixes(logp):
    """{rank path: score} for every prefix, scored by the same float64 recurrence as the tree."""
    n_pos, top_k = logp.shape
    scores, level = {}, {(): 0.0}
    for d in range(n_pos):
        level = {path + (r,): s + float(logp[d, r]) for path, s in level.items() for r in range(top_k)}
        scores.update(level)
    return scores


def check_structure(tree, ids, logp, last, budget):
    n = len(tree.tokens)
    assert all(len(a) == n for a in (tree.parents, tree.depth, tree.rank, tree.pop_index, tree.logp_cum))
    assert tree.tokens.dtype == tree.parents.dtype == tree.depth.dtype == np.int32
    assert 1 <= n <= budget + 1
    ddtree.validate_tree(tree.parents, tree.tokens)  # root first, parents before children
    assert tree.tokens[0] == last and tree.depth[0] == 0 and tree.logp_cum[0] == 0.0
    paths = rank_paths(tree)
    assert len(set(paths)) == n, "a prefix appears twice"
    assert set(p[:-1] for p in paths[1:]) <= set(paths), "not prefix-closed"
    for i in range(1, n):
        p, d, r = tree.parents[i], tree.depth[i], tree.rank[i]
        assert d == tree.depth[p] + 1 == len(paths[i])
        assert tree.tokens[i] == ids[d - 1, r]
        assert tree.logp_cum[i] == tree.logp_cum[p] + float(logp[d - 1, r])
    # DFS preorder: each node's parent is on the root path of the node before it
    on_path = [0]
    for i in range(1, n):
        while on_path[-1] != tree.parents[i]:
            on_path.pop()
            assert on_path, f"node {i} breaks DFS preorder"
        on_path.append(i)
    # children best first
    for p in range(n):
        kids = [int(tree.rank[i]) for i in range(n) if tree.parents[i] == p]
        assert kids == sorted(kids)
    # pop_index: a permutation, parents entered before their children
    assert sorted(tree.pop_index.tolist()) == list(range(n))
    assert all(tree.pop_index[tree.parents[i]] < tree.pop_index[i] for i in range(1, n))
    # the top-1 chain present in the tree sits at 1..c
    chain = [i for i in range(1, n) if all(r == 0 for r in paths[i])]
    assert chain == list(range(1, len(chain) + 1))
    return paths


@SETTINGS
@given(drafts(), st.integers(1, 64), st.booleans(), st.integers(0, 1000))
def test_structure_any_draft(draft, budget, chain_seed, last):
    ids, logp = draft
    tree = ddtree.build_tree(ids, logp, last, budget, chain_seed=chain_seed)
    check_structure(tree, ids, logp, last, budget)
    if chain_seed:
        c = min(budget, ids.shape[0])
        assert tree.parents[1:c + 1].tolist() == list(range(c))
        assert tree.tokens[1:c + 1].tolist() == ids[:c, 0].tolist()
        assert (tree.pop_index[1:c + 1] == np.arange(1, c + 1)).all()


@SETTINGS
@given(drafts(), st.integers(1, 64), st.booleans())
def test_best_first_pops_non_increasing(draft, budget, chain_seed):
    ids, logp = draft
    tree = ddtree.build_tree(ids, logp, 0, budget, chain_seed=chain_seed)
    forced = min(budget, ids.shape[0]) if chain_seed else 0
    by_pop = tree.logp_cum[np.argsort(tree.pop_index)]
    popped = by_pop[1 + forced:]
    assert (np.diff(popped) <= 0).all()


@SETTINGS
@given(drafts(max_pos=4, max_k=3), st.integers(1, 130), st.booleans())
def test_exactly_the_top_prefixes(draft, budget, chain_seed):
    ids, logp = draft
    tree = ddtree.build_tree(ids, logp, 7, budget, chain_seed=chain_seed)
    paths = check_structure(tree, ids, logp, 7, budget)
    scores = all_prefixes(logp)
    forced = {(0,) * d for d in range(1, min(budget, ids.shape[0]) + 1)} if chain_seed else set()
    assert forced <= set(paths)
    rest = sorted((s for p, s in scores.items() if p not in forced), reverse=True)
    want = rest[:budget - len(forced)]
    got = sorted((tree.logp_cum[i] for i, p in enumerate(paths) if p and p not in forced), reverse=True)
    assert len(tree.tokens) - 1 == min(budget, len(scores))
    assert got == want  # equal as multisets: ties may pick either prefix


def brute_walk(tree, am):
    cur, path = 0, [0]
    while True:
        hits = [i for i in range(len(tree.tokens)) if tree.parents[i] == cur and tree.tokens[i] == am[cur]]
        if not hits:
            return path, int(am[cur])
        cur = min(hits)
        path.append(cur)


@SETTINGS
@given(drafts(vocab=6), st.integers(1, 40), st.booleans(), st.data())
def test_walk_matches_brute_force(draft, budget, chain_seed, data):
    ids, logp = draft
    tree = ddtree.build_tree(ids, logp, 3, budget, chain_seed=chain_seed)
    n = len(tree.tokens)
    am = np.array([data.draw(st.integers(0, 7)) for _ in range(n)], np.int32)
    for i in range(n):  # steer most nodes into one of their children so paths get long
        kids = np.flatnonzero(tree.parents == i)
        if kids.size and data.draw(st.booleans()):
            am[i] = tree.tokens[kids[data.draw(st.integers(0, kids.size - 1))]]
    path, bonus = ddtree.walk(tree, am)
    want_path, want_bonus = brute_walk(tree, am)
    assert path.tolist() == want_path and bonus == want_bonus
    assert path.dtype == np.int32


@SETTINGS
@given(drafts(unique_rows=True), st.integers(1, 40), st.booleans(), st.data())
def test_walk_reaches_the_matching_node(draft, budget, chain_seed, data):
    ids, logp = draft
    tree = ddtree.build_tree(ids, logp, 3, budget, chain_seed=chain_seed)
    n = len(tree.tokens)
    target = data.draw(st.integers(0, n - 1))
    sentinel = 10_000  # no draft token
    am = np.array([data.draw(st.integers(0, 20)) for _ in range(n)], np.int32)
    node = target
    while node:
        am[tree.parents[node]] = tree.tokens[node]
        node = tree.parents[node]
    am[target] = sentinel
    path, bonus = ddtree.walk(tree, am)
    assert path[-1] == target and bonus == sentinel
    assert len(path) - 1 == tree.depth[target]


@SETTINGS
@given(drafts(unique_rows=True), st.integers(1, 40), st.booleans())
def test_walk_when_target_agrees_with_draft_top1(draft, budget, chain_seed):
    ids, logp = draft
    tree = ddtree.build_tree(ids, logp, 3, budget, chain_seed=chain_seed)
    n = len(tree.tokens)
    sentinel = 10_000
    am = np.full(n, sentinel, np.int32)
    leaf = 0
    for i in range(n):
        kids = np.flatnonzero(tree.parents == i)
        if kids.size:
            am[i] = tree.tokens[kids[0]]
    while (tree.parents == leaf).any():
        leaf = int(np.flatnonzero(tree.parents == leaf)[0])
    path, bonus = ddtree.walk(tree, am)
    assert path[-1] == leaf and bonus == sentinel
    if chain_seed:  # the walk then runs down the whole seeded chain
        assert len(path) - 1 == min(budget, ids.shape[0])


@SETTINGS
@given(drafts(max_k=1), st.integers(1, 40), st.booleans())
def test_top1_only_gives_a_chain(draft, budget, chain_seed):
    ids, logp = draft
    tree = ddtree.build_tree(ids, logp, 9, budget, chain_seed=chain_seed)
    c = min(budget, ids.shape[0])
    assert tree.parents.tolist() == list(range(-1, c))
    assert tree.tokens.tolist() == [9] + ids[:c, 0].tolist()


@SETTINGS
@given(drafts(), st.booleans())
def test_budget_one(draft, chain_seed):
    ids, logp = draft
    tree = ddtree.build_tree(ids, logp, 4, 1, chain_seed=chain_seed)
    assert tree.tokens.tolist() == [4, int(ids[0, 0])]
    assert tree.parents.tolist() == [-1, 0]


@SETTINGS
@given(drafts(), st.integers(1, 40))
def test_chain_tree(draft, n):
    ids, logp = draft
    tree = ddtree.chain_tree(ids, 5, n, logp)
    c = min(n, ids.shape[0])
    assert tree.tokens.tolist() == [5] + ids[:c, 0].tolist()
    assert tree.parents.tolist() == list(range(-1, c))
    assert tree.depth.tolist() == list(range(c + 1))
    assert np.allclose(tree.logp_cum[1:], np.cumsum(logp[:c, 0].astype(np.float64)))
    seeded = ddtree.build_tree(ids, logp, 5, c, chain_seed=True)
    assert seeded.tokens.tolist() == tree.tokens.tolist()


# --- hand-made examples ------------------------------------------------------------------------

IDS = np.array([[10, 11], [20, 21], [30, 31]], np.int32)
# prefix scores: (0) -0.1, (0,0) -0.3, (0,1) -0.6, (0,0,0) -1.3, (0,0,1) -1.4, (0,1,0) -1.6, (1) -2.0
LOGP = np.array([[-0.1, -2.0], [-0.2, -0.5], [-1.0, -1.1]], np.float32)


def test_hand_example_best_first():
    tree = ddtree.build_tree(IDS, LOGP, 1, 3, chain_seed=False)
    assert tree.tokens.tolist() == [1, 10, 20, 21]
    assert tree.parents.tolist() == [-1, 0, 1, 1]
    tree = ddtree.build_tree(IDS, LOGP, 1, 5, chain_seed=False)
    # entry order (0), (0,0), (0,1), (0,0,0), (0,0,1); preorder puts (0,0)'s subtree before (0,1)
    assert tree.tokens.tolist() == [1, 10, 20, 30, 31, 21]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 2, 1]
    assert tree.depth.tolist() == [0, 1, 2, 3, 3, 2]
    assert tree.pop_index.tolist() == [0, 1, 2, 4, 5, 3]
    assert np.allclose(tree.logp_cum, [0, -0.1, -0.3, -1.3, -1.4, -0.6])


def test_hand_example_chain_seed():
    tree = ddtree.build_tree(IDS, LOGP, 1, 3, chain_seed=True)
    assert tree.tokens.tolist() == [1, 10, 20, 30]  # the chain displaces (0,1) despite its score
    tree = ddtree.build_tree(IDS, LOGP, 1, 5, chain_seed=True)
    assert tree.tokens.tolist() == [1, 10, 20, 30, 31, 21]
    assert tree.pop_index.tolist() == [0, 1, 2, 3, 5, 4]


def test_budget_beyond_all_prefixes():
    tree = ddtree.build_tree(IDS[:2], LOGP[:2], 1, 100, chain_seed=False)
    assert sorted(tree.tokens[1:].tolist()) == [10, 11, 20, 20, 21, 21]


def test_hand_walk():
    tree = ddtree.build_tree(IDS, LOGP, 1, 5, chain_seed=False)  # [1, 10, 20, 30, 31, 21]
    am = np.array([10, 21, 31, 0, 0, 77], np.int32)
    path, bonus = ddtree.walk(tree, am)
    assert path.tolist() == [0, 1, 5] and bonus == 77
    path, bonus = ddtree.walk(tree, np.array([99, 0, 0, 0, 0, 0], np.int32))
    assert path.tolist() == [0] and bonus == 99


def test_walk_prefers_better_sibling_on_duplicate_tokens():
    tree = ddtree.tree_from_parents([1, 5, 5, 6], [-1, 0, 0, 2])
    assert tree.depth.tolist() == [0, 1, 1, 2]
    path, bonus = ddtree.walk(tree, [5, 6, 6, 8])
    assert path.tolist() == [0, 1] and bonus == 6


def test_walk_rejects_wrong_length():
    tree = ddtree.chain_tree(IDS, 1, 3)
    with pytest.raises(ValueError, match="target_argmax has 3 entries but the tree has 4"):
        ddtree.walk(tree, np.zeros(3, np.int32))


@pytest.mark.parametrize("parents, message", [
    ([0, 0], r"parents\[0\] must be -1"),
    ([-1, 0, 2], r"parents\[2\] = 2"),
    ([-1, -1], r"parents\[1\] = -1"),
    ([-1, 0, 5, 1], r"parents\[2\] = 5"),
    ([], "non-empty 1-D"),
    ([[-1, 0]], "non-empty 1-D"),
    ([-1.0, 0.0], "integers"),
])
def test_validate_tree_rejects(parents, message):
    with pytest.raises(ValueError, match=message):
        ddtree.validate_tree(np.array(parents))


def test_validate_tree_tokens_and_size():
    ddtree.validate_tree([-1, 0, 0, 1], [3, 4, 5, 6], max_nodes=4)
    with pytest.raises(ValueError, match="at most 3 fit"):
        ddtree.validate_tree([-1, 0, 0, 1], max_nodes=3)
    with pytest.raises(ValueError, match="tokens has shape"):
        ddtree.validate_tree([-1, 0], [1, 2, 3])
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        ddtree.validate_tree([-1, 0], [1, -2])


@pytest.mark.parametrize("budget, top_k, message", [
    (0, 8, "budget must be in"),
    (ddtree.MAX_BUDGET + 1, 8, "budget must be in"),
    (2.5, 8, "budget must be an integer"),
    (True, 8, "budget must be an integer"),
    (22, 0, "top_k must be"),
])
def test_check_params_rejects(budget, top_k, message):
    with pytest.raises(ValueError, match=message):
        ddtree.check_params(budget, top_k)


def test_check_params_accepts_limits():
    ddtree.check_params(1, 1)
    ddtree.check_params(ddtree.MAX_BUDGET, 64)
    ddtree.check_params(np.int32(22), np.int64(8))


@pytest.mark.parametrize("ids, logp, message", [
    (np.zeros((3, 2), np.int32), np.zeros((3, 3), np.float32), "one shape"),
    (np.zeros(3, np.int32), np.zeros(3, np.float32), "2-D"),
    (np.zeros((0, 2), np.int32), np.zeros((0, 2), np.float32), "no block positions"),
    (np.zeros((3, 0), np.int32), np.zeros((3, 0), np.float32), "top_k must be >= 1"),
    (np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32), "ids must be integer"),
])
def test_build_tree_rejects_bad_draft(ids, logp, message):
    with pytest.raises(ValueError, match=message):
        ddtree.build_tree(ids, logp, 0, 4)


def test_build_tree_rejects_bad_budget():
    with pytest.raises(ValueError, match="budget must be in"):
        ddtree.build_tree(IDS, LOGP, 0, 0)
    with pytest.raises(ValueError, match="budget must be in"):
        ddtree.chain_tree(IDS, 0, 0)


def test_full_size_draft_walks_down_whole_chain():
    rng = np.random.default_rng(0)
    ids = np.stack([rng.permutation(1000)[:8] for _ in range(15)]).astype(np.int32)
    logp = np.sort(-rng.exponential(2.0, size=(15, 8)), axis=1)[:, ::-1].astype(np.float32)
    tree = ddtree.build_tree(ids, logp, 1, 22)
    assert len(tree.tokens) == 23
    am = np.full(23, 5000, np.int32)
    am[:15] = ids[:, 0]
    path, bonus = ddtree.walk(tree, am)
    assert path.tolist() == list(range(16)) and bonus == 5000


def test_tree_from_parents_tells_preorder():
    assert ddtree.tree_from_parents([5, 6, 7, 8], [-1, 0, 1, 0]).preorder
    assert ddtree.tree_from_parents([5, 6, 7, 8], [-1, 0, 1, 1]).preorder
    assert not ddtree.tree_from_parents([5, 6, 7, 8], [-1, 0, 0, 1]).preorder  # 3's parent is 1, after 2
    assert ddtree.tree_from_parents([5], [-1]).preorder
    # a preorder-only method on a tree in another order would be wrong: check the flag's meaning
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        par = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        tree = ddtree.tree_from_parents(rng.integers(0, 5, n).tolist(), par)
        order, stack = [], [0]  # DFS from the root, children in index order
        while stack:
            i = stack.pop()
            order.append(i)
            stack.extend(reversed([j for j in range(len(par)) if par[j] == i]))
        assert tree.preorder == (order == list(range(len(par))))
