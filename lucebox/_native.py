"""ctypes mirror of native/include/lucebox.h: the only module that touches ctypes.

The table below follows the header's order. `Handle` owns one `lb_engine *` and turns every
non-zero status into a `NativeError` carrying `lb_last_error()`.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

ABI_VERSION = 7  # must equal LB_ABI_VERSION in lucebox.h

LIB_ENV = "LUCEBOX_LIB"
LIB_NAME = "liblucebox.so"

# status codes (LB_E_*)
STATUS_NAMES = {
    -1: "invalid argument", -2: "I/O error", -3: "format error", -4: "unsupported",
    -5: "draft/target mismatch", -6: "context overflow", -7: "out of memory",
    -8: "backend failure", -9: "wrong state",
}
E_CONTEXT = -6
E_OOM = -7

KV_TYPES = {"f16": 0, "q8_0": 1, "q4_0": 2, "f32": 3, "bf16": 4}  # LB_KV_*
KV_NAMES = {code: name for name, code in KV_TYPES.items()}
DRAFT_WEIGHTS = {"keep": 0, "q8_0": 1}  # LB_DRAFT_WEIGHTS_*
LOG_LEVELS = {"quiet": 0, "error": 1, "info": 2, "debug": 3}
CALL_KINDS = {"prefill": 0, "step": 1, "draft": 2, "verify": 3, "commit": 4}  # LB_CALL_*


class NativeError(RuntimeError):
    """A liblucebox call failed; `status` is the LB_E_* code, str() the library's message."""

    def __init__(self, status: int, message: str):
        super().__init__(message or STATUS_NAMES.get(status, f"status {status}"))
        self.status = status


class LibraryNotFound(RuntimeError):
    pass


_i32p = ctypes.POINTER(ctypes.c_int32)
_f32p = ctypes.POINTER(ctypes.c_float)
_f64p = ctypes.POINTER(ctypes.c_double)
_i64p = ctypes.POINTER(ctypes.c_int64)


def _fields(ctype, *names: str) -> list:
    """ctypes fields for a run of struct members of one C type, in header order."""
    return [(name, ctype) for name in names]


# typedef struct lb_params { ... } lb_params;
class Params(ctypes.Structure):
    _fields_ = (_fields(ctypes.c_char_p, "target_path", "draft_path")
                + _fields(ctypes.c_int32, "max_ctx", "type_k", "type_v", "device", "n_threads", "ubatch", "max_tree",
                          "log_level", "batch_invariant", "draft_window", "draft_weights"))


class _Record(ctypes.Structure):
    """A struct of numbers the library fills in; as_dict() reads it out."""

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name, _ in self._fields_}


# typedef struct lb_model_info { ... } lb_model_info;
class ModelInfo(_Record):
    _fields_ = _fields(ctypes.c_int32, "n_vocab", "n_embd", "n_layer", "max_ctx", "n_past", "has_draft", "block_size",
                       "mask_token_id", "max_tree", "device", "draft_window", "n_ctx_train", "type_k", "type_v")


# typedef struct lb_memory { ... } lb_memory;
class Memory(_Record):
    _fields_ = _fields(ctypes.c_int64, "weights", "draft", "kv", "recurrent", "tree", "draft_cache", "compute")


# typedef struct lb_plan_shape { ... } lb_plan_shape;
class PlanShape(ctypes.Structure):
    _fields_ = _fields(ctypes.c_int32, "verify_nodes", "draft_top_k", "n_candidates", "penalty_last_n")


# typedef struct lb_sampling { ... } lb_sampling;
class Sampling(ctypes.Structure):
    _fields_ = (_fields(ctypes.c_double, "temperature")
                + _fields(ctypes.c_float, "repeat_penalty", "presence_penalty", "frequency_penalty")
                + _fields(ctypes.c_int32, "top_k")
                + _fields(ctypes.c_double, "top_p", "min_p")
                + _fields(ctypes.c_uint64, "seed")
                + _fields(ctypes.c_int32, "n_candidates", "penalty_last_n")
                + _fields(_i32p, "history")
                + _fields(ctypes.c_int64, "n_history")
                + _fields(_i32p, "cand_ids")
                + _fields(_f32p, "cand_logits", "row_max", "row_lse")
                + _fields(_i32p, "drawn")
                + _fields(_f64p, "uniforms")
                + _fields(ctypes.c_int64, "rows_cap"))


