"""lucebox.Engine end to end on the tiny pair: lossless speculative decoding (chain, DDTree) against
AR greedy, acceptance lengths against known drafts and the reference loop, stops, limits, errors.

Oracles: the engine's own AR mode (itself checked against transformers in test_target.py), drafts
whose right answers sit at known ranks (`Oracle`), ddtree.build_tree + draft_reference.tree_accept
for the expected acceptance, and draft_reference.chain_generate (transformers + dflash) for chain
mode with the real draft.

LUCEBOX_TEST_BACKEND=cuda runs the engine on CUDA device 0.
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
from dataclasses import dataclass, field

import numpy as np
import pytest

import draft_reference as ref
from lucebox import ddtree
from lucebox._native import NativeError
from lucebox.drafters import ScriptedDrafter
from lucebox.engine import Engine

DEVICE = "cuda" if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else "cpu"
# one thread: the tiny model gains nothing from more, and CI shares 2 cores with other tests.
# Every kernel is batch-invariant (CPU always, CUDA by default): speculative == AR bit for bit, any cache.
ENGINE_OPTS = dict(device=DEVICE, n_threads=1, max_ctx=512)
E_MISMATCH = -5
N_TEXT_TOKENS = 598  # ids below this are ordinary BPE tokens in the tiny tokenizer
AR_LEN = 128         # AR reference length per prompt: covers every request + one block


def make_prompt(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(1000 * seed + n).integers(0, N_TEXT_TOKENS, n).tolist()


@pytest.fixture(scope="module")
def engine(tiny_gguf, tiny_draft_dirs):
    """Target + bf16 DFlash draft, shared by the module's tests (each resets or reuses on purpose)."""
    with Engine(tiny_gguf["f32"], draft=tiny_draft_dirs["bf16"], **ENGINE_OPTS) as e:
        yield e


@pytest.fixture(scope="module")
def target_only(tiny_gguf):
    with Engine(tiny_gguf["f32"], **ENGINE_OPTS) as e:
        yield e


@pytest.fixture(scope="module")
def ar(engine):
    """ar(prompt) -> the AR greedy continuation (AR_LEN tokens), computed once per prompt."""
    memo: dict[tuple, list[int]] = {}

    def get(prompt: list[int]) -> list[int]:
        key = tuple(prompt)
        if key not in memo:
            engine.reset()
            g = engine.generate(prompt, AR_LEN, mode="ar", ignore_eos=True)
            assert len(g.tokens) == AR_LEN and g.finish_reason == "length"
            memo[key] = g.tokens
        return memo[key]

    return get


@dataclass
class Call:
    last: int
    n_past: int
    top_k: int
    ids: np.ndarray
    logp: np.ndarray


@dataclass
class Oracle:
    """A drafter that knows the AR continuation `script` (absolute positions: prompt + AR output).

    `rank(step, row, top_k)` says at which rank row `row` of step `step` holds the right token
    (None: nowhere); every other candidate is a wrong token. `logp(step, top_k)` gives the rows'
    log-probs ([rows, top_k], non-increasing); default: -1, -2, ... per rank.
    """

    script: list[int]
    n_vocab: int
    rank: object
    logp: object = None
    block_size: int = 16
    calls: list[Call] = field(default_factory=list)

    def propose(self, last: int, n_past: int, top_k: int):
        step, rows = len(self.calls), self.block_size - 1
        assert last == self.script[n_past], "the root must be the token the target chose at n_past"
        ids = np.empty((rows, top_k), np.int32)
        for j in range(rows):
            right = self.script[n_past + 1 + j]
            row = [(right + 1 + i) % self.n_vocab for i in range(top_k)]  # all wrong (top_k < vocab)
            r = self.rank(step, j, top_k)
            if r is not None:
                row[r] = right
            ids[j] = row
        if self.logp is None:
            logp = np.tile(-np.arange(1, top_k + 1, dtype=np.float32), (rows, 1))
        else:
            logp = np.asarray(self.logp(step, top_k), np.float32)
        self.calls.append(Call(last, n_past, top_k, ids.copy(), logp.copy()))
        return ids, logp


class Recording:
    """Wraps a drafter and keeps a copy of every proposal (NativeDrafter reuses its buffers)."""

    def __init__(self, inner):
        self.inner = inner
        self.block_size = inner.block_size
        self.calls: list[Call] = []

    def propose(self, last: int, n_past: int, top_k: int):
        ids, logp = self.inner.propose(last, n_past, top_k)
        self.calls.append(Call(last, n_past, top_k, ids.copy(), logp.copy()))
        return ids, logp


