"""The memory planner: which context, KV types and prefill micro-batch fit a memory budget.

The sizes come from the native side (lb_memory_plan): it lays out what lb_load would (weights,
draft, KV cache, recurrent state, tree scratch, compute buffers) without loading anything, so a
plan is the engine's own arithmetic, not a model of it.

Budget: EngineConfig.vram_gb (--vram GiB) if given, else the GPU's free memory. On the CPU no
budget is guessed (host memory is shared with the page cache, swap and other processes, and the
weights are mapped from the file): there "auto" means CPU_AUTO_MAX_CTX tokens (or the trained length
if shorter) with f16 KV, and nothing is planned unless --vram is given.

With a budget, max_ctx="auto" takes the largest context up to the model's trained length that fits,
trying KV types f16 -> q8_0 -> q4_0 unless the config names them (the first that fits the trained
length, else the last one's largest context); a fixed max_ctx that does not fit is an error naming
the largest that does. ubatch=None then takes the largest of UBATCH_CHOICES that still fits. On
CUDA the plan adds config.CUDA_RESERVE_BYTES for what ggml-cuda allocates outside its buffers.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .config import (CPU_AUTO_MAX_CTX, CUDA_RESERVE_BYTES, DEFAULT_DRAFT_TOP_K, DEFAULT_UBATCH, PENALTY_LAST_N,
                     SAMPLING_CANDIDATES, EngineConfig)

GIB = 1 << 30
KV_SEARCH = ("f16", "q8_0", "q4_0")
CTX_STEP = 256                  # KV rows come in multiples of this (native kKvPad)
UBATCH_CHOICES = (2048, 1024)   # prefill micro-batches tried, largest first, when room is left
PARTS = (("weights", "target weights"), ("draft", "draft weights"), ("kv", "KV cache"),
         ("recurrent", "recurrent state"), ("tree", "tree scratch + features"), ("draft_cache", "draft context ring"),
         ("compute", "compute buffers"), ("reserve", "CUDA pools (reserve)"))


@dataclass(frozen=True)
class MemoryPlan:
    max_ctx: int
    type_k: str
    type_v: str
    ubatch: int
    parts: dict[str, int]       # bytes by part: lb_memory's, and the CUDA reserve
    budget: int                 # bytes
    budget_source: str          # where the budget came from, for messages

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def table(self) -> str:
        """A short plain-text table (what the CLI prints on stderr)."""
        kv = self.type_k if self.type_k == self.type_v else f"K {self.type_k} / V {self.type_v}"
        lines = [f"memory plan: context {self.max_ctx}, KV {kv}, ubatch {self.ubatch}"]
        lines += [f"  {label:<24} {_gib(self.parts[key]):>10}" for key, label in PARTS if self.parts[key]]
        lines.append(f"  {'total':<24} {_gib(self.total):>10} of {_gib(self.budget)} ({self.budget_source})")
        return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"


def resolve(config: EngineConfig, device: int) -> tuple[EngineConfig, MemoryPlan | None]:
    """The config with max_ctx, cache types and ubatch made concrete, and the plan behind them
    (None when there is no budget to plan against: the CPU without vram_gb)."""
    budget = _budget(config, device)
    if budget is None:
        max_ctx = config.max_ctx
        if max_ctx == "auto":
            max_ctx = min(CPU_AUTO_MAX_CTX, _trained_ctx(config) or CPU_AUTO_MAX_CTX)
        return dataclasses.replace(config, max_ctx=max_ctx, ubatch=config.ubatch or DEFAULT_UBATCH), None
    plan = _Planner(config, device, *budget).plan()
    return dataclasses.replace(config, max_ctx=plan.max_ctx, cache_type_k=plan.type_k, cache_type_v=plan.type_v,
                               ubatch=plan.ubatch), plan


def _budget(config: EngineConfig, device: int) -> tuple[int, str] | None:
    if config.vram_gb is not None:
        return int(config.vram_gb * GIB), f"--vram {config.vram_gb:g} GiB"
    if device < 0:
        return None
    from ._native import device_memory

    free, _ = device_memory(device)
    return free, f"free memory of cuda:{device}"


def _trained_ctx(config: EngineConfig) -> int:
    from .gguf_meta import read_metadata

    meta = read_metadata(config.target, keys=["general.architecture", "qwen35.context_length"])
    return int(meta.get(f"{meta.get('general.architecture', 'qwen35')}.context_length", 0) or 0)


class _Planner:
    def __init__(self, config: EngineConfig, device: int, budget: int, source: str):
        self.config, self.device, self.budget, self.source = config, device, budget, source
        self._sizes: dict[tuple, dict[str, int]] = {}
        fixed = config.kv or config.cache_type_k or config.cache_type_v
        self.pairs = [(config.type_k, config.type_v)] if fixed else [(t, t) for t in KV_SEARCH]

    def parts(self, ctx: int, pair: tuple[str, str], ubatch: int) -> dict[str, int]:
        key = (ctx, pair, ubatch)
        if key not in self._sizes:
            from ._native import memory_plan

            c = self.config
            self._sizes[key] = memory_plan(
                c.target, c.draft, max_ctx=ctx, type_k=pair[0], type_v=pair[1], device=self.device, ubatch=ubatch,
                max_tree=c.max_tree, draft_window=c.draft_window, draft_weights=c.draft_weights,
                verify_nodes=min(c.max_tree, ctx),
                draft_top_k=DEFAULT_DRAFT_TOP_K, n_candidates=SAMPLING_CANDIDATES, penalty_last_n=PENALTY_LAST_N)
            self._sizes[key]["reserve"] = CUDA_RESERVE_BYTES if self.device >= 0 else 0
        return self._sizes[key]

    def fits(self, ctx: int, pair: tuple[str, str], ubatch: int) -> bool:
        return sum(self.parts(ctx, pair, ubatch).values()) <= self.budget

    def largest(self, pair: tuple[str, str], ubatch: int, cap: int) -> int | None:
        """The largest context <= cap (a multiple of CTX_STEP, or cap) that fits, or None. Bytes grow
        near-linearly with the context: interpolate, then bisect what is left."""
        lo = min(CTX_STEP, cap)
        if not self.fits(lo, pair, ubatch):
            return None
        if self.fits(cap, pair, ubatch):
            return cap
        hi = cap  # invariant: lo fits, hi does not
        total = lambda c: sum(self.parts(c, pair, ubatch).values())  # noqa: E731
        interpolate = True
        while hi - lo > CTX_STEP:
            if interpolate:
                guess = lo + (self.budget - total(lo)) * (hi - lo) // max(1, total(hi) - total(lo))
            else:
                guess = (lo + hi) // 2
            mid = min(max(guess // CTX_STEP * CTX_STEP, lo + CTX_STEP), (hi - 1) // CTX_STEP * CTX_STEP)
            if mid <= lo:
                break
            width = hi - lo
            if self.fits(mid, pair, ubatch):
                lo = mid
            else:
                hi = mid
            interpolate = hi - lo < width // 2  # fall back to bisection when a guess gains little
        return lo

    def plan(self) -> MemoryPlan:
        c = self.config
        ubatch = c.ubatch or DEFAULT_UBATCH
        if c.max_ctx == "auto":
            ctx, pair = self._auto(ubatch)
        else:
            ctx, pair = c.max_ctx, self._fixed(c.max_ctx, ubatch)
        if c.ubatch is None:
            ubatch = next((u for u in UBATCH_CHOICES if u > ubatch and self.fits(ctx, pair, u)), ubatch)
        return MemoryPlan(ctx, pair[0], pair[1], ubatch, self.parts(ctx, pair, ubatch), self.budget, self.source)

    def _auto(self, ubatch: int) -> tuple[int, tuple[str, str]]:
        cap = _trained_ctx(self.config) or CPU_AUTO_MAX_CTX
        for pair in self.pairs:
            if self.fits(cap, pair, ubatch):
                return cap, pair
        pair = self.pairs[-1]
        ctx = self.largest(pair, ubatch, cap)
        if ctx is None:
            raise ValueError(self._nothing_fits(pair, ubatch))
        return ctx, pair

    def _fixed(self, ctx: int, ubatch: int) -> tuple[str, str]:
        for pair in self.pairs:
            if self.fits(ctx, pair, ubatch):
                return pair
        pair = self.pairs[-1]
        largest = self.largest(pair, ubatch, ctx)
        if largest is None:
            raise ValueError(self._nothing_fits(pair, ubatch))
        need = sum(self.parts(ctx, pair, ubatch).values())
        hint = self._draft_hint()
        raise ValueError(f"max_ctx {ctx} does not fit in {_gib(self.budget)} ({self.source}): it needs {_gib(need)} "
                         f"with {_kv_words(pair)}; the largest context that fits is {largest}: pass --max-ctx {largest} "
                         f"(or auto{'; or ' + hint if hint else ''})")

    def _nothing_fits(self, pair: tuple[str, str], ubatch: int) -> str:
        ctx = min(CTX_STEP, _trained_ctx(self.config) or CTX_STEP)
        parts = self.parts(ctx, pair, ubatch)
        hint = self._draft_hint()
        return (f"the model does not fit in {_gib(self.budget)} ({self.source}) even at context {ctx} with "
                f"{_kv_words(pair)}: it needs {_gib(sum(parts.values()))} (weights {_gib(parts['weights'])}, draft "
                f"{_gib(parts['draft'])}); free memory, use a smaller quant, {hint + ', ' if hint else ''}"
                "or drop the draft")

    def _draft_hint(self) -> str:
        """A way out when the draft's BF16 weights take the room (the draft only proposes tokens)."""
        keep = self.config.draft is not None and self.config.draft_weights == "keep"
        return "store the draft as Q8_0 (--draft-weights q8_0)" if keep else ""


def _kv_words(pair: tuple[str, str]) -> str:
    return f"{pair[0]} KV" if pair[0] == pair[1] else f"K {pair[0]} / V {pair[1]} KV"
