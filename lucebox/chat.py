"""Multi-turn chat on one loaded Engine, and the terminal REPL around it.

The conversation is kept as the exact token list the caches hold (prompt + the tokens the model
emitted), and each turn appends only the template text that closes the reply and opens the next
user turn. So a turn prefills just its new tokens, even when the template would re-render earlier
replies differently (e.g. dropping a <think> block).
"""
from __future__ import annotations

import re
import signal
import sys
from typing import Callable, Iterator

_PROBE_REPLY = "lucebox-probe-reply"  # texts no template rewrites, to find the turn boundaries
_PROBE_USER = "lucebox-probe-user"

HELP = "/set NAME VALUE changes a sampling setting, /reset starts over, /stats shows the last reply's numbers, " \
       "/help this; Ctrl+C stops a reply, Ctrl+D exits"

# what /set may change (GenerationConfig fields), and how to read a value
SETTINGS = {"temperature": float, "top_k": int, "top_p": float, "min_p": float, "repeat_penalty": float,
            "presence_penalty": float, "frequency_penalty": float, "seed": int}
_SHOWN = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty")
# GGUF keys of a model's recommended sampler settings (what llama.cpp reads) -> our names
_GGUF_SAMPLING = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
                  "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
                  "general.sampling.penalty_repeat": "repeat_penalty"}


def recommended_sampling(target) -> tuple[dict, str]:
    """(settings, where they came from): the GGUF's general.sampling.* if it has any, else Qwen's
    published thinking-mode settings (config.CHAT_SAMPLING). A value GenerationConfig would refuse (a NaN, a
    negative top-k, a string) is left out and named in the source, so chat starts with the rest."""
    from .config import CHAT_SAMPLING, GenerationConfig
    from .gguf_meta import read_metadata

    meta = read_metadata(target, keys=_GGUF_SAMPLING)
    found, ignored = {}, []
    for key, name in _GGUF_SAMPLING.items():
        if key not in meta:
            continue
        try:
            # f32 metadata: 0.7 is stored as 0.699999988; keep the digits the model card gave
            value = SETTINGS[name](meta[key]) if name == "top_k" else round(float(meta[key]), 6)
            GenerationConfig(**{name: value})
        except (TypeError, ValueError, OverflowError):
            ignored.append(f"{key} = {meta[key]!r}")
            continue
        found[name] = value
    settings = dict(CHAT_SAMPLING)
    settings.update(found)
    source = "from the GGUF" if found else "Qwen's recommended"
    if ignored:
        source += f"; ignored the GGUF's {', '.join(ignored)}: values the engine refuses"
    return settings, source


def describe_sampling(options: dict) -> str:
    if not options.get("temperature"):
        return "greedy"
    parts = [f"{k.replace('_', '-')} {options[k]:g}" for k in _SHOWN if k in options]
    if options.get("seed") is not None:
        parts.append(f"seed {options['seed']}")
    return ", ".join(parts)


class ChatSession:
    """One conversation: `for piece in session.send("hi"): print(piece, end="")`."""

    def __init__(self, engine, system: str | None = None, progress=None, **options):
        self.engine = engine
        self.system = system
        self.progress = progress       # prefill progress callback (Engine.prefill), e.g. a terminal bar
        self.options = options         # Engine.stream options: max_new_tokens, mode, budget, top_k, ...
        self._glue: str | None = None   # template text after a reply, _PROBE_USER marks the message
        self.reset()

    def reset(self) -> None:
        self.messages: list[dict] = [{"role": "system", "content": self.system}] if self.system else []
        self.ids: list[int] = []       # the conversation so far, as tokens
        self.turns = 0
        self.last = None               # Generation of the last reply
        self.engine.reset()

    # --- prompt building -------------------------------------------------------------------
    def turn_glue(self) -> str:
        """The template's text from the end of a reply to the start of the next reply, with
        _PROBE_USER where the user's message goes: for ChatML
        `<|im_end|>\n<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n`.

        Read off a rendered probe conversation, after the probe reply: what the template does to
        earlier replies (drop a <think> block, ...) does not matter, the caches keep the real ones.
        """
        if self._glue is None:
            probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE_REPLY},
                     {"role": "user", "content": _PROBE_USER}]
            text = self.engine.tokenizer.apply_chat_template(probe, add_generation_prompt=True)
            glue = text[text.rfind(_PROBE_REPLY) + len(_PROBE_REPLY):]
            if _PROBE_REPLY not in text or glue.count(_PROBE_USER) != 1:
                raise ValueError("this model's chat template does not render a conversation as plain turns; "
                                 "lucebox chat cannot continue one")
            self._glue = glue
        return self._glue

    def prompt_ids(self, user_text: str) -> list[int]:
        tok = self.engine.tokenizer
        if not self.ids:
            messages = self.messages + [{"role": "user", "content": user_text}]
            return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
        return self.ids + tok.encode(self.turn_glue().replace(_PROBE_USER, user_text))

    # --- one turn --------------------------------------------------------------------------
    def send(self, user_text: str) -> Iterator[str]:
        """Stream the reply. Closing the iterator early (Ctrl+C) keeps what was said so far."""
        ids = self.prompt_ids(user_text)
        before = getattr(self.engine, "last_generation", None)
        stream = self.engine.stream(ids, progress=self.progress, **self.options)
        try:
            yield from stream
        finally:
            stream.close()
            gen = getattr(self.engine, "last_generation", None)
            if gen is not None and gen is not before:  # the turn ran (completed or cancelled)
                self.ids = ids + list(gen.tokens)
                self.messages += [{"role": "user", "content": user_text},
                                  {"role": "assistant", "content": gen.text}]
                self.turns += 1
                self.last = gen