def expected_als(calls: list[Call], script: list[int], mode: str, budget: int, chain_seed: bool,
                 max_new: int) -> list[int]:
    """Acceptance length of every step, from the recorded drafts, by the reference walk."""
    out, emitted = [], 1
    for c in calls:
        if mode == "chain":
            tree = ddtree.chain_tree(c.ids, c.last, budget)
        else:
            tree = ddtree.build_tree(c.ids, c.logp, c.last, budget, chain_seed=chain_seed)
        path, bonus = ref.tree_accept(tree.tokens.tolist(), tree.parents.tolist(), script[c.n_past + 1:])
        al = min(len(path), max_new - emitted)
        out.append(al)
        emitted += al
    return out


def assert_cache_at_output(e: Engine, prompt: list[int], g) -> None:
    """What the engine guarantees: the caches hold prompt + output, except the output's last token
    (still pending) when it ran to its length or context; after an EOS, the whole output."""
    held = prompt + (g.tokens if g.finish_reason == "eos" else g.tokens[:-1])
    assert e._cache_tokens == held
    assert e._handle.info()["n_past"] == len(held)


# ---- lossless: speculative == AR greedy ----------------------------------------------------------

PROMPT_LENS = [1, 2, 7, 16, 33, 64, 129, 300]
NEW = [48, 64, 96]


def lossless_cases():
    """(mode, budget, top_k, chain_seed, drafter, prompt length, new tokens): every DDTree
    budget x K x seed with the real draft, the same with a noisy oracle (deep, branching paths),
    and chain mode at every budget with both."""
    cases = []
    for i, (budget, k, seed) in enumerate(itertools.product([1, 4, 22, 40], [1, 4, 8], [True, False])):
        drafter = "native" if i % 2 == 0 else "noisy"
        cases.append(("ddtree", budget, k, seed, drafter, PROMPT_LENS[i % 8], NEW[i % 3]))
    for i, (budget, drafter) in enumerate(itertools.product([1, 4, 15, 22, 40], ["native", "noisy"])):
        cases.append(("chain", budget, 8, True, drafter, PROMPT_LENS[(3 * i + 1) % 8], NEW[(i + 1) % 3]))
    return cases


def noisy_rank(seed: int, p_absent: float = 0.25):
    """Right token at rank 0 most of the time, at a random lower rank or nowhere otherwise."""
    def rank(step, row, top_k):
        u = np.random.default_rng([seed, step, row]).random()
        if u < p_absent:
            return None
        if u < 0.6 or top_k == 1:
            return 0
        return 1 + int(u * 1000) % (top_k - 1)
    return rank


@pytest.mark.parametrize("mode,budget,top_k,chain_seed,drafter,n_prompt,n_new", lossless_cases(),
                         ids=lambda v: str(v))
def test_speculative_equals_ar(engine, ar, mode, budget, top_k, chain_seed, drafter, n_prompt, n_new):
    prompt = make_prompt(n_prompt)
    want = ar(prompt)
    if drafter == "native":
        d = Recording(engine._drafter)
    else:
        d = Oracle(prompt + want, engine.info["n_vocab"], noisy_rank(n_prompt + budget))
    engine.reset()
    g = engine.generate(prompt, n_new, mode=mode, budget=budget, draft_top_k=top_k, chain_seed=chain_seed,
                        ignore_eos=True, drafter=d)
    assert g.tokens == want[:n_new]
    assert g.finish_reason == "length"
    assert 1 + sum(g.stats.accept_lengths) == n_new
    assert g.stats.accept_lengths == expected_als(d.calls, prompt + want, mode, budget, chain_seed, n_new)
    assert_cache_at_output(engine, prompt, g)
    if drafter == "noisy" and budget >= 4:
        assert max(g.stats.accept_lengths) > 2  # the oracle did get deep paths accepted


@pytest.mark.parametrize("kind,weights", [("f32", "keep"), ("sliding", "keep"), ("bf16", "q8_0")])
def test_other_drafts_are_lossless(tiny_gguf, tiny_draft_dirs, ar, kind, weights):
    prompt = make_prompt(40, seed=3)
    with Engine(tiny_gguf["f32"], draft=tiny_draft_dirs[kind], draft_weights=weights, **ENGINE_OPTS) as e:
        for mode in ("chain", "ddtree"):
            e.reset()
            assert e.generate(prompt, 40, mode=mode, ignore_eos=True).tokens == ar(prompt)[:40]


