"""lucebox serve: a live server on a loopback port, driven by the official `openai` and `anthropic`
clients (and raw httpx for malformed requests).

Two servers: the embedded default pair (real decoding: stream == non-stream, usage, stops, prefix
reuse, concurrency, cancellation) and a scripted stand-in engine (tool calls, reasoning, API key,
queue limit), since the tiny model cannot write a tool call.
"""
from __future__ import annotations

import copy
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from lucebox.config import ServeConfig  # noqa: E402
from lucebox.defaults import embedded  # noqa: E402
from lucebox.engine import Engine, Generation  # noqa: E402
from lucebox.server import create_app  # noqa: E402
from lucebox.stats import GenerationStats  # noqa: E402

HOST = "127.0.0.1"
MAX_CTX = 1024
TIMEOUT_S = 60          # any one request; a hang fails the test instead of the suite
CODE = "def parse_header(line):\n    "


class LiveServer:
    """uvicorn in a thread on a free loopback port."""

    def __init__(self, app):
        self.server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=0, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + TIMEOUT_S
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{HOST}:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=TIMEOUT_S)

    def openai(self, key="unused"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=TIMEOUT_S)

    def anthropic(self, key="unused"):
        return anthropic.Anthropic(base_url=self.url, api_key=key, max_retries=0, timeout=TIMEOUT_S)

    def healthy(self) -> bool:
        return httpx.get(self.url + "/health", timeout=TIMEOUT_S).json()["status"] == "ok"


@pytest.fixture(scope="module")
def engine():
    pair = embedded()
    if pair is None:
        pytest.fail("the embedded default pair is missing")
    with Engine(pair[0], draft=pair[1], max_ctx=MAX_CTX, device="cpu", n_threads=1) as e:
        yield e


@pytest.fixture(scope="module")
def live(engine):
    s = LiveServer(create_app(engine, ServeConfig(max_queue=64, prefix_cache_gb=0.25)))
    yield s
    s.stop()


def chat(client, content, system=None, **kw):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="lucebox", messages=messages, **kw)


def stream_text(client, content, **kw):
    parts, usage, finish = [], None, None
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0)
    stream = client.chat.completions.create(model="lucebox", messages=[{"role": "user", "content": content}],
                                            stream=True, stream_options={"include_usage": True}, **kw)
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return "".join(parts), usage, finish


# --- OpenAI: decoding, usage, stops ------------------------------------------------------------
def test_health_and_models(live):
    assert live.healthy()
    models = live.openai().models.list()
    assert [m.id for m in models.data] == ["lucebox"]


def test_stream_equals_non_stream(live, engine):
    client = live.openai()
    whole = chat(client, CODE, max_tokens=40)
    text, usage, finish = stream_text(client, CODE, max_tokens=40)
    assert text == whole.choices[0].message.content and text
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens
    # the same reply as the Engine itself gives
    want = engine.generate([{"role": "user", "content": CODE}], 40)
    assert whole.choices[0].message.content == want.text
    # completions, raw text
    c1 = client.completions.create(model="lucebox", prompt=CODE, max_tokens=30, temperature=0)
    pieces = [ch.choices[0].text for ch in client.completions.create(
        model="lucebox", prompt=CODE, max_tokens=30, temperature=0, stream=True) if ch.choices]
    assert "".join(pieces) == c1.choices[0].text == engine.generate(CODE, 30).text


def test_usage_counts(live, engine):
    client = live.openai()
    r = chat(client, "class Stack:", max_tokens=12)
    prompt = engine.encode_prompt([{"role": "user", "content": "class Stack:"}])
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens <= 12 and r.usage.total_tokens == len(prompt) + r.usage.completion_tokens
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    # max_completion_tokens wins over max_tokens
    r2 = client.chat.completions.create(model="lucebox", messages=[{"role": "user", "content": CODE}],
                                        max_completion_tokens=5, temperature=0)
    assert r2.usage.completion_tokens == 5 and r2.choices[0].finish_reason == "length"
    count = live.anthropic().messages.count_tokens(model="lucebox",
                                                   messages=[{"role": "user", "content": "class Stack:"}])
    assert count.input_tokens == len(prompt)


