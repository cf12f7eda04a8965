"""The draft's context window (lb_params.draft_window, --draft-window): the draft attends to the last
W committed tokens only, kept in a ring of W rows. The output stays AR's bit for bit whatever W is;
the ring wraps exactly (its state depends only on the committed tokens), survives snapshots and
prefix reuse, and its memory follows W, not max_ctx.

Oracle: the engine's own AR mode; for the ring, a fresh engine prefilled with the same tokens.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from lucebox._native import Handle, NativeError
from lucebox.config import EngineConfig
from lucebox.engine import Engine

DEVICE = "cuda" if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else "cpu"
OPTS = dict(device=DEVICE, n_threads=1, max_ctx=512)
N_TEXT_TOKENS = 598
E_INVALID_ARG = -1
BLOCK = 16  # the tiny drafts' block size


def make_prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, N_TEXT_TOKENS, n).tolist()


def pad256(n: int) -> int:
    return -(-n // 256) * 256


@pytest.fixture(scope="module")
def engines(tiny_pair):
    """W -> engine on the tiny pair; W = 512 (= max_ctx) keeps the whole context."""
    target, draft = tiny_pair
    opened = {w: Engine(target, draft=draft, draft_window=w, **OPTS) for w in (16, 24, 512)}
    yield opened
    for e in opened.values():
        e.close()


def proposals(engine: Engine, last: int, top_k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rows = engine.info["block_size"] - 1
    ids, logp = np.zeros((rows, top_k), np.int32), np.zeros((rows, top_k), np.float32)
    engine._handle.draft(last, ids, logp)
    return ids, logp


@pytest.mark.parametrize("window", [16, 24])
def test_small_window_is_lossless(engines, window):
    # W below the prompt (60) and the reply (80): the ring wraps several times in every mode
    e = engines[window]
    assert e.info["draft_window"] == window
    prompt = make_prompt(60, seed=window)
    e.reset()
    want = e.generate(prompt, 80, mode="ar", ignore_eos=True).tokens
    for mode, budget in (("chain", 4), ("chain", 15), ("ddtree", 4), ("ddtree", 22), ("ddtree", 40)):
        e.reset()
        g = e.generate(prompt, 80, mode=mode, budget=budget, ignore_eos=True)
        assert g.tokens == want, f"{mode} budget {budget} differs from AR with draft window {window}"
        assert len(g.stats.accept_lengths) < 80  # the draft did get tokens accepted


def test_window_changes_only_the_proposals(engines):
    # the same committed tokens: small and whole windows propose differently, yet emit the same text
    prompt = make_prompt(50, seed=3)
    outs, drafts = {}, {}
    for w in (16, 512):
        e = engines[w]
        e.reset()
        last = e.prefill(prompt)
        drafts[w] = proposals(e, last)
        outs[w] = e.generate(prompt, 40, mode="ddtree", ignore_eos=True).tokens
    assert outs[16] == outs[512]
    assert not np.array_equal(drafts[16][1], drafts[512][1])  # W is in effect


def test_wrapped_ring_equals_a_fresh_prefill(engines, tiny_pair):
    # After ~10 wraps through verify/commit, the ring holds exactly what a prefill of the same tokens
    # leaves: every proposal from there on is bit-identical.
    e = engines[16]
    prompt = make_prompt(30, seed=4)
    e.reset()
    g = e.generate(prompt, 150, mode="ddtree", ignore_eos=True)
    held = list(e.cached_tokens)
    assert e._handle.n_past() == len(held) > 160
    after_steps = proposals(e, g.tokens[-1])
    with Engine(tiny_pair[0], draft=tiny_pair[1], draft_window=16, **OPTS) as fresh:
        assert fresh.prefill(held) == g.tokens[-1]
        after_prefill = proposals(fresh, g.tokens[-1])
    np.testing.assert_array_equal(after_steps[0], after_prefill[0])
    np.testing.assert_array_equal(after_steps[1], after_prefill[1])


@pytest.mark.parametrize("ubatch", [7, 32, 512])
def test_long_prefill_leaves_the_ring_of_short_ones(tiny_pair, ubatch):
    # one prefill of 100 tokens through a ring of 24 does not project the 76 that later tokens of the same call
    # push out (micro-batches of 7 straddle that boundary); its state, draft ring included, and its proposals
    # equal those of prefills of at most W tokens each, which project every token
    target, draft = tiny_pair
    prompt = np.asarray(make_prompt(100, seed=8), np.int32)
    got = {}
    for splits in ([100], [20] * 5, [24, 24, 24, 24, 4]):
        with Handle(target, draft, max_ctx=512, draft_window=24, ubatch=ubatch, device=0 if DEVICE == "cuda" else -1,
                    n_threads=1) as h:
            at, last = 0, 0
            for n in splits:
                last = h.prefill(prompt[at:at + n])
                at += n
            rows = h.info()["block_size"] - 1
            ids, logp = np.zeros((rows, 4), np.int32), np.zeros((rows, 4), np.float32)
            h.draft(last, ids, logp)
            got[tuple(splits)] = (h.state_save().tobytes(), ids, logp)
    (want_state, want_ids, want_logp), *others = got.values()
    for state, ids, logp in others:
        assert state == want_state
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(logp, want_logp)


def test_snapshot_and_prefix_reuse_with_a_wrapped_ring(engines):
    e = engines[24]
    prompt = make_prompt(70, seed=5)
    e.reset()
    first = e.generate(prompt, 30, mode="ddtree", ignore_eos=True)
    snap = e.snapshot()  # P = 99 > W: the ring has wrapped
    continued = prompt + first.tokens
    want = e.generate(continued, 50, mode="ddtree", ignore_eos=True)
    e.generate(make_prompt(90, seed=6), 30, mode="chain", ignore_eos=True)  # other work in between
    e.restore(snap)
    got = e.generate(continued, 50, mode="ddtree", ignore_eos=True)
    assert got.tokens == want.tokens and got.stats.accept_lengths == want.stats.accept_lengths
    assert got.stats.prompt_tokens <= 1
    # prefix reuse: extending the cached conversation equals starting over, acceptance included
    extended = continued + want.tokens + make_prompt(9, seed=7)
    reused = e.generate(extended, 40, mode="ddtree", ignore_eos=True)
    e.reset()
    fresh = e.generate(extended, 40, mode="ddtree", ignore_eos=True)
    assert reused.stats.prompt_tokens < fresh.stats.prompt_tokens
    assert reused.tokens == fresh.tokens and reused.stats.accept_lengths == fresh.stats.accept_lengths


def test_draft_memory_follows_the_window(tiny_pair):
    target, draft = tiny_pair

    def draft_cache(window: int, max_ctx: int) -> tuple[int, int]:
        with Handle(target, draft, max_ctx=max_ctx, draft_window=window, n_threads=1) as h:
            return h.info()["draft_window"], h.memory()["draft_cache"]

    rows = {w: draft_cache(w, 4096) for w in (64, 300, 1024)}
    assert {w: r[0] for w, r in rows.items()} == {64: 64, 300: 300, 1024: 1024}
    per_row = rows[64][1] // pad256(64 + BLOCK)
    for w, (_, nbytes) in rows.items():
        assert nbytes == per_row * pad256(w + BLOCK)  # O(W): ring + one block, padded to 256 rows
    assert draft_cache(64, 16384) == rows[64]                    # not O(max_ctx)
    assert draft_cache(4096, 512) == (512, per_row * pad256(512 + BLOCK))  # never more than the context


def test_default_window_comes_from_the_draft_config(tiny_gguf, tiny_draft_dirs):
    for kind, want in (("bf16", 4096), ("sliding", 8)):  # no sliding_window: LB_DRAFT_WINDOW_DEFAULT
        with Handle(tiny_gguf["f32"], tiny_draft_dirs[kind], max_ctx=8192, n_threads=1) as h:
            assert h.info()["draft_window"] == want
    with Handle(tiny_gguf["f32"], None, max_ctx=512, n_threads=1) as h:
        assert h.info()["draft_window"] == 0 and h.memory()["draft_cache"] == 0


def test_bad_windows_are_one_line_errors(tiny_pair):
    with pytest.raises(ValueError, match="draft_window must be in"):
        EngineConfig(target=tiny_pair[0], draft_window=-1)
    with pytest.raises(NativeError, match="draft_window -5 is out of range") as e:
        Handle(tiny_pair[0], tiny_pair[1], max_ctx=512, draft_window=-5)
    assert e.value.status == E_INVALID_ARG and "\n" not in str(e.value)
