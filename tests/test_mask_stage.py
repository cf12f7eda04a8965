"""The engine's attention-mask stage (native/src/mask_stage.hpp) against masks written from scratch.

The stage keeps the last mask and rewrites and sends only the slots a call changed; native/tools/mask_check
(found in $LUCEBOX_TOOLS_DIR, else build/cpu) drives it through random runs of AR steps, verifies,
prefill micro-batches, shrinking prefixes and rebuilt graphs and compares every value of the host copy
and of the device mask. LUCEBOX_TEST_BACKEND=cuda puts the host copy in the device's pinned memory and
sends the changed spans as 2-D copies.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BACKEND = os.environ.get("LUCEBOX_TEST_BACKEND", "cpu")


def tool() -> Path:
    exe = Path(os.environ.get("LUCEBOX_TOOLS_DIR", ROOT / "build" / "cpu")) / "mask_check"
    if not exe.is_file():
        pytest.fail(f"{exe} not found: build it (bash tests/run.sh, or cmake --build build/cpu) "
                    f"or point LUCEBOX_TOOLS_DIR at the build folder")
    return exe


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kept_mask_equals_scratch(seed):
    r = subprocess.run([str(tool()), "--backend", BACKEND, "--calls", "3000", "--seed", str(seed)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.fullmatch(r"mask_check: (\d+) builds ok \((\d+) on kept rows, (\d+) of them sent in part\)\n", r.stdout)
    assert m, r.stdout
    builds, kept, in_part = int(m[1]), int(m[2]), int(m[3])
    # every path ran many times: rows kept from the call before (sent in part, or whole to a rebuilt graph or
    # one that does not keep its mask), and rows written anew
    assert in_part > 500 and kept - in_part > 50 and builds - kept > 100, r.stdout


def test_bad_option_is_one_line():
    r = subprocess.run([str(tool()), "--colour", "red"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "unknown option --colour" in r.stderr
