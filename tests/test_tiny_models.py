"""The tiny test models: built, shaped like the real files, and converted to the metadata lucebox reads."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from safetensors import safe_open

import tiny_models


def _kv(reader: GGUFReader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


@pytest.fixture(scope="module")
def hf_config(tiny_hf_dir) -> dict:
    return json.loads((tiny_hf_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def f32_reader(tiny_gguf) -> GGUFReader:
    return GGUFReader(tiny_gguf["f32"])


def test_target_structure_mirrors_qwen35(hf_config):
    types = hf_config["layer_types"]
    assert hf_config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert types.count("full_attention") >= 2
    assert all((t == "full_attention") == ((i + 1) % 4 == 0) for i, t in enumerate(types))
    assert hf_config["linear_num_value_heads"] > hf_config["linear_num_key_heads"]
    assert hf_config["tie_word_embeddings"] is False
    rope = hf_config["rope_parameters"]
    rot = int(hf_config["head_dim"] * rope["partial_rotary_factor"])
    assert 0 < rot < hf_config["head_dim"] and 2 * sum(rope["mrope_section"]) == rot


def test_target_weights_are_not_init_defaults(tiny_hf_dir, tiny_tokenizer):
    model = tiny_models.load_target(tiny_hf_dir)
    sd = model.state_dict()
    norm = sd["model.layers.0.input_layernorm.weight"]
    assert norm.abs().max() > 0 and norm.std() > 0  # exercises the converter's 1 + w rewrite
    assert sd["model.layers.0.linear_attn.A_log"].std() > 0
    assert sd["model.layers.0.linear_attn.dt_bias"].std() > 0
    ids = torch.tensor([tiny_tokenizer.encode("def add(a, b):\n    return a + b\n").ids])
    with torch.no_grad():
        logits = model(ids).logits[0]
    top2 = logits.topk(2, dim=-1).values
    # greedy comparisons need decisive argmaxes: most positions far from a tie
    assert (top2[:, 0] - top2[:, 1]).median() > 0.25


def test_gguf_metadata(f32_reader, hf_config, tiny_tokenizer):
    kv = _kv(f32_reader)
    assert kv["general.architecture"] == "qwen35"
    n_layer = hf_config["num_hidden_layers"]
    assert kv["qwen35.block_count"] == n_layer
    assert kv["qwen35.embedding_length"] == hf_config["hidden_size"]
    assert kv["qwen35.feed_forward_length"] == hf_config["intermediate_size"]
    assert kv["qwen35.attention.head_count"] == hf_config["num_attention_heads"]
    assert kv["qwen35.attention.head_count_kv"] == hf_config["num_key_value_heads"]
    assert kv["qwen35.attention.key_length"] == hf_config["head_dim"]
    assert kv["qwen35.attention.recurrent_layers"] == [t == "linear_attention" for t in hf_config["layer_types"]]
    rope = hf_config["rope_parameters"]
    assert kv["qwen35.rope.dimension_count"] == int(hf_config["head_dim"] * rope["partial_rotary_factor"])
    assert kv["qwen35.rope.dimension_sections"][:3] == rope["mrope_section"]
    assert kv["qwen35.ssm.conv_kernel"] == hf_config["linear_conv_kernel_dim"]
    assert kv["qwen35.ssm.state_size"] == hf_config["linear_key_head_dim"]
    assert kv["qwen35.ssm.group_count"] == hf_config["linear_num_key_heads"]
    assert kv["qwen35.ssm.time_step_rank"] == hf_config["linear_num_value_heads"]
    assert kv["qwen35.ssm.inner_size"] == hf_config["linear_value_head_dim"] * hf_config["linear_num_value_heads"]
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "qwen35"
    assert len(kv["tokenizer.ggml.tokens"]) == hf_config["vocab_size"]
    assert kv["tokenizer.ggml.eos_token_id"] == tiny_tokenizer.token_to_id("<|im_end|>")
    assert kv["tokenizer.chat_template"] == tiny_models.CHAT_TEMPLATE


def test_gguf_tensors(f32_reader, hf_config, tiny_hf_dir):
    tensors = {t.name: t for t in f32_reader.tensors}
    for i, kind in enumerate(hf_config["layer_types"]):
        names = {n.split(".", 2)[2] for n in tensors if n.startswith(f"blk.{i}.")}
        common = {"attn_norm.weight", "post_attention_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                  "ffn_down.weight"}
        if kind == "full_attention":
            own = {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                   "attn_q_norm.weight", "attn_k_norm.weight"}
        else:
            own = {"attn_qkv.weight", "attn_gate.weight", "ssm_conv1d.weight", "ssm_a", "ssm_dt.bias",
                   "ssm_alpha.weight", "ssm_beta.weight", "ssm_norm.weight", "ssm_out.weight"}
        assert names == common | own, f"layer {i} ({kind})"
    model = tiny_models.load_target(tiny_hf_dir)
    sd = model.state_dict()
    # the converter stores Qwen3.5's (1 + w) norms as plain multipliers
    np.testing.assert_allclose(np.asarray(tensors["blk.0.attn_norm.weight"].data),
                               sd["model.layers.0.input_layernorm.weight"].numpy() + 1, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(tensors["output.weight"].data), sd["lm_head.weight"].numpy())
    a = np.sort(np.asarray(tensors["blk.0.ssm_a"].data))  # -exp(A_log), V heads reordered
    np.testing.assert_allclose(a, np.sort(-np.exp(sd["model.layers.0.linear_attn.A_log"].numpy())), rtol=1e-6)


@pytest.mark.parametrize("outtype, weight_type", [("f16", GGMLQuantizationType.F16),
                                                  ("q8_0", GGMLQuantizationType.Q8_0)])
def test_gguf_outtypes(tiny_gguf, outtype, weight_type):
    reader = GGUFReader(tiny_gguf[outtype])
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert _kv(reader)["general.architecture"] == "qwen35"
    assert types["blk.0.ffn_up.weight"] == weight_type
    assert types["blk.3.attn_q.weight"] == weight_type
    assert types["blk.0.attn_norm.weight"] == GGMLQuantizationType.F32  # 1-D tensors stay f32


def test_draft_files_look_like_z_lab(tiny_draft_dirs, hf_config, tiny_tokenizer):
    for kind, path in tiny_draft_dirs.items():
        config = json.loads((path / "config.json").read_text())
        assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
        assert config["hidden_size"] == hf_config["hidden_size"]
        assert config["num_target_layers"] == hf_config["num_hidden_layers"]
        assert config["block_size"] == 16
        dcfg = config["dflash_config"]
        assert dcfg["mask_token_id"] == tiny_tokenizer.token_to_id(tiny_models.MASK_TOKEN)
        assert max(dcfg["target_layer_ids"]) < hf_config["num_hidden_layers"]
        assert len(config["layer_types"]) == config["num_hidden_layers"]
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            names = set(f.keys())
            fc = f.get_tensor("fc.weight")
        assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= names
        assert not any(n.startswith(("model.", "embed_tokens", "lm_head")) for n in names)  # uses the target's
        assert fc.dtype == (torch.float32 if kind == "f32" else torch.bfloat16)
        assert fc.shape == (config["hidden_size"], len(dcfg["target_layer_ids"]) * config["hidden_size"])
    sliding = json.loads((tiny_draft_dirs["sliding"] / "config.json").read_text())
    assert "sliding_attention" in sliding["layer_types"] and sliding["sliding_window"] > 0


def test_draft_loads_in_dflash(tiny_draft_dirs):
    for kind, path in tiny_draft_dirs.items():
        draft = tiny_models.load_draft(path)
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            expected = f.get_tensor("layers.0.self_attn.q_proj.weight").float()
        torch.testing.assert_close(draft.layers[0].self_attn.q_proj.weight, expected, rtol=0, atol=0)
        cfg = json.loads((path / "config.json").read_text())
        assert draft.target_layer_ids == cfg["dflash_config"]["target_layer_ids"]
        assert draft.mask_token_id == cfg["dflash_config"]["mask_token_id"]
        if kind == "sliding":
            assert draft.layers[0].self_attn.sliding_window == cfg["sliding_window"]


def test_bad_inputs_are_reported(tmp_path, tiny_hf_dir, tiny_gguf):
    with pytest.raises(ValueError, match="outtype"):
        tiny_models.convert(tiny_hf_dir, "q4_k")
    with pytest.raises(ValueError, match="target_layer_ids"):
        tiny_models.build_draft(tmp_path / "d", tiny_hf_dir, tiny_models.DraftSpec(target_layer_ids=(1, 99)))
    with pytest.raises(KeyError):
        tiny_gguf["q4_k"]
