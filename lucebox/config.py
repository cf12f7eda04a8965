"""Configuration dataclasses: every default lives here, and bad values raise ValueError."""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path

KV_TYPES = ("f16", "bf16", "q8_0", "q4_0", "f32")  # KV cache element types (LB_KV_*)
DEFAULT_KV = "f16"
MODES = ("auto", "ar", "chain", "ddtree")
LOG_LEVELS = ("quiet", "error", "info", "debug")
# how the draft's weights are stored (LB_DRAFT_WEIGHTS_*): as in the checkpoint, or Q8_0 (~1.6 GiB less for
# the 27B draft; it only proposes, so the output stays AR's, acceptance may drop)
DRAFT_WEIGHTS = ("keep", "q8_0")
DEFAULT_BUDGET = 22
DEFAULT_DRAFT_TOP_K = 8
# Sampling: candidates the device returns per row (a draw past them fetches the whole row; 32 is
# the largest k ggml-cuda's top-k selects in one pass), and the penalty window (llama.cpp's
# penalty_last_n): the last 64 tokens before the sampled position, prompt included.
SAMPLING_CANDIDATES = 32
PENALTY_LAST_N = 64
# `lucebox chat` when the GGUF names no sampling settings: Qwen's published thinking-mode ones.
CHAT_SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
MAX_TREE = 64  # nodes per verify, root included (native max_tree)
MAX_TREE_LIMIT = 1024  # native kMaxTreeLimit (load_params.hpp says why); ddtree and the CLI take it from here
MAX_BUDGET = MAX_TREE_LIMIT - 1  # draft nodes of the largest tree
# Draft candidates per block position: a tree of at most MAX_BUDGET draft nodes never uses a rank
# past that, and the draft's output buffers grow with it ((block_size - 1) * top_k): a typo like
# 2000000000 must be an error, not a 112 GiB allocation.
MAX_DRAFT_TOP_K = MAX_BUDGET
MAX_CTX_LIMIT = 1 << 24  # native kMaxCtxLimit
MAX_UBATCH = 1 << 16
DEFAULT_UBATCH = 512        # prefill micro-batch when neither the config nor a memory plan picks one
# max_ctx="auto" on the CPU without --vram (no budget to plan against, see memory_plan.py): this
# many tokens, or the trained length if shorter
CPU_AUTO_MAX_CTX = 8192
MAX_VRAM_GB = float(1 << 20)
# What a CUDA engine allocates outside ggml's buffers, which lb_memory_plan cannot size: kernel scratch
# pools, cuBLAS workspace (the CUDA context itself is already gone from the free memory the plan fills).
# A placeholder to calibrate against step_bench.py's measured peak on the GPU (issue 19).
CUDA_RESERVE_BYTES = 512 << 20
MAX_NEW_TOKENS = 1 << 30


def max_threads() -> int:
    """Most CPU threads the native side accepts: 4 per hardware thread, at most ggml's 512."""
    return min(512, 4 * (os.cpu_count() or 128))


