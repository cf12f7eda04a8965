"""Snapshots of the committed state (lb_state_* / Engine.snapshot, restore): save -> other work ->
load -> generate equals the uninterrupted generation bit for bit, in AR and DDTree; bad blobs are
refused with a clear error and leave the engine usable."""
from __future__ import annotations

import os

import numpy as np
import pytest

from lucebox._native import NativeError
from lucebox.engine import Engine

DEVICE = "cuda" if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else "cpu"
OPTS = dict(device=DEVICE, n_threads=1, max_ctx=512)
E_FORMAT, E_MISMATCH = -3, -5
N_TEXT_TOKENS = 598


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, N_TEXT_TOKENS, n).tolist()


@pytest.fixture(scope="module")
def engine(tiny_pair):
    target, draft = tiny_pair
    with Engine(target, draft=draft, **OPTS) as e:
        yield e


@pytest.mark.parametrize("mode", ["ar", "ddtree"])
def test_restore_then_generate_equals_uninterrupted(engine, mode):
    ids = prompt(70, 1)
    engine.reset()
    first = engine.generate(ids, 20, mode=mode, ignore_eos=True)
    # the state after a generation: prompt + reply committed, the pending token kept by Python
    continued = ids + first.tokens
    snap = engine.snapshot()
    assert snap.tokens == tuple(continued[:len(snap.tokens)]) and snap.nbytes > 0
    want = engine.generate(continued, 40, mode=mode, ignore_eos=True)

    engine.generate(prompt(150, 2), 30, mode=mode, ignore_eos=True)  # other work in between
    engine.restore(snap)
    got = engine.generate(continued, 40, mode=mode, ignore_eos=True)
    assert got.tokens == want.tokens
    assert got.stats.prompt_tokens <= 1  # only the pending token was fed again

    # restoring into a fresh engine works too (same shape), and the state survives a reset
    engine.reset()
    engine.restore(snap)
    again = engine.generate(continued, 40, mode=mode, ignore_eos=True)
    assert again.tokens == want.tokens


def test_snapshot_at_a_prefix_then_extend(engine):
    ids = prompt(90, 3)
    engine.reset()
    engine.prefill(ids[:60])
    snap = engine.snapshot()
    assert len(snap.tokens) == 60
    engine.reset()
    want = engine.generate(ids, 30, mode="ddtree", ignore_eos=True)
    engine.generate(prompt(40, 4), 10, mode="ar", ignore_eos=True)
    engine.restore(snap)
    got = engine.generate(ids, 30, mode="ddtree", ignore_eos=True)
    assert got.tokens == want.tokens and got.stats.prompt_tokens == 30


def test_bad_blobs_are_refused(engine, tiny_gguf):
    engine.reset()
    engine.prefill(prompt(20, 5))
    snap = engine.snapshot()
    h = engine._handle
    with pytest.raises(NativeError, match="wrong size") as e:
        h.state_load(snap.data[:-1], snap.tokens)
    assert e.value.status == E_FORMAT
    with pytest.raises(NativeError, match="not a lucebox snapshot"):
        h.state_load(np.zeros(64, np.uint8), ())
    with pytest.raises(NativeError, match="not a snapshot"):
        h.state_load(np.zeros(3, np.uint8), ())
    with Engine(tiny_gguf["f32"], **OPTS) as target_only:  # no draft: another shape
        with pytest.raises(NativeError, match="another shape") as e:
            target_only._handle.state_load(snap.data, snap.tokens)
        assert e.value.status == E_MISMATCH
    # the engine is unchanged and usable after the refusals
    assert engine.generate(prompt(20, 5), 5, mode="ar").tokens


def test_nothing_cached_cannot_snapshot(engine):
    engine.reset()
    with pytest.raises(ValueError, match="nothing is cached"):
        engine.snapshot()