@pytest.mark.parametrize("mode", ["ar", "chain", "ddtree"])
def test_prefix_reuse_equals_fresh(engine, ar, mode):
    # The second prompt extends the first request's prompt + output: only the difference is
    # prefilled, and the result (tokens, and the real draft's proposals) equals a fresh engine's.
    p1 = make_prompt(21, seed=5)
    p2 = p1 + ar(p1)[:30] + make_prompt(9, seed=6)
    want = ar(p2)  # (the AR oracle uses the engine too: ask it first)
    first = engine.generate(p1, 30, mode=mode, ignore_eos=True)  # whatever the cache held before
    assert first.tokens == ar(p1)[:30]
    d_reused = Recording(engine._drafter)
    reused = engine.generate(p2, 40, mode=mode, ignore_eos=True, drafter=d_reused)
    assert reused.stats.prompt_tokens == 1 + 9  # the pending last output token + the new text
    engine.reset()
    d_fresh = Recording(engine._drafter)
    fresh = engine.generate(p2, 40, mode=mode, ignore_eos=True, drafter=d_fresh)
    assert fresh.stats.prompt_tokens == len(p2)
    assert reused.tokens == fresh.tokens == want[:40]
    # the draft's context (features captured in verify batches vs one prefill) is bit-identical too,
    # so every proposal, and with it every tree and acceptance length, is the same
    assert reused.stats.accept_lengths == fresh.stats.accept_lengths
    assert len(d_reused.calls) == len(d_fresh.calls)
    for a, b in zip(d_reused.calls, d_fresh.calls):
        assert (a.last, a.n_past) == (b.last, b.n_past)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.logp, b.logp)


def test_next_logits_is_what_ar_picks_from(engine, ar):
    prompt = make_prompt(15, seed=9)
    want = ar(prompt)
    row = engine.next_logits(prompt)
    assert row.shape == (engine.info["n_vocab"],) and np.isfinite(row).all()
    assert int(row.argmax()) == want[0]
    # the cache now holds the prompt: generating from it prefills nothing
    g = engine.generate(prompt, 5, mode="ar", ignore_eos=True)
    assert g.stats.prompt_tokens == 0 and g.tokens == want[:5]
    with pytest.raises(ValueError, match="empty"):
        engine.next_logits([])


def test_same_prompt_again_prefills_nothing(engine, ar):
    prompt = make_prompt(12, seed=7)
    want = ar(prompt)
    engine.reset()
    a = engine.generate(prompt, 1, mode="ar", ignore_eos=True)
    b = engine.generate(prompt, 20, mode="ddtree", ignore_eos=True)
    assert b.stats.prompt_tokens == 0
    assert a.tokens == b.tokens[:1] and b.tokens == want[:20]


def test_shorter_prompt_after_longer_restarts(engine, ar):
    long_p = make_prompt(50, seed=8)
    want = ar(long_p[:20])
    engine.generate(long_p, 5, mode="ar", ignore_eos=True)
    g = engine.generate(long_p[:20], 24, mode="chain", ignore_eos=True)
    assert g.stats.prompt_tokens == 20 and g.tokens == want[:24]


@pytest.mark.parametrize("outtype,kv,opts", [("q8_0", "q8_0", {}), ("f16", "q4_0", {"ubatch": 16}),
                                             ("f32", "f16", {"max_tree": 8})])
def test_lossless_with_quantized_caches_and_limits(tiny_gguf, tiny_draft_dirs, outtype, kv, opts):
    # Lossless is exact for every weight and KV type (AR from the same engine is the oracle), with a
    # prompt prefilled in many micro-batches, and with a budget capped by max_tree.
    prompt = make_prompt(70, seed=21)
    with Engine(tiny_gguf[outtype], draft=tiny_draft_dirs["bf16"], **dict(ENGINE_OPTS, kv=kv, **opts)) as e:
        want = e.generate(prompt, 80, mode="ar", ignore_eos=True).tokens
        budget = min(22, e.info["max_tree"] - 1)
        for mode, chain_seed in (("ddtree", True), ("ddtree", False), ("chain", True)):
            d = Oracle(prompt + want, e.info["n_vocab"], noisy_rank(7))
            e.reset()
            g = e.generate(prompt, 60, mode=mode, draft_top_k=4, chain_seed=chain_seed, ignore_eos=True, drafter=d)
            assert g.tokens == want[:60]
            assert g.stats.accept_lengths == expected_als(d.calls, prompt + want, mode, budget, chain_seed, 60)
            e.reset()
            got = e.generate(prompt, 40, mode=mode, chain_seed=chain_seed, ignore_eos=True).tokens
            assert got == want[:40], f"{mode} (chain_seed {chain_seed}) differs from AR"


@pytest.mark.parametrize("block_size", [2, 5, 33])
def test_drafter_block_size_is_its_own(engine, ar, block_size):
    # The tree depth follows the drafter's block, not the native draft's (a longer script block
    # still verifies and commits exactly).
    prompt = make_prompt(17, seed=23)
    want = ar(prompt)
    d = Oracle(prompt + want, engine.info["n_vocab"], noisy_rank(3, p_absent=0.05), block_size=block_size)
    engine.reset()
    g = engine.generate(prompt, 90, mode="ddtree", budget=40, ignore_eos=True, drafter=d)
    assert g.tokens == want[:90]
    assert g.stats.accept_lengths == expected_als(d.calls, prompt + want, "ddtree", 40, True, 90)
    assert max(g.stats.accept_lengths) <= block_size
    engine.reset()
    g = engine.generate(prompt, 90, mode="chain", budget=40, ignore_eos=True,
                        drafter=Oracle(prompt + want, engine.info["n_vocab"], perfect, block_size=block_size))
    assert g.tokens == want[:90] and g.stats.accept_lengths[0] == block_size


