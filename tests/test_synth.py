"""benchmarks/synth_target.py and synth_draft.py: the random 27B-shaped benchmark inputs.

The target is checked against the pinned converter's output for the tiny model (names, shapes,
metadata keys and value types) and against llama-quantize's Q4_K_M choices (the 27B counts below
were read from `llama-quantize ... Q4_K_M` run on a converter-made 64-layer + MTP model); the draft
against the `dflash` package's DFlashDraftModel.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

from benchmarks import synth_draft, synth_target  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
Q4_K, Q6_K, F32 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.F32


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def value_types(reader) -> dict[str, tuple[str, ...]]:
    return {k: tuple(gguf.GGUFValueType(t).name for t in f.types)
            for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def shape_of(reader) -> synth_target.Shape:
    """The synth Shape that describes a qwen35 GGUF, from its metadata only."""
    a = "qwen35."
    nextn = field(reader, a + "nextn_predict_layers") or 0
    return synth_target.Shape(
        n_layer=field(reader, a + "block_count") - nextn, n_embd=field(reader, a + "embedding_length"),
        n_ff=field(reader, a + "feed_forward_length"), n_head=field(reader, a + "attention.head_count"),
        n_head_kv=field(reader, a + "attention.head_count_kv"),
        head_dim=field(reader, a + "attention.key_length"),
        ssm_k_heads=field(reader, a + "ssm.group_count"), ssm_v_heads=field(reader, a + "ssm.time_step_rank"),
        ssm_head_dim=field(reader, a + "ssm.state_size"), d_conv=field(reader, a + "ssm.conv_kernel"),
        n_vocab=len(field(reader, "tokenizer.ggml.tokens")), rope_dim=field(reader, a + "rope.dimension_count"),
        full_attn_interval=field(reader, a + "full_attention_interval"), mtp=nextn > 0)


@pytest.fixture(scope="module")
def small_target(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "target.gguf"
    synth_target.write(str(out), synth_target.scaled_shape(0.05, 8, mtp=True), seed=1, threads=2, quiet=True)
    return out


def test_tensors_match_the_converter(tiny_gguf):
    real = gguf.GGUFReader(tiny_gguf["f32"])
    plan = synth_target.tensor_plan(shape_of(real))
    assert {t.name: t.ne for t in plan} == {t.name: tuple(int(n) for n in t.shape) for t in real.tensors}


def test_metadata_matches_the_converter(tiny_gguf, tmp_path):
    out = tmp_path / "t.gguf"
    synth_target.write(str(out), synth_target.scaled_shape(0.05, 8, mtp=False), seed=0, threads=1, quiet=True)
    real, mine = value_types(gguf.GGUFReader(tiny_gguf["f32"])), value_types(gguf.GGUFReader(out))
    assert set(mine) - set(real) == {"general.basename"}
    assert set(real) - set(mine) == set()
    assert {k: mine[k] for k in real} == real


def test_q4_k_m_mix_follows_llama_quantize():
    plan = synth_target.tensor_plan(synth_target.Shape(n_layer=8, mtp=True))
    types = {t.name: t.qtype for t in plan}
    # use_more_bits over 9 blocks (8 + MTP): blocks 0, 3, 6, 7, 8
    bumped = {int(n.split(".")[1]) for n, q in types.items()
              if q == Q6_K and re.search(r"\.(attn_v|attn_qkv|ffn_down)\.", n)}
    assert bumped == {0, 3, 6, 7, 8}
    assert types["output.weight"] == Q6_K and types["token_embd.weight"] == Q4_K
    for t in plan:
        assert (t.qtype == F32) == (len(t.ne) == 1 or "ssm_conv1d" in t.name), t.name
        if t.qtype != F32 and not re.search(r"^output\.|\.(attn_v|attn_qkv|ffn_down)\.", t.name):
            assert t.qtype == Q4_K, t.name


def test_27b_plan_is_the_real_q4_k_m_layout():
    plan = synth_target.tensor_plan(synth_target.scaled_shape(1.0, 64, mtp=True))
    counts = {q: sum(t.qtype == q for t in plan) for q in (Q4_K, Q6_K, F32)}
    assert (len(plan), counts[Q4_K], counts[Q6_K], counts[F32]) == (866, 439, 67, 360)
    assert sum(synth_target.nbytes(t) for t in plan) == 16_799_719_424
    no_mtp = synth_target.tensor_plan(synth_target.scaled_shape(1.0, 64, mtp=False))
    assert len(no_mtp) == 851 and not any(t.name.startswith("blk.64.") for t in no_mtp)


def test_mtp_block(small_target):
    r = gguf.GGUFReader(small_target)
    assert field(r, "qwen35.block_count") == 9 and field(r, "qwen35.nextn_predict_layers") == 1
    assert field(r, "qwen35.attention.recurrent_layers") == [True, True, True, False] * 2 + [False]
    mtp = {t.name.split(".", 2)[2] for t in r.tensors if t.name.startswith("blk.8.")}
    assert {"nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight",
            "nextn.shared_head_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
            "attn_output.weight", "ffn_down.weight"} <= mtp
    assert not any(n.startswith("ssm") for n in mtp)


def test_weights_are_finite_zero_mean_and_scaled(small_target):
    r = gguf.GGUFReader(small_target)
    by_name = {t.name: t for t in r.tensors}
    for name in ("blk.0.ffn_gate.weight", "blk.0.ffn_down.weight", "output.weight", "blk.3.attn_output.weight"):
        t = by_name[name]
        w = dequantize(np.asarray(t.data).reshape(-1), t.tensor_type)
        want = 1.0 / np.sqrt(int(t.shape[0]))
        assert np.isfinite(w).all(), name
        assert abs(w.mean()) < 0.05 * want and 0.9 * want < w.std() < 1.1 * want, name
    assert (np.asarray(by_name["blk.0.ssm_a"].data) < 0).all()
    assert np.isfinite(np.asarray(by_name["blk.0.ssm_conv1d.weight"].data)).all()


def test_tokenizer_is_a_consistent_bpe(small_target):
    tokenizers = pytest.importorskip("tokenizers")
    r = gguf.GGUFReader(small_target)
    tokens, merges = field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.merges")
    assert len(tokens) == len(set(tokens)) == int({t.name: t for t in r.tensors}["token_embd.weight"].shape[1])
    assert tokens[field(r, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    n = len(tokens)
    assert field(r, "tokenizer.ggml.eos_token_id") == n - 274  # 248046 at full size
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [tuple(m.split(" ")) for m in merges]))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    text = "Write a function that returns the n-th prime.\n"
    ids = bpe.encode(text).ids
    assert len(ids) < len(text) and bpe.decode(ids) == text


def test_generation_is_deterministic(tmp_path):
    shape = synth_target.scaled_shape(0.05, 1, mtp=False)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    synth_target.write(str(a), shape, seed=7, threads=1, quiet=True)
    synth_target.write(str(b), shape, seed=7, threads=3, quiet=True)
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("scale", [0.01, 0.05, 0.1, 0.37, 0.5, 1.0])
def test_scaled_shapes_stay_quantizable_and_match_the_draft(scale):
    shape = synth_target.scaled_shape(scale, 4, mtp=True)
    synth_target.check_quantizable(synth_target.tensor_plan(shape))
    assert shape.ssm_head_dim in (32, 64, 128) and shape.head_dim >= shape.rope_dim
    draft = synth_draft.scaled_shape(scale, 64, 0)
    assert (draft.hidden, draft.n_vocab) == (shape.n_embd, shape.n_vocab)


@pytest.mark.parametrize("script,args", [("synth_target.py", ["--scale", "0"]),
                                         ("synth_target.py", ["--layers", "0"]),
                                         ("synth_draft.py", ["--scale", "2"])])
def test_bad_options_fail_with_a_message(tmp_path, script, args):
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), "--out", str(tmp_path / "x"), *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2 and "must be" in done.stderr and "Traceback" not in done.stderr


# ---- draft -------------------------------------------------------------------------------------

def test_27b_draft_config():
    shape = synth_draft.DraftShape()
    cfg = synth_draft.config(shape)
    assert cfg["dflash_config"] == {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]}
    dims = (cfg["block_size"], cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_target_layers"])
    assert dims == (16, 5120, 5, 64)
    # the real BF16 file's size
    assert sum(2 * int(np.prod(s)) for _, s in synth_draft.tensors(shape)) == 3_460_426_240


def test_draft_loads_strictly_in_dflash(tmp_path, tiny_draft_dir):
    torch = pytest.importorskip("torch")
    dflash_model = pytest.importorskip("dflash.model")
    from safetensors.torch import load_file
    from transformers import Qwen3Config

    synth_draft.write(str(tmp_path), synth_draft.scaled_shape(0.05, 8, 2048), seed=3, threads=2, quiet=True)
    config = Qwen3Config.from_json_file(str(tmp_path / "config.json"))
    model = dflash_model.DFlashDraftModel(config).eval()
    weights = load_file(str(tmp_path / "model.safetensors"))
    model.load_state_dict(weights, strict=True)
    assert all(w.dtype == torch.bfloat16 for w in weights.values())
    assert model.target_layer_ids == [1, 2, 3, 4, 5] and model.block_size == 16
    assert config.layer_types == ["sliding_attention"] * 4 + ["full_attention"]

    hidden = config.hidden_size
    with torch.no_grad():
        out = model(position_ids=torch.arange(7 + 16)[None], target_hidden=torch.randn(1, 7, 5 * hidden),
                    noise_embedding=0.02 * torch.randn(1, 16, hidden))
    assert out.shape == (1, 16, hidden) and torch.isfinite(out).all()

    # same tensor names (layer index aside) as the tiny z-lab-style draft the other tests use
    def kinds(names):
        return {re.sub(r"^layers\.\d+\.", "layers.N.", n) for n in names}
    tiny = load_file(str(tiny_draft_dir / "model.safetensors"))
    assert kinds(weights) == kinds(tiny)
    tiny_cfg = json.loads((tiny_draft_dir / "config.json").read_text())
    assert set(tiny_cfg) - set(synth_draft.config(synth_draft.DraftShape())) <= {"bos_token_id", "dtype",
                                                                                 "transformers_version"}
