"""The native DFlash draft (native/src/draft_*.cpp, driven by the draft_check tool) against the `dflash`
package's DFlashDraftModel on the same inputs; its load errors; and tests/draft_reference.py."""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import draft_reference as ref

ROOT = Path(__file__).resolve().parent.parent
ON_GPU = os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda"
# LUCEBOX_LIB=... is the dev setup; tests/run.sh also sets LUCEBOX_TOOLS_DIR.
TOOLS = Path(os.environ.get("LUCEBOX_TOOLS_DIR") or Path(os.environ.get("LUCEBOX_LIB", ROOT / "build/cpu/x")).parent)

# LB_E_* (native/include/lucebox.h)
E_INVALID_ARG, E_IO, E_FORMAT, E_UNSUPPORTED, E_MISMATCH = -1, -2, -3, -4, -5

LAYER_IDS = [1, 3, 5]


@dataclass
class Target:
    gguf: Path
    embed: np.ndarray   # [V, E] token embedding, as the native side reads it
    output: np.ndarray  # [V, E] output matrix
    n_layer: int

    @property
    def vocab(self) -> int:
        return self.output.shape[0]

    @property
    def n_embd(self) -> int:
        return self.output.shape[1]


@pytest.fixture(scope="module")
def target(tiny_gguf) -> Target:
    # The draft borrows the target's embedding and output matrix: take them from the GGUF itself.
    from gguf import GGUFReader

    path = tiny_gguf["f32"]
    reader = GGUFReader(path)
    tensors = {t.name: np.array(t.data, np.float32) for t in reader.tensors
               if t.name in ("token_embd.weight", "output.weight")}
    n_layer = int(reader.fields["qwen35.block_count"].contents())
    return Target(path, tensors["token_embd.weight"], tensors["output.weight"], n_layer)


def make_draft(path: Path, target: Target, layer_types: list[str], window: int | None = None, seed: int = 1,
               **config) -> Path:
    """A DFlash draft for `target` built with dflash's own model and saved like z-lab's
    (config.json + BF16 safetensors). Unit-scale weights keep logits well separated."""
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    dflash = {"mask_token_id": target.vocab - 1, "target_layer_ids": LAYER_IDS, "block_size": 8}
    dflash.update(config.pop("dflash_config", {}))
    shard = config.pop("max_shard_size", None)
    sizes = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96}
    sizes.update(config)
    cfg = Qwen3Config(hidden_size=target.n_embd, num_hidden_layers=len(layer_types), vocab_size=target.vocab,
                      layer_types=layer_types, use_sliding_window=window is not None, sliding_window=window,
                      num_target_layers=target.n_layer, rope_theta=1e6, architectures=["DFlashDraftModel"],
                      dflash_config=dflash, **sizes)
    torch.manual_seed(seed)
    model = DFlashDraftModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
            else:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    kwargs = {"max_shard_size": shard} if shard else {}
    model.to(torch.bfloat16).save_pretrained(str(path), **kwargs)
    return path


FULL = ["full_attention"] * 3
SLIDING = ["sliding_attention", "sliding_attention", "full_attention"]  # the Qwen3.6 draft's pattern

# Context grows past the window (6) so the sliding layers really cut; features arrive both from
# host memory and as a device tensor gathered by row (a verify tree's accepted path).
SCRIPT = [("append", 13), ("propose", 7, 4), ("append", 3), ("propose", 9, 4), ("append", 1),
          ("propose", 2, 8), ("append", 9), ("propose", 100, 3), ("append_rows", [2, 0, 5], 6),
          ("propose", 3, 4), ("propose", 3, 5)]


def features(target: Target, n: int = 64, seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, len(LAYER_IDS) * target.n_embd)).astype(np.float32)


def block_size(draft: Path) -> int:
    cfg = json.loads((draft / "config.json").read_text())
    return int(cfg["dflash_config"].get("block_size", cfg.get("block_size", 16)))


