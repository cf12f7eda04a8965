"""The target's tokenizer, built from its GGUF's own `tokenizer.ggml.*` metadata (no download).

Encoding runs the `tokenizers` library on a byte-level BPE rebuilt from the GGUF (tokens, merges,
token types, pre-tokenizer name); decoding maps ids straight to bytes, so streaming and one-shot
decoding agree by construction and a character split across tokens is emitted once complete.
"""
from __future__ import annotations

import codecs
from functools import lru_cache
from pathlib import Path

from .gguf_meta import read_metadata

# llama.cpp token types (gguf TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# tokenizer.ggml.pre -> split regex of the HF tokenizer.json it came from
_SPLIT_REGEX = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen35": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
              r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
         "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
         "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id", "tokenizer.ggml.padding_token_id",
         "tokenizer.ggml.add_bos_token", "tokenizer.chat_template")
_STOP_TEXTS = ("<|im_end|>", "<|endoftext|>")  # Qwen ends turns / documents with these


class TokenizerError(ValueError):
    pass


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level alphabet: printable char -> the byte it stands for."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class StreamDecoder:
    """push(id) -> the text completed by that token ('' while a UTF-8 character is still split)."""

    def __init__(self, tokenizer: "Tokenizer", skip_special: bool = True):
        self._tok = tokenizer
        self._skip = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tok.token_bytes(token_id, self._skip))

    def flush(self) -> str:
        """Text of a trailing incomplete character (as U+FFFD), at the end of a stream."""
        return self._utf8.decode(b"", final=True)


