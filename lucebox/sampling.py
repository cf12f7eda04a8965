"""Exact sampling of the target's next token from what the device's sampling tail returns.

Processing order (one definition for AR, chain and DDTree, see native/src/sample_graph.hpp):
penalties over the token's penalty window -> temperature -> top-k -> top-p -> min-p -> draw.
The device returns, per row, the C best tokens of the penalised logits l', max l' and the
log-normaliser lse = log sum_v exp((l'_v - max) / T) over the whole vocabulary, so the host has the
exact probabilities p = exp((l' - max) / T - lse) of the candidates. Candidates are ordered by l'
(best first), ties by token id. Only candidates strictly better than the C-th are trusted (a tie at
the boundary may hide a token); when top-k, the nucleus, min-p or the draw reach past them, the
whole processed row is fetched (one row, rare) and the draw finishes on it (draw_from_row). Any
fixed order of the tokens gives an exact draw; the order here is a function of the row alone.

The draw for the token at absolute position q uses the uniform `uniform(seed, q)`: a counter-based
hash of (seed, q) alone, so AR, chain and DDTree at any budget emit the same tokens for one seed
(they all see bit-identical logits per position), and the output distribution is the target's.

The draw on the candidates runs natively, for every row, inside the sampled calls
(native/src/sample_draw.cpp: lb_sampling's drawn and uniforms), so the decode step reads tokens as
greedy reads its argmax. `uniform` and `draw` here are its definition in Python, which the tests
hold the native draw to token for token; `draw_from_row` finishes the rows it leaves (-1).
"""
from __future__ import annotations

import secrets
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import accumulate
from math import exp, log
from typing import Callable, Sequence

import numpy as np

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit ints with good avalanche."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


@lru_cache(maxsize=16)
def _key(seed: int) -> int:
    return _mix64((int(seed) & _MASK64) ^ 0x5851F42D4C957F2D)


def uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) from (seed, position) alone (53 random bits)."""
    z = _mix64((_key(seed) + (int(position) + 1) * _GOLDEN) & _MASK64)
    return (z >> 11) * (1.0 / (1 << 53))


def fresh_seed() -> int:
    return secrets.randbits(63)


@dataclass(frozen=True)
class Processing:
    """What happens to a row of logits before the draw (GenerationConfig's sampling fields)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def has_penalties(self) -> bool:
        return self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def is_plain_greedy(self) -> bool:
        """Greedy on the raw logits: the device's argmax is the answer (the pre-sampling path)."""
        return self.temperature == 0.0 and not self.has_penalties


def draw(ids: np.ndarray, vals: np.ndarray, lse: float | None, p: Processing, u: float,
         complete: bool) -> int | None:
    """The token drawn with uniform `u` from candidates ordered best first (vals = processed logits).

    lse: log-normaliser of exp((l' - max) / T) over the vocabulary, or None to compute it from vals
    (then complete). complete: ids/vals hold the whole vocabulary. Returns None when the answer
    needs candidates past the trusted ones: fetch the whole row and call again with complete=True.
    """
    if not complete:
        i = _draw_candidates(vals.tolist(), lse, p, u)
        return None if i is None else int(ids[i])
    return _draw_row(ids, vals, lse, p, u)


def _draw_candidates(vals: list[float], lse: float, p: Processing, u: float) -> int | None:
    """`draw` on the C candidates (vals as Python floats, best first): the rank of the drawn one.

    The definition native/src/sample_draw.cpp follows operation for operation: float64 throughout,
    exp and log from libm (math.exp / math.log, the functions the C side calls: numpy's own SIMD exp
    and log differ from them in the last bit of a few percent of values), sums taken left to right.
    The whole-row path (numpy) may round a probability one bit apart, which moves only draws within
    ~1e-16 of a boundary; every mode takes the same path for a row, so they still agree."""
    n = len(vals)
    last = vals[-1]
    # Candidates are sorted best first, so "the first k are trusted" (strictly better than the
    # last, which a tie may hide behind) is one compare: vals[k - 1] > vals[-1].
    if p.temperature == 0.0:  # greedy on the processed logits: the best, lowest id among equals
        return 0 if vals[0] > last else None
    limit = None  # length of the kept prefix; None = not bounded yet (the whole vocabulary)
    if p.top_k > 0:
        if p.top_k >= n or not vals[p.top_k - 1] > last:
            return None
        limit = kept = p.top_k
    else:
        kept = n - 1  # the trusted prefix: candidates strictly better than the last
        while kept and not vals[kept - 1] > last:
            kept -= 1
    # p_j = exp(x_j - lse), x_j = log p_j - log p_0 = (v_j - v_0) / T for the kept prefix (the
    # values the whole row gives there)
    v0, temp = vals[0], p.temperature
    probs = [exp((v - v0) / temp - lse) for v in vals[:kept]]
    cum = list(accumulate(probs))  # running sums, left to right
    if limit is not None:  # top-p and the draw see the top-k renormalised
        total = cum[-1]
        if not total > 0.0:  # all underflowed: only with an lse no device returns
            return None
        cum = list(accumulate(q / total for q in probs))
    if p.top_p < 1.0:
        reach = bisect_left(cum, p.top_p) + 1  # smallest prefix with mass >= top_p
        if reach > kept:
            if limit is None:
                return None
            reach = kept
        limit = reach
    if p.min_p > 0.0:
        log_min_p = log(p.min_p)
        passing = sum(1 for v in vals[:kept] if (v - v0) / temp >= log_min_p)  # p_j >= min_p * p_max
        if limit is None and passing == kept:
            return None  # the next token might pass too
        limit = passing if limit is None else min(limit, passing)
    if limit is None:
        # no filter: the draw runs over the whole vocabulary, candidates first
        i = bisect_right(cum, u)
        return i if i < kept else None
    return min(bisect_right(cum, u * cum[limit - 1], 0, limit), limit - 1)


def _draw_row(ids: np.ndarray, vals: np.ndarray, lse: float | None, p: Processing, u: float) -> int:
    """`draw` on the whole processed row (complete), in numpy."""
    if p.temperature == 0.0:
        return int(ids[0])
    n = len(ids)
    limit = kept = min(p.top_k, n) if p.top_k > 0 else None
    # x = log p_j - log p_0, only for the kept prefix (elementwise: the same values as on the whole row)
    if lse is None:
        x = (vals.astype(np.float64) - float(vals[0])) / p.temperature
        lse = float(np.log(np.sum(np.exp(x))))
        x = x[:kept]
    else:
        x = (vals[:kept].astype(np.float64) - float(vals[0])) / p.temperature
    probs = np.exp(x - lse)
    if limit is not None:
        probs = probs / probs.sum()
    cum = np.cumsum(probs)  # sequential, so any prefix of it is the cumsum of that prefix
    if p.top_p < 1.0:
        limit = min(int(np.searchsorted(cum, p.top_p)) + 1, len(probs))
    if p.min_p > 0.0:
        passing = int(np.count_nonzero(x >= np.log(p.min_p)))
        limit = passing if limit is None else min(limit, passing)
    if limit is not None:
        cum = cum[:limit]
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    return int(ids[min(i, len(cum) - 1)])


def sort_candidates(ids: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Best first by value, ties by token id."""
    order = np.lexsort((ids, -vals))
    return ids[order], vals[order]


class Sampler:
    """One request's sampler: processing, seed, and the device buffers of its sampled calls."""

    def __init__(self, processing: Processing, seed: int, *, n_candidates: int, penalty_last_n: int,
                 max_rows: int, n_vocab: int):
        from ._native import SampleBuffers

        self.p = processing
        # the penalty windows are built natively from the history each call is given (no penalty: none)
        self.penalty_last_n = penalty_last_n if processing.has_penalties else 0
        self.io = SampleBuffers(max_rows, temperature=processing.temperature,
                                repeat_penalty=processing.repeat_penalty,
                                presence_penalty=processing.presence_penalty,
                                frequency_penalty=processing.frequency_penalty,
                                n_candidates=min(n_vocab, max(n_candidates, processing.top_k)),
                                penalty_last_n=self.penalty_last_n, top_k=processing.top_k, top_p=processing.top_p,
                                min_p=processing.min_p, seed=seed)
        self._row = np.empty(n_vocab, np.float32)

    @property
    def seed(self) -> int:
        """The draws' seed (the native draw's: lb_sampling.seed)."""
        return self.io.seed

    @seed.setter
    def seed(self, value: int) -> None:
        self.io.seed = value

    @classmethod
    def for_request(cls, gen, info: dict) -> "Sampler | None":
        """None for plain greedy decoding (the device's argmax), else a Sampler for GenerationConfig
        `gen` on an engine described by `info` (a fresh random seed when gen.seed is None)."""
        from .config import PENALTY_LAST_N, SAMPLING_CANDIDATES

        processing = gen.processing()
        if processing.is_plain_greedy:
            return None
        if processing.top_k >= info["n_vocab"]:
            # a top-k that keeps the whole vocabulary is no filter: the same draws as top-k 0 for a seed
            processing = replace(processing, top_k=0)
        seed = gen.seed if gen.seed is not None else fresh_seed()
        return cls(processing, seed, n_candidates=SAMPLING_CANDIDATES, penalty_last_n=PENALTY_LAST_N,
                   max_rows=info["max_tree"], n_vocab=info["n_vocab"])

    def set_history(self, history: Sequence[int]) -> None:
        """The tokens before the next sampled call's first token (the committed ones): each row's
        penalty window is their tail, then the call's tokens on the row's path (built natively)."""
        if self.penalty_last_n:
            self.io.set_history(history)

    def pick(self, row: int, fetch_row: Callable[[int, np.ndarray], np.ndarray]) -> int:
        """The token drawn for output row `row` of the last sampled call (see chooser)."""
        token = int(self.io.drawn[row])
        return token if token >= 0 else self._finish(row, fetch_row)

    def chooser(self, rows: int, fetch_row: Callable[[int, np.ndarray], np.ndarray]) -> Callable[[int], int]:
        """node -> the token drawn for it, over rows [0, rows) of the last sampled call: the native
        draw's token, else (-1, rare) the draw finished on the node's whole processed row, fetched
        with fetch_row(row, out) only for the nodes asked for."""
        drawn = self.io.drawn[:rows].tolist()
        if -1 not in drawn:
            return drawn.__getitem__
        return lambda row: drawn[row] if drawn[row] >= 0 else self._finish(row, fetch_row)

    def _finish(self, row: int, fetch_row: Callable[[int, np.ndarray], np.ndarray]) -> int:
        """The draw of a row its candidates did not decide, on its whole processed row, with the
        uniform the native draw took for it."""
        io = self.io
        ids, vals = sort_candidates(io.cand_ids[row], io.cand_logits[row])
        return draw_from_row(fetch_row(row, self._row), ids, vals, self.p, io.uniforms.item(row))


def draw_from_row(row: np.ndarray, ids: np.ndarray, vals: np.ndarray, p: Processing, u: float) -> int:
    """The draw of `draw` when the candidates (ids, vals: sorted) did not suffice, on the whole
    processed row. With no filter the order is the trusted candidates, then every other token by
    id (no sort of the vocabulary); with filters, the whole row sorted best first."""
    if p.top_k == 0 and p.top_p >= 1.0 and p.min_p == 0.0 and p.temperature > 0.0:
        w = np.exp((row.astype(np.float64) - float(row.max())) / p.temperature)
        target = u * w.sum()
        first = ids[:int(np.count_nonzero(vals > vals[-1]))]
        cum = np.cumsum(w[first])
        i = int(np.searchsorted(cum, target, side="right"))
        if i < len(first):
            return int(first[i])
        rest = np.ones(row.size, bool)
        rest[first] = False
        rest = np.flatnonzero(rest)
        j = int(np.searchsorted(np.cumsum(w[rest]), target - (cum[-1] if len(cum) else 0.0), side="right"))
        return int(rest[min(j, len(rest) - 1)])
    order = np.argsort(-row, kind="stable")  # best first, ties by id
    return draw(order, row[order], None, p, u, complete=True)
