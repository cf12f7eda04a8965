#!/usr/bin/env python3
"""Host (Python) cost of one speculative decode step, greedy and sampled, on any pair (default: the
embedded demo pair on the CPU).

    python benchmarks/host_bench.py [--target T.gguf --draft DIR] [--steps 300] [--rounds 5] [--top 0]

Each mode runs --steps DDTree steps on the real engine, recording what every native call returned;
then the same steps are replayed with those recorded results in place of the native calls (the
replay checks that every step commits what the real one did), so only the host work runs:
decode.Step's host part (tree build, penalty windows, the acceptance walk on the drawn tokens with
the whole-row draws the native draw leaves, the emit bookkeeping). Reported per step:
- replay us: median host time of the replayed steps (warm caches, no native work between them:
  the steadiest figure to compare two versions of the host code on one machine; the least of
  --rounds medians, since a shared machine's noise only adds time);
- live us: median host_s of the real run (caches cold after each native call; noisier);
- numpy calls: calls of numpy functions or ufuncs (np.X(...), np.X.accumulate(...), counted through a
  stand-in for `np` in decode/ddtree/sampling) and of ndarray methods (a.tolist(),
  counted by cProfile) that those modules make; numpy's internal calls are not counted again, and
  neither are operators or indexing on arrays (a + b, a[i]: nothing hooks them);
- profiled calls: every call cProfile sees in the replayed step (Python functions and C functions);
- tokens per step.
Counts are deterministic (fixed prompt and seed); times are this machine's.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from lucebox import ddtree, decode, sampling
from lucebox._native import Handle
from lucebox.config import GenerationConfig
from lucebox.decode import Step
from lucebox.defaults import embedded
from lucebox.drafters import NativeDrafter
from lucebox.sampling import Sampler
from lucebox.tokenizer import Tokenizer

PROMPT = Path(__file__).resolve().parents[1] / "lucebox" / "prompts" / "gsm8k.jsonl"
HOST_MODULES = (decode, ddtree, sampling)
HOST_FILES = tuple(Path(m.__file__).name for m in HOST_MODULES)
MODES = {
    "greedy": {},
    # what benchmarks/device/bench.sh measures on the GPU: Qwen's settings plus a repeat penalty
    "sampled": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repeat_penalty": 1.1},
    "sampled-t1": {"temperature": 1.0},
}


# --- recording the native calls, then standing in for them ------------------------------------
def sampled_outputs(io) -> tuple:
    """The buffers a sampled verify writes (SampleBuffers): what the replay must put back."""
    return io.cand_ids, io.cand_logits, io.row_max, io.row_lse, io.drawn, io.uniforms


class Recorder:
    """Wraps a Handle and a drafter for Step; keeps a copy of what each native call returned."""

    def __init__(self, h: Handle, drafter):
        self.h, self.drafter, self.block_size = h, drafter, drafter.block_size
        self.calls: list[tuple] = []

    def propose(self, last, n_past, top_k):
        ids, logp = self.drafter.propose(last, n_past, top_k)
        self.calls.append(("draft", ids.copy(), logp.copy()))
        return ids, logp

    def verify(self, tokens, parents, out_argmax):
        self.h.verify(tokens, parents, out_argmax)
        self.calls.append(("verify", out_argmax.copy()))

    def verify_sampled(self, tokens, parents, out_argmax, io):
        self.h.verify_sampled(tokens, parents, out_argmax, io)
        n = tokens.size
        self.calls.append(("verify", out_argmax.copy(), *(a[:n].copy() for a in sampled_outputs(io))))

    def processed_row(self, row, out):
        self.h.processed_row(row, out)
        self.calls.append(("row", out.copy()))
        return out

    def commit(self, path):
        self.h.commit(path)


class Replayer:
    """Stands in for the Handle and the drafter: returns the recorded results, in order."""

    def __init__(self, calls: list[tuple], block_size: int):
        self.calls, self.block_size, self.at = calls, block_size, 0

    def _next(self, kind: str) -> tuple:
        call = self.calls[self.at]
        self.at += 1
        if call[0] != kind:
            raise RuntimeError(f"replay went off the recorded run: {kind} where the run made a {call[0]} call")
        return call[1:]

    def propose(self, last, n_past, top_k):
        return self._next("draft")

    def verify(self, tokens, parents, out_argmax):
        out_argmax[:] = self._next("verify")[0]

    def verify_sampled(self, tokens, parents, out_argmax, io):
        argmax, *outputs = self._next("verify")
        n = tokens.size
        out_argmax[:] = argmax
        for buf, recorded in zip(sampled_outputs(io), outputs):
            buf[:n] = recorded

    def processed_row(self, row, out):
        out[:] = self._next("row")[0]
        return out

    def commit(self, path):
        pass


def record(h: Handle, info: dict, prompt: list[int], gen: GenerationConfig, steps: int) -> list[dict]:
    """`steps` real DDTree steps after `prompt` (restarting from it when the context fills)."""
    runs, done = [], 0
    while done < steps:
        h.reset()
        sampler = Sampler.for_request(gen, info)
        if sampler is None:
            last = h.prefill(prompt)
        else:
            sampler.set_history([])
            h.prefill_sampled(prompt, sampler.io)
            last = sampler.pick(0, h.processed_row)
        rec = Recorder(h, NativeDrafter(h, info["block_size"]))
        step = Step(rec, info, "ddtree", rec, gen, sampler)
        run = {"first": last, "history": list(prompt), "steps": [], "calls": rec.calls, "live_s": []}
        history = list(prompt)
        while done < steps and len(history) + 2 * (gen.budget + 2) < info["max_ctx"]:
            r = step.run(last, history, 1 << 30, ())
            run["steps"].append((r.committed, r.bonus))
            run["live_s"].append(r.host_s)
            history += r.committed
            last = r.bonus
            done += 1
        runs.append(run)
    return runs


def replay(runs: list[dict], info: dict, gen: GenerationConfig, profiler=None) -> list[float]:
    """Host seconds of each recorded step, run again on the recorded native results."""
    host = []
    for run in runs:
        fake = Replayer(run["calls"], info["block_size"])
        sampler = Sampler.for_request(gen, info)
        step = Step(fake, info, "ddtree", fake, gen, sampler)
        history, last = list(run["history"]), run["first"]
        for committed, bonus in run["steps"]:
            r = step.run(last, history, 1 << 30, ()) if profiler is None else profiler.runcall(
                step.run, last, history, 1 << 30, ())
            if (r.committed, r.bonus) != (committed, bonus):
                raise RuntimeError("the replayed step committed other tokens than the recorded one")
            host.append(r.host_s)
            history += committed
            last = bonus
    return host


# --- counting numpy calls -------------------------------------------------------------------------
class _Counted:
    """A numpy function or ufunc that counts its calls (and its methods' calls: accumulate, reduce)."""

    def __init__(self, fn, counter: list):
        self._fn, self._counter = fn, counter

    def __call__(self, *args, **kwargs):
        self._counter[0] += 1
        return self._fn(*args, **kwargs)

    def __getattr__(self, name):
        attr = getattr(self._fn, name)
        return _Counted(attr, self._counter) if callable(attr) else attr


class _CountingNumpy:
    """Stands in for `np` in the host modules: functions and ufuncs count; types pass through."""

    def __init__(self, counter: list):
        self._counter = counter

    def __getattr__(self, name):
        attr = getattr(np, name)
        if callable(attr) and not isinstance(attr, type):  # functions, ufuncs, array-function dispatchers
            return _Counted(attr, self._counter)
        return attr


@contextmanager
def counting_numpy(counter: list):
    """Count the host modules' np.X calls into counter[0] while inside."""
    saved = {m: m.np for m in HOST_MODULES}
    try:
        for m in HOST_MODULES:
            m.np = _CountingNumpy(counter)
        yield
    finally:
        for m, real in saved.items():
            m.np = real


def ndarray_method_calls(stats: pstats.Stats) -> int:
    """ndarray method calls (tolist, sort, sum, ...) made from the host files, in a cProfile."""
    return sum(c[1] for func, (*_, callers) in stats.stats.items() if "of 'numpy.ndarray' objects" in func[2]
               for caller, c in callers.items() if caller[0].endswith(HOST_FILES))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5, help="replays of the recorded steps; the least median counts")
    ap.add_argument("--max-ctx", type=int, default=2048)
    ap.add_argument("--budget", type=int, default=22)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--top", type=int, default=0, help="also print the replay profile's N most expensive functions")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    target, draft = (args.target, args.draft) if args.target else embedded()
    tok = Tokenizer.from_gguf(target)
    messages = json.loads(PROMPT.read_text().splitlines()[0])["messages"]
    prompt = tok.encode(tok.apply_chat_template(messages))
    h = Handle(target, draft, max_ctx=args.max_ctx, n_threads=1, max_tree=max(64, args.budget + 1))
    info = h.info()
    results = []
    print("| mode | replay us/step | live us/step | numpy calls/step | profiled calls/step | tokens/step |")
    print("|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        gen = GenerationConfig(budget=args.budget, seed=0, **MODES[mode])
        runs = record(h, info, prompt, gen, args.steps)
        replay(runs, info, gen)  # warm-up
        replay_us = min(1e6 * statistics.median(replay(runs, info, gen)) for _ in range(args.rounds))
        profiler, counter = cProfile.Profile(), [0]
        replay(runs, info, gen, profiler)
        stats = pstats.Stats(profiler)
        with counting_numpy(counter):  # a replay of its own: the stand-in's calls stay out of the profile
            replay(runs, info, gen)
        n_numpy = counter[0] + ndarray_method_calls(stats)
        n_all = sum(ncalls for _, ncalls, *_ in stats.stats.values())
        committed = sum(len(c) for run in runs for c, _ in run["steps"])
        row = {"mode": mode, "replay_us": replay_us,
               "live_us": 1e6 * statistics.median([s for run in runs for s in run["live_s"]]),
               "numpy_calls_per_step": n_numpy / args.steps, "calls_per_step": n_all / args.steps,
               "tokens_per_step": committed / args.steps}
        results.append(row)
        print(f"| {mode} | {row['replay_us']:.1f} | {row['live_us']:.1f} | {row['numpy_calls_per_step']:.1f} | "
              f"{row['calls_per_step']:.1f} | {row['tokens_per_step']:.2f} |")
        if args.top:
            stats.stream = sys.stderr
            stats.sort_stats("tottime").print_stats(args.top)
    h.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
