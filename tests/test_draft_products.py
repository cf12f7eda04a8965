"""The draft's products on ggml-cuda's streaming kernels: its BF16 weights on bf16s (patch 0075), its weights at
Q8_0 (`draft_weights="q8_0"`) on q8s (patch 0076, GGML_CUDA_Q8S=1):
- in batch-invariant mode a prompt fed in any split leaves the same caches, draft ring included, bit for bit: the
  draft's context append (its fc and K|V products) runs the kernel at each split's column count (bf16s: one column,
  up to 64: its split launches; past 64: its FOLD launches; q8s: groups of up to 24), and each column must compute as
  it does alone;
- speculative decoding gives AR's tokens, with bf16s taking the proposal's batch-dependent products too (the
  default, and GGML_CUDA_BF16_STREAM=2), with those left on mmf (=1), and with all the draft's products on mmf (=0);
  and with q8s taking every product of the draft's stored matrices.

Models: a small random pair from benchmarks/synth_target.py and synth_draft.py at width 0.1. The draft's matrices then
have k of 512, 1792 and 2560, whole multiples of bf16s's 128-value units and of q8s's 256; the tiny test drafts' k of
64, 96 and 192 keep them on mmf. Oracles: the same engine fed the prompt in one call; AR decoding. A process a
setting (ggml reads the switches once). CUDA only.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(os.environ.get("LUCEBOX_TEST_BACKEND") != "cuda",
                                reason="bf16s is a ggml-cuda kernel (LUCEBOX_TEST_BACKEND=cuda)")

ROOT = Path(__file__).resolve().parent.parent
INVARIANT_LINE = "a BF16 product streamed by bf16s"
DEPENDENT_LINE = "a batch-dependent BF16 product streamed by bf16s"
Q8S_INVARIANT_LINE = "a Q8_0 product on q8s"
Q8S_DEPENDENT_LINE = "a batch-dependent Q8_0 product on q8s"
Q8S_STORED = re.compile(r"draft: [1-9][0-9]* matrices stored in the GPU product kernel's order")

# One process: a 300-token prompt prefilled in one call, in micro-batches of 64 and in odd calls with micro-batches of
# 16 (the draft's append in chunks of at most 256 columns: 256 + 44, 64 ..., 16 ..., 1, 8 ...); then 24 tokens by AR
# and by DDTree.
RUN = """
import sys
import numpy as np
from lucebox._native import Handle
from lucebox.engine import Engine
target, draft, out, weights = sys.argv[1:5]
prompt = np.random.default_rng(3).integers(0, 2000, 300).astype(np.int32)
states, nexts = [], []
for ubatch, splits in ((512, [300]), (64, [300]), (16, [1, 40, 3, 200, 56])):
    with Handle(target, draft, max_ctx=512, device=0, n_threads=1, ubatch=ubatch, log_level="debug",
                draft_weights=weights) as h:
        at = 0
        for size in splits:
            nexts.append(h.prefill(prompt[at:at + size]))
            at += size
        states.append(h.state_save().view(np.uint8))
with Engine(target, draft=draft, device="cuda", n_threads=1, max_ctx=512, log_level="debug",
            draft_weights=weights) as e:
    ar = e.generate(prompt.tolist(), 24, mode="ar", ignore_eos=True).tokens
    dd = e.generate(prompt.tolist(), 24, mode="ddtree", ignore_eos=True).tokens
np.savez(out, states=np.stack(states), last=np.array([nexts[0], nexts[1], nexts[-1]]), ar=np.array(ar),
         dd=np.array(dd))
"""


@pytest.fixture(scope="module")
def bf16_pair(tmp_path_factory) -> tuple[Path, Path]:
    sys.path.insert(0, str(ROOT))
    from benchmarks import synth_draft, synth_target

    root = tmp_path_factory.mktemp("bf16s")
    target, draft = root / "target.gguf", root / "draft"
    # 8 trunk layers: the draft's 5 target layers are 1..5
    synth_target.write(str(target), synth_target.scaled_shape(0.1, 8, mtp=False), seed=4, threads=2, quiet=True)
    shape = synth_draft.scaled_shape(0.1, 8, 0)
    assert shape.hidden % 128 == 0 and shape.n_ff % 128 == 0  # whole bf16s units, or the test checks mmf
    synth_draft.write(str(draft), shape, seed=5, threads=2, quiet=True)
    return target, draft


def run(pair: tuple[Path, Path], out: Path, switch: str | None, weights: str = "keep", q8s: bool = False
        ) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GGML_CUDA_BF16_STREAM", "GGML_CUDA_Q8S")}
    if switch is not None:  # None: ggml's default
        env["GGML_CUDA_BF16_STREAM"] = switch
    if q8s:
        env["GGML_CUDA_Q8S"] = "1"
    done = subprocess.run([sys.executable, "-c", RUN, str(pair[0]), str(pair[1]), str(out), weights], env=env,
                          cwd=ROOT, timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    with np.load(out) as f:
        return {k: f[k] for k in f.files}, done.stderr


@pytest.mark.parametrize("switch", ["1", "2", None])
def test_any_split_leaves_the_same_draft_ring_and_ddtree_gives_ar(bf16_pair, tmp_path, switch):
    got, log = run(bf16_pair, tmp_path / "run.npz", switch)
    assert INVARIANT_LINE in log, "bf16s never ran (no '" + INVARIANT_LINE + "' in the log)"
    assert (DEPENDENT_LINE in log) == (switch != "1")
    states = got["states"]
    for other in states[1:]:
        assert other.tobytes() == states[0].tobytes()  # target KV, DeltaNet state, draft ring
    assert len(set(got["last"].tolist())) == 1
    np.testing.assert_array_equal(got["dd"], got["ar"])


def test_mmf_gives_ar_too_and_bf16s_changes_only_the_draft(bf16_pair, tmp_path):
    # the draft's products on mmf (other bits than bf16s's): the target's tokens are the same
    off, log = run(bf16_pair, tmp_path / "off.npz", "0")
    on, _ = run(bf16_pair, tmp_path / "on.npz", "1")
    assert "streamed by bf16s" not in log
    np.testing.assert_array_equal(off["dd"], off["ar"])
    np.testing.assert_array_equal(off["ar"], on["ar"])


def test_q8s_any_split_leaves_the_same_draft_ring_and_ddtree_gives_ar(bf16_pair, tmp_path):
    # the draft loaded at Q8_0 and stored for q8s: its append (invariant) and its proposal (batch-dependent) there
    got, log = run(bf16_pair, tmp_path / "q8s.npz", None, weights="q8_0", q8s=True)
    assert Q8S_STORED.search(log), "no draft matrix was stored for q8s"
    assert Q8S_INVARIANT_LINE in log and Q8S_DEPENDENT_LINE in log, "q8s did not run in both modes"
    states = got["states"]
    for other in states[1:]:
        assert other.tobytes() == states[0].tobytes()
    assert len(set(got["last"].tolist())) == 1
    np.testing.assert_array_equal(got["dd"], got["ar"])
