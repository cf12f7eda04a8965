"""benchmarks/host_bench.py: the replay reproduces the recorded steps and the counts are sane."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_host_bench_replays_and_counts(tmp_path):
    out = tmp_path / "host.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_bench.py"), "--steps", "12", "--rounds", "1",
                          "--max-ctx", "512", "--json", str(out)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr  # a replay that parts from the recorded run raises
    rows = {r["mode"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"greedy", "sampled", "sampled-t1"}
    for r in rows.values():
        assert r["replay_us"] > 0 and r["live_us"] > 0 and r["tokens_per_step"] >= 1
        assert r["numpy_calls_per_step"] >= 1  # the tree's conversions at least
    # the sampled step's windows and draws are native: about the greedy step's numpy calls (only
    # a draw the candidates do not decide adds a few, on the whole row)
    assert rows["sampled"]["numpy_calls_per_step"] <= rows["greedy"]["numpy_calls_per_step"] + 1
    table = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == ["| greedy", "| sampled", "| sampled-t1"]
