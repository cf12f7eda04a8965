"""Model downloads from the Hugging Face Hub, and finding what was downloaded before.

Files go to the standard HF cache (HF_HOME / HF_HUB_CACHE), so other tools share them. What was
pulled last is remembered in `<state dir>/pulled.json`, so run / chat / bench find it without flags.
Every failure becomes a `HubError` whose message is one line naming the fix (gated, offline, typo).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_ENV = "LUCEBOX_STATE_DIR"
DRAFT_FILES = ("config.json", "model.safetensors")


class HubError(RuntimeError):
    """A download or cache lookup failed; str() is a one-line message with the fix."""


@dataclass(frozen=True)
class ModelSpec:
    """A target GGUF file and (optionally) the DFlash draft repo trained for it."""

    name: str
    target_repo: str
    target_file: str
    draft_repo: str | None = None
    draft_files: tuple[str, ...] = DRAFT_FILES


KNOWN = {
    "qwen3.5-27b": ModelSpec("qwen3.5-27b", "unsloth/Qwen3.5-27B-GGUF", "Qwen3.5-27B-Q4_K_M.gguf",
                             "z-lab/Qwen3.5-27B-DFlash"),
    "qwen3.6-27b": ModelSpec("qwen3.6-27b", "unsloth/Qwen3.6-27B-GGUF", "Qwen3.6-27B-Q4_K_M.gguf",
                             "z-lab/Qwen3.6-27B-DFlash"),
}
DEFAULT_MODEL = "qwen3.5-27b"


@dataclass(frozen=True)
class ModelFiles:
    target: Path
    draft: Path | None  # folder holding config.json + model.safetensors


def spec_for(name_or_repo: str, file: str | None = None, draft_repo: str | None = None) -> ModelSpec:
    """`qwen3.5-27b` (a known name) or `REPO FILE` (any GGUF on the Hub, draft optional)."""
    if file is None:
        spec = KNOWN.get(name_or_repo.lower())
        if spec is None:
            raise HubError(f"unknown model {name_or_repo!r}; known: {', '.join(KNOWN)} "
                           "(or pass REPO FILE, e.g. unsloth/Qwen3.5-27B-GGUF Qwen3.5-27B-Q4_K_M.gguf)")
        if draft_repo is not None:
            spec = ModelSpec(spec.name, spec.target_repo, spec.target_file, draft_repo)
        return spec
    if "/" not in name_or_repo:
        raise HubError(f"{name_or_repo!r} is not a Hub repo id; write it as OWNER/NAME")
    if not file.endswith(".gguf"):
        raise HubError(f"{file!r} is not a .gguf file; lucebox loads GGUF targets")
    return ModelSpec(f"{name_or_repo}/{file}", name_or_repo, file, draft_repo)


# --- what was pulled ----------------------------------------------------------------------
def state_dir() -> Path:
    override = os.environ.get(STATE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lucebox"


def _record_path() -> Path:
    return state_dir() / "pulled.json"


def record_pulled(spec: ModelSpec) -> None:
    path = _record_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(spec), indent=1))
        tmp.replace(path)
    except OSError:
        pass  # remembering is a convenience: the files are in the HF cache either way


def last_pulled() -> ModelSpec | None:
    try:
        data = json.loads(_record_path().read_text())
        data["draft_files"] = tuple(data.get("draft_files", DRAFT_FILES))
        return ModelSpec(**data)
    except (OSError, ValueError, TypeError):
        return None


# --- cache lookups (never touch the network) -----------------------------------------------
def cache_root(cache_dir=None) -> Path:
    """The HF hub cache, from the environment as it is now (huggingface_hub reads it once, at import)."""
    if cache_dir:
        return Path(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _cached_file(repo: str, file: str, cache_dir) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, file, cache_dir=cache_root(cache_dir))
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def cached(spec: ModelSpec, cache_dir=None) -> ModelFiles | None:
    """The spec's files if the target (and draft, when it has one) are all in the cache."""
    target = _cached_file(spec.target_repo, spec.target_file, cache_dir)
    if target is None:
        return None
    if spec.draft_repo is None:
        return ModelFiles(target, None)
    draft_paths = [_cached_file(spec.draft_repo, f, cache_dir) for f in spec.draft_files]
    if any(p is None for p in draft_paths):
        return None
    return ModelFiles(target, draft_paths[0].parent)


