"""lucebox.tokenizer: the GGUF's own tokenizer equals the HF tokenizer it was converted from."""
from __future__ import annotations

import copy
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiny_models
from lucebox.chat_template import TemplateError
from lucebox.gguf_meta import GGUFError
from lucebox.tokenizer import Tokenizer, TokenizerError

SAMPLES = [
    "", " ", "  ", "\n", "\n\n\n", "\t\t x", "   leading and trailing   ", "a\r\nb\rc",
    "Hello, world!", "I've been told he's there, 'RE you sure? We'Ve a'lL",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "x = {'a': [1, 2.5, -3e-4], \"b\": None}  # comment\n",
    "3 33 333 3333 33333 3.3 3..3 3...3 1,000,000",
    "Grüße aus Köln — naïve café", "Привет, мир", "我想在apple工作1314151天～", "日本語 한국어 العربية עברית हिन्दी",
    "🚀 (normal) 😶‍🌫️ (zwj) ✅ 🦙🦙 👍🏽 🇫🇷", "e\u0301 vs \u00e9", "A\u030a vs \u00c5",  # NFC folds these
    "------======= !!!!!!?????? ......", "\u200b\u00a0\ufeff odd spaces",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<think>\nhmm\n</think>\n\nok<|endoftext|>",
    "<|im_start|<|im_end|> <|mask|>|>", "text<|im_end|>text",
]


@pytest.fixture(scope="module")
def tok(tiny_gguf) -> Tokenizer:
    return Tokenizer.from_gguf(tiny_gguf["f32"])


@pytest.fixture
def own_tok(tok) -> Tokenizer:
    """A copy a test may change (chat_template) without touching the shared one."""
    return copy.copy(tok)


@pytest.fixture(scope="module")
def hf_tok(tiny_hf_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_hf_dir))


def _write_gguf(path, **kv):
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen35")
    for key, value in kv.items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_uint32(key, value)
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --- encode / decode ------------------------------------------------------------------------------
@pytest.mark.parametrize("text", SAMPLES)
def test_encode_decode_match_hf(tok, tiny_tokenizer, text):
    ids = tok.encode(text)
    assert ids == tiny_tokenizer.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == tiny_tokenizer.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids, skip_special=False) == tiny_tokenizer.decode(ids, skip_special_tokens=False)
    assert tok.decode(ids, skip_special=False) == unicodedata.normalize("NFC", text)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_encode_matches_hf_on_random_text(tok, tiny_tokenizer, text):
    ids = tok.encode(text)
    assert ids == tiny_tokenizer.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special=False) == unicodedata.normalize("NFC", text)


def test_special_tokens(tok, tiny_tokenizer):
    for text in tiny_models.SPECIAL_TOKENS + tiny_models.THINK_TOKENS:
        tid = tiny_tokenizer.token_to_id(text)
        assert tok.encode(text) == [tid] and tok.token_to_id(text) == tid
    im_start = tok.token_to_id("<|im_start|>")
    think = tok.token_to_id("<think>")
    assert tok.decode([im_start, think]) == "<think>"  # control tokens hidden, user-defined ones shown
    assert tok.decode([im_start, think], skip_special=False) == "<|im_start|><think>"
    assert tok.encode("hi", add_special=True) == tok.encode("hi")  # Qwen: no BOS


