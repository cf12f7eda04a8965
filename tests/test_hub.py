"""lucebox.hub and model resolution, against a local fake Hub and pre-filled caches (no network)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fakehub import FakeHub, fill_cache as _prefill_cache
from lucebox import defaults, hub

ROOT = Path(__file__).resolve().parent.parent
SPEC = hub.KNOWN["qwen3.5-27b"]


def _files(seed: int) -> dict[str, dict[str, bytes]]:
    rnd = bytes((seed * 31 + i * 7) % 256 for i in range(4096))
    return {
        SPEC.target_repo: {SPEC.target_file: b"GGUF" + rnd},
        SPEC.draft_repo: {"config.json": b'{"block_size": 16}', "model.safetensors": rnd[::-1]},
    }


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Empty HF cache and state dir; no model env vars; no embedded pair."""
    monkeypatch.setenv(hub.STATE_ENV, str(tmp_path / "state"))
    monkeypatch.delenv(defaults.TARGET_ENV, raising=False)
    monkeypatch.delenv(defaults.DRAFT_ENV, raising=False)
    monkeypatch.setenv(defaults.EMBEDDED_ENV, str(tmp_path / "no-embedded"))
    return tmp_path / "hf"


def test_pull_downloads_target_and_draft_and_remembers(isolated):
    repos = _files(1)
    with FakeHub(repos) as fake:
        files = hub.pull(SPEC, cache_dir=isolated, endpoint=fake.url)
    assert files.target.read_bytes() == repos[SPEC.target_repo][SPEC.target_file]
    assert (files.draft / "config.json").read_bytes() == repos[SPEC.draft_repo]["config.json"]
    assert (files.draft / "model.safetensors").read_bytes() == repos[SPEC.draft_repo]["model.safetensors"]
    assert str(files.target).startswith(str(isolated))
    assert hub.last_pulled() == SPEC
    # the cache lookup (no network) finds the same files
    assert hub.cached(SPEC, isolated) == files
    assert hub.find_pulled(isolated) == files


def test_pull_twice_uses_cache_without_downloading_again(isolated):
    with FakeHub(_files(2)) as fake:
        first = hub.pull(SPEC, cache_dir=isolated, endpoint=fake.url)
        gets = sum(1 for method, _ in fake.requests if method == "GET")
        second = hub.pull(SPEC, cache_dir=isolated, endpoint=fake.url)
        assert sum(1 for method, _ in fake.requests if method == "GET") == gets
    assert first == second


def test_gated_repo_message_names_terms_and_token(isolated):
    with FakeHub(_files(3), gated={SPEC.target_repo}) as fake:
        with pytest.raises(hub.HubError) as err:
            hub.pull(SPEC, cache_dir=isolated, endpoint=fake.url)
    msg = str(err.value)
    assert "gated" in msg and "HF_TOKEN" in msg and f"https://huggingface.co/{SPEC.target_repo}" in msg
    assert "\n" not in msg
    assert hub.last_pulled() is None


def test_missing_repo_and_missing_file(isolated):
    with FakeHub(_files(4)) as fake:
        with pytest.raises(hub.HubError, match="repository someone/absent not found"):
            hub.pull(hub.spec_for("someone/absent", "x.gguf"), cache_dir=isolated, endpoint=fake.url)
        with pytest.raises(hub.HubError, match="nope.gguf not found in"):
            hub.pull(hub.spec_for(SPEC.target_repo, "nope.gguf"), cache_dir=isolated, endpoint=fake.url)


def test_unreachable_hub_is_a_clear_offline_message(isolated):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(hub.HubError) as err:
        hub.pull(SPEC, cache_dir=isolated, endpoint=f"http://127.0.0.1:{port}")
    assert "cannot reach the Hugging Face Hub" in str(err.value)
    assert "\n" not in str(err.value)


def test_spec_for_names_and_repo_file():
    assert hub.spec_for("Qwen3.6-27B").target_repo == "unsloth/Qwen3.6-27B-GGUF"
    custom = hub.spec_for("me/model-GGUF", "m.gguf", draft_repo="me/draft")
    assert (custom.target_repo, custom.target_file, custom.draft_repo) == ("me/model-GGUF", "m.gguf", "me/draft")
    assert hub.spec_for("me/model-GGUF", "m.gguf").draft_repo is None
    for bad in (("nope",), ("noslash", "m.gguf"), ("me/model", "m.bin")):
        with pytest.raises(hub.HubError):
            hub.spec_for(*bad)


# --- resolution order ----------------------------------------------------------------------

