"""Soak: 10k decode steps on one Engine (100k with LUCEBOX_FUZZ_LONG=1 / --long) keep the resident
memory flat. The steps mix AR requests, DDTree requests, streams abandoned half-way, errors and
resets, so every per-call path runs thousands of times.
"""
from __future__ import annotations

import os

import pytest

from lucebox.engine import Engine
from test_engine import ENGINE_OPTS, make_prompt

LONG = os.environ.get("LUCEBOX_FUZZ_LONG") == "1"
STEPS = 100_000 if LONG else 10_000
RSS_SLACK_MB = 4.0


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one_round(e: Engine, k: int) -> int:
    """A few requests of every kind; returns the decode steps they ran."""
    steps = 0
    g = e.generate(make_prompt(12, seed=k % 7), 400, mode="ar", ignore_eos=True)
    steps += g.stats.steps
    g = e.generate(make_prompt(9, seed=k % 5), 60, mode="ddtree", ignore_eos=True)
    steps += g.stats.steps
    stream = e.stream(make_prompt(7, seed=k % 3), 100, mode="ar", ignore_eos=True)
    for i, _ in enumerate(stream):
        if i == 20:
            break
    stream.close()
    steps += 20
    with pytest.raises(ValueError):
        e.generate(make_prompt(e.info["max_ctx"] + 1), 4)
    e.reset()
    return steps


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_rss_stays_flat_over_many_steps(tiny_pair):
    target, draft = tiny_pair
    with Engine(target, draft=draft, **ENGINE_OPTS) as e:
        steps, k = 0, 0
        while steps < 1000:  # warm-up: every graph built, every buffer at its size
            steps += one_round(e, k)
            k += 1
        before = rss_mb()
        while steps < STEPS:
            steps += one_round(e, k)
            k += 1
        grown = rss_mb() - before
    print(f"soak: {steps} steps in {k} rounds, RSS {before:.1f} MB -> +{grown:.2f} MB")
    assert grown < RSS_SLACK_MB, f"RSS grew {grown:.1f} MB over {steps} steps"
