"""The native target (GGUF loader + graph + caches) against transformers, and verify/commit against AR.

Oracle: transformers' float32 Qwen3_5ForCausalLM on the tiny model's HF folder; lucebox runs the
same weights converted by the pinned llama.cpp converter. Error metric for logits, per row:
max|ours - ref| / max|ref| (ref = transformers, or lucebox's own AR prefill for verify tests).

LUCEBOX_TEST_BACKEND=cuda runs the engine on CUDA device 0.
"""
from __future__ import annotations

import os
import subprocess
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import torch

import tiny_models
from lucebox._native import Handle

DEVICE = 0 if os.environ.get("LUCEBOX_TEST_BACKEND") == "cuda" else -1
ROOT = Path(__file__).resolve().parent.parent
# tests/run.sh sets LUCEBOX_TOOLS_DIR; the dev setup (LUCEBOX_LIB=build/x/liblucebox.so) implies it
TOOLS = Path(os.environ.get("LUCEBOX_TOOLS_DIR") or Path(os.environ.get("LUCEBOX_LIB", ROOT / "build/cpu/x")).parent)
F32_TOL = 1e-3        # transformers float32 vs lucebox F32 weights + F32 KV
SELF_TOL = 0.0        # lucebox vs lucebox (verify/commit/micro-batches vs AR prefill): bit for bit
# A "clear" greedy choice: transformers' top-1 logit ahead of its top-2 by more than the weight
# type's rounding can move it (logit std ~8; the random tiny model amplifies weight noise, so the
# coarser the type, the larger the margin: bf16 keeps 8 mantissa bits, Q8_0 ~7 per 32-block).
MARGIN = {"f32": 1.0, "f16": 1.0, "bf16": 2.0, "q8_0": 3.0}
# ggml-cuda quantizes activations for Q8_0 weights with its own rounding; on this model that
# moves logits by up to ~5 from the CPU's (benchmarks/device/backend_diff.py, H100), so a Q8_0
# choice is "clear" on CUDA only beyond that, which leaves fewer positions to compare.
if DEVICE >= 0:
    MARGIN["q8_0"] = 6.0
