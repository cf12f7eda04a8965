"""Fuzz: hypothesis-driven mutations of the tiny target GGUF and draft, each loaded (and, when it
loads, run one step of every call kind; for half the GGUFs, first through the Python tokenizer)
in a child process. A clean one-line NativeError or a
working engine passes; a signal, a hang, or any other error fails and prints the mutations.

Cases are batched (one child per batch; a crash or hang restarts the child after the culprit).
CI runs a few hundred cases; LUCEBOX_FUZZ_LONG=1 (or `pytest --long`) runs thousands.
LUCEBOX_FUZZ_REPORT=FILE appends each test's outcome counts as a JSON line.
"""
from __future__ import annotations

import collections
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import fuzz_files as ff

LONG = os.environ.get("LUCEBOX_FUZZ_LONG") == "1"
BATCH = 40
BATCHES_TARGET = 80 if LONG else 20    # x BATCH cases
BATCHES_DRAFT = 40 if LONG else 12

FUZZ_SETTINGS = dict(deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                     suppress_health_check=list(HealthCheck))

# --- values ----------------------------------------------------------------------------------
EDGE_INTS = [0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 32, 33, 63, 64, 65, 96, 128, 255, 256, 640, 1023, 1024,
             4096, 2**16, 2**20, 2**24, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, -1, -2, -64,
             -2**31, -2**63]
EDGE_FLOATS = ["nan", "inf", "-inf", 0.0, -0.0, -1.0, 1e-30, 1e-6, 1e-5, 0.5, 1.0, 2.0, 1e30, 3.4e38,
               2147483647.0, -1e-6]
ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-2**63, 2**64 - 1))
small_ints = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 8, 16, 32, 63, 64, 65, 96, 128, 640, -1, 2**31 - 1]),
                       st.integers(-4, 300))
floats = st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(width=32, allow_nan=False, allow_infinity=False))
texts = st.text(max_size=12)

# --- target GGUF -----------------------------------------------------------------------------
# the base file's keys the loader reads, with their types (tests/tiny_models.py's conversion)
TARGET_KEYS = {
    "general.architecture": (ff.STRING, None),
    "qwen35.block_count": (ff.U32, None), "qwen35.context_length": (ff.U32, None),
    "qwen35.embedding_length": (ff.U32, None), "qwen35.feed_forward_length": (ff.U32, None),
    "qwen35.attention.head_count": (ff.U32, None), "qwen35.attention.head_count_kv": (ff.U32, None),
    "qwen35.rope.dimension_sections": (ff.ARRAY, ff.I32), "qwen35.rope.freq_base": (ff.F32, None),
    "qwen35.attention.layer_norm_rms_epsilon": (ff.F32, None), "qwen35.attention.key_length": (ff.U32, None),
    "qwen35.attention.value_length": (ff.U32, None), "qwen35.ssm.conv_kernel": (ff.U32, None),
    "qwen35.ssm.state_size": (ff.U32, None), "qwen35.ssm.group_count": (ff.U32, None),
    "qwen35.ssm.time_step_rank": (ff.U32, None), "qwen35.ssm.inner_size": (ff.U32, None),
    "qwen35.attention.recurrent_layers": (ff.ARRAY, ff.BOOL), "qwen35.full_attention_interval": (ff.U32, None),
    "qwen35.rope.dimension_count": (ff.U32, None),
    "qwen35.nextn_predict_layers": (ff.U32, None),  # absent from the base file: setting it adds it
    # read by the Python tokenizer (lucebox run builds it before loading the engine)
    "tokenizer.ggml.model": (ff.STRING, None), "tokenizer.ggml.pre": (ff.STRING, None),
    "tokenizer.ggml.tokens": (ff.ARRAY, ff.STRING), "tokenizer.ggml.token_type": (ff.ARRAY, ff.I32),
    "tokenizer.ggml.merges": (ff.ARRAY, ff.STRING), "tokenizer.ggml.eos_token_id": (ff.U32, None),
    "tokenizer.ggml.bos_token_id": (ff.U32, None), "tokenizer.ggml.add_bos_token": (ff.BOOL, None),
    "tokenizer.chat_template": (ff.STRING, None),
}
INT_TYPES = [ff.U8, ff.I8, ff.U16, ff.I16, ff.U32, ff.I32, ff.U64, ff.I64]
N_TENSORS = 109
TENSOR_NAMES = ["token_embd.weight", "output.weight", "output_norm.weight", "blk.0.attn_norm.weight",
                "blk.3.attn_q.weight", "blk.0.ssm_a", "blk.9.attn_norm.weight"]


def value_of(vtype: int, sub_type: int | None = None):
    if vtype in INT_TYPES:
        return ints
    if vtype in (ff.F32, ff.F64):
        return floats
    if vtype == ff.BOOL:
        return st.integers(0, 255)
    if vtype == ff.STRING:
        return texts
    return st.lists(value_of(sub_type), max_size=10)


