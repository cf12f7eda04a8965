"""lucebox.sampling and the device's sampling tail against a plain numpy reference.

Reference: the whole processing chain written out on a full row of logits (penalties ->
temperature -> top-k -> top-p -> min-p -> renormalise). The host draw is checked exactly: over a
fine grid of uniforms the share of each token is its reference probability (to the grid step).
The device tail (penalties, top-C, max, log-normaliser) is checked on real tiny-model logits.
"""
from __future__ import annotations

import itertools
import os
from collections import Counter

import numpy as np
import pytest

from lucebox import sampling
from lucebox._native import Handle, NativeError, SampleBuffers
from lucebox.sampling import Processing

DEVICE = -1 if os.environ.get("LUCEBOX_TEST_BACKEND") != "cuda" else 0
GRID = 6000  # uniforms per check: each token's share is exact to ~1/GRID


# --- the reference -----------------------------------------------------------------------------
def penalised(logits: np.ndarray, counts: dict, p: Processing) -> np.ndarray:
    """llama.cpp's penalties, in float32 as the device does them (multiply by 1/r above zero)."""
    out = logits.astype(np.float32).copy()
    inv = np.float32(1.0) / np.float32(p.repeat_penalty)
    for tok, c in counts.items():
        v = out[tok]
        v = v * inv if v > 0 else v * np.float32(p.repeat_penalty)
        out[tok] = v - np.float32(c * p.frequency_penalty + p.presence_penalty)
    return out


def reference_probs(logits: np.ndarray, counts: dict, p: Processing) -> np.ndarray:
    l = penalised(logits, counts, p).astype(np.float64)
    probs = np.zeros(l.size)
    if p.temperature == 0:
        probs[np.argmax(l)] = 1.0
        return probs
    order = np.lexsort((np.arange(l.size), -l))  # best first, ties by id
    x = l[order] / p.temperature
    q = np.exp(x - x.max())
    q /= q.sum()
    keep = q.size
    if p.top_k > 0:
        keep = min(keep, p.top_k)
        q = q[:keep] / q[:keep].sum()
    if p.top_p < 1.0:
        keep = min(keep, int(np.argmax(np.cumsum(q) >= p.top_p)) + 1)
    if p.min_p > 0.0:
        keep = min(keep, int(np.sum(q[:keep] >= p.min_p * q[0])))
    q = q[:keep] / q[:keep].sum()
    probs[order[:keep]] = q
    return probs


def device_like(logits: np.ndarray, counts: dict, p: Processing, n_cand: int):
    """What the sampling tail returns for one row (float32 math, as on the device)."""
    l = penalised(logits, counts, p)
    ids = np.argsort(-l, kind="stable")[:n_cand].astype(np.int32)
    vals = l[ids]
    mx = np.float32(l.max())
    inv_t = np.float32(1.0) / np.float32(p.temperature or 1.0)
    lse = np.float32(np.log(np.sum(np.exp((l - mx) * inv_t), dtype=np.float32)))
    return ids, vals, float(lse), l


def shares(logits, counts, p, n_cand, grid=GRID) -> tuple[np.ndarray, int]:
    """Each token's share of draws over a uniform grid, and how many draws needed the full row."""
    ids, vals, lse, full = device_like(logits, counts, p, n_cand)
    ids, vals = sampling.sort_candidates(ids, vals)
    got = np.zeros(full.size)
    fetched = 0
    for u in (np.arange(grid) + 0.5) / grid:
        tok = sampling.draw(ids, vals, lse, p, float(u), complete=False)
        if tok is None:
            fetched += 1
            tok = sampling.draw_from_row(full, ids, vals, p, float(u))
        got[tok] += 1
    return got / grid, fetched


