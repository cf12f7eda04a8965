"""ggml-cuda kernels that load weights before their dependent wait (no graph writes a weights buffer; the engine
marks the target's so) give the logits of the loads after it, bit for bit, and run:
- a fused RMS norm's factor (patch 0069).

Oracle: the same engine with the early load off (its switch set both ways, read once per process, hence a process per
setting), on the small random Q4_K_M target of tests/test_lbq_layout.py (its calls of 1, 40, 8, 23 and 17 tokens).
Each early load logs its first use once a process: the test checks that it ran. CUDA only.
"""
from __future__ import annotations

import os

import pytest

from test_lbq_layout import check_switch, k_quant_target  # noqa: F401 (k_quant_target: a fixture)

pytestmark = pytest.mark.skipif(os.environ.get("LUCEBOX_TEST_BACKEND") != "cuda",
                                reason="ggml-cuda's dependent launch (LUCEBOX_TEST_BACKEND=cuda)")

EARLY_LOADS = {
    "GGML_CUDA_NORM_FACTORS_EARLY": "a norm's factors load before its wait",
}


@pytest.mark.parametrize("switch", sorted(EARLY_LOADS))
def test_an_early_load_gives_the_logits_of_the_load_after_the_wait(k_quant_target, tmp_path, switch):
    check_switch(k_quant_target, tmp_path, switch, EARLY_LOADS[switch])
