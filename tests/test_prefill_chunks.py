"""Chunked prefill: a prompt fed in any split (the engine's micro-batches of any ubatch, or calls
of odd sizes) leaves the same caches and gives the same logits as one call, bit for bit; and
Engine.prefill / generate with a progress callback (the CLI's bar) feed it one micro-batch (or
chunk_tokens) at a time.

Oracle: the same engine fed the prompt in one call.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from lucebox._native import Handle
from lucebox.engine import Engine

DEVICE = "cuda" if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else "cpu"
DEV = 0 if DEVICE == "cuda" else -1
N_TEXT_TOKENS = 598
PROMPT = np.random.default_rng(17).integers(0, N_TEXT_TOKENS, 300).astype(np.int32)


def feed(h: Handle, splits: list[int]) -> tuple[np.ndarray, int, np.ndarray]:
    """Prefill PROMPT in calls of these sizes; -> (every token's logits, the next token, the state)."""
    n_vocab = h.info()["n_vocab"]
    logits = np.zeros((PROMPT.size, n_vocab), np.float32)
    at = 0
    for size in splits:
        nxt = h.prefill(PROMPT[at:at + size], logits[at:at + size])
        at += size
    assert at == PROMPT.size
    return logits, nxt, h.state_save()


@pytest.mark.parametrize("kv", ["f32", "q8_0"])
def test_any_split_gives_the_same_bits(tiny_pair, kv):
    target, draft = tiny_pair
    results = {}
    for ubatch, splits in ((512, [300]), (16, [300]), (7, [300]), (64, [1, 50, 3, 200, 46]), (300, [299, 1])):
        with Handle(target, draft, max_ctx=512, kv_type=kv, device=DEV, n_threads=1, ubatch=ubatch) as h:
            results[ubatch, tuple(splits)] = feed(h, splits)
    (want_logits, want_next, want_state), *others = results.values()
    assert np.isfinite(want_logits).all()
    for logits, nxt, state in others:
        assert nxt == want_next
        np.testing.assert_array_equal(logits, want_logits)  # every row, bit for bit
        assert state.tobytes() == want_state.tobytes()      # target KV, DeltaNet state, draft ring


@pytest.mark.parametrize("options", [{}, {"temperature": 0.8, "top_p": 0.9, "seed": 5}], ids=["greedy", "sampled"])
def test_progress_feeds_micro_batches_and_changes_nothing(tiny_pair, options):
    prompt = PROMPT.tolist()
    with Engine(tiny_pair[0], draft=tiny_pair[1], device=DEVICE, n_threads=1, max_ctx=512) as e:
        want = e.generate(prompt, 30, mode="ddtree", ignore_eos=True, **options)
    with Engine(tiny_pair[0], draft=tiny_pair[1], device=DEVICE, n_threads=1, max_ctx=512, ubatch=32) as e:
        seen: list[tuple[int, int]] = []
        got = e.generate(prompt, 30, mode="ddtree", ignore_eos=True, progress=lambda d, t: seen.append((d, t)),
                         **options)
        assert seen == [(d, 300) for d in range(0, 300, 32)] + [(300, 300)]
        # a prefix already cached: only the new tokens count (the reply's last token + 29 more)
        seen.clear()
        e.prefill(prompt + got.tokens + list(range(100, 129)), progress=lambda d, t: seen.append((d, t)))
        assert seen == [(0, 30), (30, 30)]
        # chunks of another size than the micro-batch: reported as asked, same output
        e.reset()
        seen.clear()
        other = e.generate(prompt, 30, mode="ddtree", ignore_eos=True, progress=lambda d, t: seen.append((d, t)),
                           chunk_tokens=100, **options)
        assert seen == [(0, 300), (100, 300), (200, 300), (300, 300)]
    assert got.tokens == want.tokens and got.stats.accept_lengths == want.stats.accept_lengths
    assert other.tokens == want.tokens and other.stats.accept_lengths == want.stats.accept_lengths