SETTINGS = [
    Processing(temperature=1.0),
    Processing(temperature=0.6),
    Processing(temperature=2.0),
    Processing(temperature=0.0),
    Processing(temperature=1.0, top_k=5),
    Processing(temperature=1.0, top_k=40),        # more than the 32 candidates: always the full row
    Processing(temperature=0.8, top_p=0.9),
    Processing(temperature=1.5, top_p=0.5),
    Processing(temperature=1.0, min_p=0.05),
    Processing(temperature=3.0, min_p=0.001),     # min-p keeps more than the candidates
    Processing(temperature=0.6, top_k=20, top_p=0.95),
    Processing(temperature=0.7, top_k=10, top_p=0.8, min_p=0.1),
    Processing(temperature=1.0, repeat_penalty=1.3),
    Processing(temperature=1.0, presence_penalty=1.5, frequency_penalty=0.5),
    Processing(temperature=0.9, top_k=8, repeat_penalty=0.7, presence_penalty=-1.0, frequency_penalty=0.3),
    Processing(temperature=0.0, repeat_penalty=2.0, frequency_penalty=1.0),
]


@pytest.mark.parametrize("p", SETTINGS, ids=repr)
@pytest.mark.parametrize("spread", [1.0, 4.0])
def test_draw_matches_the_reference(p, spread):
    rng = np.random.default_rng(int(spread * 10) + SETTINGS.index(p))
    logits = (rng.standard_normal(300) * spread).astype(np.float32)
    # a window where tokens recur, some of them among the best
    window = list(rng.choice(np.argsort(-logits)[:12], 10)) + list(rng.integers(0, 300, 20))
    counts = Counter(int(t) for t in window)
    want = reference_probs(logits, counts, p)
    got, _ = shares(logits, counts, p, n_cand=32)
    assert set(np.flatnonzero(got)) <= set(np.flatnonzero(want))
    np.testing.assert_allclose(got, want, atol=2.0 / GRID + 1e-6)


def test_candidates_suffice_when_the_distribution_is_peaked():
    logits = -np.linspace(0, 1, 1000).astype(np.float32)  # a long flat tail, no ties
    logits[:5] = [12, 11, 10, 9, 8]
    _, fetched = shares(logits, {}, Processing(temperature=0.6, top_p=0.95, top_k=20), n_cand=32, grid=2000)
    assert fetched == 0
    _, fetched = shares(logits, {}, Processing(temperature=1.0), n_cand=32, grid=2000)
    assert 0 < fetched < 200  # only the tail mass (~2%) past the candidates needs the row


def test_ties_break_by_token_id():
    logits = np.zeros(50, np.float32)
    logits[[7, 3, 9]] = 5.0
    ids, vals, lse, _ = device_like(logits, {}, Processing(temperature=1.0), 32)
    ids, vals = sampling.sort_candidates(ids, vals)
    assert ids[:3].tolist() == [3, 7, 9]
    assert sampling.draw(ids, vals, lse, Processing(temperature=0.0), 0.5, complete=False) == 3
    # the 32 candidates end inside a run of equal values: nothing past the run's start is trusted
    assert sampling.draw(ids, vals, lse, Processing(temperature=1.0, top_k=4), 0.5, complete=False) is None


def test_sampler_pick_draws_what_draw_draws():
    """Sampler.pick reads the device buffers (candidates unordered, ties included; the native draw's
    tokens): the same token as draw() on the sorted candidates, the whole row when needed."""
    rng = np.random.default_rng(11)
    n_fetched = 0
    for trial, p in enumerate(SETTINGS * 3):
        n_vocab = 300
        logits = np.round(rng.standard_normal(n_vocab) * rng.uniform(0.5, 4.0) * 4) / 4  # ties
        s = sampling.Sampler(p, trial, n_candidates=32, penalty_last_n=64, max_rows=4, n_vocab=n_vocab)
        ids, vals, lse, full = device_like(logits.astype(np.float32), {}, p, s.io.cand_ids.shape[1])
        perm = rng.permutation(ids.size)  # the device's candidate order is arbitrary
        row = trial % 4
        s.io.cand_ids[row], s.io.cand_logits[row], s.io.row_lse[row] = ids[perm], vals[perm], lse
        fetched = []

        def fetch_row(r, out):
            fetched.append(r)
            out[:] = full
            return out

        sids, svals = sampling.sort_candidates(ids, vals)
        for position in range(20):
            u = sampling.uniform(trial, position)
            want = sampling.draw(sids, svals, float(np.float32(lse)), p, u, complete=False)
            if want is None:
                want = sampling.draw_from_row(full, sids, svals, p, u)
            s.io.draw([position] * (row + 1))  # what a sampled call draws for this row at this position
            assert s.pick(row, fetch_row) == want, (trial, p, position)
        assert set(fetched) <= {row}
        n_fetched += len(fetched)
    assert n_fetched > 0  # the whole-row path ran too