# ---- acceptance lengths with known drafts -----------------------------------------------------

def perfect(step, row, top_k):
    return 0


def never(step, row, top_k):
    return None


@pytest.mark.parametrize("mode", ["chain", "ddtree"])
def test_perfect_draft_accepts_whole_blocks(engine, ar, mode):
    prompt = make_prompt(10, seed=1)
    want = ar(prompt)
    n_new = 1 + 16 * 5 + 3
    for drafter in (ScriptedDrafter(prompt + want, 16, engine.info["n_vocab"]),
                    Oracle(prompt + want, engine.info["n_vocab"], perfect)):
        engine.reset()
        g = engine.generate(prompt, n_new, mode=mode, ignore_eos=True, drafter=drafter)
        assert g.tokens == want[:n_new]
        assert g.stats.accept_lengths == [16] * 5 + [3]
        assert_cache_at_output(engine, prompt, g)


@pytest.mark.parametrize("mode", ["chain", "ddtree"])
def test_always_wrong_draft_accepts_nothing(engine, ar, mode):
    prompt = make_prompt(10, seed=2)
    want = ar(prompt)
    wrong = [(t + 1) % engine.info["n_vocab"] for t in prompt + want]
    for drafter in (ScriptedDrafter(wrong, 16, engine.info["n_vocab"]),
                    Oracle(prompt + want, engine.info["n_vocab"], never)):
        engine.reset()
        g = engine.generate(prompt, 30, mode=mode, ignore_eos=True, drafter=drafter)
        assert g.tokens == want[:30]
        assert g.stats.accept_lengths == [1] * 29


RIGHT_ROWS = [0, 3, 15, 7, 1, 14, 2, 9, 5, 12, 0, 11]


def test_partial_acceptance_at_every_depth(engine, ar):
    # Right for the first r rows of the step's block, then wrong: chain accepts exactly r.
    prompt = make_prompt(30, seed=4)
    want = ar(prompt)
    d = Oracle(prompt + want, engine.info["n_vocab"],
               lambda step, row, k: 0 if row < RIGHT_ROWS[step % len(RIGHT_ROWS)] else None)
    n_new = 1 + sum(r + 1 for r in RIGHT_ROWS)
    engine.reset()
    g = engine.generate(prompt, n_new, mode="chain", ignore_eos=True, drafter=d)
    assert g.tokens == want[:n_new]
    assert g.stats.accept_lengths == [r + 1 for r in RIGHT_ROWS]


# rank-0 log-probs -0.1 per row, except the detour row where rank 1 is almost as likely as rank 0;
# every other lower rank is unlikely, so best-first spends the budget below the detour
def detour_logp(detour_rows):
    def logp(step, top_k):
        lp = np.full((15, top_k), -12.0, np.float32)
        lp[:, 0] = -0.1
        if top_k > 1:
            lp[detour_rows[step % len(detour_rows)], :2] = [-0.69, -0.70]
        return lp
    return logp


DETOUR_ROWS = [0, 2, 5, 9, 13, 1]


@pytest.mark.parametrize("chain_seed", [True, False])
@pytest.mark.parametrize("budget", [22, 40])
def test_tree_accepts_past_a_rank_one_token(engine, ar, chain_seed, budget):
    # At depth d+1 (row d) the right token is rank 1 and rank 0 is wrong; every other row is right
    # at rank 0. Chain stops at d accepted tokens; DDTree follows the rank-1 branch deeper.
    prompt = make_prompt(25, seed=9)
    want = ar(prompt)
    vocab = engine.info["n_vocab"]

    def rank(step, row, k):
        return 1 if row == DETOUR_ROWS[step % len(DETOUR_ROWS)] else 0

    n_new = 100
    chain_d = Oracle(prompt + want, vocab, rank, detour_logp(DETOUR_ROWS))
    engine.reset()
    chain = engine.generate(prompt, n_new, mode="chain", budget=budget, ignore_eos=True, drafter=chain_d)
    assert chain.tokens == want[:n_new]
    assert chain.stats.accept_lengths[:len(DETOUR_ROWS)] == [r + 1 for r in DETOUR_ROWS]

    tree_d = Oracle(prompt + want, vocab, rank, detour_logp(DETOUR_ROWS))
    engine.reset()
    tree = engine.generate(prompt, n_new, mode="ddtree", budget=budget, draft_top_k=4, chain_seed=chain_seed,
                           ignore_eos=True, drafter=tree_d)
    assert tree.tokens == want[:n_new]
    als = tree.stats.accept_lengths
    assert als == expected_als(tree_d.calls, prompt + want, "ddtree", budget, chain_seed, n_new)
    # beyond the chain wherever the block left room past the detour
    for step, al in enumerate(als[:len(DETOUR_ROWS)]):
        assert al > DETOUR_ROWS[step] + 2, (step, als)


