"""One engine, one request at a time: a FIFO queue served by a single thread.

Route handlers `submit()` a Job and read its events (text pieces, then a result or an error) from
an asyncio queue; the engine thread pushes them with call_soon_threadsafe. A job whose client went
away is cancelled: skipped if still queued, else its generation stops at the next piece (within
one decode step) and the engine is free for the next job.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from .prefix_cache import PrefixReuse

log = logging.getLogger("lucebox.server")


class QueueFull(RuntimeError):
    pass


@dataclass
class Result:
    text: str
    tokens: list[int]
    finish_reason: str        # the Engine's: length, eos, stop, context, cancelled
    prompt_tokens: int
    cached_tokens: int
    stats: object             # GenerationStats
    queued_s: float = 0.0


@dataclass
class Job:
    ids: list[int]
    options: dict
    loop: asyncio.AbstractEventLoop
    label: str = "POST"           # method and path, for the log line
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.cancelled.set()

    def _push(self, kind: str, value) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is gone (server shutting down)
            pass


class Worker:
    """Owns the Engine; `submit(job)` queues it (QueueFull past `max_queue` waiting jobs)."""

    def __init__(self, engine, *, max_queue: int, prefix_cache_bytes: int):
        self.engine = engine
        self.max_queue = max_queue
        self.prefix = PrefixReuse(engine, prefix_cache_bytes)
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0                 # jobs queued, not yet started
        self._running: Job | None = None
        self._thread = threading.Thread(target=self._run, name="lucebox-engine", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return self._waiting

    def submit(self, job: Job) -> None:
        with self._lock:
            # an idle engine takes the next job at once: it does not count as waiting
            if self._waiting >= self.max_queue + (self._running is None):
                raise QueueFull(f"the server is busy: {self._waiting} requests are waiting "
                                f"(--max-queue {self.max_queue}); retry later")
            self._waiting += 1
        self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
                self._running = job
            try:
                if job.cancelled.is_set():
                    log.info("%s 499 cancelled while queued", job.label)
                    job._push("error", asyncio.CancelledError())
                else:
                    self._serve(job)
            except Exception as e:  # noqa: BLE001 (any engine failure goes back to its request)
                log.debug("engine failure", exc_info=True)
                log.info("%s %d error: %s", job.label, 400 if isinstance(e, ValueError) else 500, e)
                job._push("error", e)
            finally:
                with self._lock:
                    self._running = None

    def _serve(self, job: Job) -> None:
        e = self.engine
        started = time.perf_counter()
        cached = self.prefix.prepare(job.ids)
        job._push("start", cached)
        stream = e.stream(job.ids, **job.options)
        try:
            for piece in stream:
                job._push("text", piece)
                if job.cancelled.is_set():
                    break
        finally:
            stream.close()
        gen = e.last_generation
        self.prefix.after_reply()
        result = Result(text=gen.text, tokens=list(gen.tokens), finish_reason=gen.finish_reason,
                        prompt_tokens=len(job.ids), cached_tokens=cached, stats=gen.stats,
                        queued_s=started - job.submitted)
        _log_result(job, result)
        job._push("done", result)


def _log_result(job: Job, r: Result) -> None:
    s = r.stats
    log.info("%s %d prompt=%d cached=%d generated=%d AL=%.2f tok/s=%.1f finish=%s queued=%.2fs", job.label,
             499 if r.finish_reason == "cancelled" else 200, r.prompt_tokens, r.cached_tokens, len(r.tokens),
             s.al_mean, s.decode_tok_s, r.finish_reason, r.queued_s)