def run_tool(tmp: Path, draft: Path, target: Target, script=SCRIPT, feats=None, *, wtype="f32", kv="f32",
             ctx=4096, attn="auto", check=True):
    """Runs draft_check; returns ([(ids, logp) per propose], completed process)."""
    exe = TOOLS / "draft_check"
    if not exe.exists():
        pytest.fail(f"{exe} is missing: build the tools (cmake --build build/cpu) or set LUCEBOX_TOOLS_DIR")
    lines = []
    for cmd in script:
        if cmd[0] == "append":
            lines.append(f"append {cmd[1]}")
        elif cmd[0] == "append_rows":
            lines.append(f"append_rows {len(cmd[1])} {cmd[2]} " + " ".join(map(str, cmd[1])))
        else:
            lines.append(f"propose {cmd[1]} {cmd[2]}")
    (tmp / "script.txt").write_text("\n".join(lines) + "\n")
    (features(target) if feats is None else feats).tofile(tmp / "feats.bin")
    out = tmp / "out.bin"
    proc = subprocess.run([str(exe), "run", "--draft", str(draft), "--target", str(target.gguf),
                           "--script", str(tmp / "script.txt"), "--features", str(tmp / "feats.bin"),
                           "--out", str(out), "--wtype", wtype, "--kv", kv, "--ctx", str(ctx), "--attn", attn,
                           "--threads", "2", "--device", "0" if ON_GPU else "-1"],
                          capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    results = []
    if proc.returncode == 0:
        raw = out.read_bytes()
        off, rows = 0, block_size(draft) - 1
        for cmd in script:
            if cmd[0] == "propose":
                n = rows * cmd[2]
                ids = np.frombuffer(raw, np.int32, n, off).reshape(rows, -1)
                logp = np.frombuffer(raw, np.float32, n, off + 4 * n).reshape(rows, -1)
                results.append((ids, logp))
                off += 8 * n
    return results, proc


def run_reference(draft: Path, target: Target, script=SCRIPT, feats=None):
    feats = features(target) if feats is None else feats
    dref = ref.DraftReference(ref.load_draft(draft), torch.from_numpy(target.embed), torch.from_numpy(target.output))
    results, pos = [], 0
    for cmd in script:
        if cmd[0] == "append":
            dref.append(feats[pos:pos + cmd[1]])
            pos += cmd[1]
        elif cmd[0] == "append_rows":
            dref.append(feats[pos:pos + cmd[2]][cmd[1]])
            pos += cmd[2]
        else:
            results.append(dref.propose(cmd[1], cmd[2]))
    return results


# ggml's CUDA kernels do not keep full f32 precision (tensor-core matmuls, f16 inside flash
# attention): on the GPU, log-probs agree to ~1e-2 and only near-ties may reorder.
TOL, TIE = (3e-2, 3e-2) if ON_GPU else (1e-3, 1e-4)


def assert_same(got, want, tol=TOL, tie=TIE):
    """Same ids in the same order and log-probs within tol; where the reference's neighbouring
    log-probs are closer than `tie`, rounding may swap the order, and only that is allowed."""
    assert len(got) == len(want)
    for (gi, gl), (wi, wl) in zip(got, want):
        np.testing.assert_allclose(gl, wl, atol=tol, rtol=0)
        gaps = np.abs(np.diff(wl, axis=1))
        near_tie = np.zeros(wl.shape, bool)
        near_tie[:, 1:] |= gaps < tie
        near_tie[:, :-1] |= gaps < tie
        differ = gi != wi
        assert not (differ & ~near_tie).any(), f"ids differ away from ties:\n{gi}\n{wi}"


# ---- parity with dflash ------------------------------------------------------------------------

@pytest.mark.parametrize("attn", ["flash", "plain"])
@pytest.mark.parametrize("kind", ["f32", "sliding"], ids=["all-full", "sliding+full"])
def test_draft_matches_dflash(tmp_path, target, tiny_draft_dirs, kind, attn):
    # the shared tiny drafts: Qwen3.5 layout (all full attention, non-causal) and Qwen3.6 layout
    # (causal sliding window 8 + full attention), block size 16; both attention kernels
    draft = tiny_draft_dirs[kind]
    got, _ = run_tool(tmp_path, draft, target, attn=attn)
    assert_same(got, run_reference(draft, target))


@pytest.fixture(scope="module")
def big_vocab_target(tmp_path_factory, target) -> Target:
    """A target with 5000 tokens (the top-k then runs in stages, and the log-softmax sums a row in two parts) and
    head-dim-64-friendly width: just the two matrices the draft borrows, in a GGUF."""
    import gguf

    rng = np.random.default_rng(3)
    vocab, n_embd = 5000, 128
    embed = rng.standard_normal((vocab, n_embd)).astype(np.float32)
    output = (rng.standard_normal((vocab, n_embd)) * 0.3).astype(np.float32)
    path = tmp_path_factory.mktemp("big") / "target.gguf"
    w = gguf.GGUFWriter(str(path), "qwen35")
    w.add_block_count(target.n_layer)
    w.add_tensor("token_embd.weight", embed)
    w.add_tensor("output.weight", output)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Target(path, embed, output, target.n_layer)


@pytest.mark.parametrize("k", [8, 400])
def test_large_draft_and_vocab(tmp_path, big_vocab_target, k):
    # head_dim 64 (a flash-attention size on CUDA too) and a vocabulary over the top-k chunk
    tgt = big_vocab_target
    draft = make_draft(tmp_path / "draft", tgt, SLIDING, 6, head_dim=64)
    script = [("append", 11), ("propose", 7, k), ("append", 2), ("propose", 4999, k)]
    got, _ = run_tool(tmp_path, draft, tgt, script)
    assert_same(got, run_reference(draft, tgt, script))


@pytest.mark.parametrize("layers,window", [(FULL, None), (SLIDING, 6)], ids=["all-full", "sliding+full"])
def test_dflash_built_draft_matches(tmp_path, target, layers, window):
    # drafts written by dflash's own DFlashDraftModel.save_pretrained (rope_parameters, dflash_config)
    draft = make_draft(tmp_path / "draft", target, layers, window)
    got, _ = run_tool(tmp_path, draft, target)
    assert_same(got, run_reference(draft, target))


def test_graphs_are_reused_while_their_shape_holds(tmp_path, target, tiny_draft_dirs):
    # A call uploads its inputs into the cached graph of its shape (GraphSlot, backend.hpp); a graph is
    # built only for a new shape: an append size, or the propose's attended rows (every 256) or top_k.
    draft = tiny_draft_dirs["sliding"]
    script = [("append", 13),                                   # append graph for 13 tokens
              ("propose", 7, 4), ("propose", 7, 4),             # propose graph (16 + 13 rows -> 256)
              ("append", 1), ("propose", 9, 4),                 # append graph for 1 token
              ("append", 1), ("propose", 2, 4),                 # both reused
              ("propose", 2, 5),                                # top_k 5: propose graph again
              ("append", 40), ("append", 40),                   # one graph for chunks over a block
              ("propose", 3, 5),                                # reused: 95 + 16 rows still pad to 256
              ("append", 250), ("propose", 4, 5)]               # larger chunk and 345 + 16 -> 512 rows
    feats = features(target, n=13 + 1 + 1 + 40 + 40 + 250)
    got, proc = run_tool(tmp_path, draft, target, script, feats)
    # 13 tokens, propose (K 4), 1 token, propose (K 5), 40 tokens, 250 tokens, propose (512 rows)
    assert "draft graph builds: 7\n" in proc.stdout
    np.testing.assert_array_equal(got[0][0], got[1][0])  # a reused graph computes the same bits
    np.testing.assert_array_equal(got[0][1], got[1][1])
    assert_same(got, run_reference(draft, target, script, feats))


def test_window_and_causality_come_from_config(tmp_path, target):
    # Guards the parity test above: the same weights read with another window must disagree.
    draft = make_draft(tmp_path / "draft", target, SLIDING, 6)
    want = run_reference(draft, target)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["sliding_window"] = 64
    (draft / "config.json").write_text(json.dumps(cfg))
    got, _ = run_tool(tmp_path, draft, target)
    assert any(not np.array_equal(g[0], w[0]) for g, w in zip(got, want))


def test_non_causal_sliding_layers(tmp_path, target):
    # is_causal: false overrides sliding layers' causality (windowed both ways), as in dflash.
    draft = make_draft(tmp_path / "draft", target, SLIDING, 6, is_causal=False)
    got, _ = run_tool(tmp_path, draft, target)
    assert_same(got, run_reference(draft, target))


def test_sharded_checkpoint_loads(tmp_path, target):
    draft = make_draft(tmp_path / "draft", target, FULL, max_shard_size="60KB")
    assert (draft / "model.safetensors.index.json").exists()
    got, _ = run_tool(tmp_path, draft, target)
    assert_same(got, run_reference(draft, target))


def test_ring_context_is_exact_when_only_windowed_layers_read_it(tmp_path, target):
    # A context ring of 8 slots holds every token a window-6 layer can see.
    draft = make_draft(tmp_path / "draft", target, ["sliding_attention"] * 2, 6)
    got, _ = run_tool(tmp_path, draft, target, ctx=8)
    assert_same(got, run_reference(draft, target))


def test_reduced_precision_stays_close(tmp_path, target):
    draft = make_draft(tmp_path / "draft", target, SLIDING, 6)
    want = run_reference(draft, target)
    got, _ = run_tool(tmp_path, draft, target, wtype="f32", kv="f16")
    assert_same(got, want, tol=max(TOL, 3e-2))
    got, _ = run_tool(tmp_path, draft, target, wtype="keep", kv="f16")  # BF16 matrices as shipped
    for (gi, gl), (wi, wl) in zip(got, want):
        np.testing.assert_array_equal(gi[:, 0], wi[:, 0])
        np.testing.assert_allclose(gl, wl, atol=0.2, rtol=0)


def test_mixed_dtypes_split_the_stacked_matrices(tmp_path, target):
    # matrices that share an input (q|k|v, gate|up) are stacked only when their storage types
    # agree: F32 members among BF16 ones (kept as shipped) run as products of their own
    from safetensors.torch import load_file, save_file

    draft = make_draft(tmp_path / "draft", target, SLIDING, 6)
    tensors = load_file(str(draft / "model.safetensors"))
    for name in ("layers.0.self_attn.k_proj.weight", "layers.0.mlp.up_proj.weight"):
        tensors[name] = tensors[name].float()
    save_file(tensors, str(draft / "model.safetensors"))
    want = run_reference(draft, target)
    got, _ = run_tool(tmp_path, draft, target, wtype="keep")
    for (gi, gl), (wi, wl) in zip(got, want):
        np.testing.assert_array_equal(gi[:, 0], wi[:, 0])
        np.testing.assert_allclose(gl, wl, atol=0.2, rtol=0)


# ---- bad input --------------------------------------------------------------------------------

def edit_config(draft: Path, **changes) -> None:
    """Sets config.json keys (None deletes); "dflash_<key>" addresses dflash_config's <key>."""
    cfg = json.loads((draft / "config.json").read_text())
    for key, value in changes.items():
        obj = cfg
        if key.startswith("dflash_") and key != "dflash_config":
            obj, key = cfg["dflash_config"], key[len("dflash_"):]
        if value is None:
            obj.pop(key, None)
        else:
            obj[key] = value
    (draft / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def good_draft(tmp_path_factory, target) -> Path:
    return make_draft(tmp_path_factory.mktemp("good") / "draft", target, SLIDING, 6)


def copy_draft(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.parametrize("changes,status,words", [
    ({"dflash_config": None}, E_FORMAT, "dflash_config"),
    ({"dflash_mask_token_id": None}, E_FORMAT, "mask_token_id"),
    ({"hidden_size": 32}, E_MISMATCH, "hidden_size is 32"),
    ({"vocab_size": 100000}, E_MISMATCH, "vocab_size 100000"),
    ({"num_target_layers": 99}, E_MISMATCH, "99-layer target"),
    ({"dflash_mask_token_id": 100000}, E_MISMATCH, "mask_token_id 100000"),
    ({"dflash_target_layer_ids": [1, 3, 99]}, E_MISMATCH, "target_layer_ids entry 99"),
    ({"intermediate_size": 100}, E_FORMAT, "mlp.gate_proj.weight"),
    ({"num_key_value_heads": 3}, E_FORMAT, "multiple of num_key_value_heads"),
    ({"layer_types": ["full_attention"]}, E_FORMAT, "layer_types"),
    ({"architectures": ["DFlash2DraftModel"]}, E_UNSUPPORTED, "DFlash2"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, E_UNSUPPORTED, "yarn"),
    ({"hidden_act": "gelu"}, E_UNSUPPORTED, "silu"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_config_is_a_clear_error(tmp_path, target, good_draft, changes, status, words):
    draft = copy_draft(good_draft, tmp_path / "draft")
    edit_config(draft, **changes)
    _, proc = run_tool(tmp_path, draft, target, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error {status}: ") and words in proc.stderr, proc.stderr


@pytest.mark.parametrize("text, words", [
    (b'{"hidden_size": 64,}', "invalid JSON at byte 20"),        # trailing comma
    (b'{"hidden_size": NaN}', "invalid JSON at byte 17"),
    (b'{"a": "\xff"}', "invalid JSON at byte"),                  # not UTF-8
    (b'{"a": ' + b"[" * 200 + b"]" * 200 + b"}", "nesting deeper than 128"),
    (b'{"a": 1} {}', "invalid JSON at byte"),                   # two documents
])
def test_bad_json_is_one_line(tmp_path, target, good_draft, text, words):
    draft = copy_draft(good_draft, tmp_path / "draft")
    (draft / "config.json").write_bytes(text)
    _, proc = run_tool(tmp_path, draft, target, check=False)
    assert proc.stderr.startswith(f"error {E_FORMAT}: ") and words in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_missing_files(tmp_path, target, good_draft):
    _, proc = run_tool(tmp_path, tmp_path / "nowhere", target, check=False)
    assert proc.stderr.startswith(f"error {E_IO}: ") and "config.json" in proc.stderr

    draft = copy_draft(good_draft, tmp_path / "no_weights")
    (draft / "model.safetensors").unlink()
    _, proc = run_tool(tmp_path, draft, target, check=False)
    assert proc.stderr.startswith(f"error {E_IO}: ") and "model.safetensors" in proc.stderr


def test_corrupt_safetensors(tmp_path, target, good_draft):
    from safetensors.torch import load_file, save_file

    draft = copy_draft(good_draft, tmp_path / "draft")
    weights = draft / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # truncated download
    _, proc = run_tool(tmp_path, draft, target, check=False)
    assert proc.stderr.startswith(f"error {E_FORMAT}: ") and "outside the file" in proc.stderr

    tensors = load_file(str(good_draft / "model.safetensors"))
    del tensors["layers.1.self_attn.k_norm.weight"]
    save_file(tensors, str(weights))
    _, proc = run_tool(tmp_path, draft, target, check=False)
    assert proc.stderr.startswith(f"error {E_FORMAT}: ") and "layers.1.self_attn.k_norm.weight" in proc.stderr

    tensors = load_file(str(good_draft / "model.safetensors"))
    tensors["fc.weight"] = tensors["fc.weight"].to(torch.float8_e4m3fn)
    save_file(tensors, str(weights))
    _, proc = run_tool(tmp_path, draft, target, check=False)
    assert proc.stderr.startswith(f"error {E_UNSUPPORTED}: ") and "F8_E4M3" in proc.stderr


@pytest.mark.parametrize("beyond", [False, True], ids=["zero", "vocab+1"])
def test_top_k_outside_vocab_is_rejected(tmp_path, target, good_draft, beyond):
    k = target.vocab + 1 if beyond else 0
    _, proc = run_tool(tmp_path, good_draft, target, [("append", 3), ("propose", 1, k)], check=False)
    assert proc.stderr.startswith(f"error {E_INVALID_ARG}: ") and "top_k" in proc.stderr


def test_top_k_equal_to_vocab_is_a_full_sort(tmp_path, target, good_draft):
    got, _ = run_tool(tmp_path, good_draft, target, [("append", 3), ("propose", 1, target.vocab)])
    ids, logp = got[0]
    assert (np.sort(ids, axis=1) == np.arange(target.vocab)).all()
    assert (np.diff(logp, axis=1) <= 0).all()
    np.testing.assert_allclose(np.exp(logp.astype(np.float64)).sum(axis=1), 1.0, atol=1e-4)


# ---- through the C ABI (lb_prefill / lb_verify / lb_commit / lb_draft) -----------------------------

def as_f32_draft(src: Path, dst: Path) -> Path:
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    tensors = {k: v.float() for k, v in load_file(str(src / "model.safetensors")).items()}
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("kind", ["f32", "sliding"], ids=["all-full", "sliding+full"])
def test_lb_draft_matches_reference(tmp_path, tiny_gguf, tiny_hf_dir, tiny_draft_dirs, kind):
    # The engine captures the target's features itself (output of target_layer_ids, 0-based) and
    # feeds the draft on every commit: after a prefill, and after a tree step whose accepted path
    # skips nodes, the drafted ids/log-probs must equal dflash's fed with transformers' features.
    import tiny_models
    from lucebox._native import Handle

    draft_dir = tiny_draft_dirs[kind]
    if kind != "f32":  # the engine keeps a checkpoint's BF16 matrices; f32 copies compare exactly
        draft_dir = as_f32_draft(draft_dir, tmp_path / "draft")
    tgt = tiny_models.load_target(tiny_hf_dir)
    dref = ref.DraftReference(ref.load_draft(draft_dir), tgt.get_input_embeddings().weight.detach(),
                              tgt.get_output_embeddings().weight.detach())
    tref = ref.TargetReference(tgt, dref.draft.target_layer_ids)
    prompt = [3, 17, 42, 9, 100, 7, 7, 8, 55, 21, 30, 31, 2]
    K = 4
    # the reference attends to the whole context: so must the draft (a sliding_window in its config
    # would otherwise be its context window, tests/test_draft_window.py)
    with Handle(tiny_gguf["f32"], draft_dir, max_ctx=256, device=0 if ON_GPU else -1, draft_window=256) as h:
        rows = h.info()["block_size"] - 1
        ids, logp = np.zeros((rows, K), np.int32), np.zeros((rows, K), np.float32)
        last, feats = h.prefill(prompt), None
        want_last, feats = tref.prefill(prompt)
        assert last == want_last
        dref.append(feats)
        h.draft(last, ids, logp)
        assert_same([(ids, logp)], [dref.propose(last, K)])

        # tree: root -> wrong, g1; g1 -> wrong, g2; g2 -> g3. Greedy accepts nodes 0, 2, 4, 5.
        g = ref.ar_greedy(tgt, prompt + [last], 4)
        vocab = tgt.config.vocab_size
        tokens = [last, (g[0] + 1) % vocab, g[0], (g[1] + 1) % vocab, g[1], g[2]]
        parents = [-1, 0, 0, 2, 2, 4]
        argmax = np.zeros(len(tokens), np.int32)
        h.verify(np.array(tokens, np.int32), np.array(parents, np.int32), argmax)
        path, bonus = ref.tree_accept(tokens, parents, g)
        assert path == [0, 2, 4, 5] and argmax[5] == bonus
        h.commit(path)
        chain = [tokens[i] for i in path]
        _, vfeats, _ = tref.verify(chain)
        tref.commit(chain)
        dref.append(vfeats)
        h.draft(bonus, ids, logp)
        assert_same([(ids, logp)], [dref.propose(bonus, K)])


# ---- the reference loop (tests/draft_reference.py) ---------------------------------------------

@pytest.fixture(scope="module")
def hf_pair(tiny_hf_dir, tiny_draft_dirs):
    """The shared tiny Qwen3.5 target (transformers, f32) and its f32 DFlash draft (dflash)."""
    import tiny_models

    return tiny_models.load_target(tiny_hf_dir), ref.load_draft(tiny_draft_dirs["f32"])


PROMPT = [3, 17, 42, 9, 100, 7, 7, 8]


def test_reference_chain_is_lossless(hf_pair, greedy):
    tgt, draft = hf_pair
    res = ref.chain_generate(tgt, draft, PROMPT, 10)
    assert res.tokens == greedy[:10]


@pytest.fixture(scope="module")
def greedy(hf_pair) -> list[int]:
    return ref.ar_greedy(hf_pair[0], PROMPT, 56)


@pytest.mark.parametrize("right", [0, 2, 15])
def test_reference_acceptance_follows_the_draft(hf_pair, greedy, monkeypatch, right):
    # A draft whose chain is the AR continuation for `right` tokens, then wrong: every step
    # must accept exactly `right` tokens, and the output stays AR greedy.
    tgt, draft = hf_pair

    def oracle(self, last, top_k):
        done = self.n_past - len(PROMPT) + 1  # generated tokens so far, `last` included
        assert last == greedy[done - 1]
        chain = greedy[done: done + self.block_size - 1]
        chain = chain[:right] + [(t + 1) % tgt.config.vocab_size for t in chain[right:]]
        return np.array(chain, np.int32)[:, None], np.zeros((len(chain), 1), np.float32)

    monkeypatch.setattr(ref.DraftReference, "propose", oracle)
    n_new = 2 * (right + 1) + 1  # two full steps, then one cut short by max_new_tokens
    res = ref.chain_generate(tgt, draft, PROMPT, n_new)
    assert res.tokens == greedy[:n_new]
    assert [s.accepted for s in res.steps] == [right] * 2


def test_tree_accept_walks_the_greedy_path():
    # root(5) -> 1 -> 2 -> 9 ; root -> 3 ; 1 -> 4
    tokens, parents = [5, 1, 3, 2, 4, 9], [-1, 0, 0, 1, 1, 3]
    assert ref.tree_accept(tokens, parents, [1, 2, 9, 6]) == ([0, 1, 3, 5], 6)
    assert ref.tree_accept(tokens, parents, [1, 4, 0]) == ([0, 1, 4], 0)
    assert ref.tree_accept(tokens, parents, [7, 1]) == ([0], 7)
    with pytest.raises(ValueError, match="parents"):
        ref.tree_accept([5, 1], [-1, 1], [1, 2])
