"""lb_call_times_get: each kind of call reports where its host time went, and only its own calls.

Oracle: the caller's own clock around each call (the parts must add up to the call's total, inside it) and what
each call runs: a prefill one target graph per micro-batch, each followed by the draft's append of it; a draft one
propose; a verify one target graph; a step its graph and the draft's append; a commit its graph and the append.
The sampled calls count as their kinds. LUCEBOX_TEST_BACKEND=cuda runs the engine on CUDA device 0.
"""
from __future__ import annotations

import ctypes
import os
import time
from contextlib import closing

import numpy as np
import pytest

from lucebox._native import CALL_KINDS, CallTimes, Handle, NativeError, SampleBuffers, _check, lib
from lucebox.config import GenerationConfig
from lucebox.sampling import Sampler

DEVICE = 0 if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else -1
PARTS = ("before_ms", "launch_ms", "wait_ms", "between_ms", "after_ms")
UBATCH = 16


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1e3


def check(h: Handle, kind: str, wall_ms: float, graphs: int) -> dict:
    t = h.call_times(kind)
    assert t["graphs"] == graphs, (kind, t)
    assert all(t[p] >= 0.0 for p in PARTS), (kind, t)
    assert 0.0 < t["total_ms"] <= wall_ms, (kind, t, wall_ms)
    # the parts tile the call (1 us for the clock's rounding)
    assert abs(sum(t[p] for p in PARTS) - t["total_ms"]) <= 1e-3, (kind, t)
    assert t["launch_ms"] + t["wait_ms"] > 0.0, (kind, t)
    return t


@pytest.fixture(scope="module")
def engine(tiny_pair):
    target, draft = tiny_pair
    with closing(Handle(str(target), str(draft), max_ctx=256, ubatch=UBATCH, max_tree=32, device=DEVICE)) as h:
        yield h


def draft_and_tree(h: Handle, last: int):
    rows = h.info()["block_size"] - 1
    ids, logp = np.empty((rows, 4), np.int32), np.empty((rows, 4), np.float32)
    _, wall = timed(h.draft, last, ids, logp)
    check(h, "draft", wall, 1)
    return np.array([last, int(ids[0, 0]), int(ids[0, 1])], np.int32), np.array([-1, 0, 0], np.int32)


def test_each_kind_times_its_own_calls(engine):
    h = engine
    h.reset()
    prompt = np.arange(1, 41, dtype=np.int32)  # 40 tokens: 3 micro-batches
    last, wall = timed(h.prefill, prompt)
    check(h, "prefill", wall, 2 * 3)
    prefill_times = h.call_times("prefill")

    tokens, parents = draft_and_tree(h, last)
    argmax = np.empty(3, np.int32)
    _, wall = timed(h.verify, tokens, parents, argmax)
    check(h, "verify", wall, 1)
    assert h.call_times("prefill") == prefill_times  # another kind's record stays as it was

    _, wall = timed(h.commit, np.array([0, 1], np.int32))
    check(h, "commit", wall, 2)

    _, wall = timed(h.step, int(argmax[1]))
    check(h, "step", wall, 2)


def test_the_sampled_calls_count_as_their_kinds(engine):
    h = engine
    h.reset()
    gen = GenerationConfig(temperature=0.8, seed=1)
    io = Sampler.for_request(gen, h.info()).io
    assert isinstance(io, SampleBuffers)
    history = list(range(1, 21))
    io.set_history(history)
    last, wall = timed(h.prefill_sampled, np.array(history, np.int32), io)
    check(h, "prefill", wall, 2 * 2)  # 20 tokens: 2 micro-batches

    tokens, parents = draft_and_tree(h, last)
    argmax = np.empty(3, np.int32)
    _, wall = timed(h.verify_sampled, tokens, parents, argmax, io)
    check(h, "verify", wall, 1)
    h.commit(np.array([0], np.int32))

    _, wall = timed(h.step_sampled, int(argmax[0]), io)
    check(h, "step", wall, 2)


def test_zeros_before_a_kinds_first_call(tiny_pair):
    target, draft = tiny_pair
    with closing(Handle(str(target), str(draft), max_ctx=64, device=DEVICE)) as h:
        h.prefill(np.arange(1, 5, dtype=np.int32))
        assert h.call_times("prefill")["graphs"] == 2
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


def test_bad_arguments_are_one_line_errors(engine):
    with pytest.raises(ValueError, match="not one of"):
        engine.call_times("append")
    out = CallTimes()
    for kind in (-1, len(CALL_KINDS)):
        with pytest.raises(NativeError, match=r"kind -?\d+ is not an LB_CALL_\*"):
            _check(lib().lb_call_times_get(engine._p(), kind, ctypes.byref(out)))
    with pytest.raises(NativeError, match="out must not be NULL"):
        _check(lib().lb_call_times_get(engine._p(), 0, None))
    with pytest.raises(NativeError, match="engine is NULL"):
        _check(lib().lb_call_times_get(None, 0, ctypes.byref(out)))