def test_chain_matches_the_reference_loop(tiny_gguf, tiny_hf_dir, tiny_draft_dirs):
    # The real DFlash draft in chain mode against tests/draft_reference.py (transformers target,
    # dflash draft, exact rollback): same tokens, same drafts, same acceptance per step.
    import tiny_models

    tgt = tiny_models.load_target(tiny_hf_dir)
    draft = ref.load_draft(tiny_draft_dirs["f32"])
    prompt = make_prompt(19, seed=11)
    with Engine(tiny_gguf["f32"], draft=tiny_draft_dirs["f32"], **ENGINE_OPTS) as e:
        for chain_len, n_new in ((15, 14), (4, 8)):  # the transformers loop is slow: keep it short
            want = ref.chain_generate(tgt, draft, prompt, n_new, chain_len=chain_len)
            d = Recording(e._drafter)
            e.reset()
            g = e.generate(prompt, n_new, mode="chain", budget=chain_len, ignore_eos=True, drafter=d)
            assert g.tokens == want.tokens
            assert [c.ids[:chain_len, 0].tolist() for c in d.calls] == [s.draft for s in want.steps]
            assert [c.last for c in d.calls] == [s.last for s in want.steps]
            # the reference's last step may run past max_new_tokens; ours stops at it
            cap = expected_cap(want.acceptance_lengths, n_new)
            assert g.stats.accept_lengths == cap


def expected_cap(als: list[int], n_new: int) -> list[int]:
    out, emitted = [], 1
    for al in als:
        out.append(min(al, n_new - emitted))
        emitted += out[-1]
    return out


# ---- stops and limits ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["ar", "chain", "ddtree"])
@pytest.mark.parametrize("at", [0, 5, 20, 37])
def test_eos_inside_an_accepted_block(engine, ar, monkeypatch, mode, at):
    prompt = make_prompt(8, seed=12)
    want = ar(prompt)
    eos = want[at]
    cut = want.index(eos)  # the first time AR emits it
    monkeypatch.setattr(engine.tokenizer, "eos_ids", (eos,))
    drafter = ScriptedDrafter(prompt + want, 16, engine.info["n_vocab"])
    engine.reset()
    g = engine.generate(prompt, 90, mode=mode, drafter=drafter)
    assert g.finish_reason == "eos" and g.tokens == want[:cut]
    assert 1 + sum(g.stats.accept_lengths) == cut + 1  # the steps emitted the EOS, nothing after
    assert_cache_at_output(engine, prompt, g)
    assert engine._pending == eos
    # the next turn continues from the cache: prompt + output + eos + new text
    p2 = prompt + g.tokens + [eos] + make_prompt(5, seed=13)
    nxt = engine.generate(p2, 12, mode=mode, ignore_eos=True)
    assert nxt.stats.prompt_tokens == 1 + 5
    assert nxt.tokens == ar(p2)[:12]


@pytest.mark.parametrize("mode", ["ar", "chain", "ddtree"])
@pytest.mark.parametrize("n_new", [1, 2, 17, 33, 40])
def test_max_new_tokens_is_exact(engine, ar, mode, n_new):
    prompt = make_prompt(6, seed=14)
    want = ar(prompt)
    engine.reset()
    g = engine.generate(prompt, n_new, mode=mode, ignore_eos=True,
                        drafter=ScriptedDrafter(prompt + want, 16, engine.info["n_vocab"]))
    assert g.tokens == want[:n_new] and g.finish_reason == "length"
    if mode != "ar":
        assert g.stats.accept_lengths == expected_cap([16] * 3, n_new)[:g.stats.steps]
    assert g.stats.new_tokens == n_new
    assert_cache_at_output(engine, prompt, g)


