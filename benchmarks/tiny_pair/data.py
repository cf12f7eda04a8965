"""The corpus: Python sources found offline on any machine that can run this training.

First the running Python's standard library; then, up to a character budget, the .py files of its
site-packages (torch and transformers at least, since the training needs them), in an order fixed
by path hashes and without duplicates. Some stdlib installs are thin (Debian/Ubuntu ship ~8 MB
without the test suite), and one pass over fresh text beats many passes over the same files.
Stdlib files are split into train / held-out by a hash of their path relative to the stdlib root,
so the split is the same on every machine whose stdlib has the file. Held-out files give the
evaluation prompts (code prefixes ending right after a `def` line); training files give the token
stream, raw files plus a share of chat-formatted snippets so `lucebox run`'s chat template gets
code back.
"""
from __future__ import annotations

import hashlib
import random
import re
import site
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SKIP_DIRS = {"site-packages", "dist-packages", "encodings", "__pycache__", "idle_test"}
SITE_DIR_NAMES = ("site-packages", "dist-packages")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py")
MAX_FILE_BYTES = 300_000      # bigger stdlib files are generated tables, not code
HELDOUT_PERCENT = 4           # of files, by path hash

CHAT_USER = "<|im_start|>user\n"
CHAT_ASSISTANT = "<|im_start|>assistant\n"
CHAT_END = "<|im_end|>"
DOC_END = "<|endoftext|>"

_DEF_LINE = re.compile(r"^( {0,8})def \w+\(.*\):\s*$")


@dataclass
class Corpus:
    root: Path
    train: list[tuple[str, str]]    # (relative path, text): stdlib
    heldout: list[tuple[str, str]]  # stdlib, never trained on
    site: list[tuple[str, str]] = field(default_factory=list)   # site-packages, trained on
    site_roots: list[str] = field(default_factory=list)
    site_packages: dict = field(default_factory=dict)           # top-level name -> characters

    @property
    def train_files(self) -> list[tuple[str, str]]:
        return self.train + self.site


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT


def site_roots() -> list[Path]:
    """The interpreter's site-packages / dist-packages folders that exist, in sys.path order."""
    candidates = list(sys.path) + site.getsitepackages()
    roots = []
    for c in candidates:
        p = Path(c)
        if p.name in SITE_DIR_NAMES and p.is_dir() and p.resolve() not in roots:
            roots.append(p.resolve())
    return roots


