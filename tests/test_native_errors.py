"""Every bad input to the native engine fails with its own status and a one-line message (no abort).

Broken GGUFs are made by patching the tiny F32 file's header bytes in place, so each file differs
from a good one in exactly the way the test names.
"""
from __future__ import annotations

import ctypes
import os
import struct
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from lucebox._native import Handle, NativeError, _check, _engine_p, _params, lib, memory_plan
from lucebox.config import MAX_TREE_LIMIT

DEVICE = 0 if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else -1

E_INVALID_ARG, E_IO, E_FORMAT, E_UNSUPPORTED, E_CONTEXT, E_STATE = -1, -2, -3, -4, -6, -9
GGML_TYPE_I32 = 26


def load_error(path, **kw) -> NativeError:
    kw.setdefault("device", DEVICE)
    with pytest.raises(NativeError) as info:
        Handle(path, **kw)
    err = info.value
    assert "\n" not in str(err) and str(err)
    return err


def patched(src: Path, dst: Path, edit) -> Path:
    data = bytearray(src.read_bytes())
    edit(data)
    dst.write_bytes(bytes(data))
    return dst


def tensor_info_at(data: bytearray, name: str) -> int:
    """Offset of the ggml type field in `name`'s GGUF tensor info (after name, n_dims, dims)."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.find(key)
    assert at > 0, name
    pos = at + len(key)
    n_dims = struct.unpack_from("<I", data, pos)[0]
    return pos + 4 + 8 * n_dims


@pytest.fixture(scope="module")
def good(tiny_gguf) -> Path:
    return tiny_gguf["f32"]


@pytest.fixture
def handle(good):
    with closing(Handle(good, max_ctx=64, max_tree=8, device=DEVICE)) as h:
        yield h


# --- loading ---------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    err = load_error(tmp_path / "nope.gguf")
    assert err.status == E_IO and "nope.gguf" in str(err)


def test_not_a_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("just some text, not a model\n")
    err = load_error(path)
    assert err.status == E_FORMAT and "not a GGUF" in str(err)


def test_truncated_gguf(good, tmp_path):
    data = good.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) * 2 // 3])
    err = load_error(path)
    assert err.status == E_FORMAT and "truncated" in str(err)


def test_truncated_header(good, tmp_path):
    path = tmp_path / "stub.gguf"
    path.write_bytes(good.read_bytes()[:100])
    err = load_error(path)
    assert err.status == E_FORMAT


def test_wrong_architecture(good, tmp_path):
    # same-length rename of the arch string and of every "qwen35." key: a well-formed GGUF of another arch
    path = patched(good, tmp_path / "arch.gguf", lambda d: d.__setitem__(slice(None), d.replace(b"qwen35", b"qwen99")))
    err = load_error(path)
    assert err.status == E_UNSUPPORTED and "qwen99" in str(err)


def test_missing_tensor(good, tmp_path):
    name = b"blk.3.attn_k.weight"
    path = patched(good, tmp_path / "missing.gguf",
                   lambda d: d.__setitem__(slice(None), d.replace(name, b"blk.3.attn_k.weighX")))
    err = load_error(path)
    assert err.status == E_FORMAT and "blk.3.attn_k.weight" in str(err)


def test_unsupported_tensor_type(good, tmp_path):
    # F32 -> I32 keeps every size and offset valid; lucebox cannot multiply by an integer matrix
    def edit(d):
        at = tensor_info_at(d, "blk.0.ffn_up.weight")
        assert struct.unpack_from("<I", d, at)[0] == 0
        struct.pack_into("<I", d, at, GGML_TYPE_I32)

    err = load_error(patched(good, tmp_path / "i32.gguf", edit))
    assert err.status == E_UNSUPPORTED and "blk.0.ffn_up.weight" in str(err)


def test_bad_params(good):
    err = load_error(good, max_tree=0)
    assert err.status == E_INVALID_ARG and "max_tree" in str(err)
    err = load_error(good, max_ctx=0)
    assert err.status == E_INVALID_ARG and "max_ctx" in str(err)


@pytest.mark.skipif(DEVICE < 0, reason="a CUDA limit: the CPU's attention takes any context")
def test_context_beyond_the_attention_reach(good):
    # 2^24 tokens pass the argument check but are more key rows than the batch-invariant attention's merge
    # holds (~5.9M on an H100): refused at load, naming the most it takes, before any cache is allocated
    err = load_error(good, max_ctx=1 << 24)
    assert err.status == E_UNSUPPORTED and "batch-invariant attention" in str(err) and "lower max_ctx" in str(err)
    most = int(str(err).split(" takes (")[1].split(" tokens)")[0])
    assert 1 << 20 < most < 1 << 24 and most % 256 == 0
    # the memory plan refuses it alike (no context is laid out)
    with pytest.raises(NativeError) as info:
        memory_plan(good, max_ctx=1 << 24, device=DEVICE, verify_nodes=8, draft_top_k=8)
    assert info.value.status == E_UNSUPPORTED and str(info.value) == str(err)


def test_bad_draft_weights(good):
    with pytest.raises(ValueError, match="draft_weights must be one of keep, q8_0; got 'q4'"):
        Handle(good, draft_weights="q4", device=DEVICE)
    # past the Python mirror: the library's own check, one line
    params = _params(good, max_ctx=64, device=DEVICE)
    params.draft_weights = 7
    with pytest.raises(NativeError) as info:
        _check(lib().lb_load(ctypes.byref(params), ctypes.byref(_engine_p())))
    assert info.value.status == E_INVALID_ARG and "draft_weights must be LB_DRAFT_WEIGHTS_KEEP (0) or" in str(info.value)
    assert "\n" not in str(info.value)


def test_tree_limit_is_the_native_one(good):
    # config.MAX_TREE_LIMIT (what EngineConfig and the CLI accept) mirrors native kMaxTreeLimit:
    # the library loads with it and refuses one node more
    with closing(Handle(good, max_ctx=64, max_tree=MAX_TREE_LIMIT, device=DEVICE)) as h:
        assert h.info()["max_tree"] == MAX_TREE_LIMIT
    err = load_error(good, max_tree=MAX_TREE_LIMIT + 1)
    assert err.status == E_INVALID_ARG
    assert f"max_tree {MAX_TREE_LIMIT + 1} is out of range [1, {MAX_TREE_LIMIT}]" in str(err)


def test_missing_draft_folder(good, tmp_path):
    err = load_error(good, draft_path=str(tmp_path / "no-draft"))
    assert err.status == E_IO and "no-draft" in str(err)


def test_draft_without_draft(handle):
    ids, logp = np.zeros((15, 4), dtype=np.int32), np.zeros((15, 4), dtype=np.float32)
    with pytest.raises(NativeError) as info:
        handle.draft(1, ids, logp)
    assert info.value.status == E_STATE and "draft" in str(info.value)


# --- calls -----------------------------------------------------------------------------------

def test_prompt_beyond_max_ctx(handle):
    with pytest.raises(NativeError) as info:
        handle.prefill(np.zeros(65, dtype=np.int32))
    assert info.value.status == E_CONTEXT and "max_ctx" in str(info.value)
    assert handle.info()["n_past"] == 0  # nothing was fed
    handle.prefill(np.zeros(60, dtype=np.int32))
    with pytest.raises(NativeError) as info:
        handle.verify(np.zeros(5, dtype=np.int32), np.arange(-1, 4, dtype=np.int32), np.zeros(5, dtype=np.int32))
    assert info.value.status == E_CONTEXT
    for _ in range(4):
        handle.step(1)
    with pytest.raises(NativeError) as info:
        handle.step(1)
    assert info.value.status == E_CONTEXT


def test_token_outside_vocab(handle):
    n_vocab = handle.info()["n_vocab"]
    for bad in (-1, n_vocab):
        with pytest.raises(NativeError) as info:
            handle.prefill(np.array([1, bad], dtype=np.int32))
        assert info.value.status == E_INVALID_ARG and "vocabulary" in str(info.value)


@pytest.mark.parametrize("parents", [[0, 0], [-1, 1], [-1, 2, 0], [-1, -1], [-1, 0, 0, 0, 0, 0, 0, 0, 0]])
def test_invalid_tree(handle, parents):
    handle.prefill(np.array([1, 2, 3], dtype=np.int32))
    n = len(parents)
    with pytest.raises(NativeError) as info:
        handle.verify(np.ones(n, dtype=np.int32), np.array(parents, dtype=np.int32), np.zeros(n, dtype=np.int32))
    assert info.value.status == E_INVALID_ARG


def test_commit_without_verify(handle):
    handle.prefill(np.array([1, 2, 3], dtype=np.int32))
    with pytest.raises(NativeError) as info:
        handle.commit(np.array([0], dtype=np.int32))
    assert info.value.status == E_STATE and "lb_verify" in str(info.value)


def test_commit_checks_path_and_is_single_use(handle):
    handle.prefill(np.array([1, 2, 3], dtype=np.int32))
    toks, parents = np.array([4, 5, 6], dtype=np.int32), np.array([-1, 0, 0], dtype=np.int32)
    handle.verify(toks, parents, np.zeros(3, dtype=np.int32))
    for bad in ([1], [0, 1, 2], [0, 3], [0, 0]):
        with pytest.raises(NativeError) as info:
            handle.commit(np.array(bad, dtype=np.int32))
        assert info.value.status == E_INVALID_ARG
    handle.commit(np.array([0, 2], dtype=np.int32))
    assert handle.info()["n_past"] == 5
    with pytest.raises(NativeError) as info:
        handle.commit(np.array([0], dtype=np.int32))
    assert info.value.status == E_STATE


def test_logits_buffer_too_small(handle):
    small = np.zeros(handle.info()["n_vocab"], dtype=np.float32)
    with pytest.raises(NativeError) as info:
        handle.prefill(np.array([1, 2], dtype=np.int32), small)
    assert info.value.status == E_INVALID_ARG and "logits" in str(info.value)


def test_engine_still_works_after_errors(handle):
    with pytest.raises(NativeError):
        handle.prefill(np.array([-5], dtype=np.int32))
    nxt = handle.prefill(np.array([1, 2, 3], dtype=np.int32))
    assert 0 <= nxt < handle.info()["n_vocab"]


# --- hostile values (issue 15): each a clean error at load, never an abort at the first forward ------

def _retyped(good: Path, dst: Path, key: str, vtype: int, value, sub_type=None) -> Path:
    import fuzz_files as ff

    g = ff.Gguf.read(good)
    g.set(key, vtype, value, sub_type)
    dst.write_bytes(g.to_bytes())
    return dst


@pytest.mark.parametrize("eps", [-1e-6, float("-inf"), float("nan"), float("inf"), 0.0, 2147483647.0])
def test_rms_eps_out_of_range(good, tmp_path, eps):
    import fuzz_files as ff

    path = _retyped(good, tmp_path / "eps.gguf", "qwen35.attention.layer_norm_rms_epsilon", ff.F32, eps)
    err = load_error(path)
    assert err.status == E_FORMAT and "layer_norm_rms_epsilon" in str(err)


@pytest.mark.parametrize("key", ["qwen35.rope.dimension_sections", "qwen35.attention.head_count",
                                 "qwen35.attention.recurrent_layers", "qwen35.feed_forward_length"])
def test_integer_key_stored_as_strings(good, tmp_path, key):
    import fuzz_files as ff

    path = _retyped(good, tmp_path / "strs.gguf", key, ff.ARRAY, ["3", "3", "2", "0"], ff.STRING)
    err = load_error(path)
    assert err.status == E_FORMAT and key in str(err)


@pytest.mark.parametrize("key, value", [("qwen35.attention.head_count", 0), ("qwen35.attention.head_count_kv", 3),
                                        ("qwen35.embedding_length", 2**31 - 1), ("qwen35.block_count", 100000),
                                        ("qwen35.ssm.conv_kernel", 1), ("qwen35.rope.dimension_count", 2**31 - 1)])
def test_dimension_out_of_range(good, tmp_path, key, value):
    import fuzz_files as ff

    err = load_error(_retyped(good, tmp_path / "dim.gguf", key, ff.U32, value))
    assert err.status in (E_FORMAT, E_UNSUPPORTED)


def test_rope_sections_beyond_the_rotary_pairs(good, tmp_path):
    import fuzz_files as ff

    path = _retyped(good, tmp_path / "rope.gguf", "qwen35.rope.dimension_sections", ff.ARRAY, [3, 3, 2**31 - 1, 0], ff.I32)
    err = load_error(path)
    assert err.status == E_FORMAT and "dimension_sections" in str(err)


def test_thread_count_bounded(good):
    err = load_error(good, n_threads=100000)
    assert err.status == E_INVALID_ARG and "n_threads" in str(err)


# --- drafts ----------------------------------------------------------------------------------

def _draft_copy(src: Path, dst: Path, **config_edits) -> Path:
    import json
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in config_edits.items():
        (cfg["dflash_config"] if key in cfg["dflash_config"] else cfg)[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("edit, word", [
    ({"rms_norm_eps": 2147483647}, "rms_norm_eps"), ({"rms_norm_eps": -1}, "rms_norm_eps"),
    ({"target_layer_ids": [1, 1, 1]}, "twice"), ({"target_layer_ids": [1, 3, 9]}, "target_layer_ids"),
    ({"target_layer_ids": [1, 3]}, "fc.weight"), ({"block_size": 4096}, "block_size"),
    ({"block_size": 1}, "block_size"), ({"num_hidden_layers": 2**20}, "num_hidden_layers"),
    ({"num_attention_heads": "4"}, "num_attention_heads"), ({"head_dim": 64.0}, "head_dim")])
def test_draft_config_values(good, tiny_draft_dir, tmp_path, edit, word):
    err = load_error(good, draft_path=str(_draft_copy(tiny_draft_dir, tmp_path / "d", **edit)))
    assert err.status in (E_FORMAT, -5) and word in str(err)


@pytest.mark.parametrize("delta", [-1, 1, -8, 8])
def test_safetensors_header_length_off(good, tiny_draft_dir, tmp_path, delta):
    # every tensor's bytes shift by delta: the data no longer tiles the file exactly
    d = _draft_copy(tiny_draft_dir, tmp_path / "d")
    data = bytearray((d / "model.safetensors").read_bytes())
    (n,) = struct.unpack_from("<Q", data, 0)
    struct.pack_into("<Q", data, 0, n + delta)
    (d / "model.safetensors").write_bytes(bytes(data))
    err = load_error(good, draft_path=str(d))
    assert err.status == E_FORMAT and "model.safetensors" in str(err)


def test_messages_quoting_file_strings_stay_one_line(good, tmp_path):
    import fuzz_files as ff

    err = load_error(_retyped(good, tmp_path / "nl.gguf", "general.architecture", ff.STRING, "qwen\n35\r"))
    assert err.status == E_UNSUPPORTED and "qwen?35?" in str(err)