def test_stop_strings(live):
    client = live.openai()
    full = chat(client, CODE, max_tokens=40).choices[0].message.content
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip(), full
    cut = chat(client, CODE, max_tokens=40, stop=[stop, "@@never@@"])
    assert cut.choices[0].message.content == full[:full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    text, _, finish = stream_text(client, CODE, max_tokens=40, stop=stop)
    assert text == full[:full.index(stop)] and finish == "stop"
    msg = live.anthropic().messages.create(model="lucebox", max_tokens=40, stop_sequences=[stop],
                                           messages=[{"role": "user", "content": CODE}])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == full[:full.index(stop)]


def test_n_above_one_and_neutral_options(live):
    client = live.openai()
    with pytest.raises(openai.BadRequestError, match="n = 2"):
        chat(client, "x", n=2)
    # neutral values and lucebox extras are fine
    r = chat(client, CODE, max_tokens=6, top_p=1.0, presence_penalty=0.0,
             extra_body={"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "budget": 8, "mode": "ar"})
    assert r.usage.completion_tokens == 6


def test_seeded_sampling_is_reproducible(live):
    client = live.openai()
    kw = dict(temperature=0.9, top_p=0.95, seed=1234, max_tokens=24, extra_body={"top_k": 40, "min_p": 0.01})
    a = chat(client, CODE, **kw).choices[0].message.content
    b = chat(client, CODE, **kw).choices[0].message.content
    text, _, _ = stream_text(client, CODE, **kw)
    assert a == b == text


def test_anthropic_stream_equals_non_stream(live):
    client = live.anthropic()
    args = dict(model="lucebox", max_tokens=30, messages=[{"role": "user", "content": CODE}])
    whole = client.messages.create(**args)
    kinds, text = [], []
    with client.messages.stream(**args) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text.append(event.delta.text)
        final = stream.get_final_message()
    assert "".join(text) == whole.content[0].text == final.content[0].text
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    for k in ("content_block_start", "content_block_stop", "message_delta"):
        assert k in kinds
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    # the raw event names, in the order the Messages API streams them
    with httpx.stream("POST", live.url + "/v1/messages", json={**args, "stream": True}, timeout=TIMEOUT_S) as r:
        names = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


# --- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("body, words", [
    (b"{not json", "not valid JSON"),
    (b'{"messages": "hi"}', "messages"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}', "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": -1}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}', "unknown field 'frobnicate'"),
    (b'{"messages": [{"role": "wizard", "content": "hi"}]}', "role"),
    (b'{"messages": []}', "messages is empty"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "text only"),
    (b'[1, 2]', "body"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "finite number"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": true}', "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "seed": "5"}', "seed"),
    (b'{"messages": [{"role": "user", "content": "a \\ud800 b"}]}', "not valid Unicode"),  # a lone surrogate
])
def test_bad_requests_get_400_json(live, body, words):
    r = httpx.post(live.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"},
                   timeout=TIMEOUT_S)
    assert r.status_code == 400
    err = r.json()["error"]
    assert words in err["message"] and err["type"] == "invalid_request_error"
    assert err["param"] is None or not err["param"].isdigit()  # a parameter's name, never a body offset
    assert live.healthy()


