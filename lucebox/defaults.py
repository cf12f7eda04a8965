"""Which model files run / chat / bench use when none are named.

Order: --target/--draft, then $LUCEBOX_TARGET/$LUCEBOX_DRAFT, then files pulled earlier into the HF
cache (`lucebox pull`), then the small pair embedded in the package (models/default/), so the first
command of the README works offline.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TARGET_ENV = "LUCEBOX_TARGET"
DRAFT_ENV = "LUCEBOX_DRAFT"
EMBEDDED_ENV = "LUCEBOX_EMBEDDED_DIR"  # packaging / test override of the embedded pair's folder
EMBEDDED_DIR = Path(__file__).resolve().parent / "models" / "default"

MISSING_MESSAGE = "no model given and the embedded default is missing; pass --target or run `lucebox pull`"


def demo_notice(how_to_name_one: str) -> str:
    """One line for when no model was named and the package's own small pair runs, so its output is
    not taken for what the product does."""
    return ("note: no model given, so this runs the embedded 7M-parameter demo pair (fast, not a useful model); "
            f"for the real one run `lucebox pull qwen3.5-27b` or {how_to_name_one}")


@dataclass(frozen=True)
class ResolvedModels:
    target: Path
    draft: Path | None
    source: str  # where the target came from: "flag", "env", "pulled" or "embedded"


def embedded_dir() -> Path:
    override = os.environ.get(EMBEDDED_ENV)
    return Path(override) if override else EMBEDDED_DIR


def embedded() -> tuple[Path, Path | None] | None:
    """(target.gguf, draft folder or None) of the embedded pair, if the package has it."""
    root = embedded_dir()
    target = root / "target.gguf"
    if not target.is_file():
        return None
    draft = root / "draft"
    return target, (draft if (draft / "config.json").is_file() else None)


def resolve(target: str | Path | None = None, draft: str | Path | None = None, *,
            use_draft: bool = True, cache_dir=None) -> ResolvedModels:
    """Pick the target and draft; raise FileNotFoundError (one line) when a named file is missing."""
    draft_named = draft or os.environ.get(DRAFT_ENV) or None
    if target:
        chosen = ResolvedModels(Path(target), None, "flag")
    elif os.environ.get(TARGET_ENV):
        chosen = ResolvedModels(Path(os.environ[TARGET_ENV]), None, "env")
    else:
        chosen = _pulled(cache_dir) or _embedded()
    draft_path = Path(draft_named) if draft_named else chosen.draft
    if not use_draft:
        draft_path = None
    _check_target(chosen)
    if draft_path is not None and not draft_path.exists():
        how = "--draft" if draft else (f"${DRAFT_ENV}" if draft_named else "the pulled draft")
        raise FileNotFoundError(f"draft not found: {draft_path} (from {how}); pass a DFlash draft folder "
                                "(config.json + model.safetensors) or --no-draft")
    return ResolvedModels(chosen.target, draft_path, chosen.source)


def _pulled(cache_dir) -> ResolvedModels | None:
    from . import hub

    files = hub.find_pulled(cache_dir)
    return ResolvedModels(files.target, files.draft, "pulled") if files else None


def _embedded() -> ResolvedModels:
    pair = embedded()
    if pair is None:
        raise FileNotFoundError(MISSING_MESSAGE)
    return ResolvedModels(pair[0], pair[1], "embedded")


def _check_target(chosen: ResolvedModels) -> None:
    if chosen.target.is_file():
        return
    how = {"flag": "--target", "env": f"${TARGET_ENV}"}.get(chosen.source, chosen.source)
    if chosen.target.is_dir():
        raise FileNotFoundError(f"target {chosen.target} (from {how}) is a folder; pass the .gguf file in it")
    raise FileNotFoundError(f"target GGUF not found: {chosen.target} (from {how}); "
                            "pass an existing .gguf file or run `lucebox pull`")
