"""Chat messages (as both APIs normalize them) -> prompt tokens, with the GGUF's own template.

Normalized messages are what Qwen's Jinja templates read: {"role", "content": str} plus
`reasoning_content` and `tool_calls` ([{"id", "type": "function", "function": {"name",
"arguments": dict}}]) on assistant turns and `tool_call_id` on tool results.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..chat_template import TemplateError
from ..tokenizer import TokenizerError
from .options import BadRequest
from .tool_calls import starts_in_thinking


@dataclass
class Prompt:
    ids: list[int]
    text: str
    thinking: bool           # the template left a <think> block open: the reply starts as reasoning
    tools: list[dict] | None


def text_only(content, where: str) -> str:
    """Message content (a string, or a list of {"type": "text", "text": ...} blocks / parts) as text."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for block in content:
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise BadRequest(f"{where} content of type {block.get('type')!r}: lucebox takes text only", "messages")
        parts.append(block["text"])
    return "".join(parts)


def tool_arguments(arguments) -> dict:
    """A tool call's arguments as a dict (OpenAI sends a JSON string, the template wants a mapping)."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or arguments == "":
        return {}
    try:
        value = json.loads(arguments)
    except (TypeError, ValueError):
        raise BadRequest("a tool call's arguments are not valid JSON", "messages") from None
    if not isinstance(value, dict):
        raise BadRequest("a tool call's arguments must be a JSON object", "messages")
    return value


def render(tokenizer, messages: list[dict], *, tools: list[dict] | None = None,
           template_kwargs: dict | None = None) -> Prompt:
    if not messages:
        raise BadRequest("messages is empty: send at least one message", "messages")
    if not tokenizer.chat_template:
        raise BadRequest("this model has no chat template; use /v1/completions with a raw prompt", "messages")
    if tools and "tools" not in tokenizer.chat_template:
        raise BadRequest("this model's chat template does not render tools; send the request without tools",
                         "tools")
    variables = dict(template_kwargs or {})
    for reserved in ("messages", "add_generation_prompt", "bos_token", "eos_token"):
        if reserved in variables:
            raise BadRequest(f"chat_template_kwargs may not set {reserved!r}", "chat_template_kwargs")
    if tools:
        variables["tools"] = tools
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **variables)
    except TemplateError as e:
        raise BadRequest(str(e), "messages") from None
    return Prompt(ids=encode(tokenizer, text, "messages"), text=text, thinking=starts_in_thinking(text),
                  tools=tools or None)


def encode(tokenizer, text: str, param: str) -> list[int]:
    """A request's text as tokens; text the tokenizer refuses (a lone surrogate such as a JSON "\\ud800") is the
    client's error, a 400 naming `param`, not the server's."""
    try:
        return tokenizer.encode(text)
    except TokenizerError as e:
        raise BadRequest(f"{param}: {e}", param) from None


def check_fits(n_prompt: int, max_ctx: int) -> None:
    """A prompt must leave room for at least one new token."""
    if n_prompt >= max_ctx:
        raise BadRequest(f"the prompt has {n_prompt} tokens but the context holds {max_ctx} "
                         f"(prompt + reply); shorten the prompt or restart the server with a larger --max-ctx",
                         "messages")


def max_new_tokens(asked: int | None, n_prompt: int, max_ctx: int) -> int:
    """The reply's token limit: what was asked for, at most what the context has room for."""
    room = max_ctx - n_prompt
    return room if asked is None else min(asked, room)