@pytest.mark.parametrize("mode", ["ar", "chain", "ddtree"])
def test_stop_string_cuts_the_text(engine, ar, mode):
    prompt = make_prompt(9, seed=15)
    want = ar(prompt)[:80]
    text = engine.tokenizer.decode(want)
    stop = text[len(text) // 2: len(text) // 2 + 3]
    at = text.find(stop)
    assert at > 0
    engine.reset()
    g = engine.generate(prompt, 80, mode=mode, ignore_eos=True, stop=[stop, "\x00never"],
                        drafter=ScriptedDrafter(prompt + want, 16, engine.info["n_vocab"]))
    assert g.finish_reason == "stop"
    assert g.text == text[:at]
    # the output ends at the token that completed the stop string
    assert g.tokens == want[:len(g.tokens)]
    assert stop in engine.tokenizer.decode(g.tokens) and stop not in engine.tokenizer.decode(g.tokens[:-1])
    # A step commits its whole accepted path before the text is searched, so the caches may run
    # past the output (never past what the target chose); they stay in step with the native side.
    held = engine._cache_tokens
    assert len(prompt) + len(g.tokens) - 1 <= len(held) and held == (prompt + want)[:len(held)]
    assert engine._handle.info()["n_past"] == len(held)
    p2 = prompt + g.tokens + make_prompt(4, seed=16)
    want2 = ar(p2)
    engine.generate(prompt, 80, mode=mode, ignore_eos=True, stop=[stop])
    assert engine.generate(p2, 20, mode=mode, ignore_eos=True).tokens == want2[:20]


def test_stream_pieces_make_the_text(engine, ar):
    prompt = make_prompt(9, seed=22)
    want = ar(prompt)
    engine.reset()
    pieces = list(engine.stream(prompt, 50, mode="ddtree", ignore_eos=True,
                                drafter=ScriptedDrafter(prompt + want, 16, engine.info["n_vocab"])))
    g = engine.last_generation
    assert "".join(pieces) == g.text == engine.tokenizer.decode(want[:50])
    assert g.tokens == want[:50]


@pytest.mark.parametrize("mode,drafter", [("ar", None), ("chain", "perfect"), ("ddtree", "perfect"),
                                          ("ddtree", "native"), ("chain", "native")])
def test_context_limit_ends_cleanly(tiny_gguf, tiny_draft_dirs, ar, mode, drafter):
    max_ctx, n_prompt = 64, 50
    prompt = make_prompt(n_prompt, seed=16)
    want = ar(prompt)
    opts = dict(ENGINE_OPTS, max_ctx=max_ctx)
    with Engine(tiny_gguf["f32"], draft=tiny_draft_dirs["bf16"], **opts) as e:
        d = ScriptedDrafter(prompt + want, 16, e.info["n_vocab"]) if drafter == "perfect" else None
        g = e.generate(prompt, 100, mode=mode, ignore_eos=True, drafter=d)
        # every slot filled; the last token needs none (it is not fed)
        assert g.finish_reason == "context"
        assert g.tokens == want[:max_ctx - n_prompt + 1]
        assert_cache_at_output(e, prompt, g)
        assert e._handle.info()["n_past"] == max_ctx
        # prompts that leave one slot, then none: 2 tokens, then 1 (its last token is never fed)
        for n_left, n_out in ((1, 2), (0, 1)):
            long_prompt = make_prompt(max_ctx - n_left, seed=17)
            g = e.generate(long_prompt, 5, mode=mode, ignore_eos=True, drafter=None)
            assert g.finish_reason == "context" and len(g.tokens) == n_out
            assert e._handle.info()["n_past"] == max_ctx
        assert e.generate(long_prompt, 1, mode=mode, ignore_eos=True).finish_reason == "length"


def test_cancelled_stream_leaves_a_usable_engine(engine, ar):
    prompt = make_prompt(14, seed=17)
    want = ar(prompt)
    engine.reset()
    stream = engine.stream(prompt, 60, mode="ddtree", ignore_eos=True)
    next(stream)
    stream.close()
    assert engine.last_generation.finish_reason == "cancelled"
    assert engine.last_generation.tokens == want[:len(engine.last_generation.tokens)]
    g = engine.generate(prompt, 30, mode="chain", ignore_eos=True)
    assert g.tokens == want[:30]


# ---- stats ----------------------------------------------------------------------------------------

def test_stats(engine, ar):
    prompt = make_prompt(11, seed=18)
    want = ar(prompt)
    engine.reset()
    g = engine.generate(prompt, 40, mode="chain", ignore_eos=True,
                        drafter=ScriptedDrafter(prompt + want, 16, engine.info["n_vocab"]))
    s = g.stats
    assert s is engine.last_stats
    assert s.mode == "chain" and s.steps == 3 and s.accept_lengths == [16, 16, 7]
    assert s.al_mean == pytest.approx(13.0)
    hist = s.al_histogram()
    assert len(hist) == 17 and hist[16] == 2 and hist[7] == 1 and sum(hist) == s.steps
    assert s.prompt_tokens == 11 and s.new_tokens == 40
    assert min(s.prefill_s, s.decode_s, s.draft_s, s.verify_s, s.commit_s, s.host_s) >= 0
    assert s.verify_s > 0 and s.decode_s >= s.verify_s
    ms = s.per_step_ms()
    assert set(ms) == {"draft", "verify", "commit", "host"} and min(ms.values()) >= 0
    d = s.as_dict()
    assert d["al_mean"] == s.al_mean and d["al_histogram"] == hist and d["steps"] == 3
    assert "AL 13.00 over 3 steps" in s.summary()

    engine.reset()
    a = engine.generate(prompt, 10, mode="ar", ignore_eos=True).stats
    assert a.mode == "ar" and a.steps == 9 and a.accept_lengths == [1] * 9 and a.al_mean == 1.0
    assert a.draft_s == 0 and a.verify_s > 0


# ---- bad input and lifetime -----------------------------------------------------------------------

def test_tree_modes_need_a_draft(target_only):
    with pytest.raises(ValueError, match="draft"):
        target_only.generate([1, 2, 3], 4, mode="ddtree")
    with pytest.raises(ValueError, match="draft"):
        target_only.generate([1, 2, 3], 4, mode="chain")
    assert target_only.generate([1, 2, 3], 4, mode="auto", ignore_eos=True).stats.mode == "ar"


def test_scripted_draft_on_a_target_only_engine(target_only, ar):
    prompt = make_prompt(13, seed=19)
    want = ar(prompt)
    target_only.reset()
    g = target_only.generate(prompt, 35, mode="ddtree", ignore_eos=True,
                             drafter=ScriptedDrafter(prompt + want, 16, target_only.info["n_vocab"]))
    assert g.tokens == want[:35] and g.stats.accept_lengths == [16, 16, 2]


@pytest.mark.parametrize("opts,words", [
    ({"budget": 0}, "budget"), ({"budget": -3}, "budget"), ({"draft_top_k": 0}, "draft_top_k"),
    ({"draft_top_k": -1}, "draft_top_k"), ({"max_new_tokens": 0}, "max_new_tokens"), ({"mode": "beam"}, "mode"),
    ({"top_k": -1}, "top_k"), ({"temperature": -0.5}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"min_p": -0.1}, "min_p"), ({"min_p": 2}, "min_p"),
    ({"repeat_penalty": 0}, "repeat_penalty"), ({"presence_penalty": float("inf")}, "presence_penalty"),
    ({"frequency_penalty": "x"}, "frequency_penalty"), ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"),
])
def test_bad_generation_options(engine, opts, words):
    opts = {"max_new_tokens": 4, **opts}
    with pytest.raises(ValueError, match=words):
        engine.generate([1, 2, 3], **opts)