def _check_int(name: str, value, lo: int, hi: int, hint: str = "") -> None:
    """ValueError unless value is an int (not a bool) in [lo, hi]: ctypes would wrap it silently."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}" + (f"; {hint}" if hint else ""))


@dataclass
class EngineConfig:
    """How to load: model files, context size, cache type, device."""

    target: str | Path
    draft: str | Path | None = None
    max_ctx: int | str = 4096   # or "auto": the largest that fits the memory budget (memory_plan.py)
    kv: str | None = None       # K and V cache type (KV_TYPES); None = DEFAULT_KV
    # one side's type (llama.cpp's --cache-type-k / --cache-type-v); None = kv's
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    device: str = "auto"        # "auto" (first GPU if the build has CUDA, else CPU), "cpu", "cuda", "cuda:N"
    n_threads: int = 0          # CPU threads; 0 = all cores
    ubatch: int | None = None   # prefill micro-batch; None = DEFAULT_UBATCH, or the plan's pick
    max_tree: int = MAX_TREE
    log_level: str = "error"    # one of LOG_LEVELS
    # every token computes to the same bits in any batch (greedy speculative == AR, bit for bit); False
    # lets CUDA pick faster batch-dependent kernels (benchmarks); the CPU is always invariant
    batch_invariant: bool = True
    # W: the draft attends to the last W committed tokens only, keeping their K/V in a ring of W rows
    # (memory O(W)); 0 = the draft's config.json sliding_window, else the native default (4096,
    # LB_DRAFT_WINDOW_DEFAULT). Changes what the draft proposes, never the output.
    draft_window: int = 0
    draft_weights: str = "keep"  # one of DRAFT_WEIGHTS
    # memory budget in GiB for the plan (memory_plan.py); None = the GPU's free memory, and no plan
    # on the CPU
    vram_gb: float | None = None

    def __post_init__(self):
        self.target = Path(self.target)
        if self.draft is not None:
            self.draft = Path(self.draft)
        if self.max_ctx != "auto":
            _check_int("max_ctx", self.max_ctx, 16, MAX_CTX_LIMIT, "or \"auto\"")
        for name in ("kv", "cache_type_k", "cache_type_v"):
            value = getattr(self, name)
            if value is not None and value not in KV_TYPES:
                raise ValueError(f"{name} must be one of {', '.join(KV_TYPES)}; got {value!r}")
        if self.ubatch is not None:
            _check_int("ubatch", self.ubatch, 1, MAX_UBATCH)
        if self.vram_gb is not None and (isinstance(self.vram_gb, bool) or not isinstance(self.vram_gb, (int, float))
                                         or not 0 < self.vram_gb <= MAX_VRAM_GB):
            raise ValueError(f"vram_gb must be a number of GiB in (0, {MAX_VRAM_GB:g}], got {self.vram_gb!r}")
        _check_int("max_tree", self.max_tree, 2, MAX_TREE_LIMIT)
        _check_int("draft_window", self.draft_window, 0, MAX_CTX_LIMIT,
                   "0 takes the draft's sliding_window (else 4096); W keeps the last W tokens")
        _check_int("n_threads", self.n_threads, 0, max_threads(),
                   "0 uses all cores; more than 4 per hardware thread only slows ggml down")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}; got {self.log_level!r}")
        if self.draft_weights not in DRAFT_WEIGHTS:
            raise ValueError(f"draft_weights must be one of {', '.join(DRAFT_WEIGHTS)}; got {self.draft_weights!r}")
        if not isinstance(self.device, str):
            raise ValueError(f"device must be a string (auto, cpu, cuda or cuda:N); got {self.device!r}")
        device_index(self.device)  # validates

    @property
    def type_k(self) -> str:
        return self.cache_type_k or self.kv or DEFAULT_KV

    @property
    def type_v(self) -> str:
        return self.cache_type_v or self.kv or DEFAULT_KV


def device_index(device: str, cuda_count: int | None = None) -> int:
    """Map a device string to the native index (-1 = CPU). With cuda_count, resolve "auto"."""
    d = device.strip().lower()
    if d == "cpu":
        return -1
    if d == "auto":
        if cuda_count is None:
            return -2  # resolved later, once the library is loaded
        return 0 if cuda_count > 0 else -1
    if d == "cuda" or d == "gpu":
        index = 0
    elif d.startswith("cuda:") and d[5:].isdigit():
        index = int(d[5:])
    else:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {device!r}")
    if cuda_count is not None and index >= cuda_count:
        if cuda_count == 0:
            raise ValueError(f"device {device!r} asked for, but this lucebox build has no CUDA "
                             "(reinstall with LUCEBOX_CUDA=ON) or no GPU is visible")
        raise ValueError(f"device {device!r} asked for, but only {cuda_count} CUDA device(s) are visible")
    return index


@dataclass
class GenerationConfig:
    """How to decode one request."""

    max_new_tokens: int = 256
    mode: str = "auto"          # auto = ddtree with a draft, else ar
    budget: int = DEFAULT_BUDGET  # DDTree draft nodes (root not counted)
    draft_top_k: int = DEFAULT_DRAFT_TOP_K  # draft candidates per block position
    chain_seed: bool = True       # put the draft's top-1 chain in the tree first
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    # sampling (lucebox/sampling.py): penalties -> temperature -> top-k -> top-p -> min-p -> draw
    temperature: float = 0.0      # 0 = greedy
    top_k: int = 0                # sampler top-k; 0 = off
    top_p: float = 1.0            # 1 = off
    min_p: float = 0.0            # 0 = off
    repeat_penalty: float = 1.0   # 1 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None       # None = a fresh random seed per request

    def __post_init__(self):
        _check_int("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        _check_int("budget", self.budget, 1, MAX_BUDGET, "draft nodes per verify (default 22)")
        _check_int("draft_top_k", self.draft_top_k, 1, MAX_DRAFT_TOP_K, "draft candidates per block position (default 8)")
        self._check_sampling()
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        if not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        self.stop = tuple(s for s in self.stop if s)

    def _check_sampling(self) -> None:
        # numbers.Real / Integral take numpy's scalars too; each value is stored as Python's own type after its check
        def number(name: str, low: float, high: float, low_open: bool = False) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
            if v < low or v > high or (low_open and v == low):
                raise ValueError(f"{name} must be in {'(' if low_open else '['}{low:g}, {high:g}], got {v!r}")
            setattr(self, name, float(v))

        number("temperature", 0.0, 100.0)
        number("top_p", 0.0, 1.0, low_open=True)
        number("min_p", 0.0, 1.0)
        number("repeat_penalty", 0.0, 100.0, low_open=True)
        number("presence_penalty", -100.0, 100.0)
        number("frequency_penalty", -100.0, 100.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        self.top_k = int(self.top_k)
        if self.seed is not None:
            if (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)
                    or not 0 <= self.seed < 2 ** 64):
                raise ValueError(f"seed must be an integer in [0, 2^64) or None, got {self.seed!r}")
            self.seed = int(self.seed)

    def processing(self):
        from .sampling import Processing

        return Processing(temperature=float(self.temperature), top_k=self.top_k, top_p=float(self.top_p),
                          min_p=float(self.min_p), repeat_penalty=float(self.repeat_penalty),
                          presence_penalty=float(self.presence_penalty),
                          frequency_penalty=float(self.frequency_penalty))


DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_QUEUE = 32          # requests waiting behind the running one; more get 503
DEFAULT_PREFIX_CACHE_GB = 4.0   # host memory for prefix snapshots (0 = off)


@dataclass
class ServeConfig:
    """How `lucebox serve` runs: where it listens, queue depth, prefix-cache budget, API key."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_queue: int = DEFAULT_MAX_QUEUE
    prefix_cache_gb: float = DEFAULT_PREFIX_CACHE_GB
    api_key: str | None = None
    model_name: str = "lucebox"

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if not 0 <= self.prefix_cache_gb <= 1 << 20:
            raise ValueError(f"prefix_cache_gb must be >= 0, got {self.prefix_cache_gb}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key is empty; pass a non-empty key or none")

    @property
    def prefix_cache_bytes(self) -> int:
        return int(self.prefix_cache_gb * (1 << 30))
