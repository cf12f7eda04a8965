"""OpenAI shapes: /v1/chat/completions and /v1/completions requests, responses, stream chunks.

Unknown top-level fields are refused (400), as OpenAI does. Fields OpenAI clients send that cannot
change a greedy/batch-1 reply (user, metadata, store, ...) are accepted and ignored; features
lucebox does not have (logprobs, logit_bias, json response formats, n > 1) get a clear 400.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import MAX_TREE, MODES
from .options import BadRequest, engine_options
from .prompt import text_only, tool_arguments
from .tool_calls import Event

MAX_STOPS = 16


class Sampling(BaseModel):
    """Decoding parameters both OpenAI routes share (lucebox extras: budget, mode)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN, inf: "Input should be a finite number"

    model: str | None = None
    # integers strict: JSON true or "5" is a client bug, not a count of 1 or 5
    max_tokens: int | None = Field(None, ge=1, strict=True)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2 ** 63), lt=2 ** 64, strict=True)
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, strict=True)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    n: int | None = Field(None, ge=1, strict=True)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    budget: int | None = Field(None, ge=1, le=MAX_TREE - 1, strict=True)
    mode: Literal[MODES] | None = None  # type: ignore[valid-type]
    # accepted, no effect here
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS:
            raise BadRequest(f"stop has {len(stops)} strings; at most {MAX_STOPS}", "stop")
        return [s for s in stops if s]

    def check_supported(self) -> None:
        if self.n is not None and self.n > 1:
            raise BadRequest(f"n = {self.n}: lucebox returns one choice per request (batch size 1); "
                             "send n = 1 or several requests", "n")
        if self.logprobs or self.top_logprobs:
            raise BadRequest("logprobs are not supported by lucebox", "logprobs")
        if self.logit_bias:
            raise BadRequest("logit_bias is not supported by lucebox", "logit_bias")

    def options(self, max_tokens: int, max_tree: int) -> dict:
        return engine_options(max_tokens=max_tokens, stop=self.stops(), temperature=self.temperature,
                              top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                              repeat_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty, seed=self.seed, budget=self.budget,
                              mode=self.mode, max_tree=max_tree)

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ChatRequest(Sampling):
    messages: list[Message]
    max_completion_tokens: int | None = Field(None, ge=1, strict=True)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise BadRequest("response_format other than text is not supported by lucebox", "response_format")
        if self.tool_choice not in (None, "auto", "none") and self.tools:
            raise BadRequest("tool_choice may be 'auto' or 'none' (lucebox does not force a tool)", "tool_choice")

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def active_tools(self) -> list[dict] | None:
        return None if self.tool_choice == "none" else (self.tools or None)

    def template_kwargs(self) -> dict:
        return dict(self.chat_template_kwargs or {})

    def chat_messages(self) -> list[dict]:
        return [_normalize(m) for m in self.messages]


class CompletionRequest(Sampling):
    prompt: str | list[int]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo or self.suffix or (self.best_of or 1) > 1:
            raise BadRequest("echo, suffix and best_of are not supported by lucebox", "echo")


def _normalize(m: Message) -> dict:
    role = "system" if m.role == "developer" else m.role
    out: dict = {"role": role, "content": text_only(m.content, f"{m.role} message")}
    if m.reasoning_content:
        out["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        calls = []
        for c in m.tool_calls:
            fn = c.get("function") or {}
            if not isinstance(fn.get("name"), str):
                raise BadRequest("an assistant tool call has no function name", "messages")
            calls.append({"id": c.get("id", ""), "type": "function",
                          "function": {"name": fn["name"], "arguments": tool_arguments(fn.get("arguments"))}})
        out["tool_calls"] = calls
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


# --- responses ------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def finish_reason(engine_reason: str, has_calls: bool) -> str:
    if has_calls:
        return "tool_calls"
    return "length" if engine_reason in ("length", "context") else "stop"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def tool_call_json(call, index: int | None = None) -> dict:
    out = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}
    if index is not None:
        out["index"] = index
    return out


def chat_message(events: list[Event]) -> dict:
    text = "".join(e.text for e in events if e.kind == "text")
    reasoning = "".join(e.text for e in events if e.kind == "reasoning")
    calls = [e.call for e in events if e.kind == "tool_call"]
    msg: dict = {"role": "assistant", "content": text if (text or not calls) else None}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = [tool_call_json(c) for c in calls]
    return msg


class ChatChunks:
    """The chat.completion.chunk objects of one streamed reply."""

    def __init__(self, model: str):
        self.id = new_id("chatcmpl")
        self.model = model
        self.created = int(time.time())
        self.n_calls = 0

    def chunk(self, delta: dict, finish: str | None = None, usage_: dict | None = None, choices=True) -> dict:
        out = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}] if choices else []}
        if usage_ is not None:
            out["usage"] = usage_
        return out

    def for_event(self, e: Event) -> dict:
        if e.kind == "text":
            return self.chunk({"content": e.text})
        if e.kind == "reasoning":
            return self.chunk({"reasoning_content": e.text})
        self.n_calls += 1
        return self.chunk({"tool_calls": [tool_call_json(e.call, self.n_calls - 1)]})


def chat_completion(model: str, events: list[Event], finish: str, usage_: dict) -> dict:
    return {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": chat_message(events), "logprobs": None, "finish_reason": finish}],
            "usage": usage_}


def completion(model: str, text: str, finish: str | None, usage_: dict | None, cid: str | None = None) -> dict:
    out = {"id": cid or new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
           "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
    if usage_ is not None:
        out["usage"] = usage_
    return out


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
