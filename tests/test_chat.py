"""lucebox.chat: token-exact multi-turn sessions, Ctrl+C, and the REPL through a real pseudo-terminal."""
from __future__ import annotations

import io
import os
import pty
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from lucebox import chat
from lucebox.drafters import ScriptedDrafter
from lucebox.engine import Engine

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def engine(tiny_pair):
    target, draft = tiny_pair
    with Engine(target, draft=draft, max_ctx=1024, device="cpu") as e:
        yield e


# --- sessions ------------------------------------------------------------------------------
def test_each_turn_prefills_only_new_tokens(engine):
    session = chat.ChatSession(engine, system="Be brief.", max_new_tokens=12, mode="ar")
    first = "".join(session.send("Hello there"))
    ids1, gen1 = list(session.ids), session.last
    assert first == gen1.text and session.turns == 1
    assert gen1.stats.prompt_tokens == len(ids1) - len(gen1.tokens)  # the whole first prompt

    "".join(session.send("And again"))
    gen2 = session.last
    assert session.ids[:len(ids1)] == ids1  # the conversation only grows
    new_tokens = len(session.ids) - len(gen2.tokens) - len(ids1)  # template glue + the new message
    assert 0 < new_tokens
    # the pending last token of reply 1 (not yet in the cache) + the new tokens, nothing older
    assert gen2.stats.prompt_tokens <= new_tokens + 1
    assert [m["role"] for m in session.messages] == ["system", "user", "assistant", "user", "assistant"]


def test_turn_glue_matches_the_template(engine):
    # the text appended between turns is what the template renders after a reply
    session = chat.ChatSession(engine, max_new_tokens=4, mode="ar")
    glue = session.turn_glue()
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
               {"role": "user", "content": "c"}]
    full = engine.tokenizer.apply_chat_template(history, add_generation_prompt=True)
    assert full.endswith("b" + glue.replace(chat._PROBE_USER, "c"))
    assert glue.startswith("<|im_end|>") and glue.endswith("<|im_start|>assistant\n")


# Qwen3-style: earlier replies lose their <think> block when the history is re-rendered
THINK_STRIPPING_TEMPLATE = """\
{%- for m in messages %}
{%- set content = m.content %}
{%- if m.role == 'assistant' and '</think>' in content and not loop.last %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"""


def test_glue_keeps_the_real_reply_when_the_template_rewrites_history(tiny_pair):
    from lucebox.tokenizer import Tokenizer

    class StandIn:  # what ChatSession needs from an Engine to build prompts
        def __init__(self):
            self.tokenizer = Tokenizer.from_gguf(tiny_pair[0])
            self.tokenizer.chat_template = THINK_STRIPPING_TEMPLATE

        def reset(self):
            pass

    session = chat.ChatSession(StandIn())
    tok = session.engine.tokenizer
    first = session.prompt_ids("hi")
    reply = tok.encode("I think so.\n</think>\n\nYes.")
    session.ids = first + reply
    second = session.prompt_ids("why?")
    assert second[:len(first) + len(reply)] == first + reply  # the cached prefix is untouched
    assert tok.decode(second[len(first) + len(reply):], skip_special=False) == \
        "<|im_end|>\n<|im_start|>user\nwhy?<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_spec_session_matches_ar_session(engine):
    if not engine.has_draft:
        pytest.fail("tiny_pair should provide a draft")
    replies = {}
    for mode in ("ar", "ddtree"):
        session = chat.ChatSession(engine, max_new_tokens=10, mode=mode)
        replies[mode] = ["".join(session.send(t)) for t in ("one", "two", "three")]
        assert session.turns == 3
    assert replies["ar"] == replies["ddtree"]  # greedy speculative decoding is lossless


def test_reset_starts_over(engine):
    session = chat.ChatSession(engine, max_new_tokens=6, mode="ar")
    "".join(session.send("first"))
    assert session.turns == 1 and session.last is not None
    session.reset()
    assert session.ids == [] and session.messages == []
    assert session.turns == 0 and session.last is None  # /stats then says "no reply yet"
    "".join(session.send("first"))
    assert session.last.stats.prompt_tokens == len(session.ids) - len(session.last.tokens)