def test_text_the_tokenizer_refuses_is_a_400_on_every_route(live):
    bodies = {"/v1/completions": {"prompt": "a \ud800 b", "max_tokens": 3},
              "/v1/messages": {"max_tokens": 3, "messages": [{"role": "user", "content": "a \ud800 b"}]},
              "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "a \ud800 b"}]}}
    for route, body in bodies.items():
        r = httpx.post(live.url + route, content=json.dumps(body), timeout=TIMEOUT_S,  # ASCII: "\\ud800" escaped
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid Unicode" in r.text, (route, r.text)
    assert live.healthy()


def test_huge_prompt_names_the_numbers(live):
    client = live.openai()
    with pytest.raises(openai.BadRequestError, match=f"context holds {MAX_CTX}"):
        chat(client, "word " * 3000)
    with pytest.raises(anthropic.BadRequestError, match=f"context holds {MAX_CTX}"):
        live.anthropic().messages.create(model="lucebox", max_tokens=5,
                                         messages=[{"role": "user", "content": "word " * 3000}])
    with pytest.raises(openai.BadRequestError, match=f"context holds {MAX_CTX}"):
        client.completions.create(model="lucebox", prompt=[1] * (MAX_CTX + 5), max_tokens=3)
    with pytest.raises(openai.BadRequestError, match="token ids"):
        client.completions.create(model="lucebox", prompt=[10 ** 7], max_tokens=3)
    # counting is how a client learns that a prompt does not fit: it answers past the context too
    count = live.anthropic().messages.count_tokens(model="lucebox",
                                                   messages=[{"role": "user", "content": "word " * 3000}])
    assert count.input_tokens > MAX_CTX
    assert chat(client, CODE, max_tokens=3).usage.completion_tokens == 3


def test_unknown_model_and_route_are_404(live):
    with pytest.raises(openai.NotFoundError, match="not served here"):
        live.openai().chat.completions.create(model="gpt-17", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError, match="not served here"):
        live.anthropic().messages.create(model="claude-9", max_tokens=3, messages=[{"role": "user", "content": "x"}])
    r = httpx.get(live.url + "/v1/nothing", timeout=TIMEOUT_S)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.post(live.url + "/v1/messages", content=b'{"max_tokens": "x"}', timeout=TIMEOUT_S)
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert live.healthy()


def test_cancel_on_the_real_engine_then_next_reply_is_unchanged(live):
    client = live.openai()
    solo = chat(client, "def solo(x):", max_tokens=20).choices[0].message.content
    stream = client.chat.completions.create(model="lucebox", messages=[{"role": "user", "content": CODE}],
                                            max_tokens=900, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    assert chat(client, "def solo(x):", max_tokens=20).choices[0].message.content == solo


# --- queue, concurrency, prefix reuse ---------------------------------------------------------
def test_concurrent_clients_each_get_their_solo_reply(live):
    prompts = [f"def function_{i}(value):" for i in range(32)]
    client = live.openai()
    solo = [chat(client, p, max_tokens=16).choices[0].message.content for p in prompts]
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda p: chat(live.openai(), p, max_tokens=16).choices[0].message.content,
                                 prompts))
    assert together == solo


SYSTEM = "You write Python. " + " ".join(f"Rule {i}: keep functions short and name things well." for i in range(20))


def test_second_turn_prefills_little(live, engine):
    client = live.openai()
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "def add(a, b):"}]
    r1 = client.chat.completions.create(model="lucebox", messages=first, max_tokens=24, temperature=0)
    chat(client, "another client's request in between", max_tokens=8)  # the live cache moves on
    second = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                      {"role": "user", "content": "def sub(a, b):"}]
    r2 = client.chat.completions.create(model="lucebox", messages=second, max_tokens=8, temperature=0)
    prefilled = r2.usage.prompt_tokens - r2.usage.prompt_tokens_details.cached_tokens
    assert prefilled < 0.1 * r2.usage.prompt_tokens, r2.usage
    # another request with the same system prompt reuses at least the system message
    r3 = client.chat.completions.create(model="lucebox", max_tokens=4, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "something else"}])
    assert r3.usage.prompt_tokens_details.cached_tokens > 0.8 * r3.usage.prompt_tokens
    # reuse changes nothing in the reply: the same as a fresh engine's (the server is idle here)
    again = client.chat.completions.create(model="lucebox", messages=second, max_tokens=8, temperature=0)
    engine.reset()
    fresh = engine.generate(second, 8)
    assert again.choices[0].message.content == r2.choices[0].message.content == fresh.text


