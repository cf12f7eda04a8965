"""`vendor/materialize.py --check`: an offline machine (the lent GPU) learns up front, in one line, that a carried
vendor/src is older than vendor/patches, instead of building old sources."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "vendor" / "materialize.py"
sys.path.insert(0, str(SCRIPT.parent))
import materialize  # noqa: E402


def check(dest: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--check", "--dest", str(dest), *flags],
                          capture_output=True, text=True, timeout=60)


def write_stamp(dest: Path, stamp: dict) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "stamp.json").write_text(json.dumps(stamp))


def test_a_tree_stamped_with_todays_patches_passes(tmp_path):
    write_stamp(tmp_path / "src", materialize.stamp_for(materialize.SDIST_SHA256, with_llama=True))
    for flags in ((), ("--with-llama",)):
        run = check(tmp_path / "src", *flags)
        assert run.returncode == 0, run.stderr
        assert run.stdout == run.stderr == ""


def test_a_tree_without_the_newest_patch_fails_in_one_line(tmp_path):
    stamp = materialize.stamp_for(materialize.SDIST_SHA256, with_llama=True)
    newest = sorted(stamp["patches"])[-1]
    del stamp["patches"][newest]  # materialized before the newest patch was added
    write_stamp(tmp_path / "src", stamp)
    run = check(tmp_path / "src")
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "older than vendor/patches" in lines[0] and "materialize.py" in lines[0], run.stderr


def test_an_edited_patch_or_a_missing_tree_fails(tmp_path):
    stamp = materialize.stamp_for(materialize.SDIST_SHA256, with_llama=False)
    first = sorted(stamp["patches"])[0]
    stamp["patches"][first] = "0" * 64  # the patch changed since
    write_stamp(tmp_path / "src", stamp)
    assert check(tmp_path / "src").returncode == 1
    assert check(tmp_path / "none").returncode == 1
    # a ggml-only tree does not serve a build that wants llama.cpp
    write_stamp(tmp_path / "ggml", materialize.stamp_for(materialize.SDIST_SHA256, with_llama=False))
    assert check(tmp_path / "ggml").returncode == 0
    assert check(tmp_path / "ggml", "--with-llama").returncode == 1