def _read(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_FILE_BYTES or path.name.endswith(GENERATED_SUFFIXES):
            return None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.strip() else None


def load_corpus(root: Path | None = None, max_files: int | None = None, site_chars: int = 0) -> Corpus:
    """Every readable .py under the stdlib root (minus third-party and table-like files), sorted,
    then site-packages files up to `site_chars` characters."""
    root = root or stdlib_root()
    train, heldout = [], []
    paths = sorted(p for p in root.rglob("*.py") if not SKIP_DIRS.intersection(p.relative_to(root).parts))
    for path in paths:
        text = _read(path)
        if text is None:
            continue
        rel = path.relative_to(root).as_posix()
        (heldout if is_heldout(rel) else train).append((rel, text))
    if max_files is not None:  # smoke runs: an evenly spread subset
        train = train[::max(1, len(train) // max_files)][:max_files]
    if not train or not heldout:
        raise RuntimeError(f"no usable .py files under {root} (train {len(train)}, held-out {len(heldout)})")
    corpus = Corpus(root, train, heldout)
    if site_chars > 0:
        _add_site(corpus, site_chars)
    return corpus


def _add_site(corpus: Corpus, budget: int) -> None:
    """site-packages files in path-hash order until `budget` characters, skipping exact duplicates
    (of each other and of any stdlib file, held-out ones included)."""
    seen = {hashlib.sha1(t.encode()).digest() for _, t in corpus.train + corpus.heldout}
    entries = []
    for r in site_roots():
        for path in r.rglob("*.py"):
            rel = path.relative_to(r).as_posix()
            if "__pycache__" not in rel:
                entries.append((hashlib.sha256(rel.encode()).digest(), rel, path))
    entries.sort()
    used, packages = 0, Counter()
    for _, rel, path in entries:
        if used >= budget:
            break
        text = _read(path)
        if text is None:
            continue
        digest = hashlib.sha1(text.encode()).digest()
        if digest in seen:
            continue
        seen.add(digest)
        corpus.site.append((rel, text))
        packages[rel.split("/")[0].removesuffix(".py")] += len(text)
        used += len(text)
    corpus.site_roots = [str(r) for r in site_roots()]
    corpus.site_packages = dict(packages.most_common())


def chat_snippets(files: list[tuple[str, str]], share: float, seed: int) -> list[str]:
    """Chat-formatted documents: the user gives a code prefix, the assistant continues it.

    About `share` of the raw characters, cut at line boundaries: the prefix is 1-12 lines ending
    at a `def` line when one is near, the reply the next 4-30 lines.
    """
    rng = random.Random(seed)
    budget = share * sum(len(t) for _, t in files)
    out, used = [], 0
    while used < budget:
        _, text = files[rng.randrange(len(files))]
        lines = text.splitlines(keepends=True)
        if len(lines) < 8:
            continue
        defs = [i for i, line in enumerate(lines) if _DEF_LINE.match(line)]
        end = rng.choice(defs) + 1 if defs and rng.random() < 0.7 else rng.randrange(1, len(lines) - 4)
        start = max(0, end - rng.randint(1, 12))
        stop = min(len(lines), end + rng.randint(4, 30))
        user, reply = "".join(lines[start:end]), "".join(lines[end:stop])
        if not user.strip() or not reply.strip():
            continue
        doc = f"{CHAT_USER}{user.rstrip()}{CHAT_END}\n{CHAT_ASSISTANT}{reply.rstrip()}{CHAT_END}\n"
        out.append(doc)
        used += len(doc)
    return out


def training_documents(corpus: Corpus, chat_share: float, seed: int) -> list[str]:
    """Raw files (each closed by <|endoftext|>) and chat snippets, shuffled together."""
    files = corpus.train_files
    docs = [text + DOC_END for _, text in files]
    docs += [d + DOC_END for d in chat_snippets(files, chat_share, seed)]
    random.Random(seed + 1).shuffle(docs)
    return docs


def _after_docstring(lines: list[str], i: int) -> int:
    """Index of the first line after a docstring opening at lines[i], or i when there is none."""
    head = lines[i].lstrip()
    quote = next((q for q in ('"""', "'''") if head.lstrip("rRbBuU").startswith(q)), None)
    if quote is None:
        return i
    if head.count(quote) >= 2:
        return i + 1
    for j in range(i + 1, min(len(lines), i + 60)):
        if quote in lines[j]:
            return j + 1
    return i


def heldout_prompts(corpus: Corpus, n: int, seed: int, max_lines: int = 30,
                    max_chars: int = 1000) -> list[dict]:
    """`n` code prompts from held-out files: a file excerpt ending after a `def` line (and its
    docstring, if it has one), so the continuation is the function's code.

    At most one prompt per file while files last, so the prompts cover different modules. At most
    `max_chars` (~300 tokens), so prompt + 128 generated tokens stay inside the target's training
    length.
    """
    rng = random.Random(seed)
    files = list(corpus.heldout)
    rng.shuffle(files)
    prompts = []
    rounds = 0
    while len(prompts) < n and rounds < 4:
        for rel, text in files:
            lines = text.splitlines(keepends=True)
            ends = [_after_docstring(lines, i + 1) for i, line in enumerate(lines) if _DEF_LINE.match(line)]
            ends = [e for e in ends if 4 <= e and e + 8 < len(lines)]
            if not ends:
                continue
            end = rng.choice(ends)
            start = max(0, end - max_lines)
            prompt = "".join(lines[start:end])
            if len(prompt) > max_chars:   # drop whole leading lines
                cut = prompt.find("\n", len(prompt) - max_chars)
                prompt = prompt[cut + 1:] if cut >= 0 else prompt[-max_chars:]
            if not prompt.strip() or any(p["prompt"] == prompt for p in prompts):
                continue
            prompts.append({"id": f"tiny_code_{len(prompts) + 1:02d}", "suite": "tiny_code",
                            "source": rel, "prompt": prompt})
            if len(prompts) == n:
                break
        rounds += 1
    if len(prompts) < n:
        raise RuntimeError(f"only {len(prompts)} held-out prompts found, wanted {n}")
    return prompts
