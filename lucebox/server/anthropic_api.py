"""Anthropic shapes: /v1/messages (+ count_tokens) requests, responses and stream events.

Unknown top-level fields are ignored here (Claude Code sends beta fields that change nothing for a
local model); wrong types and bad values are refused.
"""
from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import MAX_TREE, MODES
from .options import BadRequest, engine_options
from .prompt import text_only
from .tool_calls import Event

MAX_STOPS = 16


class AMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class CountRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)  # NaN, inf: "Input should be a finite number"

    model: str | None = None
    messages: list[AMessage]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def active_tools(self) -> list[dict] | None:
        if not self.tools or (self.tool_choice or {}).get("type") == "none":
            return None
        out = []
        for t in self.tools:
            if not isinstance(t.get("name"), str):
                raise BadRequest("every tool needs a name", "tools")
            out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                         "parameters": t.get("input_schema") or {}}})
        return out

    def template_kwargs(self) -> dict:
        kwargs = dict(self.chat_template_kwargs or {})
        kind = (self.thinking or {}).get("type")
        if kind in ("enabled", "disabled"):
            kwargs.setdefault("enable_thinking", kind == "enabled")
        return kwargs

    def chat_messages(self) -> list[dict]:
        out: list[dict] = []
        if self.system:
            out.append({"role": "system", "content": text_only(self.system, "system")})
        for m in self.messages:
            out.extend(_normalize(m))
        return out


class MessagesRequest(CountRequest):
    max_tokens: int = Field(ge=1, strict=True)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, strict=True)
    metadata: dict[str, Any] | None = None
    # lucebox extras (same meaning as on the OpenAI routes)
    seed: int | None = Field(None, strict=True)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    budget: int | None = Field(None, ge=1, le=MAX_TREE - 1, strict=True)
    mode: Literal[MODES] | None = None  # type: ignore[valid-type]

    def stops(self) -> list[str]:
        stops = [s for s in (self.stop_sequences or []) if s]
        if len(stops) > MAX_STOPS:
            raise BadRequest(f"stop_sequences has {len(stops)} strings; at most {MAX_STOPS}", "stop_sequences")
        return stops

    def options(self, max_tokens: int, max_tree: int) -> dict:
        return engine_options(max_tokens=max_tokens, stop=self.stops(), temperature=self.temperature,
                              top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                              repeat_penalty=self.repetition_penalty, seed=self.seed, budget=self.budget,
                              mode=self.mode, max_tree=max_tree)


def _normalize(m: AMessage) -> list[dict]:
    """One Anthropic message -> template messages (tool results become `tool` messages)."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    out: list[dict] = []
    text, reasoning, calls = [], [], []
    for block in m.content:
        kind = block.get("type")
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "thinking" and m.role == "assistant":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use" and m.role == "assistant":
            if not isinstance(block.get("input", {}), dict) or not isinstance(block.get("name"), str):
                raise BadRequest("a tool_use block needs a name and an object input", "messages")
            calls.append({"id": block.get("id", ""), "type": "function",
                          "function": {"name": block["name"], "arguments": block.get("input", {})}})
        elif kind == "tool_result" and m.role == "user":
            content = block.get("content", "")
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id", ""),
                        "content": text_only(content, "tool_result")})
        else:
            raise BadRequest(f"{m.role} content block of type {kind!r} is not supported by lucebox", "messages")
    if text or reasoning or calls or not out:
        msg: dict = {"role": m.role, "content": "".join(text)}
        if reasoning:
            msg["reasoning_content"] = "".join(reasoning)
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


# --- responses ------------------------------------------------------------------------------
def new_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def stop_reason(engine_reason: str, has_calls: bool) -> str:
    if has_calls:
        return "tool_use"
    if engine_reason in ("length", "context"):
        return "max_tokens"
    return "stop_sequence" if engine_reason == "stop" else "end_turn"


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}


def content_blocks(events: list[Event]) -> list[dict]:
    blocks: list[dict] = []
    for e in events:
        if e.kind == "tool_call":
            blocks.append({"type": "tool_use", "id": "toolu_" + e.call.id[5:], "name": e.call.name,
                           "input": e.call.arguments})
        elif e.kind == "reasoning":
            blocks.append({"type": "thinking", "thinking": e.text, "signature": ""})
        else:
            blocks.append({"type": "text", "text": e.text})
    return blocks


def message(model: str, events: list[Event], stop: str, stop_sequence: str | None, usage_: dict) -> dict:
    return {"id": new_id(), "type": "message", "role": "assistant", "model": model,
            "content": content_blocks(events), "stop_reason": stop, "stop_sequence": stop_sequence,
            "usage": usage_}


class MessageEvents:
    """The server-sent events of one streamed message: blocks open and close as the kind changes."""

    def __init__(self, model: str):
        self.model = model
        self.index = -1
        self.open_kind: str | None = None

    def start(self, prompt_tokens: int, cached: int) -> list[tuple[str, dict]]:
        msg = {"id": new_id(), "type": "message", "role": "assistant", "model": self.model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": usage(prompt_tokens, 0, cached)}
        return [("message_start", {"type": "message_start", "message": msg}), ("ping", {"type": "ping"})]

    def _close(self) -> list[tuple[str, dict]]:
        if self.open_kind is None:
            return []
        out = []
        if self.open_kind == "reasoning":  # a thinking block ends with its signature (none here)
            out.append(("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                "delta": {"type": "signature_delta", "signature": ""}}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.open_kind = None
        return out

    def _open(self, block: dict, kind: str) -> list[tuple[str, dict]]:
        out = self._close()
        self.index += 1
        self.open_kind = kind
        out.append(("content_block_start", {"type": "content_block_start", "index": self.index,
                                            "content_block": block}))
        return out

    def for_event(self, e: Event) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        if e.kind == "tool_call":
            block = {"type": "tool_use", "id": "toolu_" + e.call.id[5:], "name": e.call.name, "input": {}}
            out += self._open(block, "tool_call")
            out.append(("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                "delta": {"type": "input_json_delta",
                                                          "partial_json": e.call.arguments_json}}))
            return out + self._close()
        if e.kind != self.open_kind:
            block = ({"type": "thinking", "thinking": "", "signature": ""} if e.kind == "reasoning"
                     else {"type": "text", "text": ""})
            out += self._open(block, e.kind)
        delta = ({"type": "thinking_delta", "thinking": e.text} if e.kind == "reasoning"
                 else {"type": "text_delta", "text": e.text})
        out.append(("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}))
        return out

    def finish(self, stop: str, stop_sequence: str | None, usage_: dict) -> list[tuple[str, dict]]:
        out = self._close()
        if self.index < 0:  # an empty reply still has one (empty) text block
            out += self._open({"type": "text", "text": ""}, "text") + self._close()
        out.append(("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": stop, "stop_sequence": stop_sequence},
                                      "usage": {"output_tokens": usage_["output_tokens"],
                                                "input_tokens": usage_["input_tokens"],
                                                "cache_read_input_tokens": usage_["cache_read_input_tokens"]}}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out


def error_body(message: str, type_: str) -> dict:
    return {"type": "error", "error": {"type": type_, "message": message}}
