#!/usr/bin/env python3
"""Per-kernel GPU time of each decode stage (AR step, draft, verify, commit), from CUPTI through
torch.profiler (which records every kernel of the process, ggml's included).

    python benchmarks/profile_step.py --target T.gguf --draft DIR [--ctx 8192] [--budget 22]

For each stage: wall ms per call, summed kernel ms per call (the gap is launch/host time), the
kernels that take the most time, grouped by a shortened name, and the same time by component (issue 20's
table: launches, ms, and for the target's quantized products the weight bytes a call streams, GB/s and
the share of the measured copy bandwidth). Then speculative steps back to back as a generation runs them:
their wall time against the time some kernel of theirs ran (the union of the kernels' spans), the rest being
time the device had nothing to run (the host's work between calls, launches). Speed only: random weights.

With --overlap (run it with dependent launch on, as users run: no GGML_CUDA_PDL=0), the AR step and the verify
instead get a table of what each component adds to the call's device time: kernels overlap then (a product streams
its weights while the kernel before it runs), so their summed times overstate a kernel whose span lies mostly inside
its predecessor's and say nothing of what sits on the critical path. A kernel's exposed time is how far its end moved
the latest end seen so far (kernels in start order); the exposed times add up to the union of the spans.
"""
from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from lucebox import ddtree
from lucebox._native import Handle
from lucebox.config import GenerationConfig
from lucebox.decode import Step
from lucebox.drafters import NativeDrafter
from lucebox.sampling import Sampler
from step_bench import copy_bandwidth_gbs, weight_bytes_per_token

# A decode step's kernels by component, first match wins (short names; the invariant attention's kernels live in
# an anonymous namespace, which the profiler names "")
COMPONENTS = [
    ("K-quant products (lbq::gemm)", r"^lbq::gemm"),
    ("their split sums / activation passes", r"^lbq::"),
    ("other products (mmf, mmvq, mmq)", r"^(mul_mat|quantize_)"),
    ("attention", r"^$|flash_attn|fattn"),
    ("delta net and conv", r"gated_delta_net|ssm_conv"),
    ("norms", r"norm"),
    ("copies, concat, rows", r"cpy|concat|[Mm]emcpy|get_rows|set_rows"),
    ("elementwise, rope", r"bin_bcast|unary|rope|softplus|sigmoid|silu|scale"),
    ("selection (argmax, top-k)", r"argmax|top_k|argsort"),
]


def component_of(kernel: str) -> str:
    for label, pattern in COMPONENTS:
        if re.search(pattern, kernel):
            return label
    return "other"


def component_rows(rows: list[tuple[str, int, float]]) -> list[tuple[str, int, float]]:
    """kernel_table rows summed by component, in COMPONENTS order (then other)."""
    per: dict[str, list] = {label: [0, 0.0] for label, _ in COMPONENTS + [("other", "")]}
    for k, c, t in rows:
        entry = per[component_of(k)]
        entry[0] += c
        entry[1] += t
    return [(label, c, t) for label, (c, t) in per.items() if c > 0]


def print_components(rows, total: float, product_bytes: int, copy_gbs: float) -> None:
    """The stage's time by component; the products' row with the bytes they stream per call."""
    print(f"\n| component | kernels/call | ms/call | % | GB/s | % of copy ({copy_gbs:,.0f} GB/s) |\n|---|---|---|---|---|---|")
    for label, c, t in component_rows(rows):
        rate = share = ""
        if label == COMPONENTS[0][0] and product_bytes > 0 and t > 0:
            gbs = product_bytes / (t * 1e-3) / 1e9
            rate, share = f"{gbs:,.0f} ({product_bytes / 1e9:.2f} GB)", f"{100 * gbs / copy_gbs:.0f}%"
        print(f"| {label} | {c} | {t:.3f} | {100 * t / max(total, 1e-9):.1f} | {rate} | {share} |")


def short_name(name: str) -> str:
    """ggml kernel names are long template instantiations: keep the function name and the
    template arguments that tell the variants apart (type, column count)."""
    name = re.sub(r"\(.*\)$", "", name)           # drop the parameter list
    name = re.sub(r"^void ", "", name)
    return name[:110]