def test_resolution_order_flag_env_pulled_embedded(isolated, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="embedded default is missing"):
        defaults.resolve(cache_dir=isolated)

    embedded = tmp_path / "emb"
    (embedded / "draft").mkdir(parents=True)
    (embedded / "target.gguf").write_bytes(b"GGUF")
    (embedded / "draft" / "config.json").write_text("{}")
    monkeypatch.setenv(defaults.EMBEDDED_ENV, str(embedded))
    got = defaults.resolve(cache_dir=isolated)
    assert (got.source, got.target, got.draft) == ("embedded", embedded / "target.gguf", embedded / "draft")

    _prefill_cache(isolated, _files(5))  # a model pulled earlier, found with no record of the pull
    got = defaults.resolve(cache_dir=isolated)
    assert got.source == "pulled" and got.target.name == SPEC.target_file
    assert (got.draft / "model.safetensors").is_file()

    env_target = tmp_path / "env.gguf"
    env_target.write_bytes(b"GGUF")
    monkeypatch.setenv(defaults.TARGET_ENV, str(env_target))
    got = defaults.resolve(cache_dir=isolated)
    assert (got.source, got.target, got.draft) == ("env", env_target, None)

    flag_target = tmp_path / "flag.gguf"
    flag_target.write_bytes(b"GGUF")
    got = defaults.resolve(flag_target, embedded / "draft", cache_dir=isolated)
    assert (got.source, got.target, got.draft) == ("flag", flag_target, embedded / "draft")
    assert defaults.resolve(flag_target, embedded / "draft", use_draft=False, cache_dir=isolated).draft is None


def test_last_pull_wins_over_other_cached_models(isolated):
    other = hub.KNOWN["qwen3.6-27b"]
    _prefill_cache(isolated, _files(6))
    _prefill_cache(isolated, {other.target_repo: {other.target_file: b"GGUF6"},
                              other.draft_repo: {"config.json": b"{}", "model.safetensors": b"x"}})
    assert hub.find_pulled(isolated).target.name == SPEC.target_file  # the default model first
    hub.record_pulled(other)
    assert hub.find_pulled(isolated).target.name == other.target_file


def test_partial_pull_is_not_used(isolated):
    repos = _files(7)
    del repos[SPEC.draft_repo]["model.safetensors"]
    _prefill_cache(isolated, repos)
    assert hub.cached(SPEC, isolated) is None


def test_missing_named_files_are_one_line_errors(isolated, tmp_path):
    with pytest.raises(FileNotFoundError, match="target GGUF not found: .*--target"):
        defaults.resolve(tmp_path / "absent.gguf")
    with pytest.raises(FileNotFoundError, match="is a folder"):
        defaults.resolve(tmp_path)
    target = tmp_path / "t.gguf"
    target.write_bytes(b"GGUF")
    with pytest.raises(FileNotFoundError, match="draft not found"):
        defaults.resolve(target, tmp_path / "no-draft")


# --- the command, as a user runs it ----------------------------------------------------------
def _cli(args, env_extra, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LUCEBOX_"))}
    env.update(PYTHONPATH=str(ROOT), HF_HUB_CACHE=str(tmp_path / "hf"), HF_HUB_DISABLE_PROGRESS_BARS="1",
               **{hub.STATE_ENV: str(tmp_path / "state")}, **env_extra)
    return subprocess.run([sys.executable, "-m", "lucebox", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_cli_pull_then_offline_pull_uses_cache(tmp_path):
    with FakeHub(_files(8)) as fake:
        done = _cli(["pull", "qwen3.5-27b"], {"HF_ENDPOINT": fake.url}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert SPEC.target_file in done.stdout and "draft:" in done.stdout
    # now offline: the same pull is satisfied from the cache
    again = _cli(["pull"], {"HF_HUB_OFFLINE": "1"}, tmp_path)
    assert again.returncode == 0, again.stderr


def test_cli_pull_offline_and_gated_give_one_line(tmp_path):
    offline = _cli(["pull", "qwen3.6-27b"], {"HF_HUB_OFFLINE": "1"}, tmp_path)
    assert offline.returncode == 1
    assert offline.stderr.strip().splitlines()[-1].startswith("Error: cannot reach the Hugging Face Hub")
    assert "Traceback" not in offline.stderr
    with FakeHub(_files(9), gated={SPEC.draft_repo}) as fake:
        gated = _cli(["pull"], {"HF_ENDPOINT": fake.url}, tmp_path)
    assert gated.returncode == 1 and "Traceback" not in gated.stderr
    assert "accept its terms" in gated.stderr and "HF_TOKEN" in gated.stderr
