"""Engine: load once, then generate with AR, chain or DDTree speculative decoding.

One decode step is five named stages (see DESIGN.md): draft -> tree -> verify -> accept -> commit,
a fixed number of native calls on buffers allocated once. Greedy speculative decoding is lossless:
the committed tokens equal AR greedy decoding, whatever the draft proposes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from . import ddtree
from ._native import Handle, device_count
from .config import EngineConfig, GenerationConfig, device_index
from .drafters import Drafter, NativeDrafter
from .stats import GenerationStats


@dataclass
class Generation:
    text: str
    tokens: list[int]
    finish_reason: str          # "length", "eos", "stop", "context" or "cancelled"
    stats: GenerationStats


@dataclass(frozen=True)
class Snapshot:
    """The committed state at one moment (Engine.snapshot): the cached `tokens`, the `pending`
    next token, and the native caches as an opaque host-memory blob."""
    tokens: tuple[int, ...]
    pending: int
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


class Engine:
    """`with Engine("target.gguf", draft="draft_dir") as e: print(e.generate("Hi").text)`."""

    def __init__(self, target: str | Path | None = None, draft: str | Path | None = None, *,
                 config: EngineConfig | None = None, tokenizer=None, **options):
        if config is None:
            if target is None:
                raise ValueError("Engine needs a target GGUF path (or config=EngineConfig(...))")
            config = EngineConfig(target=target, draft=draft, **options)
        self.config = config
        if not config.target.is_file():
            raise FileNotFoundError(f"target GGUF not found: {config.target}")
        device = device_index(config.device, cuda_count=device_count())
        self._handle = Handle(config.target, config.draft, max_ctx=config.max_ctx, kv_type=config.kv,
                              device=device, n_threads=config.n_threads, ubatch=config.ubatch,
                              max_tree=config.max_tree, log_level=config.log_level)
        self.info = self._handle.info()
        self._drafter = (NativeDrafter(self._handle, self.info["block_size"])
                         if self.info["has_draft"] else None)
        self._tokenizer = tokenizer  # one already built from this target's GGUF, or None (built lazily)
        self._cache_tokens: list[int] = []   # exactly what the native caches hold
        self._pending: int | None = None     # target argmax after _cache_tokens (not yet fed)
        # verify output buffer, allocated once
        self._argmax = np.empty(self.info["max_tree"], np.int32)
        self.last_stats: GenerationStats | None = None

    # --- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _h(self) -> Handle:
        if self._handle is None:
            raise RuntimeError("Engine is closed")
        return self._handle

    @property
    def has_draft(self) -> bool:
        return self._drafter is not None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from .tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_gguf(self.config.target)
        return self._tokenizer

    def reset(self) -> None:
        self._h().reset()
        self._cache_tokens, self._pending = [], None

    # --- prompts --------------------------------------------------------------------------
    def encode_prompt(self, prompt) -> list[int]:
        """str -> raw text tokens; list of {role, content} dicts -> chat template; ints as is."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        prompt = list(prompt)
        if prompt and isinstance(prompt[0], dict):
            # the template's special markers (<|im_start|> ...) encode as their special ids
            return self.tokenizer.encode(self.tokenizer.apply_chat_template(prompt))
        return [int(t) for t in prompt]

    def _prefill(self, ids: list[int], stats: GenerationStats) -> int:
        """Bring the caches to `ids`, reusing the cached prefix; return the next token."""
        if not ids:
            raise ValueError("prompt is empty")
        n_cached = len(self._cache_tokens)
        if not (n_cached and n_cached <= len(ids) and ids[:n_cached] == self._cache_tokens):
            self.reset()
            n_cached = 0
        new = ids[n_cached:]
        t0 = time.perf_counter()
        if new:
            self._pending = self._h().prefill(np.asarray(new, np.int32))
            self._cache_tokens = list(ids)
        stats.prefill_s = time.perf_counter() - t0
        stats.prompt_tokens = len(new)
        return self._pending

    def prefill(self, prompt) -> int:
        """Bring the caches to `prompt` (reusing the cached prefix); returns the next token.
        A generate() on the same prompt afterwards prefills nothing."""
        return self._prefill(self.encode_prompt(prompt), GenerationStats(mode="ar"))

    @property
    def cached_tokens(self) -> tuple[int, ...]:
        """The tokens the caches hold now."""
        return tuple(self._cache_tokens)

    def snapshot(self) -> Snapshot:
        """Copy the committed state to host memory (restore() brings it back, bit for bit)."""
        if not self._cache_tokens:
            raise ValueError("nothing is cached: prefill a prompt before taking a snapshot")
        return Snapshot(tuple(self._cache_tokens), int(self._pending), self._h().state_save())

    def restore(self, snap: Snapshot) -> None:
        """Make the caches what they were at snapshot(); the next generate() continues from there."""
        self._h().state_load(snap.data)
        self._cache_tokens, self._pending = list(snap.tokens), snap.pending

    def next_logits(self, prompt) -> np.ndarray:
        """The target's logits ([n_vocab] float32) for the token after `prompt`; afterwards the
        cache holds the prompt, as after a generate() that produced nothing yet."""
        ids = self.encode_prompt(prompt)
        if not ids:
            raise ValueError("prompt is empty")
        self.reset()
        h = self._h()
        if len(ids) > 1:
            h.prefill(np.asarray(ids[:-1], np.int32))
        out = np.zeros((1, h.info()["n_vocab"]), np.float32)  # the last token alone: the AR step's kernels
        self._pending = h.prefill(np.asarray(ids[-1:], np.int32), out)
        self._cache_tokens = list(ids)
        return out[0]

    # --- generation -----------------------------------------------------------------------
    def generate(self, prompt, max_new_tokens: int = 256, **options) -> Generation:
        pieces: list[str] = []
        stream = self.stream(prompt, max_new_tokens, **options)
        for piece in stream:
            pieces.append(piece)
        return self._last_generation

    def stream(self, prompt, max_new_tokens: int = 256, *, drafter: Drafter | None = None,
               **options) -> Iterator[str]:
        """Yield text as tokens commit. The finished Generation is in `last_generation`."""
        gen = GenerationConfig(max_new_tokens=max_new_tokens, **options)
        mode = gen.mode
        drafter = drafter or self._drafter
        if mode == "auto":
            mode = "ddtree" if drafter is not None else "ar"
        if mode != "ar" and drafter is None:
            raise ValueError(f"mode {mode!r} needs a draft model (pass draft=...) or use mode='ar'")
        ids = self.encode_prompt(prompt)
        # a prompt may fill the context exactly: its next token needs no cache slot
        if len(ids) > self.info["max_ctx"]:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit max_ctx {self.info['max_ctx']}; "
                             "raise max_ctx or shorten the prompt")
        stats = GenerationStats(mode=mode)
        self.last_stats = stats
        tok = self.tokenizer
        stop_ids = set() if gen.ignore_eos else set(tok.eos_ids)
        detok = tok.stream_decoder()
        out: list[int] = []
        text = ""
        finish = "length"
        last = self._prefill(ids, stats)
        t_start = time.perf_counter()
        try:
            for chunk in self._decode(last, gen, mode, drafter, stats, stop_ids):
                for t in chunk:
                    if t in stop_ids:
                        finish = "eos"
                        break
                    out.append(t)
                    piece = detok.push(t)
                    text += piece
                    hit = _find_stop(text, gen.stop, len(text) - len(piece))
                    if hit is not None:
                        finish = "stop"
                        piece = piece[: len(piece) - (len(text) - hit)]
                        text = text[:hit]
                    if piece:
                        yield piece
                    if finish != "length" or len(out) >= gen.max_new_tokens:
                        break
                if finish != "length" or len(out) >= gen.max_new_tokens:
                    break
            else:
                finish = "context" if len(out) < gen.max_new_tokens else "length"
        except GeneratorExit:
            # the consumer stopped early (a chat's Ctrl+C): still record what was emitted
            stats.decode_s = time.perf_counter() - t_start
            stats.new_tokens = len(out)
            self._last_generation = Generation(text=text, tokens=out, finish_reason="cancelled", stats=stats)
            raise
        stats.decode_s = time.perf_counter() - t_start
        stats.new_tokens = len(out)
        if finish == "length":
            tail = detok.flush()
            if tail:
                text += tail
                yield tail
        self._last_generation = Generation(text=text, tokens=out, finish_reason=finish, stats=stats)

    @property
    def last_generation(self) -> Generation:
        return self._last_generation

    def _decode(self, last: int, gen: GenerationConfig, mode: str, drafter: Drafter | None,
                stats: GenerationStats, stop_ids: set[int]) -> Iterator[list[int]]:
        """Yield the tokens each step emits, starting with `last`; stops at max_new or context.

        A step never commits past an end-of-sequence token or the request's last token, so the
        caches end exactly where the output does (a chat's next turn then reuses them).
        """
        h = self._h()
        max_ctx = self.info["max_ctx"]
        max_tree = self.info["max_tree"]
        emitted = 1
        yield [last]
        if last in stop_ids:
            return
        while emitted < gen.max_new_tokens:
            n_past = len(self._cache_tokens)
            room = max_ctx - n_past          # nodes this verify may write, root included
            if room < 1:
                return
            remaining = gen.max_new_tokens - emitted
            if mode == "ar" or room < 2:
                t0 = time.perf_counter()
                nxt = h.step(last)
                stats.verify_s += time.perf_counter() - t0
                self._cache_tokens.append(last)
                self._pending = last = nxt
                stats.record_step(1)
                emitted += 1
                yield [nxt]
                continue
            # draft
            t0 = time.perf_counter()
            ids, logp = drafter.propose(last, n_past, gen.top_k)
            t1 = time.perf_counter()
            # tree
            budget = min(gen.budget, room - 1, max_tree - 1)
            if mode == "chain":
                tree = ddtree.chain_tree(ids, last, budget)
            else:
                tree = ddtree.build_tree(ids, logp, last, budget, chain_seed=gen.chain_seed)
            n = len(tree.tokens)
            t2 = time.perf_counter()
            # verify
            h.verify(tree.tokens, tree.parents, self._argmax[:n])
            t3 = time.perf_counter()
            # accept: never commit more than the request still needs
            path, bonus = ddtree.walk(tree, self._argmax[:n])
            path = list(path)
            emits = [int(t) for t in tree.tokens[path[1:]]] + [int(bonus)]
            for i, t in enumerate(emits):
                if t in stop_ids:
                    remaining = min(remaining, i + 1)
                    break
            if len(path) > remaining:
                path, bonus = path[:remaining], int(tree.tokens[path[remaining]])
            t4 = time.perf_counter()
            # commit
            h.commit(np.asarray(path, np.int32))
            t5 = time.perf_counter()
            committed = [int(t) for t in tree.tokens[path]]
            self._cache_tokens.extend(committed)
            self._pending = last = int(bonus)
            stats.draft_s += t1 - t0
            stats.verify_s += t3 - t2
            stats.commit_s += t5 - t4
            stats.host_s += (t2 - t1) + (t4 - t3)
            stats.record_step(len(path))
            emitted += len(path)
            yield committed[1:] + [last]


def _find_stop(text: str, stops: Sequence[str], new_from: int) -> int | None:
    """Index where the first stop string that ends in the new text starts, or None."""
    best = None
    for s in stops:
        i = text.find(s, max(0, new_from - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best

