"""The embedded default pair (lucebox/models/default) as shipped: it loads from where
lucebox.defaults looks, speculative decoding on it is lossless, and its draft still accepts.

Oracle for the outputs: the engine's AR mode on the same GGUF. The acceptance floors sit below
what the pair measured on these prompts when it was trained (see lucebox/models/default/README.md),
so a regression in the draft path, the tree or the export shows up as a drop under them.

LUCEBOX_TEST_BACKEND=cuda runs the engine on CUDA device 0.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from lucebox import defaults
from lucebox.engine import Engine

DEVICE = "cuda" if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else "cpu"
PROMPTS = Path(__file__).resolve().parents[1] / "benchmarks" / "tiny_pair" / "heldout_prompts.jsonl"
N_PROMPTS = 5
N_GEN = 64
BUDGET, DRAFT_TOP_K = 22, 8
# measured on these 5 prompts at n_gen 64 (model card: chain 4.82, DDTree 5.30, 1.10x), minus a
# margin for numerics across builds and backends. The 1.15x holds on all 20 prompts at
# n_gen 128 (1.16x, benchmarks/tiny_pair/native_eval.py); these 5 short runs reach 1.10x.
CHAIN_AL_FLOOR = 4.3
DDTREE_AL_FLOOR = 4.8
DDTREE_OVER_CHAIN_FLOOR = 1.05


@pytest.fixture(scope="module")
def pair() -> tuple[Path, Path]:
    found = defaults.embedded()
    assert found is not None, f"embedded default pair missing under {defaults.embedded_dir()}"
    target, draft = found
    assert draft is not None, f"embedded draft missing under {defaults.embedded_dir()}"
    return target, draft


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()][:N_PROMPTS]


@pytest.fixture(scope="module")
def engine(pair):
    with Engine(pair[0], draft=pair[1], device=DEVICE, n_threads=2, max_ctx=512) as e:
        yield e


@pytest.fixture(scope="module")
def runs(engine, prompts) -> dict[str, list]:
    out: dict[str, list] = {"ar": [], "chain": [], "ddtree": []}
    for p in prompts:
        for mode in out:
            engine.reset()
            out[mode].append(engine.generate(p, N_GEN, mode=mode, budget=BUDGET, draft_top_k=DRAFT_TOP_K, ignore_eos=True))
    return out


def test_embedded_pair_is_small_enough_to_ship(pair):
    target, draft = pair
    total = target.stat().st_size + sum(f.stat().st_size for f in draft.iterdir())
    assert total <= 30 * 2**20, f"embedded pair is {total:,} bytes"


@pytest.mark.parametrize("mode", ["chain", "ddtree"])
def test_speculative_output_equals_ar(engine, prompts, runs, mode):
    # batch-invariant kernels (CPU and CUDA): any difference is a bug, however close the logits
    for i, (a, s) in enumerate(zip(runs["ar"], runs[mode])):
        assert len(a.tokens) == N_GEN
        assert s.tokens == a.tokens, f"prompt {i}: {mode} diverges from AR"



def test_acceptance_lengths_hold(runs):
    chain = float(np.mean([g.stats.al_mean for g in runs["chain"]]))
    tree = float(np.mean([g.stats.al_mean for g in runs["ddtree"]]))
    assert chain >= CHAIN_AL_FLOOR, f"chain AL {chain:.3f}"
    assert tree >= DDTREE_AL_FLOOR, f"DDTree AL {tree:.3f}"
    assert tree >= DDTREE_OVER_CHAIN_FLOOR * chain, f"DDTree AL {tree:.3f} vs chain AL {chain:.3f}"
