"""The target's Q4_K / Q6_K matrices stored for the GPU's product kernel (patch 0049: each row tile's
super-block contiguous, ggml_backend_cuda_lbq_store_by_unit at load) give the logits of ggml's row order
bit for bit, at one column (an AR step's product) and at many (a prefill's).

Oracle: the same engine with the matrices left in ggml's order (GGML_CUDA_LBQ_BY_UNIT=0, read once per
process, hence a process per setting; run_with and check_switch also serve tests/test_cuda_fusions.py and
tests/test_cuda_early_loads.py). Target: a small random Q4_K_M GGUF from benchmarks/synth_target.py (the tiny test
models hold no K-quants). CUDA only (LUCEBOX_TEST_BACKEND=cuda): the CPU keeps ggml's order.
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
                                reason="the layout is the CUDA product kernel's (LUCEBOX_TEST_BACKEND=cuda)")

ROOT = Path(__file__).resolve().parent.parent

# One process: a 40-token prompt fed one token a call (one-column products), in one call (40 columns), in calls of
# 8 tokens (short prefills: the fused conv window's several tokens, the products' one-kernel launch of 5..8 columns)
# and in calls of 23 and 17 (a verify's column counts: three kernels a product, or a pair's three for two).
RUN = """
import sys
import numpy as np
from lucebox._native import Handle
target, out = sys.argv[1], sys.argv[2]
prompt = np.random.default_rng(5).integers(0, 2000, 40).astype(np.int32)
rows = []
for splits in ([1] * 40, [40], [8] * 5, [23, 17]):
    with Handle(target, None, max_ctx=256, device=0, n_threads=1, log_level="debug") as h:
        logits = np.zeros((prompt.size, h.info()["n_vocab"]), np.float32)
        at = 0
        for size in splits:
            h.prefill(prompt[at:at + size], logits[at:at + size])
            at += size
        rows.append(logits)
np.save(out, np.stack(rows))
"""


@pytest.fixture(scope="module")
def k_quant_target(tmp_path_factory) -> Path:
    sys.path.insert(0, str(ROOT))
    from benchmarks import synth_target

    out = tmp_path_factory.mktemp("synth") / "target.gguf"
    # width 0.1: rows of 512 and more weights (2+ super-blocks: at one a row, stored by unit is ggml's order) and
    # stacks whose last row tile is partial
    synth_target.write(str(out), synth_target.scaled_shape(0.1, 4, mtp=False), seed=2, threads=2, quiet=True)
    return out


STORED = re.compile(r"target: (\d+) matrices stored in the GPU product kernel's order")


def run_with(target: Path, out: Path, by_unit: bool = True, script: str = RUN,
             **env_switches: str) -> tuple[np.ndarray, str]:
    """-> (the logits `script` saves, the run's log); env_switches: more environment for the run."""
    env = dict(os.environ, GGML_CUDA_LBQ_BY_UNIT="1" if by_unit else "0", **env_switches)
    run = subprocess.run([sys.executable, "-c", script, str(target), str(out)], env=env, cwd=ROOT, timeout=300,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    return np.load(out), run.stderr


def check_switch(target: Path, tmp_path: Path, switch: str, line: str, script: str = RUN) -> str:
    """A ggml-cuda switch on gives the logits of it off, bit for bit, and logs `line` (its first use) only when on.
    -> the log of the run with it on."""
    want, log_off = run_with(target, tmp_path / "off.npy", script=script, **{switch: "0"})
    got, log_on = run_with(target, tmp_path / "on.npy", script=script, **{switch: "1"})
    assert line not in log_off
    assert line in log_on, f"{switch}: never ran (no '{line}' in its log)"
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    np.testing.assert_array_equal(got, want)
    return log_on


def logits_with(target: Path, out: Path, by_unit: bool) -> tuple[np.ndarray, int]:
    """-> (the logits, how many matrices the load stored by unit, from its log)."""
    logits, log = run_with(target, out, by_unit=by_unit)
    stored = [int(m.group(1)) for m in STORED.finditer(log)]  # one line a load (two loads)
    return logits, max(stored, default=0)


def test_matrices_stored_by_unit_give_the_same_logits(k_quant_target, tmp_path):
    want, stored_rows = logits_with(k_quant_target, tmp_path / "rows.npy", by_unit=False)
    got, stored = logits_with(k_quant_target, tmp_path / "units.npy", by_unit=True)
    assert stored_rows == 0
    # 4 layers (3 delta net, 1 attention), each with at least an in-projection stack, gate|up, down and output
    # projection, and the head
    assert stored >= 4 * 4 + 1, f"only {stored} matrices stored by unit"
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    for split in range(1, len(want)):  # one column == 40 columns == 8 at a time == 23 then 17, each way
        np.testing.assert_array_equal(want[0], want[split])
    np.testing.assert_array_equal(got, want)