# typedef struct lb_call_times { ... } lb_call_times;
class CallTimes(_Record):
    _fields_ = _fields(ctypes.c_int32, "graphs") + _fields(ctypes.c_double, "total_ms", "before_ms", "launch_ms",
                                                           "wait_ms", "between_ms", "after_ms")


_engine_p = ctypes.c_void_p

# (name, restype, argtypes) in header order.
_PROTOTYPES = [
    # int32_t lb_abi_version(void);
    ("lb_abi_version", ctypes.c_int32, []),
    # const char * lb_last_error(void);
    ("lb_last_error", ctypes.c_char_p, []),
    # int32_t lb_device_count(void);
    ("lb_device_count", ctypes.c_int32, []),
    # int32_t lb_device_memory(int32_t device, int64_t * free_bytes, int64_t * total_bytes);
    ("lb_device_memory", ctypes.c_int32, [ctypes.c_int32, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]),
    # void lb_params_default(lb_params * p);
    ("lb_params_default", None, [ctypes.POINTER(Params)]),
    # int32_t lb_load(const lb_params * p, lb_engine ** out);
    ("lb_load", ctypes.c_int32, [ctypes.POINTER(Params), ctypes.POINTER(_engine_p)]),
    # int32_t lb_memory_plan(const lb_params * p, const lb_plan_shape * s, lb_memory * out);
    ("lb_memory_plan", ctypes.c_int32, [ctypes.POINTER(Params), ctypes.POINTER(PlanShape), ctypes.POINTER(Memory)]),
    # int32_t lb_model_info_get(const lb_engine * e, lb_model_info * out);
    ("lb_model_info_get", ctypes.c_int32, [_engine_p, ctypes.POINTER(ModelInfo)]),
    # int32_t lb_memory_get(const lb_engine * e, lb_memory * out);
    ("lb_memory_get", ctypes.c_int32, [_engine_p, ctypes.POINTER(Memory)]),
    # int32_t lb_reset(lb_engine * e);
    ("lb_reset", ctypes.c_int32, [_engine_p]),
    # int32_t lb_prefill(lb_engine *, const int32_t * toks, int32_t n, int32_t * out_next,
    #                    float * logits, int64_t logits_cap);
    ("lb_prefill", ctypes.c_int32, [_engine_p, _i32p, ctypes.c_int32, _i32p, _f32p, ctypes.c_int64]),
    # int32_t lb_draft(lb_engine *, int32_t last, int32_t top_k, int32_t * ids, float * logp, int64_t cap);
    ("lb_draft", ctypes.c_int32, [_engine_p, ctypes.c_int32, ctypes.c_int32, _i32p, _f32p, ctypes.c_int64]),
    # int32_t lb_verify(lb_engine *, const int32_t * toks, const int32_t * parents, int32_t n,
    #                   int32_t * out_argmax, float * logits, int64_t logits_cap);
    ("lb_verify", ctypes.c_int32, [_engine_p, _i32p, _i32p, ctypes.c_int32, _i32p, _f32p, ctypes.c_int64]),
    # int32_t lb_commit(lb_engine *, const int32_t * path, int32_t n_path);
    ("lb_commit", ctypes.c_int32, [_engine_p, _i32p, ctypes.c_int32]),
    # int32_t lb_step(lb_engine *, int32_t tok, int32_t * out_next);
    ("lb_step", ctypes.c_int32, [_engine_p, ctypes.c_int32, _i32p]),
    # int32_t lb_prefill_sampled(lb_engine *, const int32_t * toks, int32_t n, int32_t * out_next,
    #                            const lb_sampling * s);
    ("lb_prefill_sampled", ctypes.c_int32, [_engine_p, _i32p, ctypes.c_int32, _i32p, ctypes.POINTER(Sampling)]),
    # int32_t lb_verify_sampled(lb_engine *, const int32_t * toks, const int32_t * parents, int32_t n,
    #                           int32_t * out_argmax, const lb_sampling * s);
    ("lb_verify_sampled", ctypes.c_int32, [_engine_p, _i32p, _i32p, ctypes.c_int32, _i32p, ctypes.POINTER(Sampling)]),
    # int32_t lb_step_sampled(lb_engine *, int32_t tok, int32_t * out_next, const lb_sampling * s);
    ("lb_step_sampled", ctypes.c_int32, [_engine_p, ctypes.c_int32, _i32p, ctypes.POINTER(Sampling)]),
    # int32_t lb_processed_row(lb_engine *, int32_t row, float * out, int64_t cap);
    ("lb_processed_row", ctypes.c_int32, [_engine_p, ctypes.c_int32, _f32p, ctypes.c_int64]),
    # int32_t lb_sampling_draw(const lb_sampling * s, int32_t rows, const int64_t * positions);
    ("lb_sampling_draw", ctypes.c_int32, [ctypes.POINTER(Sampling), ctypes.c_int32, _i64p]),
    # int32_t lb_state_size(const lb_engine * e, int64_t * out_bytes);
    ("lb_state_size", ctypes.c_int32, [_engine_p, ctypes.POINTER(ctypes.c_int64)]),
    # int32_t lb_state_save(lb_engine * e, void * buf, int64_t cap, int64_t * out_written);
    ("lb_state_save", ctypes.c_int32, [_engine_p, ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]),
    # int32_t lb_state_load(lb_engine * e, const void * buf, int64_t n);
    ("lb_state_load", ctypes.c_int32, [_engine_p, ctypes.c_void_p, ctypes.c_int64]),
    # int32_t lb_call_times_get(const lb_engine * e, int32_t kind, lb_call_times * out);
    ("lb_call_times_get", ctypes.c_int32, [_engine_p, ctypes.c_int32, ctypes.POINTER(CallTimes)]),
    # int32_t lb_sync(lb_engine * e);
    ("lb_sync", ctypes.c_int32, [_engine_p]),
    # void lb_free(lb_engine * e);
    ("lb_free", None, [_engine_p]),
]