# --- the scripted engine: tool calls, reasoning, cancellation, API key, queue limit ------------
QWEN_LIKE_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}# Tools
<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<|im_start|>user
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content }}
{%- for tc in m.tool_calls or [] %}<tool_call>
<function={{ tc.function.name }}>
{% for k, v in tc.function.arguments | items %}<parameter={{ k }}>
{{ v if v is string else v | tojson }}
</parameter>
{% endfor %}</function>
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking %}<think>
{% else %}<think>

</think>

{% endif %}{% endif %}"""

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
TOOL_REPLY = ("The user wants the weather.\n</think>\n\nLet me check.\n<tool_call>\n<function=get_weather>\n"
              "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
THINK_REPLY = "Two plus two.\nThat is four.\n</think>\n\nThe answer is 4."


class ScriptedEngine:
    """What the server needs from an Engine, replying with a script in small pieces."""

    def __init__(self, tokenizer):
        self.tokenizer = copy.copy(tokenizer)
        self.tokenizer.chat_template = QWEN_LIKE_TEMPLATE
        self.info = {"max_ctx": 4096, "max_tree": 64}
        self.script = ""
        self.piece_delay_s = 0.0
        self.prompts: list[list[int]] = []
        self.closed_early = 0
        self.last_generation = None

    cached_tokens = ()

    def stream(self, ids, max_new_tokens=256, **options):
        self.prompts.append(list(ids))
        if self.script == "FAIL":
            raise RuntimeError("scripted native failure")
        pieces = [self.script[i:i + 3] for i in range(0, len(self.script), 3)] if self.script else None
        out, finish = [], "eos"
        try:
            for i in range(max_new_tokens):
                piece = pieces[i] if pieces else "x"
                if pieces and i == len(pieces) - 1:
                    finish = "eos"
                time.sleep(self.piece_delay_s)
                out.append(piece)
                yield piece
                if pieces and i == len(pieces) - 1:
                    break
            else:
                finish = "length"
        except GeneratorExit:
            self.closed_early += 1
            finish = "cancelled"
            raise
        finally:
            self.last_generation = Generation("".join(out), list(range(len(out))), finish,
                                              GenerationStats(new_tokens=len(out)))


@pytest.fixture(scope="module")
def scripted(engine):
    fake = ScriptedEngine(engine.tokenizer)
    s = LiveServer(create_app(fake, ServeConfig(max_queue=1, prefix_cache_gb=0, api_key="secret")))
    yield s, fake
    s.stop()


def test_api_key(scripted):
    live, fake = scripted
    fake.script, fake.piece_delay_s = "done", 0.0
    with pytest.raises(openai.AuthenticationError):
        live.openai("wrong").chat.completions.create(model="lucebox", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.AuthenticationError):
        live.anthropic("wrong").messages.create(model="lucebox", max_tokens=4,
                                                messages=[{"role": "user", "content": "x"}])
    ok = live.openai("secret").chat.completions.create(model="lucebox", messages=[{"role": "user", "content": "x"}])
    assert ok.choices[0].message.content == "done"
    assert live.anthropic("secret").messages.create(model="lucebox", max_tokens=4, messages=[
        {"role": "user", "content": "x"}]).content[0].text == "done"
    assert live.healthy()  # /health needs no key


def test_tool_call_round_trip_openai(scripted):
    live, fake = scripted
    fake.script, fake.piece_delay_s = TOOL_REPLY, 0.0
    client = live.openai("secret")
    ask = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
    think = {"chat_template_kwargs": {"enable_thinking": True}}
    r = client.chat.completions.create(model="lucebox", messages=ask, tools=TOOLS, extra_body=think)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content == "Let me check." and msg.model_extra["reasoning_content"] == "The user wants the weather."
    (call,) = msg.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    prompt = fake.tokenizer.decode(fake.prompts[-1], skip_special=False)
    assert '"name": "get_weather"' in prompt  # the template rendered the tools

    # streamed: the same call, in a tool_calls delta
    calls, content = [], []
    for chunk in client.chat.completions.create(model="lucebox", messages=ask, tools=TOOLS, stream=True,
                                                extra_body=think):
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            content.append(c.delta.content or "")
            finish = c.finish_reason or None
    assert "".join(content) == "Let me check." and finish == "tool_calls"
    assert [c.function.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "days": 3}

    # the round trip: the assistant's call and the tool's result go back into the prompt
    fake.script = "It is sunny."
    follow = ask + [msg.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"}]
    r2 = client.chat.completions.create(model="lucebox", messages=follow, tools=TOOLS)
    assert r2.choices[0].message.content == "It is sunny." and r2.choices[0].finish_reason == "stop"
    prompt = fake.tokenizer.decode(fake.prompts[-1], skip_special=False)
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in prompt
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in prompt


def test_tool_call_round_trip_anthropic(scripted):
    live, fake = scripted
    fake.script, fake.piece_delay_s = TOOL_REPLY, 0.0
    client = live.anthropic("secret")
    tools = [{"name": "get_weather", "description": "Weather for a city",
              "input_schema": TOOLS[0]["function"]["parameters"]}]
    ask = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
    think = {"type": "enabled", "budget_tokens": 1024}
    msg = client.messages.create(model="lucebox", max_tokens=200, messages=ask, tools=tools, thinking=think)
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"] and msg.stop_reason == "tool_use"
    assert msg.content[0].thinking == "The user wants the weather." and msg.content[1].text == "Let me check."
    assert msg.content[2].name == "get_weather" and msg.content[2].input == {"city": "Paris", "days": 3}
    with client.messages.stream(model="lucebox", max_tokens=200, messages=ask, tools=tools, thinking=think) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == {"city": "Paris", "days": 3} and final.stop_reason == "tool_use"
    assert kinds[-1] == "message_stop"

    fake.script = "Sunny."
    follow = ask + [{"role": "assistant", "content": [b.model_dump() for b in msg.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": msg.content[2].id,
                                                  "content": "sunny, 21C"}]}]
    again = client.messages.create(model="lucebox", max_tokens=50, messages=follow, tools=tools)
    assert again.content[0].text == "Sunny." and again.stop_reason == "end_turn"
    prompt = fake.tokenizer.decode(fake.prompts[-1], skip_special=False)
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in prompt and "<parameter=days>\n3\n" in prompt


def test_reasoning_split_and_template_kwargs(scripted):
    live, fake = scripted
    fake.script, fake.piece_delay_s = THINK_REPLY, 0.0
    client = live.openai("secret")
    ask = [{"role": "user", "content": "2+2?"}]
    think = {"chat_template_kwargs": {"enable_thinking": True}}
    msg = client.chat.completions.create(model="lucebox", messages=ask, extra_body=think).choices[0].message
    assert msg.content == "The answer is 4."
    assert msg.model_extra["reasoning_content"] == "Two plus two.\nThat is four."
    reasoning, content = [], []
    for chunk in client.chat.completions.create(model="lucebox", messages=ask, stream=True, extra_body=think):
        for c in chunk.choices:
            reasoning.append((c.delta.model_extra or {}).get("reasoning_content") or "")
            content.append(c.delta.content or "")
    assert "".join(reasoning) == "Two plus two.\nThat is four." and "".join(content) == "The answer is 4."
    # enable_thinking=True reached the template (it opened the think block); False closes it
    fake.script = "Four."
    r = client.chat.completions.create(model="lucebox", messages=ask,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert fake.tokenizer.decode(fake.prompts[-1], skip_special=False).endswith("<think>\n\n</think>\n\n")
    assert r.choices[0].message.content == "Four." and "reasoning_content" not in (r.choices[0].message.model_extra or {})
    # Anthropic: thinking={"type": "enabled"} sets enable_thinking=True, and gives a thinking block
    fake.script = THINK_REPLY
    msg = live.anthropic("secret").messages.create(model="lucebox", max_tokens=100, messages=ask,
                                                   thinking={"type": "enabled", "budget_tokens": 1024})
    assert fake.tokenizer.decode(fake.prompts[-1], skip_special=False).endswith("<think>\n")
    assert [(b.type, getattr(b, "thinking", None) or b.text) for b in msg.content] == [
        ("thinking", "Two plus two.\nThat is four."), ("text", "The answer is 4.")]


def test_engine_failure_is_500_and_the_server_keeps_serving(scripted):
    live, fake = scripted
    fake.script, fake.piece_delay_s = "FAIL", 0.0
    client = live.openai("secret")
    with pytest.raises(openai.InternalServerError, match="scripted native failure") as e:
        client.chat.completions.create(model="lucebox", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 500
    with pytest.raises(anthropic.InternalServerError, match="scripted native failure"):
        live.anthropic("secret").messages.create(model="lucebox", max_tokens=5,
                                                 messages=[{"role": "user", "content": "x"}])
    fake.script = "fine"
    assert client.chat.completions.create(model="lucebox", messages=[
        {"role": "user", "content": "x"}]).choices[0].message.content == "fine"


def test_cancel_mid_stream_then_next_request_is_served(scripted):
    live, fake = scripted
    fake.script, fake.piece_delay_s = "", 0.002   # endless "x" pieces until max_tokens
    client = live.openai("secret")
    closed = fake.closed_early
    stream = client.chat.completions.create(model="lucebox", messages=[{"role": "user", "content": "go"}],
                                            max_tokens=100_000, stream=True)
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    fake.piece_delay_s = 0.0
    fake.script = "next"
    r = client.chat.completions.create(model="lucebox", messages=[{"role": "user", "content": "again"}])
    assert r.choices[0].message.content == "next"
    assert fake.closed_early == closed + 1          # the engine's stream was closed, not run out
    assert fake.prompts and len(fake.last_generation.text) == 4


def test_a_non_streaming_client_that_leaves_cancels_its_job(scripted):
    live, fake = scripted
    fake.script, fake.piece_delay_s = "", 0.002
    closed = fake.closed_early
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live.url + "/v1/chat/completions", headers={"x-api-key": "secret"}, timeout=0.5,
                   json={"messages": [{"role": "user", "content": "go"}], "max_tokens": 100_000})
    deadline = time.monotonic() + TIMEOUT_S   # the reply would take ~8 s more: it must be stopped
    while fake.closed_early == closed and time.monotonic() < deadline:
        time.sleep(0.01)
    fake.piece_delay_s, fake.script = 0.0, "served"
    r = live.openai("secret").chat.completions.create(model="lucebox", messages=[{"role": "user", "content": "x"}])
    assert r.choices[0].message.content == "served" and fake.closed_early == closed + 1


def test_queue_full_is_503(scripted):
    live, fake = scripted
    fake.script, fake.piece_delay_s = "", 0.002
    client = live.openai("secret")
    streams = []
    try:
        for _ in range(2):  # one runs, one waits (max_queue 1)
            streams.append(client.chat.completions.create(
                model="lucebox", messages=[{"role": "user", "content": "go"}], max_tokens=100_000, stream=True))
        deadline = time.monotonic() + TIMEOUT_S
        while httpx.get(live.url + "/health", timeout=TIMEOUT_S).json()["waiting"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model="lucebox", messages=[{"role": "user", "content": "more"}])
        assert e.value.status_code == 503 and "max-queue" in str(e.value)
    finally:
        for s in streams:
            s.close()
    deadline = time.monotonic() + TIMEOUT_S  # the server notices the closed streams on its own time
    while httpx.get(live.url + "/health", timeout=TIMEOUT_S).json()["waiting"] > 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    fake.piece_delay_s, fake.script = 0.0, "ok"
    assert client.chat.completions.create(model="lucebox", messages=[
        {"role": "user", "content": "after"}]).choices[0].message.content == "ok"
