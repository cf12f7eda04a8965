"""The native draw (native/src/sample_draw.cpp, lb_sampling's drawn / uniforms, lb_sampling_draw)
against its Python definition (lucebox.sampling: `uniform`, `draw` on the candidates).

Oracle: the Python reference, token for token and uniform for uniform (bits), on random candidate
sets in the device's layout (unordered, ties, ties at the boundary) under every combination of the
draw's options; then on the tiny target's real sampled calls (prefill, step, verify), where the
positions the C side derives (the position after each row's token) are checked too.
"""
from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest

from lucebox import sampling
from lucebox._native import Handle, NativeError, SampleBuffers, Sampling, _i64p, lib
from lucebox.sampling import Processing

DEVICE = -1 if os.environ.get("LUCEBOX_TEST_BACKEND") != "cuda" else 0
E_INVALID_ARG = -1

TEMPERATURES = [0.0, 0.3, 0.6, 1.0, 2.5]
TOP_KS = [0, 1, 5, 20, 40]
TOP_PS = [1.0, 0.95, 0.5, 0.1]
MIN_PS = [0.0, 0.01, 0.2, 1.0]
OPTIONS = [Processing(temperature=t, top_k=k, top_p=p, min_p=m)
           for t, k, p, m in itertools.product(TEMPERATURES, TOP_KS, TOP_PS, MIN_PS)]


def buffers(rows: int, p: Processing, n_cand: int, seed: int) -> SampleBuffers:
    return SampleBuffers(rows, temperature=p.temperature, repeat_penalty=1.0, presence_penalty=0.0,
                         frequency_penalty=0.0, n_candidates=n_cand, penalty_last_n=0, top_k=p.top_k, top_p=p.top_p,
                         min_p=p.min_p, seed=seed)


def random_rows(rng, rows: int, n_cand: int, n_vocab: int = 400):
    """Candidates as the device returns them: the top n_cand of a processed row, unordered, with
    their values and the row's lse (float32, over the whole row at T = 1); values rounded so ties
    happen, at the top and at the boundary."""
    ids = np.empty((rows, n_cand), np.int32)
    vals = np.empty((rows, n_cand), np.float32)
    lse = np.empty(rows, np.float32)
    for r in range(rows):
        grid = np.float32(rng.choice([2, 8, 1024]))
        row = (np.round(rng.standard_normal(n_vocab) * rng.uniform(0.2, 6.0) * grid) / grid).astype(np.float32)
        top = np.argsort(-row, kind="stable")[:n_cand]
        perm = rng.permutation(n_cand)
        ids[r], vals[r] = top[perm], row[top[perm]]
        lse[r] = np.log(np.sum(np.exp(row.astype(np.float64) - row.max())))
    return ids, vals, lse


def reference(ids, vals, lse, p: Processing, seed: int, position: int) -> int:
    sids, svals = sampling.sort_candidates(ids, vals)
    tok = sampling.draw(sids, svals, float(lse), p, sampling.uniform(seed, position), complete=False)
    return -1 if tok is None else tok


@pytest.mark.parametrize("t", TEMPERATURES)
def test_native_draw_equals_the_reference_on_random_candidates(t):
    """Every option combination at this temperature, 40 random rows each: the same token (or the
    same -1) as the Python definition, and the same uniform."""
    rng = np.random.default_rng(int(t * 1000))
    seen = set()
    for p in (o for o in OPTIONS if o.temperature == t):
        n_cand = int(rng.choice([1, 2, 8, 32, 48]))
        rows, seed = 40, int(rng.integers(0, 2 ** 63)) * 2 + 1
        io = buffers(rows, p, n_cand, seed)
        ids, vals, lse = random_rows(rng, rows, n_cand)
        io.cand_ids[:], io.cand_logits[:], io.row_lse[:] = ids, vals, lse
        positions = rng.integers(0, 1 << 40, rows)
        io.draw(positions)
        for r in range(rows):
            want = reference(ids[r], vals[r], lse[r], p, seed, int(positions[r]))
            assert io.drawn[r] == want, (p, n_cand, r)
            assert io.uniforms[r] == sampling.uniform(seed, int(positions[r]))
            seen.add(want >= 0)
    assert seen == {True, False}  # both outcomes: decided on the candidates, and left to the whole row


def test_native_draw_at_exact_edges():
    """top-p equal to a running sum (and one bit either side), min-p whose log equals a candidate's
    (v - v0) / T: where one bit of exp or log, or the side of a binary search, changes the kept
    prefix, the native draw still draws what the reference draws."""
    rng = np.random.default_rng(17)
    ids, vals, lse = random_rows(rng, 12, 32)
    cases = 0
    for r in range(12):
        sids, svals = sampling.sort_candidates(ids[r], vals[r])
        v = svals.tolist()
        kept = sum(1 for x in v if x > v[-1])
        for t in (0.7, 1.0):
            x = [(a - v[0]) / t for a in v[:kept]]
            cum = list(itertools.accumulate(math.exp(a - float(lse[r])) for a in x))
            edges = [Processing(temperature=t, top_p=q) for c in cum if 0.0 < c <= 1.0
                     for q in (c, math.nextafter(c, 0.0), math.nextafter(c, 1.0)) if 0.0 < q <= 1.0]
            edges += [Processing(temperature=t, min_p=m) for a in x if a < 0.0 for m in [math.exp(a)]
                      if math.log(m) == a and 0.0 < m <= 1.0]
            for p in edges:
                rows = 8
                io = buffers(rows, p, 32, r)
                io.cand_ids[:], io.cand_logits[:], io.row_lse[:] = ids[r], vals[r], lse[r]
                positions = np.arange(rows) * 1000 + r
                io.draw(positions)
                for i in range(rows):
                    assert io.drawn[i] == reference(ids[r], vals[r], lse[r], p, r, int(positions[i])), (r, p)
                cases += 1
    assert cases > 500


