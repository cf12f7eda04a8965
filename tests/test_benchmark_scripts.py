"""The shell scripts under benchmarks/ answer -h / --help with their usage, before doing any work."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").rglob("*.sh") if p.name != "usage.sh" and "results" not in p.parts)


def header_first_line(script: Path) -> str:
    return script.read_text().splitlines()[1].removeprefix("# ")


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_help_prints_usage_and_does_nothing_else(script, flag, tmp_path):
    # a `lucebox` on PATH that leaves a mark: reproduce.sh would call it to pull the 27B pair
    marker = tmp_path / "lucebox-was-called"
    fake = tmp_path / "bin" / "lucebox"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
           "LUCEBOX_BENCH_OUT": str(tmp_path / "results"), "LUCEBOX_DEVICE_WORK": str(tmp_path / "work")}
    run = subprocess.run(["bash", str(script), flag], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(header_first_line(script))
    assert "bash benchmarks/" in run.stdout  # the usage line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]  # nothing called, nothing written
