"""Render a model's Jinja chat template (from its GGUF) the way transformers does.

Same environment as transformers' apply_chat_template: sandboxed, trim_blocks + lstrip_blocks,
loop controls, a `tojson` that keeps non-ASCII and does not HTML-escape, `raise_exception`,
`strftime_now`. Extra keyword arguments (e.g. enable_thinking=False) become template variables.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache


class TemplateError(ValueError):
    """The template itself raised (raise_exception) or failed to render."""


def _raise_exception(message):
    raise TemplateError(f"chat template: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template does not parse (line {e.lineno}: {e.message})") from None


def render(source: str, messages: list[dict], *, add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", **variables) -> str:
    """-> the prompt text for `messages` ([{"role": ..., "content": ...}, ...])."""
    import jinja2

    if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
        raise TypeError("messages must be a list of dicts like {'role': 'user', 'content': 'Hi'}")
    template = _compile(source)
    try:
        return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **variables)
    except TemplateError:
        raise
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template failed to render: {e}") from None