def kernel_table(prof, n_calls: int) -> tuple[float, list[tuple[str, int, float]]]:
    per = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        k = short_name(ev.name)
        per[k][0] += 1
        per[k][1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    rows = sorted(((k, c // n_calls, t / n_calls / 1e3) for k, (c, t) in per.items()), key=lambda r: -r[2])
    return sum(r[2] for r in rows), rows


def run_stage(label: str, fn, n_calls: int, top: int, product_bytes: int, copy_gbs: float) -> None:
    """product_bytes: the weight bytes one call's K-quant products stream (0: not the target's step)."""
    prof, wall = profiled_calls(fn, n_calls)
    total, rows = kernel_table(prof, n_calls)
    print(f"\n### {label}: wall {wall:.2f} ms/call, kernels {total:.2f} ms/call, "
          f"{sum(r[1] for r in rows)} kernels/call")
    print_rows(rows, total, top, "ms/call")
    print_components(rows, total, product_bytes, copy_gbs)


def profiled_calls(fn, n_calls: int):
    """fn run n_calls times under the profiler, after two unprofiled runs (graph builds and CUDA-graph captures happen
    there): the profile and the wall ms a call."""
    fn()
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(n_calls):
            fn()
        torch.cuda.synchronize()  # a commit returns with its graphs still running
        wall = (time.perf_counter() - t0) * 1e3 / n_calls
    return prof, wall


def print_rows(rows, total: float, top: int, unit: str) -> None:
    """The `top` kernels of a kernel_table as a markdown table."""
    print(f"| kernel | calls | {unit} | % |\n|---|---|---|---|")
    for k, c, t in rows[:top]:
        print(f"| `{k}` | {c} | {t:.3f} | {100 * t / max(total, 1e-9):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--budget", type=int, default=22)
    ap.add_argument("--draft-top-k", type=int, default=8)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--overlap", action="store_true",
                    help="only the exposed-time tables of the AR step and the verify (run with dependent launch on)")
    ap.add_argument("--prefill", type=int, default=4096,
                    help="also profile one prefill of this many tokens, batch-invariant and not (0: skip)")
    args = ap.parse_args()
    torch.cuda.init()
    rng = np.random.default_rng(0)
    with Handle(args.target, args.draft, max_ctx=args.ctx, device=0, max_tree=max(64, args.budget + 1)) as h:
        info = h.info()
        prompt = rng.integers(0, min(info["n_vocab"], 150000), args.ctx // 2).astype(np.int32)
        last = h.prefill(prompt)
        rows = info["block_size"] - 1
        ids = np.empty((rows, args.draft_top_k), np.int32)
        logp = np.empty((rows, args.draft_top_k), np.float32)
        argmax = np.empty(info["max_tree"], np.int32)
        h.draft(last, ids, logp)
        tree = ddtree.build_tree(ids, logp, last, args.budget)
        n = tree.n_nodes
        state = {"last": last}

        def ar():
            state["last"] = h.step(state["last"])

        def draft():
            h.draft(state["last"], ids, logp)

        def verify():  # verify + a one-node commit keeps the engine state legal between calls
            h.verify(tree.tokens, tree.parents, argmax[:n])
            h.commit(np.zeros(1, np.int32))

        def commit_only():
            h.commit(np.zeros(1, np.int32))

        if args.overlap:
            run_overlap("AR step", ar, args.calls, args.top)
            run_overlap(f"verify({args.budget}) + commit(1)", verify, args.calls, args.top)
            return

        copy_gbs = copy_bandwidth_gbs()
        weights = weight_bytes_per_token(args.target)
        print(f"copy bandwidth {copy_gbs:,.0f} GB/s; the target's weights {weights / 1e9:.2f} GB a step "
              f"(roofline {copy_gbs * 1e9 / weights:.1f} steps/s)")
        run_stage("AR step", ar, args.calls, args.top, weights, copy_gbs)
        run_stage("draft", draft, args.calls, args.top, 0, copy_gbs)
        # the commit replays the accepted path's recurrence only (no products): the weights stream once
        run_stage(f"verify({args.budget}) + commit(1)", verify, args.calls, args.top, weights, copy_gbs)
        # commit alone, after an unprofiled verify each time
        h.verify(tree.tokens, tree.parents, argmax[:n])
        commit_only()
        h.verify(tree.tokens, tree.parents, argmax[:n])
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            commit_only()
        total, krows = kernel_table(prof, 1)
        print(f"\n### commit(1): kernels {total:.3f} ms, {sum(r[1] for r in krows)} kernels")
        profile_back_to_back(h, info, state["last"], args)
    if args.prefill:
        profile_prefill(args, rng)


def run_overlap(label: str, fn, n_calls: int, top: int) -> None:
    """Per component, then per kernel (the `top` most exposed): kernels, summed and exposed time a call (see
    --overlap)."""
    prof, _ = profiled_calls(fn, n_calls)
    per = exposed_by(prof)
    total = sum(r[1] for r in per.values()) / n_calls / 1e3
    exposed = sum(r[2] for r in per.values()) / n_calls / 1e3
    print(f"\n### {label}, dependent launch as run: kernels {total:.3f} ms/call summed, {exposed:.3f} exposed "
          f"(the union of their spans)")
    print_exposed(per, n_calls, "component")
    print()
    print_exposed(exposed_by(prof, key=lambda name: f"`{name}`"), n_calls, "kernel", top)


def print_exposed(per: dict[str, list], n_calls: int, what: str, top: int = 0) -> None:
    """An exposed_by table, most exposed first (top: that many rows; 0: all)."""
    rows = sorted(per.items(), key=lambda kv: -kv[1][2])
    print(f"| {what} | kernels/call | summed ms/call | exposed ms/call |\n|---|---|---|---|")
    for name, (c, t, e) in rows[:top or None]:
        print(f"| {name} | {c // n_calls} | {t / n_calls / 1e3:.3f} | {e / n_calls / 1e3:.3f} |")


def exposed_by(prof, key=component_of) -> dict[str, list]:
    """key(kernel's short name): [kernels, summed us, exposed us]. Kernels in start order; a kernel's exposed time is
    how far its end moved the latest end seen, so the exposed times add up to the union of the spans (they overlap
    under dependent launch)."""
    spans = sorted((ev.time_range.start, ev.time_range.end, short_name(ev.name)) for ev in prof.events()
                   if ev.device_type == torch.autograd.DeviceType.CUDA)
    per: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0])
    end = float("-inf")
    for a, b, name in spans:
        row = per[key(name)]
        row[0] += 1
        row[1] += b - a
        if b > end:
            row[2] += b - max(a, end)
            end = b
    return per


def busy_ms(prof) -> float:
    """The time some kernel ran: the union of the kernels' spans."""
    return sum(r[2] for r in exposed_by(prof).values()) / 1e3


def profile_back_to_back(h: Handle, info: dict, last: int, args) -> None:
    """Speculative steps as lucebox.decode.Step runs them in a generation (draft, tree, verify, commit), one after
    another: wall ms a step against the ms a step's kernels kept the device busy."""
    gen = GenerationConfig(budget=args.budget, draft_top_k=args.draft_top_k)
    step = Step(h, info, "ddtree", NativeDrafter(h, info["block_size"]), gen, Sampler.for_request(gen, info))
    history = h.committed_tokens()

    def run(n: int) -> None:
        nonlocal last
        for _ in range(n):
            r = step.run(last, history, 1 << 30, ())
            history.extend(r.committed)
            last = r.bonus

    run(4)  # commit graphs of new path lengths are built outside the profile (most of them)
    h.sync()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        run(args.calls * 2)
        h.sync()
        wall = (time.perf_counter() - t0) * 1e3 / (args.calls * 2)
    busy = busy_ms(prof) / (args.calls * 2)
    print(f"\n### speculative steps back to back: wall {wall:.2f} ms/step, kernels busy {busy:.2f} ms/step, "
          f"device idle {wall - busy:.2f} ms/step ({100 * (wall - busy) / wall:.1f}%)")


def profile_prefill(args, rng) -> None:
    """One prefill of a fresh context (all its micro-batches and the draft's append), with the
    batch-invariant kernels and without: where the prefill gap between the two modes is."""
    for invariant in (True, False):
        with Handle(args.target, args.draft, max_ctx=args.ctx, device=0, batch_invariant=invariant) as h:
            prompt = rng.integers(0, min(h.info()["n_vocab"], 150000), args.prefill).astype(np.int32)
            h.prefill(prompt[:64])  # graph builds and first-use allocations outside the profile
            h.reset()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                t0 = time.perf_counter()
                h.prefill(prompt)
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) * 1e3
            total, rows = kernel_table(prof, 1)
        label = "batch-invariant" if invariant else "batch-dependent"
        print(f"\n### prefill {args.prefill} tokens, {label}: wall {wall:.1f} ms "
              f"({args.prefill / wall * 1e3:.0f} tok/s), kernels {total:.1f} ms")
        print_rows(rows, total, args.top, "ms")


if __name__ == "__main__":
    main()