def test_uniform_is_a_function_of_seed_and_position():
    a = [sampling.uniform(7, q) for q in range(2000)]
    assert a == [sampling.uniform(7, q) for q in range(2000)]
    assert all(0.0 <= u < 1.0 for u in a)
    assert a != [sampling.uniform(8, q) for q in range(2000)]
    # roughly uniform: each tenth holds about a tenth
    hist = np.histogram(a, bins=10, range=(0, 1))[0]
    assert hist.min() > 150 and hist.max() < 250
    assert sampling.uniform(2 ** 64 - 1, 0) != sampling.uniform(0, 0)


# --- the device tail -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def handle(tiny_gguf):
    h = Handle(tiny_gguf["f32"], max_ctx=256, kv_type="f32", device=DEVICE, n_threads=1, max_tree=16)
    yield h
    h.close()


def buffers(rows: int, p: Processing, n_cand: int, last_n: int) -> SampleBuffers:
    return SampleBuffers(rows, temperature=p.temperature or 1.0, repeat_penalty=p.repeat_penalty,
                         presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
                         n_candidates=n_cand, penalty_last_n=last_n)


TREE_TOKENS = np.array([11, 40, 41, 90, 91, 92, 300], np.int32)
TREE_PARENTS = np.array([-1, 0, 0, 1, 1, 2, 3], np.int32)


@pytest.mark.parametrize("p,last_n", [
    (Processing(temperature=1.0), 0),
    (Processing(temperature=0.5, repeat_penalty=1.4, presence_penalty=0.7, frequency_penalty=0.25), 12),
    (Processing(temperature=2.0, repeat_penalty=0.8, presence_penalty=-0.5), 4),
], ids=["plain", "penalties", "negative"])
def test_tail_matches_numpy_on_real_logits(handle, p, last_n):
    n_vocab = handle.info()["n_vocab"]
    prompt = np.arange(20, 52, dtype=np.int32)
    n = TREE_TOKENS.size
    handle.reset()
    handle.prefill(prompt)
    raw = np.zeros((n, n_vocab), np.float32)
    argmax = np.zeros(n, np.int32)
    handle.verify(TREE_TOKENS, TREE_PARENTS, argmax, raw)
    handle.reset()
    handle.prefill(prompt)
    rng = np.random.default_rng(last_n)
    io = buffers(n, p, 16, last_n)
    # a history that repeats some of the rows' best tokens (counts > 1 where they matter), and
    # ends in a repeat, so that even the shortest window counts a token twice
    best = np.argsort(-raw, axis=1)[:, :3].ravel()
    history = [int(t) for t in rng.choice(np.concatenate([best, rng.integers(0, n_vocab, 6)]), size=20)]
    history += [int(best[0]), int(best[1]), int(best[0])]
    io.set_history(history)
    paths = []
    for r in range(n):
        paths.append((paths[TREE_PARENTS[r]] if r else []) + [int(TREE_TOKENS[r])])
    windows = [Counter((history + path)[-last_n:]) if last_n else Counter() for path in paths]
    assert any(c > 1 for w in windows for c in w.values()) or not last_n
    got_argmax = np.zeros(n, np.int32)
    handle.verify_sampled(TREE_TOKENS, TREE_PARENTS, got_argmax, io)
    np.testing.assert_array_equal(got_argmax, argmax)  # the plain argmax is untouched
    row = np.empty(n_vocab, np.float32)
    for r in range(n):
        ids, vals, lse, full = device_like(raw[r], windows[r], p, 16)
        np.testing.assert_array_equal(handle.processed_row(r, row), full)  # penalties are exact
        assert sorted(io.cand_ids[r].tolist()) == sorted(ids.tolist())
        np.testing.assert_array_equal(np.sort(io.cand_logits[r]), np.sort(vals))
        assert io.row_max[r] == full.max()
        assert abs(io.row_lse[r] - lse) < 1e-5 * max(1.0, abs(lse))