def test_draft_top_k_beyond_vocab_is_a_native_error(engine, ar):
    prompt = make_prompt(5, seed=20)
    want = ar(prompt)
    vocab = engine.info["n_vocab"]
    with pytest.raises(NativeError, match="top_k") as err:
        engine.generate(prompt, 8, mode="ddtree", draft_top_k=vocab + 1, ignore_eos=True)
    assert str(vocab + 1) in str(err.value) or str(vocab) in str(err.value)
    assert "\n" not in str(err.value)
    # the engine is still usable, and K == vocab is fine
    assert engine.generate(prompt, 8, mode="ddtree", draft_top_k=vocab, ignore_eos=True).tokens == want[:8]


def test_token_outside_vocab_leaves_the_engine_usable(engine, ar):
    prompt = make_prompt(6, seed=24)
    want = ar(prompt)
    vocab = engine.info["n_vocab"]
    engine.generate(prompt, 3, mode="ar", ignore_eos=True)
    # refused before any native call (test_native_errors covers the native prefill's own check)
    for bad in ([vocab], prompt + [vocab + 5], [-1], [2 ** 40]):  # (the second one shares the cached prefix)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            engine.generate(bad, 4, mode="ddtree")
    assert engine._handle.info()["n_past"] == len(engine._cache_tokens)
    assert engine.generate(prompt, 20, mode="ddtree", ignore_eos=True).tokens == want[:20]


def test_auto_mode_uses_the_draft(engine, ar):
    prompt = make_prompt(6, seed=25)
    want = ar(prompt)
    g = engine.generate(prompt, 20, ignore_eos=True)
    assert g.stats.mode == "ddtree" and g.tokens == want[:20]


def test_prompt_beyond_max_ctx(engine):
    n = engine.info["max_ctx"] + 1
    with pytest.raises(ValueError, match="max_ctx") as err:
        engine.generate(make_prompt(n), 4)
    assert str(n) in str(err.value)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([], 4)


def test_close(tiny_gguf):
    e = Engine(tiny_gguf["f32"], **ENGINE_OPTS)
    e.close()
    e.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        e.generate([1, 2, 3], 4)
    with pytest.raises(RuntimeError, match="closed"):
        e.reset()
    with Engine(tiny_gguf["f32"], **ENGINE_OPTS) as e2:
        assert len(e2.generate([1, 2, 3], 3, ignore_eos=True).tokens) == 3
    with pytest.raises(RuntimeError, match="closed"):
        e2.generate([1, 2, 3], 3)


