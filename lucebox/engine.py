"""Engine: load once, then generate with AR, chain or DDTree speculative decoding.

One decode step is five named stages (decode.py): draft -> tree -> verify ->
accept -> commit, a fixed number of native calls on buffers allocated once. Speculative decoding is
lossless: greedy, the committed tokens equal AR greedy decoding whatever the draft proposes; sampled
(temperature > 0 or penalties), they equal AR sampling with the same seed (sampling.py).
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ._native import Handle, device_count
from . import memory_plan as planner
from .config import EngineConfig, GenerationConfig, device_index
from .decode import Step
from .sampling import Sampler
from .drafters import Drafter, NativeDrafter
from .stats import GenerationStats


@dataclass
class Generation:
    text: str
    tokens: list[int]           # a cancelled stream adds what its last step committed unshown (see stream)
    finish_reason: str          # "length", "eos", "stop", "context" or "cancelled"
    stats: GenerationStats
    seed: int | None = None     # the sampling seed used (None: greedy)


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
    """`with Engine("target.gguf", draft="draft_dir") as e: print(e.generate("Hi").text)`.

    Threads: one Engine serves one request at a time. `generate()`, `next_logits()`, `reset()` and
    `close()` hold `engine.lock` (a re-entrant lock) for their whole run, so calls from several
    threads are serialised, each with the output it would get alone. A `stream()` holds the lock only
    while a step runs, not while it is paused at a `yield`: another call may then take the engine,
    and the paused stream raises RuntimeError when resumed instead of yielding text from a cache it
    no longer owns. To keep the engine for a whole stream (a server), hold `engine.lock` around it.

    Interrupts: an exception at any point (Ctrl+C in a native call, an error) leaves Python's record
    of the cache equal to what the native cache holds (read back from the handle's journal), so the
    next call reuses what it can and gives the output a fresh engine would.
    """

    def __init__(self, target: str | Path | None = None, draft: str | Path | None = None, *,
                 config: EngineConfig | None = None, tokenizer=None, **options):
        """target: a GGUF path; None picks what `lucebox run` would: $LUCEBOX_TARGET (and
        $LUCEBOX_DRAFT), the pair `lucebox pull` fetched, else the embedded demo pair (with a warning)."""
        if config is None:
            if target is None:
                target, draft = _default_models(draft)
            config = EngineConfig(target=target, draft=draft, **options)
        if not config.target.is_file():
            raise FileNotFoundError(f"target GGUF not found: {config.target}")
        device = device_index(config.device, cuda_count=device_count())
        # concrete max_ctx, KV types and ubatch, from the memory plan when there is a budget
        config, self.memory_plan = planner.resolve(config, device)
        self.config = config
        self._handle = Handle(config.target, config.draft, max_ctx=config.max_ctx, type_k=config.type_k,
                              type_v=config.type_v, device=device, n_threads=config.n_threads, ubatch=config.ubatch,
                              max_tree=config.max_tree, log_level=config.log_level,
                              batch_invariant=config.batch_invariant, draft_window=config.draft_window,
                              draft_weights=config.draft_weights)
        self.info = self._handle.info()
        self._drafter = (NativeDrafter(self._handle, self.info["block_size"])
                         if self.info["has_draft"] else None)
        self._tokenizer = tokenizer  # one already built from this target's GGUF, or None (built lazily)
        self._cache_tokens: list[int] = []   # exactly what the native caches hold
        self._pending: int | None = None     # target argmax after _cache_tokens (not yet fed)
        self.lock = threading.RLock()        # one request at a time (see the class docstring)
        self._epoch = 0                      # bumped by every call that takes the engine over
        self.last_stats: GenerationStats | None = None
        self._last_generation: Generation | None = None  # the last finished (or cancelled) request

    @classmethod
    def from_pretrained(cls, name: str = "qwen3.5-27b", *, cache_dir=None, **options) -> "Engine":
        """The pair `lucebox pull NAME` fetched into the Hugging Face cache ("qwen3.5-27b", "qwen3.6-27b");
        options as for Engine(). FileNotFoundError (one line) when it has not been pulled."""
        from . import hub

        files = hub.cached(hub.spec_for(name), cache_dir)
        if files is None:
            raise FileNotFoundError(f"{name} is not in the Hugging Face cache; fetch it with `lucebox pull {name}`")
        return cls(files.target, files.draft, **options)

    # --- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_handle", None) is None:
            return
        with self.lock:  # never free the native engine under a call running in another thread
            if self._handle is not None:
                self._epoch += 1
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

    def memory(self) -> dict[str, int]:
        """Bytes the engine holds now, by part: weights, draft, kv, recurrent, tree, draft_cache, compute."""
        return self._h().memory()

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
        with self.lock:
            self._epoch += 1
            self._cache_tokens, self._pending = [], None  # first: an interrupted reset then resets again
            self._transaction(self._h().reset)

    # --- bookkeeping that survives exceptions ----------------------------------------------
    def _transaction(self, fn, *args):
        """fn(*args); on any exception (Ctrl+C included) resync with the native cache, then re-raise."""
        try:
            return fn(*args)
        except BaseException:
            self._resync()
            raise

    def _resync(self) -> None:
        """Make Python's record equal the native cache after an exception cut a call short."""
        self._pending = None  # the argmax after the cache is unknown: the next prompt feeds a token again
        if self._handle is not None:
            self._cache_tokens = self._handle.committed_tokens()

    def _exclusive(self, steps: Iterator[list[int]], epoch: int) -> Iterator[list[int]]:
        """Run the decode steps one at a time under the lock, as long as this stream owns the engine."""
        while True:
            with self.lock:
                if epoch != self._epoch:
                    steps.close()
                    raise RuntimeError("this stream lost the Engine to another call (generate, stream, reset, "
                                       "next_logits or close) while it was paused; finish or close a stream "
                                       "before the next call, or hold engine.lock around it")
                try:
                    chunk = next(steps)
                except StopIteration:
                    return
                except BaseException:
                    self._resync()
                    raise
            yield chunk

    # --- prompts --------------------------------------------------------------------------
    def encode_prompt(self, prompt) -> list[int]:
        """str -> raw text tokens; list of {role, content} dicts -> chat template; ints as is."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        kind = type(prompt).__name__
        try:
            if isinstance(prompt, (bytes, bytearray)):
                raise TypeError
            prompt = list(prompt)
            if prompt and isinstance(prompt[0], dict):
                # the template's special markers (<|im_start|> ...) encode as their special ids
                return self.tokenizer.encode(self.tokenizer.apply_chat_template(prompt))
            if not all(isinstance(t, (int, np.integer)) for t in prompt):
                raise TypeError
        except TypeError:
            raise ValueError("prompt must be a str, a list of {role, content} messages or a list of token ids; "
                             f"got {kind}") from None
        ids = [int(t) for t in prompt]
        # here, not only in the native prefill: an id past int32 would fail the conversion with numpy's message
        n_vocab = self.info["n_vocab"]
        bad = next((t for t in ids if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {n_vocab}); pass the model's ids")
        return ids

    def _prefill(self, ids: list[int], stats: GenerationStats, sampler=None, progress=None,
                 chunk_tokens: int | None = None) -> int:
        """Bring the caches to `ids`, reusing the cached prefix; return the next token (the argmax,
        or with a sampler the token drawn at position len(ids)). progress: see prefill()."""
        if not ids:
            raise ValueError("prompt is empty")
        n_cached = len(self._cache_tokens)
        # reuse the cached prefix; a prompt equal to the cache also needs the pending token
        if not (n_cached and ids[:n_cached] == self._cache_tokens
                and (n_cached < len(ids) or self._pending is not None)):
            self.reset()
            n_cached = 0
        if sampler is not None and n_cached == len(ids):
            # the draw needs the last prompt token's row, which no cache keeps: feed the prompt again
            self.reset()
            n_cached = 0
        new = np.asarray(ids[n_cached:], np.int32)
        t0 = time.perf_counter()
        first = self._pending
        if progress is not None and new.size:
            new = self._feed_in_chunks(new, progress, chunk_tokens or self.config.ubatch)
        if new.size and sampler is None:
            self._pending = first = self._h().prefill(new)
        elif new.size:
            sampler.set_history(ids[:len(ids) - new.size])
            self._pending = self._h().prefill_sampled(new, sampler.io)
            first = sampler.pick(0, self._h().processed_row)
        if progress is not None and len(ids) > n_cached:
            progress(len(ids) - n_cached, len(ids) - n_cached)
        if len(ids) > n_cached:
            self._cache_tokens = list(ids)
        stats.prefill_s = time.perf_counter() - t0
        stats.prompt_tokens = len(ids) - n_cached
        return first

    def _feed_in_chunks(self, new: np.ndarray, progress, chunk: int) -> np.ndarray:
        """Prefill all but the last chunk of `new`, `chunk` tokens per call, calling progress(done,
        total) before each; returns the rest. Batch invariance makes any split give the bits of one call."""
        total = new.size
        done = 0
        while total - done > chunk:
            progress(done, total)
            self._h().prefill(new[done:done + chunk])
            done += chunk
        progress(done, total)
        return new[done:]

    def prefill(self, prompt, progress: Callable[[int, int], None] | None = None,
                chunk_tokens: int | None = None) -> int:
        """Bring the caches to `prompt` (reusing the cached prefix); returns the next token.
        A generate() on the same prompt afterwards prefills nothing.

        progress(done, total): None, or a callable told how many of the `total` prompt tokens not
        cached yet are in the caches: (0, total) first, again after each `chunk_tokens` tokens (None:
        config.ubatch, the native micro-batch), and (total, total) at the end; a progress bar for long
        prompts. The caches end the same for any chunking (batch-invariant kernels)."""
        ids = self.encode_prompt(prompt)
        _check_chunk_tokens(chunk_tokens)
        with self.lock:
            self._epoch += 1  # a paused stream must not continue from these caches
            return self._transaction(self._prefill, ids, GenerationStats(mode="ar"), None, progress, chunk_tokens)

    @property
    def cached_tokens(self) -> tuple[int, ...]:
        """The tokens the caches hold now."""
        return tuple(self._cache_tokens)

    def snapshot(self) -> Snapshot:
        """Copy the committed state to host memory (restore() brings it back, bit for bit)."""
        with self.lock:
            if not self._cache_tokens or self._pending is None:
                raise ValueError("nothing is cached: prefill a prompt before taking a snapshot")
            return Snapshot(tuple(self._cache_tokens), int(self._pending), self._h().state_save())

    def restore(self, snap: Snapshot) -> None:
        """Make the caches what they were at snapshot(); the next generate() continues from there."""
        with self.lock:
            self._epoch += 1
            self._transaction(self._h().state_load, snap.data, snap.tokens)
            self._cache_tokens, self._pending = list(snap.tokens), snap.pending

    def next_logits(self, prompt) -> np.ndarray:
        """The target's logits ([n_vocab] float32) for the token after `prompt`; afterwards the
        cache holds the prompt, as after a generate() that produced nothing yet."""
        ids = self.encode_prompt(prompt)
        if not ids:
            raise ValueError("prompt is empty")
        with self.lock:
            self.reset()
            return self._transaction(self._next_logits, ids)

    def _next_logits(self, ids: list[int]) -> np.ndarray:
        h = self._h()
        if len(ids) > 1:
            h.prefill(np.asarray(ids[:-1], np.int32))
        out = np.zeros((1, self.info["n_vocab"]), np.float32)  # the last token alone: the AR step's kernels
        self._pending = h.prefill(np.asarray(ids[-1:], np.int32), out)
        self._cache_tokens = list(ids)
        return out[0]

    # --- generation -----------------------------------------------------------------------
    def generate(self, prompt, max_new_tokens: int = 256, **options) -> Generation:
        with self.lock:  # the whole request: concurrent generate() calls run one after the other
            for _ in self.stream(prompt, max_new_tokens, **options):
                pass
            return self._last_generation

    def stream(self, prompt, max_new_tokens: int = 256, *, drafter: Drafter | None = None,
               progress: Callable[[int, int], None] | None = None, chunk_tokens: int | None = None,
               **options) -> Iterator[str]:
        """Yield text as tokens commit. The finished Generation is in `last_generation`.
        progress, chunk_tokens: the prompt's prefill progress (see prefill())."""
        _check_chunk_tokens(chunk_tokens)
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
        sampler = Sampler.for_request(gen, self.info)
        seed = sampler.seed if sampler is not None else None
        stats = GenerationStats(mode=mode)
        self.last_stats = stats
        tok = self.tokenizer
        stop_ids = set() if gen.ignore_eos else set(tok.eos_ids)
        detok = tok.stream_decoder()
        out: list[int] = []
        text = ""
        finish = "length"
        with self.lock:
            last = self._transaction(self._prefill, ids, stats, sampler, progress, chunk_tokens)
            self._epoch += 1  # after _prefill, whose reset() bumps it too: this stream owns the engine now
            epoch = self._epoch
        t_start = time.perf_counter()
        step = Step(self._h(), self.info, mode, drafter, gen, sampler)
        chunk, i = [], 0
        try:
            for chunk in self._exclusive(self._decode(last, gen, step, stats, stop_ids), epoch):
                for i, t in enumerate(chunk):
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
            # the consumer stopped early (a chat's Ctrl+C): still record what was emitted, plus the
            # rest of the step's tokens (committed, not shown) so the caches stay a prefix of
            # prompt + tokens and a chat's next turn prefills only its new text
            stats.decode_s = time.perf_counter() - t_start
            stats.new_tokens = len(out)
            unshown = list(itertools.takewhile(lambda t: t not in stop_ids, chunk[i + 1:]))
            self._last_generation = Generation(text=text, tokens=out + unshown, finish_reason="cancelled",
                                               stats=stats, seed=seed)
            raise
        stats.decode_s = time.perf_counter() - t_start
        stats.new_tokens = len(out)
        if finish == "length":
            tail = detok.flush()
            if tail:
                text += tail
                yield tail
        self._last_generation = Generation(text=text, tokens=out, finish_reason=finish, stats=stats, seed=seed)

    @property
    def last_generation(self) -> Generation | None:
        return self._last_generation

    def _decode(self, last: int, gen: GenerationConfig, step: Step, stats: GenerationStats,
                stop_ids: set[int]) -> Iterator[list[int]]:
        """Yield the tokens each step emits, starting with `last`; stops at max_new or context.

        A step never commits past an end-of-sequence token or the request's last token, so the
        caches end exactly where the output does (a chat's next turn then reuses them).
        """
        emitted = 1
        yield [last]
        if last in stop_ids:
            return
        while emitted < gen.max_new_tokens:
            r = step.run(last, self._cache_tokens, gen.max_new_tokens - emitted, stop_ids)
            if r is None:
                return
            self._cache_tokens.extend(r.committed)
            self._pending = r.argmax_after
            last = r.bonus
            stats.draft_s += r.draft_s
            stats.verify_s += r.verify_s
            stats.commit_s += r.commit_s
            stats.host_s += r.host_s
            stats.record_step(len(r.committed))
            emitted += len(r.committed)
            yield r.committed[1:] + [last]


def _default_models(draft) -> tuple[Path, Path | None]:
    """Engine()'s target and draft when no target is named: the CLI's order (defaults.resolve)."""
    import warnings

    from .defaults import demo_notice, resolve

    models = resolve(None, draft)
    if models.source == "embedded":
        warnings.warn(demo_notice("pass a GGUF path: Engine(target, draft=...)"), stacklevel=3)
    return models.target, models.draft


def _check_chunk_tokens(chunk_tokens) -> None:
    if chunk_tokens is not None and (isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, (int, np.integer))
                                     or chunk_tokens < 1):
        raise ValueError(f"chunk_tokens must be an integer >= 1 (or None: config.ubatch), got {chunk_tokens!r}")


def _find_stop(text: str, stops: Sequence[str], new_from: int) -> int | None:
    """Index where the first stop string that ends in the new text starts, or None."""
    best = None
    for s in stops:
        i = text.find(s, max(0, new_from - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best