def test_prefill_tail_is_the_last_row(handle):
    n_vocab = handle.info()["n_vocab"]
    prompt = np.arange(30, 70, dtype=np.int32)
    handle.reset()
    raw = np.zeros((prompt.size, n_vocab), np.float32)
    handle.prefill(prompt, raw)
    handle.reset()
    p = Processing(temperature=0.7)
    io = buffers(1, p, 8, 0)
    handle.prefill_sampled(prompt, io)
    ids, vals, lse, _ = device_like(raw[-1], {}, p, 8)
    assert sorted(io.cand_ids[0].tolist()) == sorted(ids.tolist())
    assert abs(io.row_lse[0] - lse) < 1e-5 * max(1.0, abs(lse))


@pytest.mark.parametrize("field,value,words", [
    ("temperature", -1.0, "temperature"), ("repeat_penalty", -1.0, "repeat_penalty"),
    ("n_candidates", 0, "n_candidates"), ("penalty_last_n", 5000, "penalty_last_n"),
    ("penalty_last_n", -1, "penalty_last_n"), ("n_history", -1, "n_history"),
    ("top_k", -1, "top_k"), ("top_p", 0.0, "top_p"), ("top_p", 1.5, "top_p"), ("min_p", 2.0, "min_p"),
])
def test_bad_sampling_struct_is_a_clear_error(handle, field, value, words):
    p = Processing(temperature=1.0)
    io = buffers(2, p, 4, 2)
    setattr(io._struct, field, value)
    handle.reset()
    handle.prefill(np.arange(5, dtype=np.int32))
    with pytest.raises(NativeError, match=words):
        handle.verify_sampled(np.array([1, 2], np.int32), np.array([-1, 0], np.int32), np.zeros(2, np.int32), io)
    # the engine is still usable
    handle.verify(np.array([1], np.int32), np.array([-1], np.int32), np.zeros(1, np.int32))


def test_history_outside_the_vocabulary_and_stale_row_are_errors(handle):
    p = Processing(temperature=1.0, repeat_penalty=1.2)
    io = buffers(1, p, 4, 3)
    n_vocab = handle.info()["n_vocab"]
    handle.reset()
    handle.prefill(np.arange(5, dtype=np.int32))
    io.set_history([5, n_vocab])
    with pytest.raises(NativeError, match=r"history\[1\] = %d is outside the vocabulary" % n_vocab):
        handle.verify_sampled(np.array([1], np.int32), np.array([-1], np.int32), np.zeros(1, np.int32), io)
    io.set_history([-1, 5, 6])  # only the last penalty_last_n - 1 are read
    handle.verify_sampled(np.array([1], np.int32), np.array([-1], np.int32), np.zeros(1, np.int32), io)
    row = np.empty(handle.info()["n_vocab"], np.float32)
    handle.processed_row(0, row)
    with pytest.raises(NativeError, match="outside"):
        handle.processed_row(1, row)
    handle.commit(np.array([0], np.int32))
    with pytest.raises(NativeError, match="no sampled forward"):
        handle.processed_row(0, row)


def test_null_sampling_and_too_few_rows_are_errors(handle):
    from lucebox import _native

    L, ptr = _native.lib(), handle._p()
    toks, parents, out = np.array([1, 2], np.int32), np.array([-1, 0], np.int32), np.zeros(2, np.int32)
    i32 = lambda a: a.ctypes.data_as(_native._i32p)
    handle.reset()
    assert L.lb_verify_sampled(ptr, i32(toks), i32(parents), 2, i32(out), None) == -1
    assert "must not be NULL" in L.lb_last_error().decode()
    assert L.lb_prefill_sampled(ptr, i32(toks), 2, i32(out), None) == -1
    assert L.lb_step_sampled(ptr, 1, i32(out), None) == -1
    io = buffers(1, Processing(temperature=1.0), 4, 0)  # room for one row, the tree has two
    with pytest.raises(ValueError, match="2 rows"):
        handle.verify_sampled(toks, parents, out, io)
    io = buffers(2, Processing(temperature=1.0), 4, 0)
    io._struct.rows_cap = 1  # what a C caller could pass
    with pytest.raises(NativeError, match="rows_cap"):
        handle.verify_sampled(toks, parents, out, io)
    assert handle.info()["n_past"] == 0
