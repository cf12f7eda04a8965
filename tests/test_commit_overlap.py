"""lb_commit returns with its graphs still running (the target's replay, the draft's append); every later call sees
their results: lb_draft, whose inputs queue after them, and the calls that wait for them first (lb_verify, lb_step,
lb_state_save, lb_reset, ...), lb_sync on request.

Oracle: the same calls with lb_sync after each commit, so that nothing runs when the next call starts. On the CPU a
graph finishes in its launch and both runs are one; LUCEBOX_TEST_BACKEND=cuda runs them on CUDA device 0, where the
draft's host work overlaps the commit's graphs.
"""
from __future__ import annotations

import os
from contextlib import closing

import numpy as np
import pytest

from lucebox._native import Handle, NativeError, _check, lib

DEVICE = 0 if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else -1
TOP_K = 3


def run(pair, sync_after_commit: bool) -> list[np.ndarray]:
    """Five draft -> verify -> commit rounds after a prompt, each round's outputs and the state after the last commit
    (read right after it), then a step and the state after a reset."""
    target, draft = pair
    out = []
    with closing(Handle(str(target), str(draft), max_ctx=256, max_tree=32, device=DEVICE)) as h:
        last = h.prefill(np.arange(3, 43, dtype=np.int32))
        rows = h.info()["block_size"] - 1
        for r in range(5):
            ids, logp = np.empty((rows, TOP_K), np.int32), np.empty((rows, TOP_K), np.float32)
            h.draft(last, ids, logp)
            # a chain of the draft's first choices and a sibling of its first node
            tokens = np.array([last, *ids[:4, 0], ids[0, 1]], np.int32)
            parents = np.array([-1, 0, 1, 2, 3, 0], np.int32)
            argmax = np.empty(tokens.size, np.int32)
            h.verify(tokens, parents, argmax)
            path = [0, 1, 2] if r % 2 == 0 else [0, 5]  # the chain's start, or the sibling (its KV rows move)
            h.commit(np.array(path, np.int32))
            if sync_after_commit:
                h.sync()
            last = int(argmax[path[-1]])
            out += [ids, logp, argmax]
        out.append(h.state_save())
        out.append(np.array([h.step(last)]))
        h.reset()
        out.append(np.array([h.prefill(np.arange(5, 15, dtype=np.int32))]))
    return out


def test_the_calls_after_a_commit_see_its_results(tiny_pair):
    overlapped, settled = run(tiny_pair, False), run(tiny_pair, True)
    assert len(overlapped) == len(settled)
    for a, b in zip(overlapped, settled):
        np.testing.assert_array_equal(a, b)


def test_sync_needs_an_engine():
    with pytest.raises(NativeError, match="engine is NULL"):
        _check(lib().lb_sync(None))


def test_a_reset_or_free_right_after_a_commit(tiny_pair):
    """A commit leaves its graphs running; a reset waits for them before it clears the caches (the prefill after it is
    a fresh engine's), and a free before it releases them (no error, no crash)."""
    target, draft = tiny_pair
    prompt = np.arange(3, 23, dtype=np.int32)
    with closing(Handle(str(target), str(draft), max_ctx=128, max_tree=8, device=DEVICE)) as fresh:
        want = fresh.prefill(prompt)
    for then_reset in (True, False):
        h = Handle(str(target), str(draft), max_ctx=128, max_tree=8, device=DEVICE)
        last = h.prefill(np.arange(40, 50, dtype=np.int32))
        argmax = np.empty(3, np.int32)
        h.verify(np.array([last, 7, 9], np.int32), np.array([-1, 0, 1], np.int32), argmax)
        h.commit(np.array([0, 1, 2], np.int32))
        if then_reset:
            h.reset()
            assert h.prefill(prompt) == want
        h.close()
