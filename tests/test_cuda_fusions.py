"""ggml-cuda fusions lucebox adds for its graphs give the logits of the ops run apart, bit for bit, and run:
- a SwiGLU read by the product after it (patch 0051: the FFN's and the delta net's output gate; no GLU kernel),
- a delta net's conv reading its window and writing the next in place (patch 0052: no concat, no copy),
  computing the l2 norm of q and k after it (no norm kernel) and the layer's gates before it (no gates kernel),
- an attention layer's q / k norm with its multi-section rope (patch 0053: no rope kernel; K's rows straight into
  an f16 cache, no set_rows kernel),
- two products of one input in one launch (patches 0057-0058: the small target's Q6_K qkv with its Q4_K z|beta|alpha,
  its Q4_K q|k with its Q6_K v; one kernel in the one- and 8-token calls, a pair's three in the 23- and 17-token ones),
- a verify's conv over its token tree reading its window, with the l2 norm and the gates (patch 0063: no concat, no
  silu, no norm and no gates kernel; a tree's run, below),
- a verify's FFN: the gate|up product's split sums, the SwiGLU and the down product's activation pass in one kernel
  (patch 0072; the 23- and 17-token calls).

The small target's Q6_K qkv layer (its own product, whose buffer the allocator gives the conv's output) takes the conv
fusion too (patch 0054: the output over its tokens, each value where its token was): no conv is kept apart.

Oracle: the same engine with the fusion off (its GGML_CUDA_FUSE_* switch, read once per process, hence a process
per setting), on the small random Q4_K_M target of tests/test_lbq_layout.py (its calls of 1, 40, 8, 23 and 17
tokens). Each fusion logs its first match once a process: the test checks that it ran. CUDA only.
"""
from __future__ import annotations

import os

import pytest

from test_lbq_layout import check_switch, k_quant_target, run_with  # noqa: F401 (k_quant_target: a fixture)

pytestmark = pytest.mark.skipif(os.environ.get("LUCEBOX_TEST_BACKEND") != "cuda",
                                reason="ggml-cuda's fusions (LUCEBOX_TEST_BACKEND=cuda)")

FUSIONS = {
    "GGML_CUDA_FUSE_GLU_LBQ": "a SwiGLU read by the product after it",
    "GGML_CUDA_FUSE_CONV_WINDOW": "a conv read its window and wrote the next",
    "GGML_CUDA_FUSE_CONV_L2": "a conv's l2 norm in the conv",
    "GGML_CUDA_FUSE_CONV_GATES": "a delta net's gates in its conv",
    "GGML_CUDA_FUSE_NORM_MROPE": "a norm and its multi-section rope in one kernel",
    "GGML_CUDA_FUSE_LBQ_PAIR": "two products of one input in one launch",
    "GGML_CUDA_FUSE_LBQ_GLU_DOWN": "a SwiGLU's split sums and the down product's activations in one kernel",
}


@pytest.mark.parametrize("switch", sorted(FUSIONS))
def test_a_fusion_gives_the_logits_of_the_ops_apart(k_quant_target, tmp_path, switch):
    check_switch(k_quant_target, tmp_path, switch, FUSIONS[switch])


def test_a_conv_over_its_tokens_fuses(k_quant_target, tmp_path):
    # In the one-token and 8-token calls (the 40-token one is past the kernel's 32) the allocator gives the Q6_K qkv
    # layer's conv output its tokens' buffer (ggml-alloc's placement on this model: a change there may move it, which
    # this test then reports): that conv fuses, and no conv is kept apart for sharing memory. Its logits are checked
    # by the test above (GGML_CUDA_FUSE_CONV_WINDOW). Not seen from here: convs the matcher's structure refuses.
    _, log = run_with(k_quant_target, tmp_path / "fused.npy")
    assert "a conv wrote its output over its tokens" in log
    assert "a conv kept apart" not in log


# One process: a 40-token prompt (past the conv window kernel's 32 tokens: its prefill fuses no conv), then verify
# calls of two trees, a DDTree-like one of 23 tokens and a bushy one of 17, each with its logits.
RUN_TREES = """
import sys
import numpy as np
from lucebox._native import Handle
target, out = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(9)
prompt = rng.integers(0, 2000, 40).astype(np.int32)
trees = ([-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 1, 11, 2, 13, 14, 3, 16, 17, 5, 19, 8, 0],
         [-1] + [0] * 8 + list(range(1, 9)))
rows = []
with Handle(target, None, max_ctx=256, device=0, n_threads=1, log_level="debug") as h:
    h.prefill(prompt)
    for parents in trees:
        n = len(parents)
        logits = np.zeros((n, h.info()["n_vocab"]), np.float32)
        h.verify(rng.integers(0, 2000, n).astype(np.int32), np.array(parents, np.int32), np.zeros(n, np.int32), logits)
        rows.append(logits.ravel())
np.save(out, np.concatenate(rows))
"""


def test_a_tree_conv_fuses_with_the_logits_of_the_ops_apart(k_quant_target, tmp_path):
    log = check_switch(k_quant_target, tmp_path, "GGML_CUDA_FUSE_CONV_TREE", "a tree's conv read its window",
                       script=RUN_TREES)
    # the norm and the gates fused into a conv can only be the trees' here (the prompt's conv runs apart)
    for line in (FUSIONS["GGML_CUDA_FUSE_CONV_L2"], FUSIONS["GGML_CUDA_FUSE_CONV_GATES"]):
        assert line in log, f"not in the log: {line}"
    assert "a conv read its window and wrote the next" not in log
