"""Split a Qwen3.5/3.6 reply into reasoning, text and tool calls, as it streams.

The model writes `<think>...</think>` (the chat template may already have opened the <think> in
the prompt) and Qwen3-Coder XML tool calls:
    <tool_call>
    <function=NAME>
    <parameter=KEY>
    value
    </parameter>
    </function>
    </tool_call>
(or Qwen3's JSON body `{"name": ..., "arguments": {...}}`). `ReplyParser.feed(piece)` returns the
events completed by that piece; text that might be the start of a tag is held back until it is not.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)


@dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Event:
    kind: str                    # "text", "reasoning" or "tool_call"
    text: str = ""
    call: ToolCall | None = None


def starts_in_thinking(prompt_text: str) -> bool:
    """Whether the rendered prompt leaves a <think> block open (Qwen3.5's thinking templates end
    the generation prompt with `<think>\\n`), so the reply starts as reasoning."""
    return prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)


def _param_types(tools: list[dict] | None) -> dict[str, dict[str, str]]:
    """tool name -> {parameter: JSON-schema type}, from OpenAI-style tool definitions."""
    out: dict[str, dict[str, str]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool)
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name", "")] = {k: (v.get("type") if isinstance(v, dict) else None) or "" for k, v in props.items()}
    return out


def _convert(value: str, type_: str):
    """A parameter's text as the type its schema declares (strings stay as written)."""
    if type_ == "string":
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def parse_call(body: str, types: dict[str, dict[str, str]]) -> ToolCall | None:
    """The body between <tool_call> and </tool_call>; None when it is not a call."""
    body = body.strip()
    if body.startswith("{"):
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        args = obj.get("arguments", obj.get("parameters", {})) if isinstance(obj, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(args, dict):
            return None
        return ToolCall(obj["name"], args)
    m = _FUNCTION.search(body)
    if m is None:
        return None
    name = m.group(1).strip()
    schema = types.get(name, {})
    args = {}
    for p in _PARAMETER.finditer(m.group(2)):
        key = p.group(1).strip()
        value = p.group(2)
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        args[key] = _convert(value, schema.get(key, ""))
    return ToolCall(name, args)


def _held_tail(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of `buf` that is a proper prefix of one of `tags`."""
    for n in range(min(len(buf), max(len(t) for t in tags) - 1), 0, -1):
        if any(t.startswith(buf[-n:]) for t in tags):
            return n
    return 0


class ReplyParser:
    """Feed reply text in pieces; get reasoning / text / tool-call events back."""

    def __init__(self, *, thinking: bool = False, tools: list[dict] | None = None):
        self.mode = "reasoning" if thinking else "text"
        self.parse_tools = bool(tools)
        self._types = _param_types(tools)
        self._buf = ""            # unconsumed text of the current mode
        self._space = ""          # trailing whitespace, held: dropped before a tag, else emitted
        self._dropped = ""        # the whitespace dropped before the open <tool_call>
        self._strip_lead = thinking  # drop whitespace opening a block (the "\n\n" after </think>)
        self.calls: list[ToolCall] = []

    def _emit(self, kind: str, text: str, out: list[Event]) -> None:
        if self._strip_lead:
            text = text.lstrip()
            if not text:
                return
            self._strip_lead = False
        body = text.rstrip()
        if body:
            out.append(Event(kind, self._space + body))
            self._space = ""
        self._space += text[len(body):]

    def _tags(self) -> tuple[str, ...]:
        if self.mode == "reasoning":
            return (THINK_CLOSE,)
        if self.mode == "tool":
            return (CALL_CLOSE,)
        return (THINK_OPEN, CALL_OPEN) if self.parse_tools else (THINK_OPEN,)

    def feed(self, piece: str) -> list[Event]:
        out: list[Event] = []
        self._buf += piece
        while True:
            tags = self._tags()
            hits = [(self._buf.find(t), t) for t in tags if t in self._buf]
            if not hits:
                break
            at, tag = min(hits)
            before, self._buf = self._buf[:at], self._buf[at + len(tag):]
            self._close(before, tag, out)
        if self.mode != "tool":
            keep = _held_tail(self._buf, self._tags())
            ready, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
            self._emit(self.mode, ready, out)
        return out

    def _close(self, before: str, tag: str, out: list[Event]) -> None:
        """`before` is the text of the current mode up to `tag`."""
        if self.mode == "tool":
            call = parse_call(before, self._types)
            if call is None:   # not a call after all: give the text back as written
                self._emit("text", self._dropped + CALL_OPEN + before + CALL_CLOSE, out)
            else:
                self.calls.append(call)
                out.append(Event("tool_call", call=call))
            self.mode = "text"
            return
        self._emit(self.mode, before, out)
        self._dropped, self._space = self._space, ""  # whitespace before a tag belongs to the tag
        self.mode = {THINK_OPEN: "reasoning", THINK_CLOSE: "text", CALL_OPEN: "tool"}[tag]
        self._strip_lead = tag in (THINK_OPEN, THINK_CLOSE)

    def finish(self) -> list[Event]:
        """Events for what is left at the end of the reply (an unclosed tag is kept as text)."""
        out: list[Event] = []
        rest, self._buf = self._buf, ""
        if self.mode == "tool":   # cut off before </tool_call> (max_tokens): not a call
            self.mode = "text"
            self._emit("text", self._dropped + CALL_OPEN + rest, out)
        else:
            self._emit(self.mode, rest, out)
        if self._space:       # the reply's own trailing whitespace
            out.append(Event(self.mode, self._space))
            self._space = ""
        return out


def merge_events(events: list[Event]) -> list[Event]:
    """Adjacent reasoning or text events as one (a whole reply's content blocks, in order)."""
    merged: list[Event] = []
    for e in events:
        if merged and e.kind != "tool_call" and merged[-1].kind == e.kind:
            merged[-1] = Event(e.kind, merged[-1].text + e.text)
        else:
            merged.append(e)
    return merged
