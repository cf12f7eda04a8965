"""Stage 1: a byte-level BPE tokenizer trained with `tokenizers`, shaped like Qwen3.5's.

Same normalizer (NFC), split regex and byte-level mapping as Qwen3.5's tokenizer.json, so the GGUF
converter's "qwen35" pre-tokenizer (llama.cpp's copy of that regex) tokenizes it identically.
The special tokens sit at the end of the vocabulary, as in Qwen's.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# Qwen3.5's split regex, verbatim from its tokenizer.json (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35).
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK = "<|mask|>"              # the DFlash draft's mask token; the target never sees it
SPECIAL_TOKENS = (EOS, IM_START, IM_END, MASK)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(docs: list[str], vocab_size: int, max_chars: int) -> tuple[Tokenizer, dict]:
    """BPE over the first `max_chars` characters of `docs` (shuffled already); returns it and stats."""
    t0 = time.perf_counter()
    tok = Tokenizer(models.BPE(byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS), min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    sample, used = [], 0
    for d in docs:
        if used >= max_chars:
            break
        sample.append(d)
        used += len(d)
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size} "
                           "(corpus too small for that many merges?)")
    return tok, {"vocab_size": vocab_size, "train_chars": used, "seconds": time.perf_counter() - t0}


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {name: tok.token_to_id(name) for name in SPECIAL_TOKENS}


def save_tokenizer(tok: Tokenizer, model_dir: Path) -> None:
    """tokenizer.json + tokenizer_config.json (chat template, eos) as transformers and the converter read them."""
    model_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(model_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": IM_END,
        "pad_token": EOS,
        "bos_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 32768,
        "chat_template": CHAT_TEMPLATE,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def encode_documents(tok: Tokenizer, docs: list[str]) -> list[list[int]]:
    """Token ids of each document; special tokens written in the text are matched as such."""
    return [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
