#!/usr/bin/env python3
"""Materialize the pinned, patched ggml source (and llama.cpp's converter) into vendor/src/.

Only the standard library is used: this runs from CMake before anything is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMA_ROOT = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"

VENDOR = Path(__file__).resolve().parent
PATCHES = VENDOR / "patches"
CACHE = VENDOR / "cache"
DEFAULT_DEST = VENDOR / "src"

# ggml backends we never build; leaving them out keeps vendor/src small enough to travel.
SKIPPED_BACKENDS = (
    "ggml-blas", "ggml-cann", "ggml-et", "ggml-hexagon", "ggml-hip", "ggml-metal", "ggml-musa",
    "ggml-opencl", "ggml-openvino", "ggml-rpc", "ggml-sycl", "ggml-virtgpu", "ggml-vulkan",
    "ggml-webgpu", "ggml-zdnn", "ggml-zendnn",
)
# Top-level llama.cpp entries the converter needs, and nlohmann/json, which liblucebox reads JSON with.
ALWAYS_ENTRIES = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "vendor/nlohmann/")
# Extra llama.cpp entries for building llama-bench from the same pin (with --with-llama), plus a
# pristine, unpatched copy of ggml at llama.cpp/ggml (the sdist's own layout): the baseline must run
# stock ggml, not ours.
LLAMA_ENTRIES = ("CMakeLists.txt", "LICENSE", "cmake/", "common/", "include/", "src/", "tools/", "vendor/",
                 "licenses/")
# Path prefixes inside those entries that llama-bench never reads (the web UI and server,
# only configured with LLAMA_BUILD_SERVER; a 4 MB header only libmtmd includes; media fixtures).
# Leaving them out keeps vendor/src small enough to travel to the GPU machine.
LLAMA_SKIPPED = ("tools/ui/", "tools/server/", "vendor/miniaudio/miniaudio.h",
                 "tools/mtmd/test-", "tools/mtmd/tests/")
# Bump when the --with-llama layout changes, so an older llama.cpp tree is re-extracted (only stamps
# made with --with-llama carry it: a ggml-only tree stays valid and nobody's ggml build goes stale).
LLAMA_LAYOUT = 2
# Bump when what every tree holds changes, so an older tree is re-extracted.
LAYOUT = 2


def fail(msg: str) -> None:
    sys.exit(f"materialize: error: {msg}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def find_or_download_sdist(explicit: str | None) -> Path:
    candidates = [explicit, os.environ.get("LUCEBOX_SDIST"), str(CACHE / SDIST_NAME)]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    if explicit:
        fail(f"sdist not found at {explicit}")
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"materialize: downloading {PACKAGE}=={VERSION} sdist from PyPI", flush=True)
    # pip's isolated build environment (where `pip install .` runs CMake) hides the interpreter's
    # own site-packages through PYTHONPATH: run pip without it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    for python in pip_pythons(env):
        cmd = [python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"{PACKAGE}=={VERSION}", "-d", str(CACHE), "-q"]
        if subprocess.run(cmd, env=env).returncode == 0 and (CACHE / SDIST_NAME).is_file():
            return CACHE / SDIST_NAME
    fail(f"could not download {PACKAGE}=={VERSION}; offline? pass --sdist FILE or set LUCEBOX_SDIST")


def pip_pythons(env: dict) -> list[str]:
    """Interpreters on this machine that can run pip."""
    found = []
    for python in (sys.executable, shutil.which("python3"), shutil.which("python"),
                   getattr(sys, "_base_executable", None)):
        if python and python not in found and subprocess.run(
                [python, "-m", "pip", "--version"], capture_output=True, env=env).returncode == 0:
            found.append(python)
    return found


def patch_series() -> list[Path]:
    return sorted(PATCHES.glob("*.patch"))


def stamp_for(sdist_sha: str, with_llama: bool) -> dict:
    stamp = {
        "sdist_sha256": sdist_sha,
        "patches": {p.name: sha256_of(p) for p in patch_series()},
        "with_llama": with_llama,
        "layout": LAYOUT,
    }
    if with_llama:
        stamp["llama_layout"] = LLAMA_LAYOUT
    return stamp


def ggml_part(stamp: dict) -> dict:
    """The stamp of the ggml-only tree contained in `stamp`'s tree."""
    return {**{k: v for k, v in stamp.items() if k != "llama_layout"}, "with_llama": False}


def _under(rel: str, entries: tuple[str, ...]) -> bool:
    return any(rel == e or (e.endswith("/") and rel.startswith(e)) for e in entries)