_lib: ctypes.CDLL | None = None


def library_path() -> Path:
    override = os.environ.get(LIB_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise LibraryNotFound(f"{LIB_ENV}={override} does not exist; unset it or point it at liblucebox.so")
        return path
    path = Path(__file__).resolve().parent / LIB_NAME
    if not path.is_file():
        raise LibraryNotFound(
            f"{LIB_NAME} not found next to the lucebox package ({path.parent}); "
            f"reinstall with `pip install .` or set {LIB_ENV} to a built library")
    return path


def lib() -> ctypes.CDLL:
    """Load liblucebox once, declare every prototype and check the ABI version."""
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    where = f"{LIB_ENV}={path}" if os.environ.get(LIB_ENV) else str(path)
    try:
        handle = ctypes.CDLL(str(path))
    except OSError as e:
        raise LibraryNotFound(f"cannot load {where} ({' '.join(str(e).split())}); point {LIB_ENV} at a "
                              "liblucebox.so built from this checkout, or unset it") from None
    for name, restype, argtypes in _PROTOTYPES:
        fn = getattr(handle, name, None)
        if fn is None:
            raise LibraryNotFound(f"{where} has no {name}(): it is not liblucebox or is too old; point "
                                  f"{LIB_ENV} at a liblucebox.so built from this checkout, or unset it")
        fn.restype = restype
        fn.argtypes = argtypes
    found = handle.lb_abi_version()
    if found != ABI_VERSION:
        raise LibraryNotFound(
            f"{where}: liblucebox ABI version {found} != {ABI_VERSION} expected by this Python package; "
            "rebuild the library from the same checkout")
    _lib = handle
    return handle


def device_count() -> int:
    """CUDA devices usable by this build (0 for a CPU-only build)."""
    return int(lib().lb_device_count())


def _check(status: int) -> None:
    if status != 0:
        message = lib().lb_last_error()
        raise NativeError(status, message.decode("utf-8", "replace") if message else "")


def _i32(arr: np.ndarray):
    return arr.ctypes.data_as(_i32p)


def _f32_or_null(arr: np.ndarray | None):
    if arr is None:
        return None, 0
    if arr.dtype != np.float32 or not arr.flags.c_contiguous:
        raise ValueError("logits buffer must be a C-contiguous float32 array")
    return arr.ctypes.data_as(_f32p), arr.size


def _as_i32(values) -> np.ndarray:
    arr = np.ascontiguousarray(values, dtype=np.int32)
    if arr.ndim != 1:
        raise ValueError("token/tree arrays must be one-dimensional")
    return arr


def _i32_param(name: str, value) -> int:
    """lb_params fields are int32: ctypes would silently wrap 2**31 to a negative number."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not -2**31 <= value < 2**31:
        raise ValueError(f"{name} must be an int32 integer, got {value!r}")
    return int(value)


def _params(target_path, draft_path=None, *, max_ctx=4096, kv_type="f16", device=-1, n_threads=0, ubatch=512,
            max_tree=64, log_level="error", batch_invariant=True, draft_window=0, type_k=None, type_v=None,
            draft_weights="keep") -> Params:
    """An lb_params from lb_params_default and these values (the paths' bytes live as long as it does)."""
    type_k, type_v = type_k or kv_type, type_v or kv_type
    for name, value in (("type_k", type_k), ("type_v", type_v)):
        if value not in KV_TYPES:
            raise ValueError(f"{name} must be one of {', '.join(KV_TYPES)}; got {value!r}")
    if isinstance(log_level, str) and log_level not in LOG_LEVELS:
        raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}; got {log_level!r}")
    if draft_weights not in DRAFT_WEIGHTS:
        raise ValueError(f"draft_weights must be one of {', '.join(DRAFT_WEIGHTS)}; got {draft_weights!r}")
    params = Params()
    lib().lb_params_default(ctypes.byref(params))
    params._paths = (os.fsencode(str(target_path)), os.fsencode(str(draft_path)) if draft_path else None)
    params.target_path, params.draft_path = params._paths
    params.max_ctx = _i32_param("max_ctx", max_ctx)
    params.type_k = KV_TYPES[type_k]
    params.type_v = KV_TYPES[type_v]
    params.device = _i32_param("device", device)
    params.n_threads = _i32_param("n_threads", n_threads)
    params.ubatch = _i32_param("ubatch", ubatch)
    params.max_tree = _i32_param("max_tree", max_tree)
    params.log_level = LOG_LEVELS[log_level] if isinstance(log_level, str) else _i32_param("log_level", log_level)
    params.batch_invariant = int(bool(batch_invariant))
    params.draft_window = _i32_param("draft_window", draft_window)
    params.draft_weights = DRAFT_WEIGHTS[draft_weights]
    return params


def memory_plan(target_path, draft_path=None, *, verify_nodes: int, draft_top_k: int, n_candidates: int = 0,
                penalty_last_n: int = 0, **params) -> dict:
    """What lb_load would hold at most, by part (lb_memory_plan); `params` as Handle's."""
    shape = PlanShape(_i32_param("verify_nodes", verify_nodes), _i32_param("draft_top_k", draft_top_k),
                      _i32_param("n_candidates", n_candidates), _i32_param("penalty_last_n", penalty_last_n))
    out = Memory()
    p = _params(target_path, draft_path, **params)
    _check(lib().lb_memory_plan(ctypes.byref(p), ctypes.byref(shape), ctypes.byref(out)))
    return out.as_dict()


def device_memory(device: int) -> tuple[int, int]:
    """(free, total) bytes of a device (-1: the host, whose memory ggml counts as all free)."""
    free, total = ctypes.c_int64(), ctypes.c_int64()
    _check(lib().lb_device_memory(_i32_param("device", device), ctypes.byref(free), ctypes.byref(total)))
    return free.value, total.value


class Handle:
    """Owns one lb_engine. Low level: arrays in, arrays out; `lucebox.Engine` builds on it.

    It also journals the tokens each call commits, written before the call: the native cache then
    always holds `journal[:n_past]`, even when an exception (Ctrl+C) lands between the native call
    and the caller's bookkeeping; `committed_tokens()` reads that back.
    """

    def __init__(self, target_path, draft_path=None, max_ctx=4096, kv_type="f16", device=-1,
                 n_threads=0, ubatch=512, max_tree=64, log_level="error", batch_invariant=True, draft_window=0,
                 type_k=None, type_v=None, draft_weights="keep"):
        """kv_type: the K and V cache type; type_k / type_v (llama.cpp's names) override one side."""
        L = lib()
        params = _params(target_path, draft_path, max_ctx=max_ctx, kv_type=kv_type, device=device,
                         n_threads=n_threads, ubatch=ubatch, max_tree=max_tree, log_level=log_level,
                         batch_invariant=batch_invariant, draft_window=draft_window, type_k=type_k, type_v=type_v,
                         draft_weights=draft_weights)
        out = _engine_p()
        _check(L.lb_load(ctypes.byref(params), ctypes.byref(out)))
        self._ptr = out
        self._next = np.zeros(1, dtype=np.int32)
        self._info = ModelInfo()
        self._journal: list[int] = []          # native cache == _journal[:n_past]
        self._tree: np.ndarray | None = None   # tokens of the last verify, for commit's journal entry
        self.info_cache = self.info()

    # --- lifetime -------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._ptr is None

    def _p(self):
        if self._ptr is None:
            raise RuntimeError("engine is closed")
        return self._ptr

    def close(self) -> None:
        if getattr(self, "_ptr", None) is not None:
            lib().lb_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    # --- calls ----------------------------------------------------------------------------
    def info(self) -> dict:
        """lb_model_info as a dict; type_k / type_v as names ("f16", "q8_0", ...)."""
        out = ModelInfo()
        _check(lib().lb_model_info_get(self._p(), ctypes.byref(out)))
        info = out.as_dict()
        info["type_k"], info["type_v"] = KV_NAMES[info["type_k"]], KV_NAMES[info["type_v"]]
        return info

    def memory(self) -> dict:
        """Bytes the engine holds now, by part (lb_memory_get)."""
        out = Memory()
        _check(lib().lb_memory_get(self._p(), ctypes.byref(out)))
        return out.as_dict()

    def call_times(self, kind: str) -> dict:
        """Where the host's time went in the last call of `kind` ("prefill", "step", "draft", "verify",
        "commit"; lb_call_times_get): graphs, total_ms, before_ms, launch_ms, wait_ms, between_ms, after_ms."""
        if kind not in CALL_KINDS:
            raise ValueError(f"call_times: kind {kind!r} is not one of {', '.join(CALL_KINDS)}")
        out = CallTimes()
        _check(lib().lb_call_times_get(self._p(), CALL_KINDS[kind], ctypes.byref(out)))
        return out.as_dict()

    def sync(self) -> None:
        """Wait until the device has run what the engine queued (lb_sync: a commit's graphs), e.g. to time it."""
        _check(lib().lb_sync(self._p()))

    def n_past(self) -> int:
        """Tokens the native caches hold now (P)."""
        _check(lib().lb_model_info_get(self._p(), ctypes.byref(self._info)))
        return int(self._info.n_past)

    def committed_tokens(self) -> list[int]:
        """The tokens the native caches hold, in order (the journal up to the native P)."""
        n = self.n_past()
        del self._journal[n:]
        if len(self._journal) != n:  # only if lb_* were called around this Handle
            raise RuntimeError(f"lost track of the native cache ({n} tokens, {len(self._journal)} journaled); "
                               "call reset() and prefill again")
        return list(self._journal)

    def _journal_at_p(self, tokens) -> None:
        """Record `tokens` as committed after the native P, before the call that commits them."""
        del self._journal[self.n_past():]
        self._journal.extend(int(t) for t in tokens)

    def reset(self) -> None:
        _check(lib().lb_reset(self._p()))
        self._journal.clear()  # harmless if skipped: the native P is 0 either way

    def prefill(self, tokens, logits: np.ndarray | None = None) -> int:
        toks = _as_i32(tokens)
        lp, cap = _f32_or_null(logits)
        self._journal_at_p(toks.tolist())
        _check(lib().lb_prefill(self._p(), _i32(toks), toks.size, _i32(self._next), lp, cap))
        return int(self._next[0])

    def step(self, token: int) -> int:
        self._journal_at_p([token])
        _check(lib().lb_step(self._p(), int(token), _i32(self._next)))
        return int(self._next[0])

    def draft(self, last: int, ids: np.ndarray, logp: np.ndarray) -> None:
        """Fill ids[(B-1), K] and logp[(B-1), K] (preallocated, C-contiguous)."""
        if ids.dtype != np.int32 or logp.dtype != np.float32 or ids.shape != logp.shape or ids.ndim != 2:
            raise ValueError("draft buffers must be int32 and float32 arrays of one shape [B-1, K]")
        _check(lib().lb_draft(self._p(), int(last), ids.shape[1], _i32(ids),
                              logp.ctypes.data_as(_f32p), ids.size))

    def verify(self, tokens: np.ndarray, parents: np.ndarray, out_argmax: np.ndarray,
               logits: np.ndarray | None = None) -> None:
        toks, pars = _as_i32(tokens), _as_i32(parents)
        if pars.size != toks.size or out_argmax.size < toks.size or out_argmax.dtype != np.int32:
            raise ValueError("verify: tokens, parents and out_argmax (int32) must have one length")
        lp, cap = _f32_or_null(logits)
        self._tree = None
        _check(lib().lb_verify(self._p(), _i32(toks), _i32(pars), toks.size, _i32(out_argmax), lp, cap))
        self._tree = toks.copy()

    def prefill_sampled(self, tokens, io: "SampleBuffers") -> int:
        """prefill with the sampling tail on the last token's row (io.rows(1) is filled)."""
        toks = _as_i32(tokens)
        self._journal_at_p(toks.tolist())
        _check(lib().lb_prefill_sampled(self._p(), _i32(toks), toks.size, _i32(self._next), io.struct(1)))
        return int(self._next[0])

    def verify_sampled(self, tokens: np.ndarray, parents: np.ndarray, out_argmax: np.ndarray,
                       io: "SampleBuffers") -> None:
        toks, pars = _as_i32(tokens), _as_i32(parents)
        if pars.size != toks.size or out_argmax.size < toks.size or out_argmax.dtype != np.int32:
            raise ValueError("verify: tokens, parents and out_argmax (int32) must have one length")
        self._tree = None
        _check(lib().lb_verify_sampled(self._p(), _i32(toks), _i32(pars), toks.size, _i32(out_argmax),
                                       io.struct(toks.size)))
        self._tree = toks.copy()

    def step_sampled(self, token: int, io: "SampleBuffers") -> int:
        """step with the sampling tail on its row (io row 0 is filled); returns the plain argmax."""
        self._journal_at_p([token])
        _check(lib().lb_step_sampled(self._p(), int(token), _i32(self._next), io.struct(1)))
        return int(self._next[0])

    def processed_row(self, row: int, out: np.ndarray) -> np.ndarray:
        lp, cap = _f32_or_null(out)
        _check(lib().lb_processed_row(self._p(), int(row), lp, cap))
        return out

    def commit(self, path) -> None:
        arr = _as_i32(path)
        tree = self._tree
        if tree is not None and arr.size and (arr.min() < 0 or arr.max() >= tree.size):
            tree = None  # a bad path: lb_commit refuses it and commits nothing
        self._journal_at_p(tree[arr].tolist() if tree is not None else [])
        _check(lib().lb_commit(self._p(), _i32(arr), arr.size))
        self._tree = None


    def state_save(self) -> np.ndarray:
        """The committed state as an opaque uint8 array (lb_state_save)."""
        size = ctypes.c_int64()
        _check(lib().lb_state_size(self._p(), ctypes.byref(size)))
        buf = np.empty(size.value, np.uint8)
        written = ctypes.c_int64()
        _check(lib().lb_state_save(self._p(), buf.ctypes.data_as(ctypes.c_void_p), buf.size, ctypes.byref(written)))
        return buf[: written.value]

    def state_load(self, blob: np.ndarray, tokens) -> None:
        """Load a state_save() blob taken when the caches held `tokens` (they become the journal)."""
        arr = np.ascontiguousarray(blob, dtype=np.uint8)
        _check(lib().lb_state_load(self._p(), arr.ctypes.data_as(ctypes.c_void_p), arr.size))
        self._journal[:] = [int(t) for t in tokens]

class SampleBuffers:
    """The lb_sampling of one request: its processing settings, seed and buffers for up to `max_rows` rows.

    Before a sampled call, set_history() gives the tokens before it (the penalty windows' start);
    the outputs land in cand_ids, cand_logits, row_max, row_lse, and the native draw's in drawn (the
    token, or -1: draw on the whole processed row) and uniforms.
    """

    def __init__(self, max_rows: int, *, temperature: float, repeat_penalty: float, presence_penalty: float,
                 frequency_penalty: float, n_candidates: int, penalty_last_n: int, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, seed: int = 0):
        self.max_rows = max_rows
        self.history = np.zeros(max(penalty_last_n - 1, 1), np.int32)  # the last N - 1 are all a window reads
        self.cand_ids = np.zeros((max_rows, n_candidates), np.int32)
        self.cand_logits = np.zeros((max_rows, n_candidates), np.float32)
        self.row_max = np.zeros(max_rows, np.float32)
        self.row_lse = np.zeros(max_rows, np.float32)
        self.drawn = np.full(max_rows, -1, np.int32)
        self.uniforms = np.zeros(max_rows, np.float64)
        s = self._struct = Sampling()
        s.temperature, s.repeat_penalty = temperature, repeat_penalty
        s.presence_penalty, s.frequency_penalty = presence_penalty, frequency_penalty
        s.top_k, s.top_p, s.min_p = top_k, top_p, min_p
        self.seed = seed
        s.n_candidates, s.penalty_last_n = n_candidates, penalty_last_n
        s.history = _i32(self.history)
        s.cand_ids = _i32(self.cand_ids)
        s.cand_logits = self.cand_logits.ctypes.data_as(_f32p)
        s.row_max = self.row_max.ctypes.data_as(_f32p)
        s.row_lse = self.row_lse.ctypes.data_as(_f32p)
        s.drawn = _i32(self.drawn)
        s.uniforms = self.uniforms.ctypes.data_as(_f64p)
        s.rows_cap = max_rows

    def set_history(self, tokens) -> None:
        """The tokens before the next sampled call's first one (a list, oldest first): its last
        penalty_last_n - 1 start every row's penalty window."""
        n = min(len(tokens), self._struct.penalty_last_n - 1)
        if n > 0:
            self.history[:n] = tokens[len(tokens) - n:]
        self._struct.n_history = max(n, 0)

    @property
    def seed(self) -> int:
        return int(self._struct.seed)

    @seed.setter
    def seed(self, value: int) -> None:
        self._struct.seed = int(value) & (2 ** 64 - 1)  # the draw's seed is its low 64 bits

    def struct(self, rows: int):
        if rows > self.max_rows:
            raise ValueError(f"{rows} rows but the sampling buffers hold {self.max_rows}")
        return ctypes.byref(self._struct)

    def draw(self, positions) -> None:
        """lb_sampling_draw: draw rows [0, len(positions)) again from the candidates these buffers
        hold, row r for position positions[r], into drawn and uniforms (e.g. with another seed)."""
        pos = np.ascontiguousarray(positions, dtype=np.int64)
        _check(lib().lb_sampling_draw(self.struct(pos.size), pos.size, pos.ctypes.data_as(_i64p)))