class Tokenizer:
    """Build with `Tokenizer.from_gguf(path)`."""

    def __init__(self, meta: dict, source: str = "GGUF"):
        model = meta.get("tokenizer.ggml.model")
        if model is None or "tokenizer.ggml.tokens" not in meta:
            raise TokenizerError(f"{source} has no tokenizer metadata (tokenizer.ggml.*); "
                                 "use a GGUF converted with its tokenizer")
        if model != "gpt2":
            raise TokenizerError(f"{source}: tokenizer model {model!r} is not supported "
                                 "(lucebox reads byte-level BPE, tokenizer.ggml.model = 'gpt2')")
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in _SPLIT_REGEX:
            raise TokenizerError(f"{source}: pre-tokenizer {pre!r} is not supported "
                                 f"(supported: {', '.join(sorted(_SPLIT_REGEX))})")
        self.tokens: list[str] = meta["tokenizer.ggml.tokens"]
        n = len(self.tokens)
        types = meta.get("tokenizer.ggml.token_type")
        self.token_types = [NORMAL] * n if types is None else [int(t) for t in types]
        if len(self.token_types) != n:
            raise TokenizerError(f"{source}: {len(self.token_types)} token types for {n} tokens")
        self._hf = _build_hf(self.tokens, self.token_types, meta.get("tokenizer.ggml.merges") or [], pre)
        self._bytes: dict[int, bytes] = {}

        def token_id(key, ends_replies: bool = False):
            v = meta.get(key)
            if v is not None and not 0 <= int(v) < n:
                if ends_replies:  # ignored, a reply would never end at end-of-sequence: silently wrong output
                    raise TokenizerError(f"{source}: {key} = {int(v)} is outside the vocabulary (0..{n - 1}); "
                                         "fix the GGUF's metadata (gguf_set_metadata.py) or convert it again")
                return None
            return None if v is None else int(v)

        self.bos_id = token_id("tokenizer.ggml.bos_token_id")
        self.eos_id = token_id("tokenizer.ggml.eos_token_id", ends_replies=True)
        self.pad_id = token_id("tokenizer.ggml.padding_token_id")
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and self.bos_id is not None
        stops = [self.eos_id, token_id("tokenizer.ggml.eot_token_id", ends_replies=True),
                 token_id("tokenizer.ggml.eom_token_id", ends_replies=True)]
        stops += [self._hf.token_to_id(t) for t in _STOP_TEXTS]
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in stops if i is not None))
        self.chat_template: str | None = meta.get("tokenizer.chat_template")

    @classmethod
    def from_gguf(cls, path: str | Path) -> "Tokenizer":
        meta = read_metadata(path, _KEYS)
        try:
            tok = cls(meta, source=str(path))
            if tok.chat_template is not None and not isinstance(tok.chat_template, str):
                raise TypeError("tokenizer.chat_template is not a string")
            return tok
        except TokenizerError:
            raise
        except Exception as e:  # noqa: BLE001 (a value of the wrong type or shape in the file)
            raise TokenizerError(f"{path}: malformed tokenizer metadata ({type(e).__name__}: "
                                 f"{' '.join(str(e).split())[:200]}); re-convert the model") from None

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def token_to_id(self, text: str) -> int | None:
        return self._hf.token_to_id(text)

    # --- encode / decode -----------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Special tokens written in `text` (e.g. <|im_start|>) become their ids; `add_special`
        prepends BOS when the GGUF asks for it (Qwen does not)."""
        if not isinstance(text, str):
            raise TokenizerError(f"text to encode must be a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # lone surrogates: undecodable bytes from argv, stdin or a file
            raise TokenizerError(f"the text is not valid Unicode (an undecodable byte at character {e.start}); "
                                 "pass UTF-8 text") from None
        ids = self._hf.encode(text, add_special_tokens=False).ids
        return [self.bos_id] + ids if add_special and self.add_bos else ids

    def token_bytes(self, token_id: int, skip_special: bool = True) -> bytes:
        """The bytes a token stands for; control tokens give b'' when skip_special, unused ones always."""
        b = self._bytes.get(token_id)
        if b is None:
            if not 0 <= token_id < len(self.tokens):
                raise TokenizerError(f"token id {token_id} is outside the vocabulary (0..{len(self.tokens) - 1})")
            ttype, text = self.token_types[token_id], self.tokens[token_id]
            if ttype == UNUSED:
                b = b""
            elif ttype in (CONTROL, USER_DEFINED):
                b = text.encode("utf-8")
            else:
                table = _byte_decoder()
                try:
                    b = bytes(table[c] for c in text)
                except KeyError:  # not byte-level text: take it literally
                    b = text.encode("utf-8")
            self._bytes[token_id] = b
        if skip_special and self.token_types[token_id] == CONTROL:
            return b""
        return b

    def decode(self, ids, skip_special: bool = True) -> str:
        return b"".join(self.token_bytes(int(i), skip_special) for i in ids).decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special)

    # --- chat ----------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        """Render `messages` with the GGUF's template; extra keywords (e.g. enable_thinking=False)
        are template variables."""
        from .chat_template import render

        if not self.chat_template:
            raise TokenizerError("this GGUF has no chat template (tokenizer.chat_template); "
                                 "pass raw text instead of messages")
        return render(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                      bos_token=self._text(self.bos_id), eos_token=self._text(self.eos_id), **variables)

    def _text(self, token_id: int | None) -> str:
        return "" if token_id is None else self.tokens[token_id]


def _build_hf(tokens: list[str], types: list[int], merges: list[str], pre: str):
    """A `tokenizers.Tokenizer` equal to the HF tokenizer.json the GGUF was converted from.

    Added tokens (CONTROL / USER_DEFINED) keep their ids because they are in the model's vocab
    when added; UNUSED padding rows are left out, so no text can ever encode to them. (Built from
    Python objects: ~2x faster than serializing a tokenizer.json for a 248k vocab.)
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {text: i for i, (text, t) in enumerate(zip(tokens, types)) if t != UNUSED}
    try:
        bpe = models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges], fuse_unk=False, byte_fallback=False)
    except Exception as e:  # tokenizers raises a bare Exception on merges that name unknown tokens
        detail = " ".join(str(e).split())[:200]  # tokenizers' messages span lines
        raise TokenizerError(f"the GGUF's tokenizer metadata is inconsistent ({detail}); re-convert the model") from None
    hf = Tokenizer(bpe)
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_REGEX[pre]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    hf.decoder = decoders.ByteLevel()
    added = [(i, t) for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)]
    hf.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i, t in added if t == CONTROL])
    hf.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i, t in added if t == USER_DEFINED])
    for i, _ in added:
        if hf.token_to_id(tokens[i]) != i:
            raise TokenizerError(f"the GGUF's tokenizer metadata is inconsistent: token {tokens[i]!r} "
                                 f"(id {i}) appears twice; re-convert the model")
    return hf
