"""lb_call_times_get: each kind of call reports where its host time went, and only its own calls.

Oracle: the caller's own clock around each call (the parts must add up within it) and what each call runs
(a prefill of several micro-batches runs one target graph each plus the draft's appends; a commit its graph and
the draft's append). LUCEBOX_TEST_BACKEND=cuda runs the engine on CUDA device 0.
"""
from __future__ import annotations

import os
import time
from contextlib import closing

import numpy as np
import pytest

from lucebox._native import CALL_KINDS, CallTimes, Handle, NativeError, _check, lib

DEVICE = 0 if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else -1
PARTS = ("before_ms", "launch_ms", "wait_ms", "after_ms")


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1e3


def check_parts(t: dict, wall_ms: float) -> None:
    assert all(t[p] >= 0.0 for p in PARTS), t
    assert 0.0 < t["total_ms"] <= wall_ms, (t, wall_ms)
    # the parts lie inside the call (what is left is host work between graphs); 1 us for the clock's rounding
    assert sum(t[p] for p in PARTS) <= t["total_ms"] + 1e-3, t
    assert t["launch_ms"] + t["wait_ms"] > 0.0, t


@pytest.fixture(scope="module")
def engine(tiny_pair):
    target, draft = tiny_pair
    with closing(Handle(str(target), str(draft), max_ctx=256, ubatch=16, max_tree=32, device=DEVICE)) as h:
        yield h


def test_each_kind_times_its_own_calls(engine):
    h = engine
    h.reset()
    prompt = np.arange(1, 41, dtype=np.int32)  # 40 tokens: 3 micro-batches of 16
    last, wall = timed(h.prefill, prompt)
    t = h.call_times("prefill")
    check_parts(t, wall)
    assert t["graphs"] >= 3, t  # one target graph a micro-batch (and the draft's appends)

    info = h.info()
    rows = info["block_size"] - 1
    ids, logp = np.empty((rows, 4), np.int32), np.empty((rows, 4), np.float32)
    _, wall = timed(h.draft, last, ids, logp)
    t = h.call_times("draft")
    check_parts(t, wall)
    assert t["graphs"] == 1, t

    tokens = np.array([last, int(ids[0, 0]), int(ids[0, 1])], np.int32)
    parents = np.array([-1, 0, 0], np.int32)
    argmax = np.empty(3, np.int32)
    prefill_times = h.call_times("prefill")
    _, wall = timed(h.verify, tokens, parents, argmax)
    t = h.call_times("verify")
    check_parts(t, wall)
    assert t["graphs"] == 1, t
    assert h.call_times("prefill") == prefill_times  # another kind's record stays as it was

    _, wall = timed(h.commit, np.array([0, 1], np.int32))
    t = h.call_times("commit")
    check_parts(t, wall)
    assert t["graphs"] >= 1, t

    _, wall = timed(h.step, int(argmax[1]))
    t = h.call_times("step")
    check_parts(t, wall)
    assert t["graphs"] >= 1, t


def test_zeros_before_a_kinds_first_call(tiny_pair):
    target, draft = tiny_pair
    with closing(Handle(str(target), str(draft), max_ctx=64, device=DEVICE)) as h:
        h.prefill(np.arange(1, 5, dtype=np.int32))
        assert h.call_times("prefill")["graphs"] >= 1
        for kind in ("step", "draft", "verify", "commit"):
            assert h.call_times(kind) == {"graphs": 0, "total_ms": 0.0, **{p: 0.0 for p in PARTS}}


def test_a_failed_call_keeps_the_last_times(engine):
    h = engine
    h.reset()
    last = h.prefill(np.arange(1, 9, dtype=np.int32))
    argmax = np.empty(2, np.int32)
    h.verify(np.array([last, 5], np.int32), np.array([-1, 0], np.int32), argmax)
    good = h.call_times("verify")
    assert good["graphs"] == 1
    with pytest.raises(NativeError):  # parents[1] must precede node 1
        h.verify(np.array([last, 5], np.int32), np.array([-1, 1], np.int32), argmax)
    assert h.call_times("verify") == good


def test_bad_kind_is_a_one_line_error(engine):
    with pytest.raises(ValueError, match="not one of"):
        engine.call_times("append")
    out = CallTimes()
    for kind in (-1, len(CALL_KINDS)):
        with pytest.raises(NativeError) as info:
            _check(lib().lb_call_times_get(engine._p(), kind, out))
        assert "LB_CALL_" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(NativeError, match="engine is NULL"):
        _check(lib().lb_call_times_get(None, 0, out))
