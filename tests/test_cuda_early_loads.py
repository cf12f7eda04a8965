"""ggml-cuda kernels that load what no kernel writes before their dependent wait give the logits of the loads after
it, bit for bit, and run: a fused RMS norm's factor from a weights buffer (patch 0069; the engine marks the target's
weights so).

Oracle: the same engine with the early load off (its switch, read once per process, hence a process per setting), on
the small random Q4_K_M target of tests/test_lbq_layout.py (its calls of 1, 40, 8, 23 and 17 tokens). An early load
logs its first use once a process: the test checks that it ran. CUDA only.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from test_lbq_layout import k_quant_target, run_with  # noqa: F401 (k_quant_target: a fixture)

pytestmark = pytest.mark.skipif(os.environ.get("LUCEBOX_TEST_BACKEND") != "cuda",
                                reason="ggml-cuda's dependent launch (LUCEBOX_TEST_BACKEND=cuda)")

EARLY_LOADS = {
    "GGML_CUDA_NORM_FACTORS_EARLY": "a norm's factors load before its wait",
}


@pytest.mark.parametrize("switch", sorted(EARLY_LOADS))
def test_an_early_load_gives_the_logits_of_the_load_after_the_wait(k_quant_target, tmp_path, switch):
    want, log_after = run_with(k_quant_target, tmp_path / "after.npy", **{switch: "0"})
    got, log_early = run_with(k_quant_target, tmp_path / "early.npy", **{switch: "1"})
    assert EARLY_LOADS[switch] not in log_after
    assert EARLY_LOADS[switch] in log_early, f"{switch}: the early load never ran"
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    np.testing.assert_array_equal(got, want)
