"""lucebox.server's pure parts: reply parsing (reasoning, Qwen3-Coder XML / JSON tool calls, split at
every position), the prefix-snapshot LRU, and the one mapping of request parameters to Engine options."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from lucebox.config import GenerationConfig
from lucebox.server.options import BadRequest
from lucebox.server.options import engine_options as options_of
from lucebox.server.prefix_cache import PrefixCache, message_boundaries
from lucebox.server.tool_calls import ReplyParser, merge_events, starts_in_thinking

HAS_SAMPLER = any(f.name == "temperature" for f in dataclasses.fields(GenerationConfig))
TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"properties": {
    "cmd": {"type": "string"}, "timeout": {"type": "number"}, "env": {"type": "object"}}}}}]
XML_REPLY = ("Thinking about it.\n</think>\n\nI will run it.\n<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n"
             "</parameter>\n<parameter=timeout>\n2.5\n</parameter>\n<parameter=env>\n{\"A\": 1}\n</parameter>\n"
             "</function>\n</tool_call>\n<tool_call>\n{\"name\": \"run\", \"arguments\": {\"cmd\": \"pwd\"}}\n"
             "</tool_call>")


def parse(text, pieces, **kw):
    p = ReplyParser(**kw)
    events = []
    for piece in pieces:
        events += p.feed(piece)
    return merge_events(events + p.finish())


def summary(events):
    return [(e.kind, e.call.name if e.call else e.text, e.call.arguments if e.call else None) for e in events]


def test_tool_calls_and_reasoning_whatever_the_split():
    want = [("reasoning", "Thinking about it.", None), ("text", "I will run it.", None),
            ("tool_call", "run", {"cmd": "ls -la", "timeout": 2.5, "env": {"A": 1}}),
            ("tool_call", "run", {"cmd": "pwd"})]
    assert summary(parse(XML_REPLY, [XML_REPLY], thinking=True, tools=TOOLS)) == want
    rng = np.random.default_rng(0)
    for _ in range(50):  # random piece boundaries, tags split anywhere
        cuts = sorted(set(rng.integers(1, len(XML_REPLY), 12).tolist()))
        pieces = [XML_REPLY[a:b] for a, b in zip([0] + cuts, cuts + [len(XML_REPLY)])]
        assert summary(parse(XML_REPLY, pieces, thinking=True, tools=TOOLS)) == want


def test_text_is_kept_as_written():
    code = "    x = a < b\n    return '<tool' + x\n"
    assert summary(parse(code, list(code))) == [("text", code, None)]
    # without tools a <tool_call> is just text; an unclosed or malformed call comes back as text
    raw = "<tool_call>\n<function=run>\n</function>\n</tool_call>"
    assert summary(parse(raw, [raw])) == [("text", raw, None)]
    cut = "ok <tool_call>\n<function=run>\n<parameter=cmd>\nl"
    assert "".join(e.text for e in parse(cut, [cut], tools=TOOLS)) == cut
    bad = "<tool_call>\nnot a call\n</tool_call>"
    assert summary(parse(bad, [bad], tools=TOOLS)) == [("text", bad, None)]


def test_think_block_the_model_opens_itself():
    text = "<think>\nhmm\n</think>\n\nAnswer."
    assert summary(parse(text, list(text))) == [("reasoning", "hmm", None), ("text", "Answer.", None)]
    assert starts_in_thinking("<|im_start|>assistant\n<think>\n")
    assert not starts_in_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")


class Snap:
    def __init__(self, tokens, nbytes):
        self.tokens, self.nbytes = tuple(tokens), nbytes


def test_prefix_cache_longest_prefix_and_lru_budget():
    cache = PrefixCache(budget_bytes=100)
    cache.put(Snap([1, 2], 40))
    cache.put(Snap([1, 2, 3, 4], 40))
    assert cache.longest_prefix([1, 2, 3, 4, 5]).tokens == (1, 2, 3, 4)
    assert cache.longest_prefix([1, 2, 9]).tokens == (1, 2)
    assert cache.longest_prefix([7]) is None
    cache.longest_prefix([1, 2, 9])  # (1, 2) is now the most recently used
    cache.put(Snap([5, 6], 40))      # over budget: the least recently used goes
    assert cache.longest_prefix([1, 2, 3, 4]).tokens == (1, 2) and cache.bytes == 80 and len(cache) == 2
    cache.put(Snap([9], 101))        # larger than the whole budget: not kept
    assert cache.longest_prefix([9]) is None
    assert message_boundaries([5, 1, 2, 5, 3, 5, 4], start_id=5) == [3, 5]
    assert message_boundaries([1, 2], start_id=None) == []


def test_engine_options_mapping():
    engine_options = functools.partial(options_of, max_tree=64)
    assert engine_options(max_tokens=7, stop=["x"]) == {"max_new_tokens": 7, "stop": ("x",)}
    greedy = engine_options(max_tokens=7, temperature=0, top_p=0.5, top_k=3, min_p=0.2, seed=1, budget=8, mode="ar")
    assert greedy == {"max_new_tokens": 7, "stop": (), "budget": 8, "mode": "ar"}
    with pytest.raises(BadRequest, match=r"budget must be in \[1, 63\] \(the server's --max-tree 64\)"):
        engine_options(max_tokens=1, budget=64)
    assert options_of(max_tokens=1, budget=100, max_tree=128)["budget"] == 100  # the engine's own limit
    asked = dict(temperature=0.8, top_p=0.9, top_k=20, min_p=0.05, repeat_penalty=1.1, seed=3)
    if HAS_SAMPLER:
        opts = engine_options(max_tokens=4, **asked)
        assert opts["temperature"] == 0.8 and opts["top_k"] == 20 and opts["seed"] == 3
        assert opts["repeat_penalty"] == 1.1 and opts["min_p"] == 0.05 and opts["top_p"] == 0.9
        GenerationConfig(**opts)  # the names are the Engine's
        # an API's signed or oversized seed reaches the engine as its two's complement in [0, 2^64)
        for seed, engine_seed in ((-1, 2 ** 64 - 1), (2 ** 64 + 5, 5), (-(2 ** 63), 2 ** 63)):
            opts = engine_options(max_tokens=4, temperature=0.8, seed=seed)
            assert opts["seed"] == engine_seed
            GenerationConfig(**opts)
    else:
        with pytest.raises(BadRequest, match="greedily"):
            engine_options(max_tokens=4, **asked)
        with pytest.raises(BadRequest, match="repeat_penalty"):  # a penalty changes even a greedy pick
            engine_options(max_tokens=4, temperature=0, repeat_penalty=1.2)