class _StopOnInterrupt:
    """While active, Ctrl+C sets `.hit` instead of raising, so a reply stops between tokens and the
    engine is never left between a native call and its bookkeeping."""

    def __init__(self):
        self.hit = False

    def __enter__(self):
        self.hit = False
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        self.hit = True

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._previous)


def repl(session: ChatSession, *, read: Callable[[str], str] = input, out=None, err=None,
         banner: str = "") -> int:
    """Read lines until EOF (Ctrl+D); returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        import readline  # noqa: F401  (line editing and history for input(), where available)
    except ImportError:
        pass
    if banner:
        print(banner, file=err, flush=True)
    while True:
        try:
            text = read("> ").strip()
            handled = _command(session, text, err) if text.startswith("/") else None
            if handled == "exit":
                return 0
            if text and handled is None:
                _reply(session, text, out, err)
        except EOFError:
            print(file=out, flush=True)
            return 0
        except KeyboardInterrupt:
            print(file=out, flush=True)  # like Python's REPL: drop the line, ask again


def _command(session: ChatSession, text: str, err) -> str | None:
    """Handle a /command; None if the text is not one (it is then sent as a message)."""
    word = text.split()[0].lower()
    if word == "/reset":
        session.reset()
        print("[conversation cleared]", file=err, flush=True)
    elif word == "/stats":
        if session.last is None:
            print("[no reply yet]", file=err, flush=True)
        else:
            s = session.last.stats
            print(f"[{s.summary()}; conversation {len(session.ids)} tokens, {session.turns} turns]",
                  file=err, flush=True)
    elif word == "/set":
        print(f"[{_set(session, text.split()[1:])}]", file=err, flush=True)
    elif word in ("/help", "/?"):
        print(HELP, file=err, flush=True)
    elif word in ("/exit", "/quit"):
        return "exit"
    elif re.fullmatch(r"/[a-z]+", text.lower()):
        # a lone /word is a mistyped command far more often than a message (a path has more than one slash)
        print(f"[unknown command {text}; {HELP}]", file=err, flush=True)
    else:
        return None
    return "done"


def _set(session: ChatSession, args: list[str]) -> str:
    """`/set NAME VALUE` (names as the CLI spells them, - or _); `/set` alone shows the settings."""
    from .config import GenerationConfig

    if not args:
        return "sampling: " + describe_sampling(session.options)
    if len(args) != 2:
        return "usage: /set NAME VALUE, e.g. /set temperature 0.7 (names: " + ", ".join(SETTINGS) + ")"
    name, text = args[0].lower().lstrip("-").replace("-", "_"), args[1]
    if name == "temp":
        name = "temperature"
    if name not in SETTINGS:
        return f"unknown setting {args[0]!r}; one of: " + ", ".join(SETTINGS)
    try:
        value = None if name == "seed" and text.lower() in ("none", "random") else SETTINGS[name](text)
        options = {**session.options, name: value}
        GenerationConfig(**options)  # validates the whole set
    except ValueError as e:
        return f"not set: {e}"
    session.options = options
    return "sampling: " + describe_sampling(options)


def _reply(session: ChatSession, text: str, out, err) -> None:
    with _StopOnInterrupt() as interrupt:
        try:
            stream = session.send(text)
            for piece in stream:
                out.write(piece)
                out.flush()
                if interrupt.hit:
                    break
            stream.close()
        except (ValueError, RuntimeError) as e:  # the conversation outgrew max_ctx, a native failure
            from .tokenizer import TokenizerError

            # a message that cannot be encoded (invalid UTF-8) leaves the conversation as it was
            hint = "" if isinstance(e, TokenizerError) else "; /reset starts a new conversation"
            print(f"\n[error: {e}{hint}]", file=err, flush=True)
            return
    print(file=out, flush=True)
    reason = session.last.finish_reason if session.last is not None else None
    if reason == "cancelled":
        print("[stopped]", file=err, flush=True)
    elif reason == "context":
        print("[context full: /reset starts a new conversation]", file=err, flush=True)
