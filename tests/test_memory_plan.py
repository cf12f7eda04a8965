"""The memory planner: lb_memory_plan's sizes against what an engine really allocates (lb_memory_get)
once every kind of call has run at full depth, and the Python planner on a fake budget (--vram):
the largest context that fits, the KV type fallback, one-line errors naming what does fit.

Oracle: the native engine's own buffers after a workload that reaches each graph's largest shape.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from click.testing import CliRunner

from lucebox import memory_plan
from lucebox._native import Handle, NativeError, SampleBuffers, device_memory
from lucebox._native import memory_plan as native_plan
from lucebox.cli import main
from lucebox.config import PENALTY_LAST_N, SAMPLING_CANDIDATES, EngineConfig
from lucebox.engine import Engine

DEVICE = "cuda" if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else "cpu"
DEV = 0 if DEVICE == "cuda" else -1
N_TEXT_TOKENS = 598
E_INVALID_ARG, E_IO = -1, -2


def tokens(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, N_TEXT_TOKENS, n).astype(np.int32)


def sampled(rows: int) -> SampleBuffers:
    return SampleBuffers(rows, temperature=1.0, repeat_penalty=1.1, presence_penalty=0.0, frequency_penalty=0.0,
                         n_candidates=SAMPLING_CANDIDATES, penalty_last_n=PENALTY_LAST_N)


def run_every_call_at_full_depth(h: Handle, max_ctx: int, ubatch: int, nodes: int, block: int) -> None:
    """Draft appends of every size up to a block; commits of every path length, moved and in place;
    then prefill, step and verify (greedy and sampled) with every KV row attended, and the draft over
    every row of its ring."""
    for n in range(1, block + 1):  # the draft keeps one append graph per size up to a block
        h.reset()
        h.prefill(tokens(n, 9))
    h.reset()
    h.prefill(tokens(ubatch, 1))  # the draft's largest append: one micro-batch into an empty ring
    out = np.zeros(nodes, np.int32)
    for n_path in range(1, block + 1):
        # in place: a chain, path 0..n_path-1; moved: a decoy child 1 of the root, path 0, 2, 3, ..., n_path
        h.verify(tokens(n_path, n_path), np.arange(-1, n_path - 1, dtype=np.int32), out)
        h.commit(list(range(n_path)))
        if n_path > 1:
            parents = np.array([-1, 0, 0] + list(range(2, n_path)), np.int32)
            h.verify(tokens(n_path + 1, n_path), parents, out)
            h.commit([0] + list(range(2, n_path + 1)))
    h.prefill(tokens(max_ctx - nodes - ubatch - h.n_past(), 2))
    io = sampled(nodes)
    h.prefill_sampled(tokens(ubatch, 3), io)  # a whole micro-batch attending every row, sampled
    rows, k = h.info()["block_size"] - 1, 8
    draft_out = np.zeros((rows, k), np.int32), np.zeros((rows, k), np.float32)
    h.draft(1, *draft_out)
    tree = np.array([-1] + list(range(nodes - 1)), np.int32)
    h.verify(tokens(nodes, 4), tree, out)
    h.verify_sampled(tokens(nodes, 5), tree, out, io)
    h.commit([0])
    h.step(7)
    h.step_sampled(8, io)
    assert h.n_past() == max_ctx - nodes + 3
    h.prefill(tokens(max_ctx - 1 - h.n_past(), 6))
    h.draft(1, *draft_out)  # at the last position: every ring row attended, also when the ring is the context


@pytest.mark.parametrize("kv,window,weights", [(("f16", "f16"), 100, "keep"), (("q8_0", "q4_0"), 0, "keep"),
                                               (("f16", "f16"), 0, "q8_0")])
def test_plan_equals_what_the_engine_allocates(tiny_pair, kv, window, weights):
    if DEVICE == "cuda" and kv[0] != kv[1]:
        pytest.skip("mixed K/V types run on the CPU only for now")
    target, draft = tiny_pair
    max_ctx, ubatch, nodes = 1024, 64, 23
    opts = dict(max_ctx=max_ctx, type_k=kv[0], type_v=kv[1], device=DEV, ubatch=ubatch, max_tree=32,
                draft_window=window, draft_weights=weights)
    plan = native_plan(target, draft, verify_nodes=nodes, draft_top_k=8, n_candidates=SAMPLING_CANDIDATES,
                       penalty_last_n=PENALTY_LAST_N, **opts)
    with Handle(target, draft, n_threads=1, **opts) as h:
        loaded = h.memory()
        assert {k: v for k, v in loaded.items() if k != "compute"} == {k: v for k, v in plan.items() if k != "compute"}
        assert loaded["compute"] == 0  # compute buffers come with the first calls
        run_every_call_at_full_depth(h, max_ctx, ubatch, nodes, h.info()["block_size"])
        used = h.memory()
    assert used == plan  # exact: the same layouts and graphs, sized by the same allocator


def test_plan_scales_with_the_context_and_kv_types(tiny_pair):
    target, draft = tiny_pair
    shape = dict(verify_nodes=23, draft_top_k=8, device=DEV, n_threads=1)
    p = {(ctx, kv): native_plan(target, draft, max_ctx=ctx, kv_type=kv, **shape)
         for ctx in (1024, 2048, 4096) for kv in ("f16", "q8_0", "q4_0")}
    for kv in ("f16", "q8_0", "q4_0"):
        # KV bytes are linear in the rows; weights and state do not move
        assert p[4096, kv]["kv"] - p[2048, kv]["kv"] == 2 * (p[2048, kv]["kv"] - p[1024, kv]["kv"])
        assert p[4096, kv]["weights"] == p[1024, kv]["weights"] and p[4096, kv]["recurrent"] == p[1024, kv]["recurrent"]
    # (the tiny model's 136-byte q8_0 rows are padded to 272 bytes, see caches.cpp; a 27B row is not padded)
    assert p[4096, "q8_0"]["kv"] > p[4096, "f16"]["kv"] > p[4096, "q4_0"]["kv"]
    # a Q8_0 draft: 34 bytes per 32 values instead of 64 (its vectors stay as they are)
    q8 = native_plan(target, draft, max_ctx=1024, kv_type="f16", draft_weights="q8_0", **shape)
    assert 0.5 < q8["draft"] / p[1024, "f16"]["draft"] < 0.6
    no_draft = native_plan(target, None, max_ctx=1024, **shape)
    assert no_draft["draft"] == no_draft["draft_cache"] == 0 and no_draft["weights"] == p[1024, "f16"]["weights"]


def test_plan_errors_are_lb_load_errors(tiny_pair, tmp_path):
    target, draft = tiny_pair
    with pytest.raises(NativeError, match="not found|No such|cannot open") as e:
        native_plan(tmp_path / "missing.gguf", None, max_ctx=512, verify_nodes=8, draft_top_k=8)
    assert e.value.status == E_IO
    with pytest.raises(NativeError, match="verify_nodes 99 is outside") as e:
        native_plan(target, draft, max_ctx=512, max_tree=64, verify_nodes=99, draft_top_k=8)
    assert e.value.status == E_INVALID_ARG
    free, total = device_memory(DEV)
    assert 0 < free <= total


# --- the Python planner on a fake budget --------------------------------------------------------
# The search is the same on every device; on CUDA the plan also holds config.CUDA_RESERVE_BYTES, which
# these budgets (a few MiB for the tiny pair) leave no room for.
on_cpu_only = pytest.mark.skipif(DEVICE != "cpu", reason="tiny fake budgets; CUDA adds its runtime reserve")


def engine_on(tiny_pair, **options) -> Engine:
    return Engine(tiny_pair[0], draft=tiny_pair[1], device=DEVICE, n_threads=1, **options)


@on_cpu_only
def test_auto_takes_the_largest_context_that_fits(tiny_pair):
    config = EngineConfig(target=tiny_pair[0], draft=tiny_pair[1], max_ctx="auto", vram_gb=0.015, device=DEVICE)
    planned, plan = memory_plan.resolve(config, DEV)
    assert plan.max_ctx == planned.max_ctx and plan.max_ctx % 256 == 0 and plan.total <= plan.budget
    assert (plan.type_k, plan.type_v) == ("q4_0", "q4_0")  # f16 and q8_0 cannot reach the trained 8192
    bigger = native_plan(tiny_pair[0], tiny_pair[1], max_ctx=plan.max_ctx + 256, kv_type="q4_0", device=DEV,
                         max_tree=64, verify_nodes=64, draft_top_k=8, n_candidates=SAMPLING_CANDIDATES,
                         penalty_last_n=PENALTY_LAST_N, ubatch=plan.ubatch)
    assert sum(bigger.values()) > plan.budget  # one step more does not fit
    with engine_on(tiny_pair, max_ctx="auto", vram_gb=0.015) as e:
        assert e.info["max_ctx"] == plan.max_ctx and (e.info["type_k"], e.info["type_v"]) == ("q4_0", "q4_0")
        assert e.memory_plan == plan
        assert "KV q4_0" in plan.table() and "--vram 0.015 GiB" in plan.table()
    # a roomy budget: the trained length with f16, and a larger prefill micro-batch
    roomy = engine_on(tiny_pair, max_ctx="auto", vram_gb=1.0)
    with roomy as e:
        assert (e.info["max_ctx"], e.info["type_k"], e.memory_plan.ubatch) == (8192, "f16", 2048)
        assert e.info["max_ctx"] == e.info["n_ctx_train"]


@on_cpu_only
def test_fixed_types_and_contexts_are_checked(tiny_pair):
    with engine_on(tiny_pair, max_ctx="auto", vram_gb=0.015, kv="q8_0") as e:  # the user's type is kept
        assert e.info["type_k"] == "q8_0" and e.info["max_ctx"] < 8192
    with engine_on(tiny_pair, max_ctx=1024, vram_gb=0.016) as e:  # fits with f16
        assert (e.info["max_ctx"], e.info["type_k"]) == (1024, "f16")
    with pytest.raises(ValueError) as err:
        engine_on(tiny_pair, max_ctx=8192, vram_gb=0.012)
    message = str(err.value)
    largest = int(message.split("the largest context that fits is ")[1].split(":")[0])
    assert message.startswith("max_ctx 8192 does not fit in 12.3 MiB (--vram 0.012 GiB)") and "\n" not in message
    with engine_on(tiny_pair, max_ctx=largest, vram_gb=0.012) as e:  # what the message names does fit
        assert e.info["max_ctx"] == largest
    with pytest.raises(ValueError, match="does not fit in .* even at context 256"):
        engine_on(tiny_pair, max_ctx="auto", vram_gb=0.001)


@on_cpu_only
def test_cpu_auto_without_a_budget_is_a_fixed_default(tiny_pair):
    with engine_on(tiny_pair, max_ctx="auto") as e:
        assert e.memory_plan is None and e.info["max_ctx"] == 8192 and e.config.ubatch == 512


@on_cpu_only
def test_cli_prints_the_plan_and_one_line_errors(tiny_pair):
    models = ["--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--device", DEVICE, "--threads", "1"]
    ok = CliRunner().invoke(main, ["run", "-p", "Hello", "-n", "4", "--max-ctx", "auto", "--vram", "0.015", *models])
    assert ok.exit_code == 0, ok.output
    assert "memory plan: context" in ok.stderr and "compute buffers" in ok.stderr
    bad = CliRunner().invoke(main, ["run", "-p", "Hello", "--max-ctx", "8192", "--vram", "0.012", *models])
    assert bad.exit_code == 1 and bad.output.startswith("Error: max_ctx 8192 does not fit")
    assert len(bad.output.strip().splitlines()) == 1
    for args, word in ((["--vram", "0"], "--vram"), (["--max-ctx", "big"], "--max-ctx")):
        usage = CliRunner().invoke(main, ["run", "-p", "Hello", *args, *models])
        assert usage.exit_code == 2 and word in usage.output