def typed_value(vtype=None):
    """(vtype, value, sub_type) of the given or any type; arrays of any element type."""
    vtypes = st.just(vtype) if vtype is not None else st.sampled_from(INT_TYPES + [ff.F32, ff.F64, ff.BOOL, ff.STRING, ff.ARRAY])

    def build(t):
        if t != ff.ARRAY:
            return value_of(t).map(lambda v: (t, v, None))
        return st.sampled_from(INT_TYPES + [ff.F32, ff.F64, ff.BOOL, ff.STRING]).flatmap(
            lambda sub: value_of(ff.ARRAY, sub).map(lambda v: (ff.ARRAY, v, sub)))
    return vtypes.flatmap(build)


target_keys = st.sampled_from(sorted(TARGET_KEYS))
same_type_set = target_keys.flatmap(lambda k: (
    value_of(*TARGET_KEYS[k]).map(lambda v: ("set", k, TARGET_KEYS[k][0], v, TARGET_KEYS[k][1]))))
any_type_set = st.tuples(target_keys, typed_value()).map(lambda kv: ("set", kv[0], *kv[1]))
tensor = st.integers(0, N_TENSORS - 1)
target_mutation = st.one_of(
    same_type_set, same_type_set, any_type_set,
    target_keys.map(lambda k: ("del", k)),
    st.tuples(st.just("ne"), tensor, st.integers(0, 4), small_ints),
    st.tuples(st.just("type"), tensor, st.one_of(st.sampled_from([0, 1, 8, 12, 14, 30]), st.integers(0, 45),
                                                  st.sampled_from([4, 5, 2**31, 2**32 - 1]))),
    st.tuples(st.just("drop"), tensor),
    st.tuples(st.just("rename"), tensor, st.one_of(st.sampled_from(TENSOR_NAMES), texts)),
    st.tuples(st.just("fill"), tensor, floats),
    st.tuples(st.just("flip"), st.one_of(st.integers(0, 40_000), st.integers(0, 2**22)), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("insert"), st.integers(0, 40_000), st.binary(min_size=1, max_size=16).map(list)),
)
target_case = st.tuples(st.sampled_from(["f32", "q8_0"]), st.lists(target_mutation, min_size=1, max_size=3))

# --- draft -----------------------------------------------------------------------------------
DRAFT_KEYS = [["num_hidden_layers"], ["hidden_size"], ["num_attention_heads"], ["num_key_value_heads"],
              ["head_dim"], ["intermediate_size"], ["vocab_size"], ["num_target_layers"], ["rms_norm_eps"],
              ["attention_bias"], ["hidden_act"], ["rope_theta"], ["rope_scaling"], ["rope_parameters"],
              ["layer_types"], ["use_sliding_window"], ["sliding_window"], ["max_window_layers"], ["is_causal"],
              ["block_size"], ["architectures"], ["dflash_config"], ["dflash_config", "mask_token_id"],
              ["dflash_config", "target_layer_ids"], ["dflash_config", "block_size"],
              ["dflash_config", "input_embedding_scale"], ["dflash_config", "output_multiplier"],
              ["dflash_config", "final_logit_softcapping"], ["target_layer_ids"]]
json_scalar = st.one_of(ints, small_ints, floats, texts, st.booleans(), st.none(),
                        st.sampled_from(["silu", "linear", "default", "full_attention", "sliding_attention",
                                         "DFlash2DraftModel"]))
json_value = st.recursive(json_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.sampled_from(["rope_type", "type", "factor", "rope_theta",
                                                                  "mask_token_id", "block_size"]), inner, max_size=3)),
    max_leaves=8)
layer_ids = st.lists(st.one_of(small_ints, st.sampled_from([1, 3, 5, 6, 7])), min_size=0, max_size=6)
draft_mutation = st.one_of(
    st.tuples(st.just("cfg_set"), st.sampled_from(DRAFT_KEYS), json_value),
    st.tuples(st.just("cfg_set"), st.just(["dflash_config", "target_layer_ids"]), layer_ids),
    st.tuples(st.just("cfg_set"), st.sampled_from(DRAFT_KEYS[:9] + [["block_size"]]), small_ints),
    st.tuples(st.just("cfg_del"), st.sampled_from(DRAFT_KEYS)),
    st.tuples(st.just("cfg_flip"), st.integers(0, 1200), st.integers(0, 255)),
    st.tuples(st.just("cfg_truncate"), st.floats(0, 1)),
    st.tuples(st.just("st_set"), st.integers(0, 30), st.just("dtype"),
              st.one_of(st.sampled_from(["F32", "F16", "BF16", "F64", "I8", "U8", "BOOL", "F8_E4M3", "Q4", ""]),
                        json_value)),
    st.tuples(st.just("st_set"), st.integers(0, 30), st.just("shape"),
              st.one_of(st.lists(small_ints, max_size=4), json_value)),
    st.tuples(st.just("st_set"), st.integers(0, 30), st.just("data_offsets"),
              st.one_of(st.lists(st.one_of(small_ints, ints), min_size=2, max_size=2), json_value)),
    st.tuples(st.just("st_rename"), st.integers(0, 30), st.sampled_from(["fc.weight", "model.fc.weight", "norm.weight",
                                                                        "layers.0.attention_conv.weight", "x"])),
    st.tuples(st.just("st_len"), st.integers(-16, 16).filter(bool)),
    st.tuples(st.just("st_flip"), st.integers(0, 300_000), st.integers(0, 255)),
    st.tuples(st.just("st_truncate"), st.floats(0, 1)),
    st.tuples(st.just("st_insert"), st.integers(0, 300_000), st.binary(min_size=1, max_size=8).map(list)),
)
draft_case = st.lists(draft_mutation, min_size=1, max_size=3)


