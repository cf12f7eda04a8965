"""Drafters: who proposes the per-position top-K candidates for one block.

The engine only needs `block_size` and `propose(last, n_past, top_k) -> (ids, logp)`, each
[block_size - 1, top_k]: row j holds candidates for the token j+1 places after `last`.
`NativeDrafter` is the DFlash draft in liblucebox; `ScriptedDrafter` is a test hook that proposes
a known continuation (perfect or deliberately wrong drafts).
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class Drafter(Protocol):
    block_size: int

    def propose(self, last: int, n_past: int, top_k: int) -> tuple[np.ndarray, np.ndarray]: ...


class NativeDrafter:
    """The loaded DFlash draft: one lb_draft call per step, into buffers reused across steps."""

    def __init__(self, handle, block_size: int):
        self._handle = handle
        self.block_size = block_size
        self._buffers: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def propose(self, last: int, n_past: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
        bufs = self._buffers.get(top_k)
        if bufs is None:
            shape = (self.block_size - 1, top_k)
            bufs = (np.empty(shape, np.int32), np.empty(shape, np.float32))
            self._buffers[top_k] = bufs
        self._handle.draft(last, bufs[0], bufs[1])
        return bufs


class ScriptedDrafter:
    """Proposes `script[n_past + 1 + j]` as the top-1 at row j (position n_past+1+j).

    With the AR continuation as script (indexed by absolute position) this is a perfect draft;
    any other script is a wrong one. Lower ranks are filled with other ids, log-probs decrease.
    """

    def __init__(self, script: Sequence[int], block_size: int, n_vocab: int):
        self.script = list(script)
        self.block_size = block_size
        self.n_vocab = n_vocab

    def propose(self, last: int, n_past: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self.block_size - 1
        ids = np.empty((rows, top_k), np.int32)
        for j in range(rows):
            pos = n_past + 1 + j
            first = self.script[pos] if pos < len(self.script) else 0
            ids[j] = (first + np.arange(top_k)) % self.n_vocab
        logp = np.broadcast_to(-np.arange(1, top_k + 1, dtype=np.float32), (rows, top_k)).copy()
        return ids, logp
