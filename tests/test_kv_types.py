"""Separate K and V cache types (lb_params.type_k / type_v; --cache-type-k / --cache-type-v as in
llama.cpp; --kv sets both). On the CPU every pair of f32, f16, bf16, q8_0 and q4_0 runs, and
speculative decoding stays AR's bit for bit with each (oracle: AR on the same engine).

LUCEBOX_TEST_BACKEND=cuda: ggml-cuda's batch-invariant attention (vendor/patches/0009) takes K == V of
every type and mixed pairs of f16, q8_0 and q4_0 (its tensor-core path, compute capability 8.0+); any
other pair is refused at load.
"""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from click.testing import CliRunner

from lucebox._native import Handle, NativeError
from lucebox.cli import main
from lucebox.config import KV_TYPES, EngineConfig
from lucebox.engine import Engine

DEVICE = "cuda" if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else "cpu"
OPTS = dict(device=DEVICE, n_threads=1, max_ctx=512)
N_TEXT_TOKENS = 598
E_UNSUPPORTED = -4
TENSOR_CORE_TYPES = ("f16", "q8_0", "q4_0")
PAIRS = [(k, v) for k, v in itertools.product(KV_TYPES, KV_TYPES)
         if DEVICE == "cpu" or k == v or (k in TENSOR_CORE_TYPES and v in TENSOR_CORE_TYPES)]


def make_prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, N_TEXT_TOKENS, n).tolist()


@pytest.mark.parametrize("type_k,type_v", PAIRS, ids=lambda t: t)
def test_every_pair_is_lossless(tiny_pair, type_k, type_v):
    prompt = make_prompt(37, seed=len(type_k) + 7 * len(type_v))
    with Engine(tiny_pair[0], draft=tiny_pair[1], cache_type_k=type_k, cache_type_v=type_v, **OPTS) as e:
        assert (e.info["type_k"], e.info["type_v"]) == (type_k, type_v)
        want = e.generate(prompt, 40, mode="ar", ignore_eos=True).tokens
        e.reset()
        assert e.generate(prompt, 40, mode="ddtree", ignore_eos=True).tokens == want


@pytest.mark.skipif(DEVICE != "cpu", reason="mixed K/V types run on the CPU only for now")
@pytest.mark.parametrize("type_k,type_v", [("q8_0", "q4_0"), ("f16", "q8_0"), ("q4_0", "bf16")])
def test_mixed_pairs_deep_and_branching(tiny_gguf, tiny_draft_dirs, type_k, type_v):
    # many micro-batches (ubatch 16), branching trees whose accepted paths move K and V rows of
    # different sizes, every budget regime; then a snapshot round trip with these caches
    prompt = make_prompt(70, seed=11)
    with Engine(tiny_gguf["f16"], draft=tiny_draft_dirs["bf16"], cache_type_k=type_k, cache_type_v=type_v,
                ubatch=16, **OPTS) as e:
        want = e.generate(prompt, 80, mode="ar", ignore_eos=True).tokens
        for mode, budget, chain_seed in (("chain", 4, True), ("ddtree", 4, False), ("ddtree", 22, False),
                                         ("ddtree", 40, True)):
            e.reset()
            got = e.generate(prompt, 80, mode=mode, budget=budget, chain_seed=chain_seed, ignore_eos=True).tokens
            assert got == want, f"{mode} budget {budget} with K {type_k} / V {type_v} differs from AR"
        e.reset()
        first = e.generate(prompt, 30, mode="ddtree", ignore_eos=True)
        snap = e.snapshot()
        rest = e.generate(prompt + first.tokens, 30, mode="ddtree", ignore_eos=True)
        e.generate(make_prompt(50, seed=12), 10, mode="ar", ignore_eos=True)
        e.restore(snap)
        assert e.generate(prompt + first.tokens, 30, mode="ddtree", ignore_eos=True).tokens == rest.tokens


def test_snapshots_do_not_cross_kv_types(tiny_gguf):
    with Handle(tiny_gguf["f32"], max_ctx=256, type_k="q8_0", type_v="q4_0", n_threads=1) as a, \
            Handle(tiny_gguf["f32"], max_ctx=256, type_k="q4_0", type_v="q8_0", n_threads=1) as b:
        a.prefill(make_prompt(20, seed=3))
        with pytest.raises(NativeError, match="another shape"):
            b.state_load(a.state_save(), ())


def test_kv_sets_both_and_sides_override(tiny_pair):
    c = EngineConfig(target=tiny_pair[0], kv="q8_0", cache_type_v="q4_0")
    assert (c.type_k, c.type_v) == ("q8_0", "q4_0")
    assert (EngineConfig(target=tiny_pair[0]).type_k, EngineConfig(target=tiny_pair[0]).type_v) == ("f16", "f16")
    for field in ("kv", "cache_type_k", "cache_type_v"):
        with pytest.raises(ValueError, match=f"{field} must be one of f16, bf16, q8_0, q4_0, f32; got 'q5_1'"):
            EngineConfig(target=tiny_pair[0], **{field: "q5_1"})


def test_cli_cache_types(tiny_pair):
    types = ["-ctk", "q8_0", "-ctv", "q4_0"]
    args = ["run", "-p", "Hello", "-n", "12", *types, "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
            "--device", DEVICE, "--threads", "1"]
    ar, tree = (CliRunner().invoke(main, args + ["--mode", mode]) for mode in ("ar", "ddtree"))
    assert ar.exit_code == 0 and tree.exit_code == 0, tree.output
    assert tree.stdout == ar.stdout
    bad = CliRunner().invoke(main, args + ["--cache-type-v", "q5_1"])
    assert bad.exit_code == 2 and "--cache-type-v" in bad.output


@pytest.mark.skipif(DEVICE != "cuda", reason="the CPU runs every pair")
def test_cuda_refuses_a_pair_without_an_invariant_kernel(tiny_gguf):
    with pytest.raises(NativeError, match="K cache f32 with V cache f16 has no attention kernel") as e:
        Handle(tiny_gguf["f32"], max_ctx=256, type_k="f32", type_v="f16", device=0)
    assert e.value.status == E_UNSUPPORTED and "\n" not in str(e.value)
