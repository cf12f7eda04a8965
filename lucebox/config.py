"""Configuration dataclasses: every default lives here, and bad values raise ValueError."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

KV_TYPES = ("f16", "q8_0", "q4_0", "f32")
MODES = ("auto", "ar", "chain", "ddtree")
DEFAULT_BUDGET = 22
DEFAULT_TOP_K = 8
MAX_TREE = 64  # nodes per verify, root included (native max_tree)


@dataclass
class EngineConfig:
    """How to load: model files, context size, cache type, device."""

    target: str | Path
    draft: str | Path | None = None
    max_ctx: int = 4096
    kv: str = "f16"
    device: str = "auto"        # "auto" (first GPU if the build has CUDA, else CPU), "cpu", "cuda", "cuda:N"
    n_threads: int = 0          # CPU threads; 0 = all cores
    ubatch: int = 512           # prefill micro-batch
    max_tree: int = MAX_TREE
    log_level: str = "error"

    def __post_init__(self):
        self.target = Path(self.target)
        if self.draft is not None:
            self.draft = Path(self.draft)
        if self.max_ctx < 16:
            raise ValueError(f"max_ctx must be >= 16, got {self.max_ctx}")
        if self.kv not in KV_TYPES:
            raise ValueError(f"kv must be one of {', '.join(KV_TYPES)}; got {self.kv!r}")
        if self.ubatch < 1:
            raise ValueError(f"ubatch must be >= 1, got {self.ubatch}")
        if not 2 <= self.max_tree <= 1024:
            raise ValueError(f"max_tree must be in [2, 1024], got {self.max_tree}")
        if self.n_threads < 0:
            raise ValueError(f"n_threads must be >= 0, got {self.n_threads}")
        device_index(self.device)  # validates


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
    top_k: int = DEFAULT_TOP_K    # draft candidates per block position
    chain_seed: bool = True       # put the draft's top-1 chain in the tree first
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1, got {self.budget}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(s for s in self.stop if s)


DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_QUEUE = 32          # requests waiting behind the running one; more get 503
DEFAULT_PREFIX_CACHE_GB = 4.0   # host memory for prefix snapshots (0 = off)
DEFAULT_SERVE_MAX_CTX = 8192    # context per request (prompt + reply) when --max-ctx is not given


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