MIN_CLEAR = {"f32": 20, "f16": 20, "bf16": 20, "q8_0": 5 if DEVICE >= 0 else 20}

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fib"


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    """Largest per-row max|diff| / max|ref|."""
    ours, ref = np.atleast_2d(ours), np.atleast_2d(ref)
    return float((np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())


def engine(path, **kw) -> Handle:
    kw.setdefault("max_ctx", 512)
    kw.setdefault("device", DEVICE)
    return Handle(path, **kw)


def prefill_logits(h: Handle, toks, reset=True) -> np.ndarray:
    toks = np.asarray(toks, dtype=np.int32)
    if reset:
        h.reset()
    out = np.zeros((toks.size, h.info()["n_vocab"]), dtype=np.float32)
    h.prefill(toks, out)
    return out


@pytest.fixture(scope="module")
def hf_model(tiny_hf_dir):
    return tiny_models.load_target(tiny_hf_dir)


@pytest.fixture(scope="module")
def prompt(tiny_tokenizer) -> np.ndarray:
    ids = np.array(tiny_tokenizer.encode(PROMPT).ids, dtype=np.int32)
    assert 12 <= ids.size <= 40
    return ids


@pytest.fixture(scope="module")
def hf_greedy(hf_model, prompt) -> np.ndarray:
    """transformers' 64 greedy tokens after the prompt."""
    with torch.no_grad():
        out = hf_model.generate(torch.tensor(prompt[None].astype(np.int64)), max_new_tokens=64, do_sample=False,
                                min_new_tokens=64, eos_token_id=None, pad_token_id=0)
    return out[0, prompt.size:].numpy().astype(np.int32)


def hf_logits(hf_model, toks) -> np.ndarray:
    with torch.no_grad():
        return hf_model(torch.tensor(np.asarray(toks, dtype=np.int64)[None])).logits[0].float().numpy()


@pytest.fixture(scope="module")
def f32_engine(tiny_gguf):
    h = engine(tiny_gguf["f32"], kv_type="f32", ubatch=32, max_tree=32)
    yield h
    h.close()


# --- prefill / step vs transformers ---------------------------------------------------------

@pytest.mark.parametrize("n_tokens", [1, 20, 300])
def test_prefill_logits_match_transformers(f32_engine, hf_model, n_tokens):
    toks = np.random.default_rng(n_tokens).integers(0, f32_engine.info()["n_vocab"], n_tokens, dtype=np.int32)
    ours = prefill_logits(f32_engine, toks)  # ubatch 32: 300 tokens take 10 micro-batches
    ref = hf_logits(hf_model, toks)
    assert rel_err(ours, ref) <= F32_TOL
    assert f32_engine.info()["n_past"] == n_tokens


def test_prefill_in_pieces_equals_one_prefill(f32_engine):
    toks = np.random.default_rng(7).integers(0, 200, 90, dtype=np.int32)
    whole = prefill_logits(f32_engine, toks)
    f32_engine.reset()
    parts = [prefill_logits(f32_engine, toks[a:b], reset=False) for a, b in ((0, 1), (1, 41), (41, 90))]
    assert rel_err(np.concatenate(parts), whole) <= SELF_TOL


def test_greedy_64_tokens_match_transformers(f32_engine, prompt, hf_greedy):
    f32_engine.reset()
    out = [f32_engine.prefill(prompt)]
    while len(out) < 64:
        out.append(f32_engine.step(out[-1]))
    assert np.array_equal(np.array(out, dtype=np.int32), hf_greedy)


@pytest.fixture(scope="module")
def teacher(hf_model, prompt, hf_greedy):
    """(prompt + transformers' greedy tokens, transformers' logits over that sequence)."""
    seq = np.concatenate([prompt, hf_greedy])
    return seq, hf_logits(hf_model, seq)


@pytest.mark.parametrize("outtype,kv_type", [("f16", "f16"), ("q8_0", "f16"), ("bf16", "f16"),
                                             ("f32", "f16"), ("f32", "q8_0"), ("f32", "q4_0"), ("q8_0", "q8_0")])
def test_quantized_agree_where_margin_is_clear(tiny_gguf, teacher, outtype, kv_type):
    """Teacher-forced on transformers' greedy sequence: same argmax wherever its top-1 is clear."""
    seq, ref = teacher
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > MARGIN[outtype]
    assert clear.sum() >= MIN_CLEAR[outtype]  # the comparison is not vacuous
    with closing(engine(tiny_gguf[outtype], kv_type=kv_type, ubatch=16)) as h:
        ours = prefill_logits(h, seq)
    agree = ours.argmax(1) == ref.argmax(1)
    assert agree[clear].all(), f"argmax differs at clear positions {np.flatnonzero(clear & ~agree)}"


# --- files with an MTP (nextn) block -------------------------------------------------------

def copy_metadata(reader, writer, edit=lambda name, value: value) -> None:
    """reader's key-values into writer (the GGUF header's own and the architecture excepted), each
    passed through edit(name, value)."""
    from gguf import GGUFValueType

    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, edit(name, field.contents()), field.types[0], sub_type)


def finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_mtp_block(src, dst):
    """Copy of src as recent Qwen3.5-27B conversions lay it out: block_count + 1 with
    nextn_predict_layers = 1 and an extra full-attention block (plus nextn tensors) after the trunk."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    n_layer = int(reader.fields["qwen35.block_count"].contents())
    writer = GGUFWriter(str(dst), "qwen35")
    def extend(name, value):
        if name == "qwen35.block_count":
            return n_layer + 1
        if name == "qwen35.attention.recurrent_layers":
            return list(value) + [False]
        return value

    copy_metadata(reader, writer, extend)
    writer.add_key_value("qwen35.nextn_predict_layers", 1, GGUFValueType.UINT32)
    last_attn = max(int(t.name.split(".")[1]) for t in reader.tensors if t.name.endswith("attn_q.weight"))
    n_embd = int(reader.fields["qwen35.embedding_length"].contents())
    for t in reader.tensors:
        writer.add_tensor(t.name, np.asarray(t.data))
    for t in reader.tensors:
        if t.name.startswith(f"blk.{last_attn}."):
            writer.add_tensor(t.name.replace(f"blk.{last_attn}.", f"blk.{n_layer}."), np.asarray(t.data))
    rng = np.random.default_rng(0)
    writer.add_tensor(f"blk.{n_layer}.nextn.eh_proj.weight", rng.standard_normal((n_embd, 2 * n_embd), dtype=np.float32))
    for norm in ("enorm", "hnorm", "shared_head_norm"):
        writer.add_tensor(f"blk.{n_layer}.nextn.{norm}.weight", np.ones(n_embd, dtype=np.float32))
    finish(writer)
    return dst


def test_file_with_mtp_block_loads_and_matches(tiny_gguf, f32_engine, tmp_path):
    path = add_mtp_block(tiny_gguf["f32"], tmp_path / "with-mtp.gguf")
    toks = np.random.default_rng(11).integers(0, f32_engine.info()["n_vocab"], 40, dtype=np.int32)
    ref = prefill_logits(f32_engine, toks)
    with closing(engine(path, kv_type="f32", ubatch=32)) as h:
        assert h.info()["n_layer"] == f32_engine.info()["n_layer"]
        assert rel_err(prefill_logits(h, toks), ref) <= SELF_TOL


# --- matrices of mixed storage types ---------------------------------------------------------

def retype(src, dst, as_f16):
    """Copy of src with the tensors named in as_f16 stored as F16 (the rest as they were)."""
    from gguf import GGUFReader, GGUFWriter

    reader = GGUFReader(src)
    writer = GGUFWriter(str(dst), "qwen35")
    copy_metadata(reader, writer)
    for t in reader.tensors:
        data = np.asarray(t.data)
        writer.add_tensor(t.name, data.astype(np.float16) if t.name in as_f16 else data)
    finish(writer)
    return dst


def test_mixed_types_split_the_stacked_matrices(tiny_gguf, f32_engine, tmp_path):
    # The loader stacks matrices that share an input (qkv|z|beta|alpha, q|k|v, gate|up) per run of
    # one storage type; F16 members here cut those runs at the start, middle and end.
    from gguf import GGUFReader

    names = {t.name for t in GGUFReader(tiny_gguf["f32"]).tensors}
    recurrent = sorted(int(n.split(".")[1]) for n in names if n.endswith("attn_qkv.weight"))
    attn = sorted(int(n.split(".")[1]) for n in names if n.endswith("attn_q.weight"))
    as_f16 = {f"blk.{recurrent[0]}.attn_qkv.weight", f"blk.{recurrent[1]}.ssm_beta.weight",
              f"blk.{recurrent[-1]}.ssm_alpha.weight", f"blk.{attn[0]}.attn_k.weight",
              f"blk.{recurrent[0]}.ffn_up.weight"}
    path = retype(tiny_gguf["f32"], tmp_path / "mixed.gguf", as_f16)
    toks = np.random.default_rng(5).integers(0, f32_engine.info()["n_vocab"], 40, dtype=np.int32)
    ref = prefill_logits(f32_engine, toks)
    with closing(engine(path, kv_type="f32", ubatch=32)) as h:
        # F16 rounding of five matrices moves the logits a little; a misplaced row range would not
        assert rel_err(prefill_logits(h, toks), ref) <= 2e-2


# --- verify / commit vs AR -------------------------------------------------------------------

def random_tree(rng, n, n_vocab):
    parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], dtype=np.int32)
    return rng.integers(0, n_vocab, n, dtype=np.int32), parents


def shuffle_tree(rng, toks, parents):
    """The same tree in a random order where every parent still precedes its children."""
    order, placed = [], set()
    while len(order) < len(toks):
        ready = [i for i in range(len(toks)) if i not in placed and (parents[i] < 0 or parents[i] in placed)]
        pick = ready[int(rng.integers(0, len(ready)))]
        order.append(pick)
        placed.add(pick)
    where = {old: new for new, old in enumerate(order)}
    new_parents = [-1 if parents[i] < 0 else where[parents[i]] for i in order]
    return np.array([toks[i] for i in order], dtype=np.int32), np.array(new_parents, dtype=np.int32)


def path_to(parents, node):
    path = []
    while node >= 0:
        path.append(int(node))
        node = parents[node]
    return path[::-1]


def test_verify_chain_equals_prefill(f32_engine, prompt):
    n_vocab = f32_engine.info()["n_vocab"]
    chain = np.random.default_rng(3).integers(0, n_vocab, 9, dtype=np.int32)
    ref = prefill_logits(f32_engine, np.concatenate([prompt, chain]))[prompt.size:]
    prefill_logits(f32_engine, prompt)
    argmax = np.zeros(chain.size, dtype=np.int32)
    logits = np.zeros((chain.size, n_vocab), dtype=np.float32)
    f32_engine.verify(chain, np.arange(-1, chain.size - 1, dtype=np.int32), argmax, logits)
    assert rel_err(logits, ref) <= SELF_TOL
    assert np.array_equal(argmax, ref.argmax(1))


@pytest.mark.parametrize("seed", range(4))
def test_verify_tree_node_equals_ar_of_its_path(f32_engine, prompt, seed):
    rng = np.random.default_rng(100 + seed)
    n_vocab = f32_engine.info()["n_vocab"]
    toks, parents = random_tree(rng, int(rng.integers(2, 16)), n_vocab)
    prefill_logits(f32_engine, prompt)
    argmax = np.zeros(toks.size, dtype=np.int32)
    logits = np.zeros((toks.size, n_vocab), dtype=np.float32)
    f32_engine.verify(toks, parents, argmax, logits)
    for node in range(toks.size):
        ref = prefill_logits(f32_engine, np.concatenate([prompt, toks[path_to(parents, node)]]))[-1]
        assert rel_err(logits[node], ref) <= SELF_TOL, f"node {node}"
        assert argmax[node] == ref.argmax()


def commit_then_continue(h, prompt, rng, min_nodes: int, min_node: int):
    """Verify a random tree of at least min_nodes nodes after `prompt`, commit the path to a random node (index
    min_node or more), then prefill 6 more tokens. Returns (their logits, the same tokens' logits from one prefill of
    prompt + path + tail, how far n_past after the commit is from len(prompt) + len(path))."""
    n_vocab = h.info()["n_vocab"]
    toks, parents = random_tree(rng, int(rng.integers(min_nodes, 20)), n_vocab)
    path = path_to(parents, int(rng.integers(min_node, toks.size)))
    tail = rng.integers(0, n_vocab, 6, dtype=np.int32)
    ref = prefill_logits(h, np.concatenate([prompt, toks[path], tail]))[-tail.size:]

    prefill_logits(h, prompt)
    h.verify(toks, parents, np.zeros(toks.size, dtype=np.int32))
    h.commit(np.array(path, dtype=np.int32))
    n_past_off = h.info()["n_past"] - prompt.size - len(path)
    return prefill_logits(h, tail, reset=False), ref, n_past_off


@pytest.mark.parametrize("seed", range(6))
def test_commit_any_path_then_continue_equals_ar(f32_engine, prompt, seed):
    """The lossless core: after commit(path), the caches are exactly those of prefix + path."""
    ours, ref, n_past_off = commit_then_continue(f32_engine, prompt, np.random.default_rng(200 + seed), 1, 0)
    assert n_past_off == 0
    assert rel_err(ours, ref) <= SELF_TOL


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory) -> Path:
    """A narrow synthetic qwen35 of 24 layers: 18 DeltaNet layers, so commit replays them in more than one group."""
    from benchmarks import synth_target
    out = tmp_path_factory.mktemp("deep") / "target.gguf"
    synth_target.write(str(out), synth_target.scaled_shape(0.05, 24, mtp=False), seed=5, threads=2, quiet=True)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_commit_of_many_deltanet_layers_equals_ar(deep_target, seed):
    """The same as the test above on a model whose DeltaNet layers do not fit one commit group."""
    rng = np.random.default_rng(300 + seed)
    with closing(engine(deep_target, kv_type="f32", ubatch=32, max_tree=32)) as h:
        prompt = rng.integers(0, h.info()["n_vocab"], 20, dtype=np.int32)
        ours, ref, _ = commit_then_continue(h, prompt, rng, 2, 1)
    assert rel_err(ours, ref) <= SELF_TOL


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0", "q4_0"])
def test_speculative_loop_equals_ar_greedy(tiny_gguf, prompt, kv_type):
    """Many verify/commit rounds with random trees that contain the true continuation to a random
    depth (a draft that is sometimes right): the committed stream equals plain AR greedy."""
    n_new = 48
    with closing(engine(tiny_gguf["f32"], kv_type=kv_type, max_tree=24)) as h:
        n_vocab = h.info()["n_vocab"]
        ar = [h.prefill(prompt)]
        while len(ar) < n_new + 8:
            ar.append(h.step(ar[-1]))

        rng = np.random.default_rng(5)
        h.reset()
        out = [h.prefill(prompt)]
        argmax = np.zeros(24, dtype=np.int32)
        rounds = moved = 0
        while len(out) < n_new:
            # chain of the true next tokens (as far as the draft "guesses"), then random branches
            truth = ar[len(out): len(out) + int(rng.integers(0, 6))]
            toks = [out[-1]] + truth
            parents = list(range(-1, len(truth)))
            size = int(rng.integers(len(toks), 25))
            while len(toks) < size:
                parents.append(int(rng.integers(0, len(toks))))
                toks.append(int(rng.integers(0, n_vocab)))
            toks, parents = shuffle_tree(rng, toks, parents)
            h.verify(toks, parents, argmax[: toks.size])
            # accept: follow the target's choice while a child carries it
            path, node = [0], 0
            while True:
                kids = np.flatnonzero((parents == node) & (toks == argmax[node]))
                if kids.size == 0:
                    break
                node = int(kids[0])
                path.append(node)
            h.commit(np.array(path, dtype=np.int32))
            out.extend(int(toks[c]) for c in path[1:])
            out.append(int(argmax[node]))
            rounds += 1
            moved += path != list(range(len(path)))
        assert rounds < n_new * 0.75 and moved > 0  # tokens were accepted, KV rows were moved
        assert out[:n_new] == ar[:n_new]


# --- captured hidden states (the draft's input), via native/tools/target_check ----------------

CAPTURE_LAYERS = [1, 3, 5]


def captured(gguf, n_embd, tmp_path, prefix, tree=None, ubatch=8) -> np.ndarray:
    """Features the engine hands the draft for every committed token: [n, len(CAPTURE_LAYERS), n_embd]."""
    (tmp_path / "prefix.i32").write_bytes(np.asarray(prefix, dtype=np.int32).tobytes())
    cmd = [str(TOOLS / "target_check"), "--model", str(gguf), "--layers", ",".join(map(str, CAPTURE_LAYERS)),
           "--prefix", str(tmp_path / "prefix.i32"), "--out", str(tmp_path / "feats.f32"),
           "--ubatch", str(ubatch), "--device", str(DEVICE), "--threads", "2"]
    if tree is not None:
        toks, parents, path = tree
        blob = np.concatenate([[toks.size], toks, parents, [len(path)], path]).astype(np.int32)
        (tmp_path / "tree.i32").write_bytes(blob.tobytes())
        cmd += ["--tree", str(tmp_path / "tree.i32")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return np.fromfile(tmp_path / "feats.f32", dtype=np.float32).reshape(-1, len(CAPTURE_LAYERS), n_embd)


def test_captured_features_are_transformers_hidden_states(tiny_gguf, hf_model, prompt, tmp_path):
    feats = captured(tiny_gguf["f32"], hf_model.config.hidden_size, tmp_path, prompt)
    assert feats.shape[0] == prompt.size
    with torch.no_grad():
        hidden = hf_model(torch.tensor(prompt[None].astype(np.int64)), output_hidden_states=True).hidden_states
    for j, layer in enumerate(CAPTURE_LAYERS):  # hidden_states[l + 1] = residual stream after layer l
        assert rel_err(feats[:, j], hidden[layer + 1][0].numpy()) <= F32_TOL, f"layer {layer}"


def test_captured_features_of_a_committed_path_equal_ar(tiny_gguf, f32_engine, prompt, tmp_path):
    info = f32_engine.info()
    toks, parents = random_tree(np.random.default_rng(9), 14, info["n_vocab"])
    path = np.array(path_to(parents, 13), dtype=np.int32)
    spec = captured(tiny_gguf["f32"], info["n_embd"], tmp_path, prompt, (toks, parents, path))
    ar = captured(tiny_gguf["f32"], info["n_embd"], tmp_path, np.concatenate([prompt, toks[path]]))
    assert spec.shape == ar.shape == (prompt.size + path.size, len(CAPTURE_LAYERS), info["n_embd"])
    assert rel_err(spec.reshape(len(ar), -1), ar.reshape(len(ar), -1)) <= SELF_TOL