def test_draft_for_another_target_is_a_mismatch(tmp_path, tiny_gguf, tiny_hf_dir):
    # A self-consistent draft for a 32-wide target, loaded next to the 64-wide one.
    import tiny_models
    from safetensors.torch import save_file

    cfg = tiny_models.draft_config(tiny_models.DraftSpec(), tiny_hf_dir)
    cfg["hidden_size"] = 32
    out = tmp_path / "draft"
    out.mkdir()
    save_file({k: v.contiguous() for k, v in tiny_models._draft_state_dict(cfg, 5).items()},
              str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(NativeError, match="hidden_size") as err:
        Engine(tiny_gguf["f32"], draft=out, **ENGINE_OPTS)
    assert err.value.status == E_MISMATCH and "32" in str(err.value) and "64" in str(err.value)


def test_draft_reading_a_layer_the_target_lacks(tmp_path, tiny_gguf, tiny_draft_dirs):
    out = tmp_path / "draft"
    shutil.copytree(tiny_draft_dirs["bf16"], out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [1, 3, 8]  # the tiny target has layers 0..7
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(NativeError, match="target_layer_ids") as err:
        Engine(tiny_gguf["f32"], draft=out, **ENGINE_OPTS)
    assert err.value.status == E_MISMATCH and "8" in str(err.value)


def test_missing_draft_folder(tmp_path, tiny_gguf):
    with pytest.raises(NativeError, match="config.json"):
        Engine(tiny_gguf["f32"], draft=tmp_path / "nowhere", **ENGINE_OPTS)
    with pytest.raises(FileNotFoundError):
        Engine(tmp_path / "missing.gguf", **ENGINE_OPTS)


# --- opening: Engine() with no path, from_pretrained, prefill with progress -------------------------
@pytest.fixture
def no_models_named(tmp_path, monkeypatch):
    """No model env vars, an empty HF cache and state dir: Engine() falls back to the embedded pair."""
    from lucebox import defaults, hub

    monkeypatch.setenv(hub.STATE_ENV, str(tmp_path / "state"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv(defaults.TARGET_ENV, raising=False)
    monkeypatch.delenv(defaults.DRAFT_ENV, raising=False)
    return tmp_path / "hf"


def test_engine_with_no_path_opens_the_embedded_pair_with_a_warning(no_models_named):
    from lucebox import defaults

    with pytest.warns(UserWarning, match="embedded 7M-parameter demo pair.*lucebox pull qwen3.5-27b"):
        engine = Engine(**ENGINE_OPTS)
    with engine:
        assert (engine.config.target, engine.config.draft) == defaults.embedded()
        assert engine.has_draft


def test_engine_with_no_path_takes_the_environment(no_models_named, tiny_pair, monkeypatch, recwarn):
    from lucebox import defaults

    monkeypatch.setenv(defaults.TARGET_ENV, str(tiny_pair[0]))
    monkeypatch.setenv(defaults.DRAFT_ENV, str(tiny_pair[1]))
    with Engine(**ENGINE_OPTS) as engine:
        assert (engine.config.target, engine.config.draft) == tiny_pair
    assert not [w for w in recwarn if "demo pair" in str(w.message)]


def test_from_pretrained_opens_the_pulled_pair(no_models_named, tiny_pair):
    from fakehub import fill_cache
    from lucebox import hub

    with pytest.raises(FileNotFoundError, match="qwen3.5-27b is not in the Hugging Face cache.*lucebox pull qwen3.5-27b"):
        Engine.from_pretrained("qwen3.5-27b", **ENGINE_OPTS)
    with pytest.raises(hub.HubError, match="unknown model"):
        Engine.from_pretrained("qwen9", **ENGINE_OPTS)
    spec = hub.KNOWN["qwen3.5-27b"]
    fill_cache(no_models_named, {spec.target_repo: {spec.target_file: tiny_pair[0].read_bytes()},
                                 spec.draft_repo: {f: (tiny_pair[1] / f).read_bytes() for f in spec.draft_files}})
    with Engine.from_pretrained("qwen3.5-27b", **ENGINE_OPTS) as engine:
        assert engine.config.target.name == spec.target_file and engine.has_draft
        with Engine(*tiny_pair, **ENGINE_OPTS) as direct:
            ids = make_prompt(20)
            assert engine.generate(ids, 16).tokens == direct.generate(ids, 16).tokens


def test_prefill_progress_reports_chunks_and_changes_nothing(tiny_pair):
    ids = make_prompt(70, seed=3)
    with Engine(*tiny_pair, **ENGINE_OPTS) as engine:
        reference = engine.generate(ids, 12, mode="ddtree").tokens
        engine.reset()
        calls = []
        first = engine.prefill(ids[:30])  # a cached prefix: only the 40 tokens after it count
        assert engine.prefill(ids, progress=lambda done, total: calls.append((done, total)), chunk_tokens=16) \
            == engine.prefill(ids)
        assert calls == [(0, 40), (16, 40), (32, 40), (40, 40)] and isinstance(first, int)
        gen = engine.generate(ids, 12, mode="ddtree")
        assert gen.stats.prompt_tokens == 0 and gen.tokens == reference
        for bad in (0, -3, 2.5, True):
            with pytest.raises(ValueError, match="chunk_tokens"):
                engine.prefill(ids, progress=print, chunk_tokens=bad)
        with pytest.raises(ValueError, match="chunk_tokens"):
            engine.generate(ids, 4, chunk_tokens=0)
