"""Prefix reuse across requests: snapshots of the engine's committed state in a host-memory LRU.

A request's prompt starts from the longest cached prefix: the engine's live cache (the last
request's prompt + reply) or a snapshot. Snapshots are taken at message boundaries, where the next
turn of a conversation, or another agent request with the same system prompt and tools, will
share the prefix:
  - the end of the first message (system prompt + tools),
  - the end of the last message (just before the generation prompt: the next turn shares it even
    when the template re-renders this reply differently, e.g. without its <think> block),
  - the end of the reply (the next turn shares it when the template renders the reply as generated).
A message boundary is where a `<|im_start|>` token starts the next message (ChatML, Qwen).
"""
from __future__ import annotations

from collections import OrderedDict

MIN_SNAPSHOT_TOKENS = 16   # shorter prefixes prefill faster than a snapshot copies


class PrefixCache:
    """tokens -> Snapshot, least recently used evicted first past `budget_bytes`."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._snaps: OrderedDict[tuple[int, ...], object] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._snaps)

    def longest_prefix(self, ids: list[int]):
        """The snapshot whose tokens are the longest prefix of `ids`, or None."""
        best = None
        for tokens, snap in self._snaps.items():
            n = len(tokens)
            if n <= len(ids) and (best is None or n > len(best.tokens)) and tuple(ids[:n]) == tokens:
                best = snap
        if best is not None:
            self._snaps.move_to_end(best.tokens)
        return best

    def has(self, tokens: tuple[int, ...]) -> bool:
        if tokens in self._snaps:
            self._snaps.move_to_end(tokens)
            return True
        return False

    def put(self, snap) -> None:
        if snap.nbytes > self.budget_bytes or snap.tokens in self._snaps:
            return
        self._snaps[snap.tokens] = snap
        self.bytes += snap.nbytes
        while self.bytes > self.budget_bytes:
            _, old = self._snaps.popitem(last=False)
            self.bytes -= old.nbytes


def message_boundaries(ids: list[int], start_id: int | None) -> list[int]:
    """Token positions where a message starts (after position 0), in order."""
    if start_id is None:
        return []
    return [i for i, t in enumerate(ids) if t == start_id and i > 0]


class PrefixReuse:
    """Brings the engine to a prompt from the best cached prefix, snapshotting boundaries on the way."""

    def __init__(self, engine, budget_bytes: int):
        self.engine = engine
        self.cache = PrefixCache(budget_bytes) if budget_bytes > 0 else None
        self._start_id = engine.tokenizer.token_to_id("<|im_start|>")

    def prepare(self, ids: list[int]) -> int:
        """Make the engine's caches hold a prefix of `ids` (the generation prefills the rest);
        returns how many prompt tokens were reused."""
        e = self.engine
        live = e.cached_tokens
        reused = len(live) if live and len(live) <= len(ids) and tuple(ids[:len(live)]) == live else 0
        if self.cache is None:
            return reused
        snap = self.cache.longest_prefix(ids)
        if snap is not None and len(snap.tokens) > reused:
            e.restore(snap)
            reused = len(snap.tokens)
        for b in self._snapshot_points(ids, reused):
            e.prefill(ids[:b])
            self.cache.put(e.snapshot())
        return reused

    def _snapshot_points(self, ids: list[int], reused: int) -> list[int]:
        bounds = message_boundaries(ids, self._start_id)
        points = sorted({bounds[0], bounds[-1]}) if bounds else []
        return [b for b in points if b > reused and b >= MIN_SNAPSHOT_TOKENS
                and not self.cache.has(tuple(ids[:b]))]

    def after_reply(self) -> None:
        """Snapshot the end of the reply (prompt + generated tokens)."""
        if self.cache is None:
            return
        tokens = self.engine.cached_tokens
        if len(tokens) >= MIN_SNAPSHOT_TOKENS and not self.cache.has(tokens):
            self.cache.put(self.engine.snapshot())