def test_eos_ids(tok, tiny_gguf):
    from lucebox.gguf_meta import read_metadata

    eos = read_metadata(tiny_gguf["f32"], ["tokenizer.ggml.eos_token_id"])["tokenizer.ggml.eos_token_id"]
    assert tok.eos_ids[0] == eos
    assert {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")} <= set(tok.eos_ids)
    assert len(set(tok.eos_ids)) == len(tok.eos_ids)


@pytest.mark.parametrize("key", ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"])
def test_an_end_of_sequence_id_outside_the_vocabulary_is_an_error(tiny_gguf, key):
    from lucebox.gguf_meta import read_metadata
    from lucebox.tokenizer import _KEYS

    meta = read_metadata(tiny_gguf["f32"], _KEYS)
    n = len(meta["tokenizer.ggml.tokens"])
    with pytest.raises(TokenizerError, match=f"{key} = {n} is outside the vocabulary \\(0..{n - 1}\\)"):
        Tokenizer({**meta, key: n}, source="x.gguf")  # ignoring it, replies would never end at EOS
    assert Tokenizer({**meta, "tokenizer.ggml.padding_token_id": n}).pad_id is None  # no output depends on it


def test_padding_rows_decode_to_nothing(tok, tiny_tokenizer):
    n_real = tiny_tokenizer.get_vocab_size()
    assert tok.vocab_size > n_real  # the tiny target pads its vocabulary like Qwen does
    pads = list(range(n_real, tok.vocab_size))
    assert tok.decode(pads, skip_special=False) == ""
    assert not set(pads) & set(tok.encode(" ".join(tok.tokens[i] for i in pads)))
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


# --- streaming ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", SAMPLES)
def test_stream_equals_decode(tok, text):
    ids = tok.encode(text)
    for skip in (True, False):
        stream = tok.stream_decoder(skip_special=skip)
        pieces = [stream.push(i) for i in ids]
        assert "".join(pieces) + stream.flush() == tok.decode(ids, skip_special=skip)
        assert not any("\ufffd" in p for p in pieces)


def test_stream_holds_split_characters(tok):
    # an emoji is 4 UTF-8 bytes; with this small vocab it is spread over several byte tokens
    ids = tok.encode("🦙")
    assert len(ids) > 1
    stream = tok.stream_decoder()
    pieces = [stream.push(i) for i in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "🦙"


def test_stream_flush_reports_a_cut_character(tok):
    ids = tok.encode("🦙")
    stream = tok.stream_decoder()
    assert [stream.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.flush() == "\ufffd"


# --- chat template --------------------------------------------------------------------------------
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Grüße 🦙"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "user", "content": "q"},
     {"role": "assistant", "content": "ans", "reasoning_content": "think hard"},
     {"role": "user", "content": "more"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("extra", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tok, hf_tok, messages, extra, add_generation_prompt):
    ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **extra)
    theirs = hf_tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                        tokenize=False, **extra)
    assert ours == theirs


# Qwen3-style constructs: namespace, reversed loop, string tests and methods, tojson of non-ASCII tools.
QWEN_LIKE = """\
{%- if tools %}
{{- '<|im_start|>system\\n# Tools\\n' }}
{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_query=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if message.role == "user" and message.content is string and not message.content.startswith('<tool') %}
{%- set ns.last_query = index %}{% break %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == "assistant" and loop.index0 > ns.last_query and '</think>' in message.content %}
{{- '<|im_start|>assistant\\n<think>\\n' + message.content.split('</think>')[0].strip() + '\\n</think>\\n\\n' }}
{{- message.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}"""


@pytest.mark.parametrize("extra", [{}, {"enable_thinking": False}])
def test_qwen_like_template_matches_transformers(own_tok, hf_tok, extra):
    tools = [{"name": "météo", "description": "Wetter für <Köln> & co", "parameters": {"type": "object"}}]
    messages = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "r\n</think>\n\na1"},
                {"role": "user", "content": "q2"}, {"role": "assistant", "content": "why\n</think>\n\na2"}]
    own_tok.chat_template = QWEN_LIKE
    ours = own_tok.apply_chat_template(messages, tools=tools, **extra)
    theirs = hf_tok.apply_chat_template(messages, tools=tools, chat_template=QWEN_LIKE, tokenize=False,
                                        add_generation_prompt=True, **extra)
    assert ours == theirs and "météo" in ours and "<Köln>" in ours


def test_template_errors(own_tok):
    with pytest.raises(TemplateError, match="system message must come first"):
        own_tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])
    with pytest.raises(TypeError, match="list of dicts"):
        own_tok.apply_chat_template("hello")
    own_tok.chat_template = "{% for m in messages %}"
    with pytest.raises(TemplateError, match="does not parse"):
        own_tok.apply_chat_template([{"role": "user", "content": "a"}])
    own_tok.chat_template = "{{ ''.__class__.__mro__ }}"  # the sandbox refuses attribute escapes
    with pytest.raises(TemplateError):
        own_tok.apply_chat_template([{"role": "user", "content": "a"}])
    own_tok.chat_template = None
    with pytest.raises(TokenizerError, match="no chat template"):
        own_tok.apply_chat_template([{"role": "user", "content": "a"}])


# --- bad files ------------------------------------------------------------------------------------
def test_gguf_without_tokenizer(tmp_path):
    path = _write_gguf(tmp_path / "no_tok.gguf")
    with pytest.raises(TokenizerError, match="no tokenizer metadata"):
        Tokenizer.from_gguf(path)


def test_unsupported_tokenizer_model(tmp_path):
    path = _write_gguf(tmp_path / "spm.gguf", **{"tokenizer.ggml.model": "llama",
                                                "tokenizer.ggml.tokens": ["<unk>", "a"]})
    with pytest.raises(TokenizerError, match="tokenizer model 'llama' is not supported"):
        Tokenizer.from_gguf(path)


def test_unsupported_pre_tokenizer(tmp_path):
    path = _write_gguf(tmp_path / "pre.gguf", **{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe",
                                                "tokenizer.ggml.tokens": ["a", "b"]})
    with pytest.raises(TokenizerError, match="pre-tokenizer 'llama-bpe' is not supported"):
        Tokenizer.from_gguf(path)


def test_inconsistent_merges(tmp_path):
    path = _write_gguf(tmp_path / "merges.gguf", **{
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.token_type": [1, 1, 1], "tokenizer.ggml.merges": ["a zz"]})
    with pytest.raises(TokenizerError, match="inconsistent"):
        Tokenizer.from_gguf(path)


def test_minimal_qwen2_gguf(tmp_path):
    path = _write_gguf(tmp_path / "q2.gguf", **{
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": ["a", "b", "ab", "<|im_end|>"], "tokenizer.ggml.token_type": [1, 1, 1, 3],
        "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.eos_token_id": 3})
    tok = Tokenizer.from_gguf(path)
    assert tok.encode("abab<|im_end|>") == [2, 2, 3] and tok.eos_ids == (3,)
    assert tok.decode([2, 0, 3]) == "aba"


@pytest.mark.parametrize("content, message", [(b"", "not a GGUF"), (b"GGML" + bytes(20), "bad magic"),
                                              (b"GGUF\x03\x00\x00\x00" + bytes(4), "truncated")])
def test_not_a_gguf(tmp_path, content, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFError, match=message):
        Tokenizer.from_gguf(path)
    with pytest.raises(GGUFError, match="no such file"):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")


def test_truncated_gguf(tmp_path, tiny_gguf):
    data = tiny_gguf["f32"].read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:5000])  # cut inside the token list
    with pytest.raises(GGUFError, match="truncated"):
        Tokenizer.from_gguf(path)
