#!/usr/bin/env python3
"""Per-step timings of the decode loop on one model pair; prints one markdown table + JSON.

    python benchmarks/step_bench.py --target T.gguf [--draft DIR] [--ctx 8192,32768] [--n-gen 128]

AR: tok/s of lb_step after warm-up, and the fraction of the memory roofline (weight bytes one token
reads over the measured copy bandwidth, passed as --copy-gbs). Speculative (with a draft): median
ms of draft, verify at --budget, commit (its graphs' time included: lb_sync) and Python host work per
step, at each context length, with the memory the engine holds (lb_memory_get) next to what lb_memory_plan
predicted for it, and the median wall time of a step run back to back as a generation runs it (the host's work
after a commit overlapping the commit's graphs, which lb_commit leaves running).
--temperature T > 0 runs the same step sampled (device sampling tail + host draw; add
--repeat-penalty to include the penalty stage), so two runs show its cost per step.
A fill that outlasts one call of a lent GPU (a 256K prompt) runs in two: --save-state FILE --save-at N
prefills the prompt's first N tokens and writes the engine's state; the same command with --load-state
FILE instead starts from it and prefills the rest (the prompt is the same: it comes from a fixed seed).
Synthetic random models give meaningless acceptance: this measures speed only.
"""
from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import statistics
import subprocess
import sys
import time

import numpy as np

from lucebox._native import Handle, memory_plan
from lucebox.config import DRAFT_WEIGHTS, GenerationConfig
from lucebox.decode import Step
from lucebox.drafters import NativeDrafter
from lucebox.sampling import Sampler
from lucebox.gguf_meta import read_metadata


def weight_bytes_per_token(gguf_path: str) -> int:
    """Bytes of tensor data one decode step reads: every weight except the embedding table
    (one row is read) and an MTP/nextn block (not used for decoding)."""
    import gguf  # reads tensor infos only (no data)
    reader = gguf.GGUFReader(gguf_path)
    meta = read_metadata(gguf_path)
    arch = meta.get("general.architecture", "qwen35")
    n_nextn = int(meta.get(f"{arch}.nextn_predict_layers", 0) or 0)
    n_blocks = int(meta[f"{arch}.block_count"])
    first_nextn = n_blocks - n_nextn
    total = 0
    for t in reader.tensors:
        name = t.name
        if name.startswith("token_embd"):
            continue
        if name.startswith("blk.") and int(name.split(".")[1]) >= first_nextn:
            continue
        total += int(t.n_bytes)
    return total