# --- running ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bases(tiny_gguf):
    return {kind: ff.Gguf.read(tiny_gguf[kind]) for kind in ("f32", "q8_0")}


def check_batch(cases: list[dict], descriptions: list, workdir: Path, test: str) -> None:
    outcomes = ff.run_cases(cases, workdir)
    counts = collections.Counter(o.kind for o in outcomes)
    report = os.environ.get("LUCEBOX_FUZZ_REPORT")
    if report:
        with open(report, "a") as f:
            errors = collections.Counter(re.sub(r"[0-9]+|/\S+", "#", o.detail.strip("'\""))[:90]
                                         for o in outcomes if o.kind == "error")
            f.write(json.dumps({"test": test, **{k: counts.get(k, 0) for k in ff.OUTCOMES},
                                "errors": dict(errors)}) + "\n")
    failures = [(d, o) for d, o in zip(descriptions, outcomes) if o.kind in ("bad", "crash", "hang")]
    shutil.rmtree(workdir, ignore_errors=True)
    assert not failures, "\n".join(f"{o.kind}: {o.detail} <- {json.dumps(d)}" for d, o in failures[:10])


def test_fuzz_target_gguf(bases, tmp_path_factory):
    @settings(max_examples=BATCHES_TARGET, **FUZZ_SETTINGS)
    @given(st.lists(target_case, min_size=BATCH, max_size=BATCH))
    def batch(cases):
        work = tmp_path_factory.mktemp("fuzz-target")
        files = []
        for i, (kind, mutations) in enumerate(cases):
            path = work / f"case-{i}.gguf"
            path.write_bytes(ff.mutate_gguf(bases[kind], mutations))
            # every other case also goes through the Python tokenizer, as `lucebox run` would
            files.append({"target": str(path), "draft": None, "tokenizer": i % 2 == 0})
        check_batch(files, cases, work, "target")
    batch()


def test_fuzz_draft(tiny_gguf, tiny_draft_dir, tmp_path_factory):
    target = str(tiny_gguf["f32"])

    @settings(max_examples=BATCHES_DRAFT, **FUZZ_SETTINGS)
    @given(st.lists(draft_case, min_size=BATCH, max_size=BATCH))
    def batch(cases):
        work = tmp_path_factory.mktemp("fuzz-draft")
        files = []
        for i, mutations in enumerate(cases):
            ff.mutate_draft(tiny_draft_dir, work / f"case-{i}", mutations)
            files.append({"target": target, "draft": str(work / f"case-{i}")})
        check_batch(files, cases, work, "draft")
    batch()


def test_unmutated_files_load_and_run(tiny_gguf, tiny_draft_dir, bases, tmp_path):
    # the fuzz harness itself: re-serialized base files are accepted and run (so "error" is earned)
    cases = []
    for kind in ("f32", "q8_0"):
        path = tmp_path / f"same-{kind}.gguf"
        path.write_bytes(ff.mutate_gguf(bases[kind], []))
        cases.append({"target": str(path), "draft": None})
    ff.mutate_draft(tiny_draft_dir, tmp_path / "same-draft", [])
    cases.append({"target": str(tiny_gguf["f32"]), "draft": str(tmp_path / "same-draft")})
    assert [o.kind for o in ff.run_cases(cases, tmp_path / "run")] == ["ok", "ok", "ok"]


def test_harness_isolates_crashes_and_hangs(tiny_gguf, tmp_path):
    ok = {"target": str(tiny_gguf["f32"]), "draft": None}
    cases = [ok, {**ok, "selftest": "crash"}, ok, {**ok, "selftest": "hang"}, ok]
    outcomes = ff.run_cases(cases, tmp_path, timeout_per_case=1.0, timeout_base=2.0)
    assert [o.kind for o in outcomes] == ["ok", "crash", "ok", "hang", "ok"]
