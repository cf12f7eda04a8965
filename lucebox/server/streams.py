"""Server-sent event streams: a job's events (start, text pieces, done or error) -> the OpenAI
chunks (ending in `data: [DONE]`) or the Anthropic Messages events of one reply."""
from __future__ import annotations

import json
from typing import AsyncIterator, Callable

from . import anthropic_api as A
from . import openai_api as O
from .options import BadRequest
from .tool_calls import ReplyParser


def data(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def event(name: str, obj) -> str:
    return f"event: {name}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _failure(e: BaseException) -> tuple[bool, str]:
    """(is the client's fault, message) for an error that arrived after the stream began."""
    if isinstance(e, (ValueError, BadRequest)):
        return True, str(e)
    return False, f"the engine failed: {e}"


async def openai_chat(events: AsyncIterator, parser: ReplyParser, model: str, include_usage: bool):
    chunks = O.ChatChunks(model)
    yield data(chunks.chunk({"role": "assistant", "content": ""}))
    async for kind, value in events:
        if kind == "text":
            for e in parser.feed(value):
                yield data(chunks.for_event(e))
        elif kind == "done":
            for e in parser.finish():
                yield data(chunks.for_event(e))
            yield data(chunks.chunk({}, O.finish_reason(value.finish_reason, bool(parser.calls))))
            if include_usage:
                u = O.usage(value.prompt_tokens, len(value.tokens), value.cached_tokens)
                yield data(chunks.chunk({}, usage_=u, choices=False))
        elif kind == "error":
            client, message = _failure(value)
            yield data(O.error_body(message, "invalid_request_error" if client else "server_error"))
    yield "data: [DONE]\n\n"


async def openai_completion(events: AsyncIterator, model: str, include_usage: bool):
    cid = O.new_id("cmpl")
    async for kind, value in events:
        if kind == "text":
            yield data(O.completion(model, value, None, None, cid))
        elif kind == "done":
            yield data(O.completion(model, "", O.finish_reason(value.finish_reason, False), None, cid))
            if include_usage:
                u = O.usage(value.prompt_tokens, len(value.tokens), value.cached_tokens)
                yield data({**O.completion(model, "", None, u, cid), "choices": []})
        elif kind == "error":
            client, message = _failure(value)
            yield data(O.error_body(message, "invalid_request_error" if client else "server_error"))
    yield "data: [DONE]\n\n"


async def anthropic_messages(events: AsyncIterator, parser: ReplyParser, model: str, n_prompt: int,
                             stop_sequence: Callable):
    ev = A.MessageEvents(model)
    async for kind, value in events:
        if kind == "start":
            out = ev.start(n_prompt, value)
        elif kind == "text":
            out = [x for e in parser.feed(value) for x in ev.for_event(e)]
        elif kind == "done":
            out = [x for e in parser.finish() for x in ev.for_event(e)]
            u = A.usage(value.prompt_tokens, len(value.tokens), value.cached_tokens)
            out += ev.finish(A.stop_reason(value.finish_reason, bool(parser.calls)), stop_sequence(value), u)
        else:
            client, message = _failure(value)
            out = [("error", A.error_body(message, "invalid_request_error" if client else "api_error"))]
        for name, obj in out:
            yield event(name, obj)