def find_pulled(cache_dir=None) -> ModelFiles | None:
    """Files pulled earlier: the last `lucebox pull`, else any known model found in the cache."""
    candidates = [s for s in (last_pulled(),) if s is not None]
    candidates += [KNOWN[DEFAULT_MODEL]] + [s for n, s in KNOWN.items() if n != DEFAULT_MODEL]
    for spec in candidates:
        files = cached(spec, cache_dir)
        if files is not None:
            return files
    return None


# --- downloads ---------------------------------------------------------------------------
def pull(spec: ModelSpec, *, cache_dir=None, endpoint: str | None = None, token=None) -> ModelFiles:
    """Download the target GGUF and the draft into the HF cache (tqdm progress); remember them."""
    if cached(spec, cache_dir) is None:
        _check_reachable(spec, endpoint)
    target = _download(spec.target_repo, spec.target_file, cache_dir, endpoint, token)
    draft = None
    if spec.draft_repo is not None:
        paths = [_download(spec.draft_repo, f, cache_dir, endpoint, token) for f in spec.draft_files]
        draft = paths[0].parent
    record_pulled(spec)
    return ModelFiles(target, draft)


def _check_reachable(spec: ModelSpec, endpoint: str | None) -> None:
    """Fail fast when offline: huggingface_hub retries a dead connection with backoff for ~20 s."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or any(os.environ.get(v) for v in (
            "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")):
        return  # offline mode fails fast by itself; behind a proxy a direct probe proves nothing
    url = urlsplit(endpoint or constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=5).close()
    except OSError:
        raise HubError(f"cannot reach the Hugging Face Hub at {url.hostname}:{port} (offline?) and "
                       f"{spec.name} is not fully in the cache; connect and run `lucebox pull` again, "
                       "or pass --target PATH") from None


def _download(repo: str, file: str, cache_dir, endpoint, token) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                       LocalEntryNotFoundError, RepositoryNotFoundError)

    where = cache_root(cache_dir)
    try:
        return Path(hf_hub_download(repo, file, cache_dir=where, endpoint=endpoint, token=token))
    # order matters: LocalEntryNotFoundError is an EntryNotFoundError, GatedRepoError a RepositoryNotFoundError
    except LocalEntryNotFoundError:
        raise HubError(f"cannot reach the Hugging Face Hub (offline, or HF_HUB_OFFLINE=1) and {repo}/{file} "
                       f"is not in the cache ({where}); connect and run `lucebox pull` again, "
                       "or pass --target PATH") from None
    except GatedRepoError:
        raise HubError(f"{repo} is gated: accept its terms at https://huggingface.co/{repo} while logged in, "
                       "then set HF_TOKEN (or run `hf auth login`) and pull again") from None
    except RepositoryNotFoundError:
        raise HubError(f"repository {repo} not found on the Hub (if it is private, set HF_TOKEN)") from None
    except EntryNotFoundError:
        raise HubError(f"{file} not found in {repo}; check the file name on https://huggingface.co/{repo}") from None
    except HfHubHTTPError as e:
        raise HubError(f"download of {repo}/{file} failed: {_one_line(e)}") from None
    except Exception as e:  # disk full, permissions, a connection dropped mid-file (HTTP client errors)
        raise HubError(f"download of {repo}/{file} failed: {_one_line(e)}") from None


def _one_line(err: Exception) -> str:
    text = " ".join(str(err).split())
    return text[:300] or type(err).__name__