def wanted(member: str, with_llama: bool) -> list[str]:
    """Map an sdist member to its paths under dest (none: skip it)."""
    if not member.startswith(LLAMA_ROOT):
        return []
    rel = member[len(LLAMA_ROOT):]
    if rel.startswith("ggml/"):
        parts = rel.split("/")
        if len(parts) > 2 and parts[1] == "src" and parts[2] in SKIPPED_BACKENDS:
            return []
        # ggml/ gets our patches; llama.cpp/ggml/ stays stock for the llama-bench baseline.
        return [rel, "llama.cpp/" + rel] if with_llama else [rel]
    if _under(rel, ALWAYS_ENTRIES):
        return ["llama.cpp/" + rel]
    if with_llama and _under(rel, LLAMA_ENTRIES) and not rel.startswith(LLAMA_SKIPPED):
        return ["llama.cpp/" + rel]
    return []


def extract(sdist: Path, dest: Path, with_llama: bool) -> None:
    with tarfile.open(sdist, "r:gz") as tar:
        for m in tar.getmembers():
            if not (m.isfile() or m.isdir()):
                continue
            for rel in wanted(m.name, with_llama):
                out = dest / rel
                if m.isdir():
                    out.mkdir(parents=True, exist_ok=True)
                    continue
                out.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(m) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.chmod(out, 0o755 if m.mode & 0o111 else 0o644)
    # ggml's CMake configures ggml.pc.in in standalone builds; the sdist lacks it. We build ggml
    # through add_subdirectory, but a stub keeps a standalone build (tests, benches) working too.
    for ggml_dir in (dest / "ggml", dest / "llama.cpp" / "ggml"):
        pc = ggml_dir / "ggml.pc.in"
        if ggml_dir.is_dir() and not pc.exists():
            pc.write_text("Name: ggml\nDescription: ggml (lucebox pin)\nVersion: @GGML_VERSION@\n"
                          "Libs: -L@CMAKE_INSTALL_FULL_LIBDIR@ -lggml\nCflags: -I@CMAKE_INSTALL_FULL_INCLUDEDIR@\n")


def apply_patches(ggml_dir: Path) -> None:
    for p in patch_series():
        # --directory is relative to the git root; apply inside ggml/ with paths relative to it.
        # Inside another git work tree (this repository), `git apply` would silently skip every path
        # outside it; a ceiling directory keeps git from discovering that repository.
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(ggml_dir.parent)}
        r = subprocess.run(["git", "apply", "--whitespace=nowarn", "-p1", str(p)], cwd=ggml_dir,
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            fail(f"patch {p.name} does not apply: {r.stderr.strip()}")
        print(f"materialize: applied {p.name}", flush=True)


def up_to_date(dest: Path, with_llama: bool) -> bool:
    """Whether `dest` holds the pinned sdist with today's patch series (and llama.cpp if asked)."""
    stamp_file = dest / "stamp.json"
    if not stamp_file.is_file():
        return False
    have, want = json.loads(stamp_file.read_text()), stamp_for(SDIST_SHA256, with_llama)
    return have == want or (not with_llama and ggml_part(have) == want)


def materialize(sdist_arg: str | None, dest: Path, with_llama: bool, force: bool) -> Path:
    # The stamp records the pinned hash, so an up-to-date tree needs no sdist: this is what lets a
    # carried vendor/src serve an offline machine.
    if not force and up_to_date(dest, with_llama):
        return dest
    want = stamp_for(SDIST_SHA256, with_llama)
    sdist = find_or_download_sdist(sdist_arg)
    sdist_sha = sha256_of(sdist)
    if sdist_sha != SDIST_SHA256:
        fail(f"{sdist} has sha256 {sdist_sha}, expected {SDIST_SHA256}: wrong or corrupt download; delete it")
    tmp = Path(tempfile.mkdtemp(prefix="materialize-", dir=dest.parent if dest.parent.exists() else None))
    try:
        extract(sdist, tmp, with_llama)
        apply_patches(tmp / "ggml")
        (tmp / "stamp.json").write_text(json.dumps(want, indent=1))
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"materialize: ggml ready in {dest}", flush=True)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sdist", help="path to an already downloaded sdist (offline use)")
    ap.add_argument("--dest", default=str(DEFAULT_DEST), help="output folder (default vendor/src)")
    ap.add_argument("--with-llama", action="store_true", help="also extract llama.cpp (for llama-bench)")
    ap.add_argument("--force", action="store_true", help="re-extract even if up to date")
    ap.add_argument("--check", action="store_true",
                    help="only say whether the tree is up to date with vendor/patches (exit 1 if not)")
    args = ap.parse_args()
    dest = Path(args.dest).resolve()
    if args.check:
        # an offline machine (the lent GPU) cannot re-materialize: a stale carried tree would build old sources
        if not up_to_date(dest, args.with_llama):
            fail(f"{dest} is missing or older than vendor/patches; run `python3 vendor/materialize.py"
                 f"{' --with-llama' if args.with_llama else ''}` where the network is (and carry the result)")
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    materialize(args.sdist, dest, args.with_llama, args.force)


if __name__ == "__main__":
    main()
