"""Sampling through the Engine on the tiny pair: seeded determinism across AR, chain and DDTree,
penalty windows along tree paths, and the sampled distribution against transformers' logits.

Oracles: the engine's own AR sampling for the same seed (spec == AR, token for token), and the
softmax of transformers' logits under the reference processing of test_sampling.py (chi-square
over >= 2,000 seeds).
"""
from __future__ import annotations

import math
import os
from collections import Counter

import numpy as np
import pytest
import torch

import tiny_models
from lucebox.config import PENALTY_LAST_N, GenerationConfig
from lucebox.drafters import ScriptedDrafter
from lucebox.engine import Engine
from lucebox.sampling import Sampler
from test_sampling import reference_probs

DEVICE = "cuda" if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else "cpu"
ENGINE_OPTS = dict(device=DEVICE, n_threads=1, max_ctx=512)
N_SEEDS = 2000
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fib"

SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.6, top_k=20, top_p=0.95),
    dict(temperature=1.2, min_p=0.02, repeat_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2),
    dict(temperature=0.0, repeat_penalty=1.5, frequency_penalty=0.5),  # greedy on penalised logits
]
MODES = [("chain", 22), ("ddtree", 4), ("ddtree", 22), ("ddtree", 40)]


@pytest.fixture(scope="module")
def engine(tiny_gguf, tiny_draft_dirs):
    with Engine(tiny_gguf["f32"], draft=tiny_draft_dirs["bf16"], **ENGINE_OPTS) as e:
        yield e


@pytest.fixture(scope="module")
def prompt(engine) -> list[int]:
    return engine.encode_prompt(PROMPT)


def perfect_drafter(engine, prompt, tokens):
    """Proposes the given continuation: deep acceptance when it is the sampled AR output."""
    return ScriptedDrafter(prompt + tokens, engine.info["block_size"], engine.info["n_vocab"])


