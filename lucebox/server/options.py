"""Request parameters -> Engine.generate options, in one place for both APIs.

Sampling options go to the Engine only when they differ from greedy decoding (a request that leaves
them out decodes greedily).
"""
from __future__ import annotations

from ..config import MODES

# the neutral value of each sampling option: leaving it out changes nothing
NEUTRAL = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
           "presence_penalty": 0.0, "frequency_penalty": 0.0}


class BadRequest(ValueError):
    """A parameter the client must change; becomes a 400 in the API's error shape."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def engine_options(*, max_tokens: int, stop: list[str] | None = None, temperature: float | None = None,
                   top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
                   repeat_penalty: float | None = None, presence_penalty: float | None = None,
                   frequency_penalty: float | None = None, seed: int | None = None, budget: int | None = None,
                   mode: str | None = None, max_tree: int) -> dict:
    """The keyword arguments for Engine.stream(ids, **options). Values were range-checked by the
    request models; this decides what reaches the Engine (max_tree: the engine's, which bounds budget)."""
    opts: dict = {"max_new_tokens": max_tokens, "stop": tuple(stop or ())}
    if mode is not None:
        if mode not in MODES:
            raise BadRequest(f"mode must be one of {', '.join(MODES)}; got {mode!r}", "mode")
        opts["mode"] = mode
    if budget is not None:
        if not 1 <= budget < max_tree:
            raise BadRequest(f"budget must be in [1, {max_tree - 1}] (the server's --max-tree {max_tree}), "
                             f"got {budget}", "budget")
        opts["budget"] = budget
    asked = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
             "repeat_penalty": repeat_penalty, "presence_penalty": presence_penalty,
             "frequency_penalty": frequency_penalty}
    sampling = {k: v for k, v in asked.items() if v is not None and v != NEUTRAL[k]}
    if "temperature" not in sampling:
        # greedy: truncation (top_p, top_k, min_p) cannot change an argmax; penalties can
        sampling = {k: v for k, v in sampling.items() if k.endswith("penalty")}
    if not sampling:
        return opts
    opts.update(sampling)
    if seed is not None:
        # the APIs' seeds are signed 64-bit (OpenAI) or any integer; the engine's are [0, 2^64): two's complement
        opts["seed"] = seed % 2 ** 64
    return opts