def test_uniform_equals_the_reference():
    rng = np.random.default_rng(5)
    seeds = ([0, 1, 2, 2 ** 32 - 1, 2 ** 32, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1]
             + [int(s) for s in rng.integers(0, 2 ** 63, 24)])
    positions = ([0, 1, 2, 4095, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 53 + 1, 2 ** 62, 2 ** 63 - 1]
                 + [int(q) for q in rng.integers(0, 2 ** 62, 54)])
    for seed in seeds:
        io = buffers(len(positions), Processing(temperature=1.0), 2, seed)
        io.draw(positions)
        got = io.uniforms.tolist()
        assert got == [sampling.uniform(seed, q) for q in positions], seed
        assert all(0.0 <= u < 1.0 for u in got)


# --- the sampled calls draw for the right positions ----------------------------------------------
@pytest.fixture(scope="module")
def handle(tiny_gguf):
    h = Handle(tiny_gguf["f32"], max_ctx=256, kv_type="f32", device=DEVICE, n_threads=1, max_tree=16)
    yield h
    h.close()


@pytest.mark.parametrize("p", [Processing(temperature=1.0), Processing(temperature=0.6, top_k=20, top_p=0.95),
                               Processing(temperature=2.0, min_p=0.02), Processing(temperature=0.0)], ids=repr)
def test_sampled_calls_draw_what_the_reference_draws(handle, p):
    """prefill_sampled (the position after the prompt), step_sampled (after the fed token) and
    verify_sampled (after each node: P + depth + 1) against the reference on their own outputs."""
    tokens = np.array([11, 40, 41, 90, 91, 92, 300], np.int32)
    parents = np.array([-1, 0, 0, 1, 1, 2, 3], np.int32)
    depth = [0, 1, 1, 2, 2, 2, 3]
    for seed in (0, 77, 2 ** 64 - 1):
        io = buffers(tokens.size, p, 16, seed)
        handle.reset()
        prompt = np.arange(20, 52, dtype=np.int32)
        handle.prefill_sampled(prompt, io)
        assert io.drawn[0] == reference(io.cand_ids[0], io.cand_logits[0], io.row_lse[0], p, seed, prompt.size)
        handle.step_sampled(5, io)  # the token at position 32, drawing for 33
        assert io.drawn[0] == reference(io.cand_ids[0], io.cand_logits[0], io.row_lse[0], p, seed, prompt.size + 1)
        handle.verify_sampled(tokens, parents, np.zeros(tokens.size, np.int32), io)
        n_past = prompt.size + 1
        for r, d in enumerate(depth):
            want = reference(io.cand_ids[r], io.cand_logits[r], io.row_lse[r], p, seed, n_past + d + 1)
            assert io.drawn[r] == want, (seed, r)
            assert io.uniforms[r] == sampling.uniform(seed, n_past + d + 1)


# --- bad input ---------------------------------------------------------------------------------
def one_line_error(fn) -> NativeError:
    with pytest.raises(NativeError) as info:
        fn()
    err = info.value
    assert err.status == E_INVALID_ARG and str(err) and "\n" not in str(err)
    return err


@pytest.mark.parametrize("field,value", [
    ("top_p", 0.0), ("top_p", 1.5), ("top_p", float("nan")), ("top_k", -1), ("min_p", -0.1), ("min_p", 1.01),
    ("min_p", float("nan")), ("temperature", -1.0), ("temperature", float("inf")), ("n_candidates", 0),
])
def test_bad_draw_settings_are_clear_errors(field, value):
    io = buffers(2, Processing(temperature=1.0), 4, 0)
    setattr(io._struct, field, value)
    err = one_line_error(lambda: io.draw([1, 2]))
    assert f"lb_sampling.{field}" in str(err)


def test_bad_draw_calls_are_clear_errors():
    io = buffers(2, Processing(temperature=1.0), 4, 0)
    io._struct.rows_cap = 1  # what a C caller could pass
    assert "rows_cap" in str(one_line_error(lambda: io.draw([1, 2])))
    L = lib()
    positions = np.zeros(2, np.int64)
    assert L.lb_sampling_draw(None, 2, positions.ctypes.data_as(_i64p)) == E_INVALID_ARG
    assert "must not be NULL" in L.lb_last_error().decode()
    s = Sampling()  # all NULL buffers
    s.temperature, s.top_p, s.n_candidates, s.rows_cap = 1.0, 1.0, 4, 2
    assert L.lb_sampling_draw(s, 2, positions.ctypes.data_as(_i64p)) == E_INVALID_ARG
    assert "drawn and uniforms must not be NULL" in L.lb_last_error().decode()
    io = buffers(2, Processing(temperature=1.0), 4, 0)
    assert L.lb_sampling_draw(io._struct, -1, positions.ctypes.data_as(_i64p)) == E_INVALID_ARG
    assert "rows = -1" in L.lb_last_error().decode()
    assert L.lb_sampling_draw(io._struct, 2, None) == E_INVALID_ARG