# --- determinism ---------------------------------------------------------------------------------
@pytest.mark.parametrize("opts", SETTINGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_speculative_sampling_equals_ar(engine, prompt, opts, seed):
    ar = engine.generate(prompt, 40, mode="ar", seed=seed, ignore_eos=True, **opts)
    assert ar.seed == seed and len(ar.tokens) == 40
    for mode, budget in MODES:
        g = engine.generate(prompt, 40, mode=mode, budget=budget, seed=seed, ignore_eos=True, **opts)
        assert g.tokens == ar.tokens, (mode, budget)
    # a draft that knows the sampled continuation gets whole blocks accepted, and still matches
    g = engine.generate(prompt, 40, mode="ddtree", budget=22, seed=seed, ignore_eos=True,
                        drafter=perfect_drafter(engine, prompt, ar.tokens), **opts)
    assert g.tokens == ar.tokens
    assert g.stats.al_mean > 4


def test_different_seeds_differ_and_no_seed_is_fresh(engine, prompt):
    runs = [engine.generate(prompt, 32, temperature=1.0, seed=s, ignore_eos=True).tokens for s in range(4)]
    assert len({tuple(r) for r in runs}) == 4
    a = engine.generate(prompt, 32, temperature=1.0, ignore_eos=True)
    b = engine.generate(prompt, 32, temperature=1.0, ignore_eos=True)
    assert a.seed != b.seed and a.tokens != b.tokens
    assert engine.generate(prompt, 32, temperature=1.0, seed=a.seed, ignore_eos=True).tokens == a.tokens


def test_a_top_k_of_the_whole_vocabulary_is_no_top_k(engine, prompt):
    n_vocab = engine.info["n_vocab"]
    # a flat distribution, so draws land past the candidates (where the two paths order the row differently)
    off = engine.generate(prompt, 24, temperature=20.0, seed=5, ignore_eos=True).tokens
    for top_k in (n_vocab, 10 * n_vocab):
        assert engine.generate(prompt, 24, temperature=20.0, top_k=top_k, seed=5, ignore_eos=True).tokens == off


def test_cached_prompt_is_resampled_and_greedy_reuses_the_argmax(engine, prompt):
    engine.reset()
    greedy = engine.generate(prompt, 24, mode="ar", ignore_eos=True)
    assert greedy.seed is None
    assert engine.generate(prompt, 24, mode="ddtree", ignore_eos=True).tokens == greedy.tokens
    sampled = engine.generate(prompt, 24, mode="ddtree", temperature=1.0, seed=3, ignore_eos=True)
    assert sampled.tokens != greedy.tokens
    # the caches hold exactly the prompt (and its greedy next token is pending): a sampled request
    # still draws its own first token
    engine.reset()
    engine.generate(prompt, 1, mode="ar")
    again = engine.generate(prompt, 24, mode="ddtree", temperature=1.0, seed=3, ignore_eos=True)
    assert again.tokens == sampled.tokens
    # ... and after a sampled request, a greedy one on the cached prompt prefills nothing
    engine.reset()
    engine.generate(prompt, 1, mode="ar", temperature=1.0, seed=9)
    g = engine.generate(prompt, 24, mode="ar", ignore_eos=True)
    assert g.tokens == greedy.tokens and g.stats.prompt_tokens == 0


def test_stops_and_limits_with_sampling(engine, prompt, monkeypatch):
    ar = engine.generate(prompt, 30, mode="ar", temperature=1.0, seed=5, ignore_eos=True)
    stop = ar.tokens[11]
    monkeypatch.setattr(engine.tokenizer, "eos_ids", (stop,))
    for mode in ("ar", "ddtree"):
        g = engine.generate(prompt, 30, mode=mode, temperature=1.0, seed=5,
                            drafter=perfect_drafter(engine, prompt, ar.tokens) if mode == "ddtree" else None)
        assert g.finish_reason == "eos" and g.tokens == ar.tokens[:ar.tokens.index(stop)]
        assert engine._cache_tokens == prompt + g.tokens  # nothing committed past the stop


# --- penalties follow tree paths -------------------------------------------------------------------
class ShiftedDrafter:
    """Rank 0 proposes the token one place later than the target's (wrong here, right next), rank 1
    the right one: the accepted path leaves the top-1 chain, whose tokens then sit before it in
    flat order but are not its ancestors."""

    def __init__(self, script, block_size, n_vocab):
        self.script, self.block_size, self.n_vocab = script, block_size, n_vocab

    def propose(self, last, n_past, top_k):
        rows = self.block_size - 1
        ids = np.zeros((rows, top_k), np.int32)
        for j in range(rows):
            at = lambda q: self.script[q] if q < len(self.script) else 0
            ids[j, 0], ids[j, 1] = at(n_past + 2 + j), at(n_past + 1 + j)
            for r in range(2, top_k):
                ids[j, r] = (at(n_past + 1 + j) + r) % self.n_vocab
        logp = np.tile(-np.arange(1, top_k + 1, dtype=np.float32), (rows, 1))
        return ids, logp


def chain_seen_too(drafter):
    """A wrong rule for Sampler.set_history: every node also sees the tree's top-1 chain (the
    draft's rank-0 tokens), which sits before the accepted off-chain path in flat order but is not
    among its ancestors (the verify adds each node's own root path after these tokens)."""
    right = Sampler.set_history

    def set_history(self, history):
        ids, _ = drafter.propose(None, len(history), 2)
        right(self, list(history) + ids[:, 0].tolist())
    return set_history


def test_penalties_see_ancestors_not_flat_predecessors(engine, prompt, monkeypatch):
    opts = dict(temperature=0.0, presence_penalty=6.0)  # greedy: any wrongly penalised token shows
    ar = engine.generate(prompt, 40, mode="ar", ignore_eos=True, **opts)
    drafter = ShiftedDrafter(prompt + ar.tokens, engine.info["block_size"], engine.info["n_vocab"])
    run = lambda: engine.generate(prompt, 40, mode="ddtree", budget=40, draft_top_k=2, chain_seed=True,
                                  ignore_eos=True, drafter=drafter, **opts)
    g = run()
    assert g.tokens == ar.tokens
    assert g.stats.al_mean > 2  # paths off the top-1 chain were accepted
    monkeypatch.setattr(Sampler, "set_history", chain_seen_too(drafter))
    assert run().tokens != ar.tokens  # the test tells the two rules apart


def test_node_windows_are_history_plus_ancestors(engine):
    """The tokens the verify penalises for each node (where its processed row differs from the raw
    logits, under a presence penalty alone) are its window: the history's tail, then its root path."""
    tokens = np.array([9, 1, 2, 3, 4], np.int32)
    parents = np.array([-1, 0, 0, 2, 1], np.int32)
    history = [70, 71, 72, 73, 74]
    h, n_vocab = engine._h(), engine.info["n_vocab"]
    engine.reset()
    h.prefill(np.asarray(history, np.int32))
    raw = np.zeros((tokens.size, n_vocab), np.float32)
    h.verify(tokens, parents, np.zeros(tokens.size, np.int32), raw)
    engine.reset()
    h.prefill(np.asarray(history, np.int32))
    gen = GenerationConfig(temperature=1.0, presence_penalty=1.0)
    sampler = Sampler(gen.processing(), 0, n_candidates=8, penalty_last_n=4, max_rows=8, n_vocab=n_vocab)
    sampler.set_history(history)
    h.verify_sampled(tokens, parents, np.zeros(tokens.size, np.int32), sampler.io)
    row = np.empty(n_vocab, np.float32)
    rows = [np.flatnonzero(h.processed_row(i, row) != raw[i]).tolist() for i in range(tokens.size)]
    assert rows == [[9, 72, 73, 74], [1, 9, 73, 74], [2, 9, 73, 74], [2, 3, 9, 74], [1, 4, 9, 74]]
    engine.reset()


# --- the distribution --------------------------------------------------------------------------------
def chi_square_ok(samples: list[int], probs: np.ndarray) -> tuple[float, float]:
    """(statistic, critical value at p ~ 3e-5): tokens expected < 5 times are pooled."""
    n = len(samples)
    counts = Counter(samples)
    assert all(probs[t] > 0 for t in counts), "drew a token the processing excludes"
    expected = probs * n
    big = np.flatnonzero(expected >= 5)
    obs = [counts.get(int(t), 0) for t in big]
    exp = list(expected[big])
    rest_e = n - sum(exp)
    if rest_e >= 5:
        obs.append(n - sum(obs))
        exp.append(rest_e)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    df = len(obs) - 1
    z = 4.0  # Wilson-Hilferty: chi2 quantile from the normal one
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


@pytest.fixture(scope="module")
def hf_model(tiny_hf_dir):
    return tiny_models.load_target(tiny_hf_dir)


def hf_logits(hf_model, toks) -> np.ndarray:
    with torch.no_grad():
        return hf_model(torch.tensor(np.asarray(toks, dtype=np.int64)[None])).logits[0, -1].float().numpy()


DIST_SETTINGS = [dict(temperature=1.5),
                 dict(temperature=2.0, top_k=12, top_p=0.9, min_p=0.01, repeat_penalty=1.5, frequency_penalty=0.4)]


@pytest.mark.parametrize("opts", DIST_SETTINGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_ar_first_token_distribution_matches_transformers(engine, prompt, hf_model, opts):
    p = GenerationConfig(**opts).processing()
    want = reference_probs(hf_logits(hf_model, prompt), Counter(prompt[-PENALTY_LAST_N:]), p)
    got = [engine.generate(prompt, 1, mode="ar", seed=s, **opts).tokens[0] for s in range(N_SEEDS)]
    stat, crit = chi_square_ok(got, want)
    assert stat < crit, (stat, crit)


@pytest.mark.parametrize("opts", DIST_SETTINGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_tree_node_distributions_match_transformers(engine, prompt, hf_model, opts):
    """One sampled verify of a branching tree; each node's draws over N_SEEDS seeds follow the
    target's processed distribution after the prompt + that node's path (not its flat order)."""
    tokens = np.array([prompt[-1], 40, 41, 90, 91, 92], np.int32)
    parents = np.array([-1, 0, 0, 1, 2, 2], np.int32)
    h = engine._h()
    engine.reset()
    h.prefill(np.asarray(prompt[:-1], np.int32))
    gen = GenerationConfig(**opts)
    sampler = Sampler(gen.processing(), 0, n_candidates=32, penalty_last_n=PENALTY_LAST_N,
                      max_rows=engine.info["max_tree"], n_vocab=engine.info["n_vocab"])
    paths = {0: [prompt[-1]]}
    for i in range(1, tokens.size):
        paths[i] = paths[int(parents[i])] + [int(tokens[i])]
    contexts = {i: prompt[:-1] + paths[i] for i in paths}
    sampler.set_history(prompt[:-1])  # node i's window: the tail of contexts[i]
    h.verify_sampled(tokens, parents, np.zeros(tokens.size, np.int32), sampler.io)
    for node in (0, 1, 4, 5):
        ctx = contexts[node]
        want = reference_probs(hf_logits(hf_model, ctx), Counter(ctx[-PENALTY_LAST_N:]), gen.processing())
        got = []
        for s in range(N_SEEDS):
            sampler.seed = s
            sampler.io.draw([len(contexts[i]) for i in range(node + 1)])  # the verify's draws, for seed s
            got.append(sampler.pick(node, h.processed_row))
        stat, crit = chi_square_ok(got, want)
        assert stat < crit, (node, stat, crit)
    engine.reset()
