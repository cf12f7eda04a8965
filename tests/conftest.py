"""Session fixtures: the tiny random models of tests/tiny_models.py, built once per session.

Set LUCEBOX_TEST_CACHE=/some/dir to keep them across runs (rebuilt when tiny_models.py, the
converter wrapper or library versions change); otherwise they live in pytest's tmp dir.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

import tiny_models  # pytest puts tests/ on sys.path (rootdir conftest, default import mode)


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true",
                     help="long mode: thousands of fuzz cases (same as LUCEBOX_FUZZ_LONG=1)")


def pytest_configure(config):
    if config.getoption("--long"):
        os.environ["LUCEBOX_FUZZ_LONG"] = "1"  # read by test_fuzz.py and the soak test at import


class LazyGGUFs(Mapping):
    """outtype -> GGUF path; each outtype is converted on first access only."""

    def __init__(self, models: tiny_models.TinyModels):
        self._models = models

    def __getitem__(self, outtype: str) -> Path:
        if outtype not in tiny_models.OUTTYPES:
            raise KeyError(outtype)
        return self._models.gguf(outtype)

    def __iter__(self):
        return iter(tiny_models.OUTTYPES)

    def __len__(self) -> int:
        return len(tiny_models.OUTTYPES)


@pytest.fixture(scope="session")
def tiny_models_cache(tmp_path_factory) -> tiny_models.TinyModels:
    root = os.environ.get("LUCEBOX_TEST_CACHE")
    return tiny_models.TinyModels(Path(root) if root else tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def tiny_hf_dir(tiny_models_cache) -> Path:
    """HF folder of the tiny Qwen3.5 target: config.json, model.safetensors (f32), tokenizer files."""
    return tiny_models_cache.target_dir()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_hf_dir):
    """The tiny target's `tokenizers.Tokenizer` (from its tokenizer.json)."""
    return tiny_models.load_hf_tokenizer(tiny_hf_dir)


@pytest.fixture(scope="session")
def tiny_gguf(tiny_models_cache) -> LazyGGUFs:
    """Mapping outtype ('f32', 'f16', 'bf16', 'q8_0') -> GGUF path, converted on first use."""
    return LazyGGUFs(tiny_models_cache)


@pytest.fixture(scope="session")
def tiny_draft_dir(tiny_models_cache) -> Path:
    """z-lab-style DFlash draft (bf16, 2 full-attention layers) for the tiny target."""
    return tiny_models_cache.draft_dir("bf16")


@pytest.fixture(scope="session")
def tiny_draft_dirs(tiny_models_cache) -> dict[str, Path]:
    """All draft variants: 'bf16', 'f32' (same layout, f32 weights), 'sliding' (Qwen3.6-style
    sliding_attention + full_attention layers, window 8, bf16)."""
    return {kind: tiny_models_cache.draft_dir(kind) for kind in tiny_models.DRAFT_KINDS}


@pytest.fixture(scope="session")
def tiny_pair(tiny_gguf, tiny_draft_dir) -> tuple[Path, Path]:
    """(f32 target GGUF, bf16 draft dir): what an Engine loads."""
    return tiny_gguf["f32"], tiny_draft_dir