def copy_bandwidth_gbs(n_floats: int = 1 << 30, reps: int = 10) -> float:
    """The GPU's device-to-device copy speed in GB/s, bytes read plus written (the roofline's yardstick): the median
    of `reps` copies of a 4 GiB f32 buffer, after three untimed ones."""
    import torch
    a = torch.randn(n_floats, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    seconds = []
    for _ in range(reps):
        start.record()
        b.copy_(a)
        end.record()
        torch.cuda.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    n_bytes = 2 * a.numel() * a.element_size()
    del a, b
    torch.cuda.empty_cache()  # the 8 GiB go back (a caller may go on to load models)
    return n_bytes / sorted(seconds)[len(seconds) // 2] / 1e9


def gpu_memory_used_mib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return float(out.strip().splitlines()[0])
    except Exception:
        return None


def bench_ar(h: Handle, n_vocab: int, n_gen: int, prompt_len: int, rng) -> dict:
    prompt = rng.integers(0, min(n_vocab, 150000), prompt_len).astype(np.int32)
    h.reset()
    t0 = time.perf_counter()
    last = h.prefill(prompt)
    prefill_s = time.perf_counter() - t0
    for _ in range(8):  # warm-up: graph build, CUDA graph capture
        last = h.step(last)
    t0 = time.perf_counter()
    for _ in range(n_gen):
        last = h.step(last)
    dt = time.perf_counter() - t0
    return {"prefill_tokens": prompt_len, "prefill_s": prefill_s, "tok_s": n_gen / dt, "ms_per_tok": 1e3 * dt / n_gen}


def _prompt_digest(tokens: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(tokens, np.int32).tobytes()).hexdigest()


def save_state(h: Handle, path: str, prompt: np.ndarray) -> None:
    """The engine's committed state (after `prompt`) to `path`, and what it holds to `path`.json."""
    h.state_save().tofile(path)
    with open(path + ".json", "w") as f:
        json.dump({"tokens": int(prompt.size), "prompt_sha256": _prompt_digest(prompt)}, f)


def load_state(h: Handle, path: str, prompt: np.ndarray) -> int:
    """Loads a save_state file whose prompt is a prefix of `prompt`; returns its token count."""
    with open(path + ".json") as f:
        meta = json.load(f)
    n = int(meta["tokens"])
    if n >= prompt.size or meta["prompt_sha256"] != _prompt_digest(prompt[:n]):
        sys.exit(f"step_bench: {path} holds another prompt (or all of this one); save it again with the same "
                 "arguments and a --save-at below the prompt length")
    h.state_load(np.fromfile(path, np.uint8), prompt[:n].tolist())
    return n


# The calls of a speculative step and the AR step, and the parts of their host time (lb_call_times): a part other
# than the wait that grows is host work the GPU waits for; caller ms is the step's own clock around the call (its
# Python side and the ctypes crossing on top of the native total)
CALL_SPLIT = ("draft", "verify", "commit", "step")
CALL_PARTS = ("graphs", "caller_ms", "total_ms", "before_ms", "launch_ms", "wait_ms", "between_ms", "after_ms")


def print_call_split(spec: list[dict]) -> None:
    print("\n| ctx | call | graphs | " + " | ".join(p.replace("_ms", " ms") for p in CALL_PARTS[1:]) + " |")
    print("|---" * (len(CALL_PARTS) + 2) + "|")
    for r in spec:
        for kind, t in r["call_times"].items():
            print(f"| {r['ctx']} | {kind} | {t['graphs']:.0f} | " + " | ".join(f"{t[p]:.3f}" for p in CALL_PARTS[1:])
                  + " |")


def bench_spec(h: Handle, info: dict, ctx: int, gen: GenerationConfig, steps: int, rng, profiler=None,
               prompt_tokens: int = 0, state: tuple[str, str, int] | None = None) -> dict | None:
    """state: ("save", FILE, N) prefills the first N prompt tokens, saves and returns None;
    ("load", FILE, 0) starts from such a file and prefills the rest."""
    h.reset()
    n_steps = steps + 4 + (steps if profiler is not None else 0)  # 4 warm-up steps, then the timed ones
    # room for them, each with its AR step, at most; they commit a few tokens each (random weights), which leaves room
    # for the steps back to back below (they stop where the context is full)
    n_prompt = prompt_tokens or ctx - 2 * (gen.budget + 2) * (n_steps + 4)
    prompt = rng.integers(0, min(info["n_vocab"], 150000), n_prompt).astype(np.int32)
    if state is not None and state[0] == "save":
        h.prefill(prompt[:state[2]])
        save_state(h, state[1], prompt[:state[2]])
        return None
    resumed = load_state(h, state[1], prompt) if state is not None else 0
    t0 = time.perf_counter()
    last = h.prefill(prompt[resumed:])
    prefill_s = time.perf_counter() - t0
    history = prompt.tolist()
    step = Step(h, info, "ddtree", NativeDrafter(h, info["block_size"]), gen, Sampler.for_request(gen, info))
    t_draft, t_verify, t_commit, t_host, t_ar = [], [], [], [], []
    split = {kind: [] for kind in CALL_SPLIT}  # lb_call_times of each timed step's calls
    # the timed steps run without the profiler (it would add its own cost to every Python call, i.e. to
    # host_ms); with one, as many steps again run under it afterwards
    for i in range(n_steps):
        timed = i < steps + 4
        r = step.run(last, history, 1 << 30, ()) if timed else profiler.runcall(step.run, last, history, 1 << 30, ())
        history += r.committed
        s = time.perf_counter()
        h.sync()  # the commit's graphs, which lb_commit leaves running: its time, not the AR step's
        commit_s = r.commit_s + time.perf_counter() - s
        g = time.perf_counter()
        nxt = h.step(r.bonus)  # one AR step at the same context, for the verify/AR ratio
        k = time.perf_counter()
        history.append(r.bonus)
        last = nxt
        if 4 <= i < steps + 4:
            t_draft.append(r.draft_s); t_verify.append(r.verify_s); t_commit.append(commit_s)
            t_host.append(r.host_s); t_ar.append(k - g)
            caller = {"draft": r.draft_s, "verify": r.verify_s, "commit": r.commit_s, "step": k - g}
            for kind in CALL_SPLIT:
                split[kind].append(dict(h.call_times(kind), caller_ms=1e3 * caller[kind]))
    # The step as a generation runs it: steps back to back, the host's work after each commit (the Python between the
    # steps, the next draft's inputs) overlapping the commit's graphs. The median of the times from one step's start
    # to the next's (a step that builds a graph for a new commit length is one sample).
    h.sync()
    back_to_back, t_prev = [], time.perf_counter()
    for _ in range(steps):
        r = step.run(last, history, 1 << 30, ())
        if r is None:  # the context is full (a --prompt-tokens run)
            break
        history += r.committed
        last = r.bonus
        t = time.perf_counter()
        back_to_back.append(t - t_prev)
        t_prev = t
    h.sync()
    med = lambda xs: 1e3 * statistics.median(xs)
    return {"ctx": ctx, "prefill_tokens": n_prompt - resumed, "resumed_from": resumed, "prefill_s": prefill_s,
            "budget": gen.budget,
            "temperature": gen.temperature, "draft_ms": med(t_draft), "verify_ms": med(t_verify),
            "commit_ms": med(t_commit), "host_ms": med(t_host), "ar_step_ms": med(t_ar),
            "back_to_back_ms": med(back_to_back) if back_to_back else float("nan"),
            "gpu_mem_mib": gpu_memory_used_mib(), "held_mib": sum(h.memory().values()) / 2**20,
            "call_times": {kind: {part: statistics.median(t[part] for t in ts) for part in ts[0]}
                           for kind, ts in split.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--ctx", default="8192,32768")
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--budget", type=int, default=22)
    ap.add_argument("--draft-top-k", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--temperature", type=float, default=0.0, help="sample (Qwen's top-p/top-k) when > 0")
    ap.add_argument("--repeat-penalty", type=float, default=1.0)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--ubatch", type=int, default=512,
                    help="prefill micro-batch (512: llama-bench's default n_ubatch; the memory plan takes 2048 where it fits)")
    ap.add_argument("--draft-weights", choices=DRAFT_WEIGHTS, default="keep",
                    help="the draft's matrices as in the checkpoint or Q8_0 (lb_params.draft_weights)")
    ap.add_argument("--draft-window", type=int, default=0,
                    help="draft context window W (0: the draft's sliding_window, else 4096)")
    ap.add_argument("--no-invariant", action="store_true",
                    help="let CUDA pick batch-dependent kernels (lb_params.batch_invariant = 0)")
    ap.add_argument("--copy-gbs", type=float, default=0.0, help="measured copy bandwidth (GB/s)")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="prefill this many tokens (default: fill the context); e.g. to measure memory at a "
                         "large --ctx without the long prefill")
    ap.add_argument("--save-state", metavar="FILE",
                    help="prefill only --save-at prompt tokens, write the engine state to FILE (and FILE.json), "
                         "stop; one --ctx")
    ap.add_argument("--save-at", type=int, default=0, help="prompt tokens before --save-state")
    ap.add_argument("--load-state", metavar="FILE",
                    help="start from a --save-state FILE made with the same other arguments, prefill the rest")
    ap.add_argument("--profile-host", action="store_true",
                    help="print a cProfile of --steps further speculative steps (Python side) to stderr; "
                         "the timed steps run without it")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    ctxs = [int(c) for c in args.ctx.split(",") if c]
    state = None
    if args.save_state or args.load_state:
        if args.save_state and args.load_state:
            ap.error("--save-state and --load-state are two calls: give one")
        if len(ctxs) != 1 or not args.draft:
            ap.error("--save-state / --load-state need a --draft and exactly one --ctx")
        if args.save_state and args.save_at <= 0:
            ap.error("--save-state needs --save-at N > 0 (prompt tokens to prefill before saving)")
        state = ("save", args.save_state, args.save_at) if args.save_state else ("load", args.load_state, 0)
    results: dict = {"target": args.target, "draft": args.draft}

    invariant = not args.no_invariant
    results["batch_invariant"] = invariant
    results["ubatch"] = args.ubatch
    h = Handle(args.target, None, max_ctx=4096, kv_type=args.kv, device=args.device, batch_invariant=invariant)
    info = h.info()
    ar = bench_ar(h, info["n_vocab"], args.n_gen, 32, rng)
    h.close()
    wb = weight_bytes_per_token(args.target)
    ar["weight_bytes"] = wb
    if args.copy_gbs > 0:
        roofline = args.copy_gbs * 1e9 / wb
        ar["roofline_tok_s"] = roofline
        ar["roofline_fraction"] = ar["tok_s"] / roofline
    results["ar"] = ar
    print(f"| AR decode | {ar['tok_s']:.1f} tok/s | {ar['ms_per_tok']:.2f} ms/tok | weights {wb / 1e9:.2f} GB/token"
          + (f" | roofline {ar['roofline_tok_s']:.1f} tok/s | {100 * ar['roofline_fraction']:.0f}% of roofline |"
             if args.copy_gbs > 0 else " |"))

    if args.draft:
        results["spec"] = []
        print("\n| ctx | draft ms | verify(%d) ms | commit ms | host ms | AR step ms | verify/AR | draft/verify | GPU MiB "
              "| held MiB | plan MiB | prefill tok/s | step back to back ms |" % args.budget)
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for ctx in ctxs:
            opts = dict(max_ctx=ctx, kv_type=args.kv, device=args.device, max_tree=max(64, args.budget + 1),
                        draft_window=args.draft_window, draft_weights=args.draft_weights, ubatch=args.ubatch)
            # what lb_memory_plan predicts for this run's largest calls (no sampling tail when greedy)
            plan = memory_plan(args.target, args.draft, verify_nodes=args.budget + 1, draft_top_k=args.draft_top_k,
                               n_candidates=32 if args.temperature > 0 else 0,
                               penalty_last_n=64 if args.repeat_penalty != 1.0 else 0, **opts)
            h = Handle(args.target, args.draft, batch_invariant=invariant, **opts)
            gen = GenerationConfig(budget=args.budget, draft_top_k=args.draft_top_k, temperature=args.temperature,
                                   repeat_penalty=args.repeat_penalty, seed=0,
                                   **({"top_p": 0.95, "top_k": 20} if args.temperature > 0 else {}))
            profiler = cProfile.Profile() if args.profile_host else None
            r = bench_spec(h, h.info(), ctx, gen, args.steps, rng, profiler, args.prompt_tokens, state)
            h.close()
            if r is None:
                print(f"| {ctx} | state after {args.save_at} prompt tokens saved to {args.save_state} |")
                return
            if profiler is not None:  # host-side hot spots (native calls show as their ctypes wrappers)
                pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(15)
            results["spec"].append(r)
            print(f"| {ctx} | {r['draft_ms']:.2f} | {r['verify_ms']:.2f} | {r['commit_ms']:.2f} | {r['host_ms']:.3f} | "
                  f"{r['ar_step_ms']:.2f} | {r['verify_ms'] / r['ar_step_ms']:.2f} | "
                  f"{r['draft_ms'] / r['verify_ms']:.2f} | {r['gpu_mem_mib']} | {r['held_mib']:.0f} | "
                  f"{sum(plan.values()) / 2**20:.0f} | {r['prefill_tokens'] / r['prefill_s']:.0f} | "
                  f"{r['back_to_back_ms']:.2f} |")
            r["plan"] = plan
        if results["spec"]:
            print_call_split(results["spec"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