class _InterruptingOut(io.StringIO):
    """Sends this process SIGINT (what Ctrl+C does) on the n-th write, like a user mid-reply."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.writes = at, 0

    def write(self, text):
        self.writes += 1
        if self.writes == self.at:
            os.kill(os.getpid(), signal.SIGINT)
        return super().write(text)


def test_ctrl_c_stops_the_reply_and_the_session_goes_on(engine):
    session = chat.ChatSession(engine, max_new_tokens=200, mode="ar", ignore_eos=True)
    handler = signal.getsignal(signal.SIGINT)
    out, err = _InterruptingOut(at=3), io.StringIO()
    chat._reply(session, "tell me a long story", out, err)
    assert "[stopped]" in err.getvalue()
    stopped = session.last
    assert stopped.finish_reason == "cancelled"
    assert 3 <= len(stopped.tokens) < 20
    ids_before = list(session.ids)
    out2 = io.StringIO()
    chat._reply(session, "shorter please", out2, err)
    assert session.turns == 2 and session.last.finish_reason != "cancelled"
    assert session.ids[:len(ids_before)] == ids_before
    # AR commits token by token, so the cache still ends where the stopped reply did
    assert session.last.stats.prompt_tokens <= len(session.ids) - len(session.last.tokens) - len(ids_before) + 1
    assert signal.getsignal(signal.SIGINT) is handler  # Ctrl+C is itself again at the prompt


def test_ctrl_c_mid_ddtree_reply_keeps_the_cache_for_the_next_turn(engine, tiny_pair):
    # A DDTree step commits several tokens at once (a perfect draft: a whole block); stopping after
    # the first shown one must not leave committed-but-unshown tokens that make the next turn
    # re-prefill the whole conversation.
    target, draft = tiny_pair
    with Engine(target, draft=draft, max_ctx=1024, device="cpu") as fresh:
        first = chat.ChatSession(fresh).prompt_ids("tell me a long story")
        script = first + fresh.generate(first, 40, mode="ar", ignore_eos=True).tokens
        perfect = ScriptedDrafter(script, engine.info["block_size"], engine.info["n_vocab"])
        session = chat.ChatSession(engine, max_new_tokens=40, mode="ddtree", ignore_eos=True, drafter=perfect)
        chat._reply(session, "tell me a long story", _InterruptingOut(at=2), io.StringIO())
        assert session.last.finish_reason == "cancelled"
        assert len(session.last.tokens) > 2  # the step's unshown tokens are part of the conversation
        ids_next = session.prompt_ids("shorter please")
        n_new = len(ids_next) - len(session.ids)  # template glue + the message
        "".join(session.send("shorter please"))
        # those, and at most the pending last token of the stopped reply: nothing older
        assert session.last.stats.prompt_tokens <= n_new + 1
        assert session.last.tokens == fresh.generate(ids_next, 40, mode="ar", ignore_eos=True).tokens


def test_context_overflow_is_reported_and_reset_recovers(tiny_pair):
    target, draft = tiny_pair
    with Engine(target, max_ctx=64, device="cpu") as small:
        session = chat.ChatSession(small, max_new_tokens=8, mode="ar")
        err = io.StringIO()
        chat._reply(session, "word " * 200, io.StringIO(), err)
        assert "does not fit max_ctx" in err.getvalue() and "/reset" in err.getvalue()
        assert session.turns == 0
        chat._reply(session, "hi", io.StringIO(), err)
        assert session.turns == 1


def run_repl(session, lines: list[str]) -> io.StringIO:
    """Feed `lines` to the REPL, then EOF; returns what it wrote to stderr."""
    it = iter(lines)

    def read(prompt):
        try:
            return next(it)
        except StopIteration:
            raise EOFError

    err = io.StringIO()
    assert chat.repl(session, read=read, out=io.StringIO(), err=err) == 0
    return err


def test_repl_commands_and_eof():
    class FakeSession:
        last, ids, turns = None, [], 0

        def reset(self):
            self.was_reset = True

    session = FakeSession()
    err = run_repl(session, ["/help", "/stats", "/reset", "/rest"])
    assert "Ctrl+D exits" in err.getvalue() and "[no reply yet]" in err.getvalue()
    assert session.was_reset
    assert "[unknown command /rest; /set NAME VALUE" in err.getvalue()  # not sent to the model (no send here)


def test_set_changes_validated_sampling_settings(tiny_gguf, tmp_path):
    class FakeSession:
        last, ids, turns = None, [], 0
        options = {"max_new_tokens": 8, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}

    session = FakeSession()
    said = run_repl(session, ["/set temperature 0.9", "/set --top-p 0.5", "/set seed 7", "/set top_k -3",
                              "/set nope 1", "/set temperature", "/set temp 0", "/set"]).getvalue().splitlines()
    assert said[0] == "[sampling: temperature 0.9, top-k 20, top-p 0.95, min-p 0]"
    assert said[1] == "[sampling: temperature 0.9, top-k 20, top-p 0.5, min-p 0]"
    assert said[2].endswith("seed 7]")
    assert said[3].startswith("[not set: top_k must be")
    assert said[4].startswith("[unknown setting 'nope'")
    assert said[5].startswith("[usage: /set NAME VALUE")
    assert said[6] == said[7] == "[sampling: greedy]"
    assert session.options["temperature"] == 0.0 and session.options["seed"] == 7


def test_recommended_sampling_reads_the_gguf(tiny_gguf, tmp_path):
    import gguf

    from lucebox.gguf_meta import read_metadata

    assert chat.recommended_sampling(tiny_gguf["f32"]) == (
        {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}, "Qwen's recommended")
    # a copy that names its own settings (llama.cpp's general.sampling.* keys)
    src = gguf.GGUFReader(tiny_gguf["f32"])
    dst = tmp_path / "with-sampling.gguf"
    writer = gguf.GGUFWriter(dst, arch=read_metadata(tiny_gguf["f32"], keys=["general.architecture"])["general.architecture"])
    writer.add_float32("general.sampling.temp", 0.7)
    writer.add_int32("general.sampling.top_k", 40)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    settings, source = chat.recommended_sampling(dst)
    assert source == "from the GGUF"
    assert settings == {"temperature": 0.7, "top_p": 0.95, "top_k": 40, "min_p": 0.0}
    assert src is not None
    # values the engine would refuse are left out (and named), so chat still starts
    bad = tmp_path / "bad-sampling.gguf"
    writer = gguf.GGUFWriter(bad, arch=src.fields["general.architecture"].contents())
    writer.add_float32("general.sampling.temp", float("nan"))
    writer.add_int32("general.sampling.top_k", -5)
    writer.add_string("general.sampling.top_p", "high")
    writer.add_float32("general.sampling.min_p", 0.1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    settings, source = chat.recommended_sampling(bad)
    assert settings == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.1}
    assert source.startswith("from the GGUF; ignored the GGUF's general.sampling.temp = nan")
    assert source.endswith(": values the engine refuses")
    assert "general.sampling.top_k = -5" in source and "general.sampling.top_p = 'high'" in source


# --- the REPL in a real terminal -----------------------------------------------------------------
class Terminal:
    """`lucebox chat` on a pseudo-terminal, so Ctrl+C is a real SIGINT from the line discipline."""

    def __init__(self, args: list[str]):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["TERM"] = "dumb"
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child: the session leader of the new terminal
            # a shell that started us in the background may have left SIGINT ignored; exec keeps that
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(sys.executable, [sys.executable, "-m", "lucebox", "chat", *args], env)
        self.seen = ""
        self.exited = False

    def close(self) -> None:
        if not self.exited:  # only our own child, and only while it is not reaped
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.exited = True
        os.close(self.fd)

    def expect(self, text: str, timeout: float = 120) -> str:
        """Read until `text` appears after what was consumed; return what came before it."""
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {text!r}; terminal shows:\n{self.seen[-2000:]}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # the child exited
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"chat exited while waiting for {text!r}:\n{self.seen[-2000:]}")
                self.seen += chunk.decode("utf-8", "replace")
        before, _, self.seen = self.seen.partition(text)
        return before

    def at_prompt(self) -> None:
        """Wait for the prompt, and for readline to take the terminal: a control key typed before
        that (only a program is that quick) is lost, as with any readline program."""
        self.expect("> ")
        time.sleep(0.5)

    def read_at_least(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.seen) < n:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"timed out waiting for output; terminal shows:\n{self.seen[-2000:]}")
            self.seen += os.read(self.fd, 4096).decode("utf-8", "replace")

    def send(self, data: str) -> None:
        os.write(self.fd, data.encode())

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([self.fd], [], [], 0.05)[0]:
                try:
                    self.seen += os.read(self.fd, 4096).decode("utf-8", "replace")  # never let it block
                except OSError:
                    pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.exited = True
                return os.waitstatus_to_exitcode(status)
        raise AssertionError(f"chat did not exit; terminal shows:\n{self.seen[-2000:]}")


def test_repl_in_a_pty(tiny_pair):
    target, draft = tiny_pair
    # replies run to --n-gen (no end-of-sequence), so a long one is surely still streaming at Ctrl+C
    term = Terminal(["--target", str(target), "--draft", str(draft), "--mode", "ar", "--device", "cpu",
                     "--max-ctx", "512", "--ignore-eos", "--n-gen", "300"])
    try:
        term.expect("Ctrl+D exits")
        term.at_prompt()
        term.send("\x03")  # Ctrl+C at the prompt: a fresh prompt, no exit
        term.expect("> ")

        term.send("Count to one hundred\r")
        term.expect("Count to one hundred")
        term.read_at_least(20)  # the reply is streaming
        term.send("\x03")  # Ctrl+C mid-reply: the reply stops, the session stays
        term.expect("[stopped]")
        term.expect("> ")
        term.send("/stats\r")
        stats = term.expect("turns]")
        assert "(ar)" in stats and stats.rstrip().endswith(" 1")
        stopped_at = int(stats.split("decode ")[1].split(" tok")[0])
        assert 0 < stopped_at < 300

        term.send("Still there?\r")
        term.send("/stats\r")  # queued behind the reply
        stats = term.expect("turns]")
        assert "decode 300 tok" in stats and stats.rstrip().endswith(" 2")

        term.send("/reset\r")
        term.expect("[conversation cleared]")
        term.at_prompt()
        term.send("\x04")  # Ctrl+D
        assert term.wait() == 0
    finally:
        term.close()
