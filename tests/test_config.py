"""Config dataclasses and the ctypes layer refuse absurd values with one-line ValueErrors that name
the field and its range (never a KeyError, a wrapped int32, or a huge allocation)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lucebox._native import Handle
from lucebox.config import MAX_DRAFT_TOP_K, EngineConfig, GenerationConfig, max_threads
from lucebox.engine import Engine


@pytest.mark.parametrize("field, value, words", [
    ("log_level", "loud", ["log_level", "quiet, error, info, debug"]),
    ("max_ctx", 2**31, ["max_ctx", "2147483648"]),
    ("max_ctx", 8, ["max_ctx"]),
    ("n_threads", 100000, ["n_threads", str(max_threads())]),
    ("n_threads", True, ["n_threads", "integer"]),
    ("ubatch", 2**40, ["ubatch"]),
    ("max_tree", 0, ["max_tree"]),
    ("device", 0, ["device"]),
    ("kv", "f8", ["kv"]),
])
def test_engine_config_rejects(field, value, words):
    with pytest.raises(ValueError) as err:
        EngineConfig(target="x.gguf", **{field: value})
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


@pytest.mark.parametrize("field, value, word", [
    ("draft_top_k", 2_000_000_000, "draft_top_k"), ("draft_top_k", MAX_DRAFT_TOP_K + 1, "draft_top_k"), ("budget", 10**6, "budget"),
    ("max_new_tokens", 0, "max_new_tokens"), ("max_new_tokens", 2.5, "max_new_tokens"),
    ("mode", "fast", "mode"), ("stop", [1, 2], "stop"),
])
def test_generation_config_rejects(field, value, word):
    with pytest.raises(ValueError, match=word):
        GenerationConfig(**{field: value})


def test_generation_config_takes_numpy_scalars_as_python_numbers():
    import numpy as np

    gen = GenerationConfig(temperature=np.float32(0.5), top_p=np.float64(0.9), top_k=np.int64(4), seed=np.uint64(7))
    assert (gen.temperature, gen.top_p, gen.top_k, gen.seed) == (0.5, 0.9, 4, 7)
    assert type(gen.temperature) is float and type(gen.top_k) is int and type(gen.seed) is int
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        GenerationConfig(temperature=np.float32("nan"))


def test_engine_options_checked_before_loading(tiny_gguf):
    with pytest.raises(ValueError, match="log_level"):
        Engine(tiny_gguf["f32"], log_level="loud")
    with pytest.raises(ValueError, match="max_ctx"):
        Engine(tiny_gguf["f32"], max_ctx=2**31)


@pytest.mark.parametrize("kw", [{"max_ctx": 2**31}, {"ubatch": -2**40}, {"log_level": "loud"}, {"n_threads": 1.5}])
def test_handle_params_never_wrap(tiny_gguf, kw):
    with pytest.raises(ValueError) as err:
        Handle(tiny_gguf["f32"], device=-1, **kw)
    assert next(iter(kw)) in str(err.value)


@pytest.mark.parametrize("content", [b"not a library\n", None])
def test_bad_lucebox_lib_names_the_variable(tmp_path, content):
    path = tmp_path / "liblucebox.so"
    if content is not None:
        path.write_bytes(content)
    env = dict(os.environ, LUCEBOX_LIB=str(path), PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    done = subprocess.run([sys.executable, "-c", "from lucebox._native import lib; lib()"],
                          capture_output=True, text=True, env=env)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and "LUCEBOX_LIB" in last and str(path) in last
