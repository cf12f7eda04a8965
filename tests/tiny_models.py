"""Tiny random models with the real files' layout, built at test time (no downloads, no pytest).

- `build_tokenizer`: a byte-level BPE trained with `tokenizers` on stdlib sources + a multilingual
  sample; Qwen's pre-tokenizer (NFC, Qwen3.5 split regex, byte-level), ChatML special tokens, a mask
  token, and a Qwen3-style chat template. Saved as HF files (tokenizer.json, tokenizer_config.json).
- `build_target`: a random transformers `Qwen3_5ForCausalLM` shaped like Qwen3.5-27B scaled down
  (see `TargetSpec`), saved with save_pretrained + the tokenizer files.
- `convert`: the pinned llama.cpp converter on that folder -> a `qwen35` GGUF.
- `build_draft`: a random z-lab DFlash draft (`config.json` + `model.safetensors`) for that target.

Weights are re-drawn larger than transformers' init (std 0.02 gives near-uniform logits, so greedy
ties would flip on rounding): every test that compares argmaxes needs clear margins.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA_DIR = ROOT / "vendor" / "src" / "llama.cpp"
CONVERT_WRAPPER = Path(__file__).resolve().parent / "convert_tiny.py"

# Appended after the trained BPE vocab, in this order (Qwen puts its added tokens after the BPE
# ranks too). `special` tokens are control tokens; <think>/</think> are added but not special.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
THINK_TOKENS = ["<think>", "</think>"]
MASK_TOKEN = "<|mask|>"

# Qwen3.5's split regex (tokenizer.json / transformers' Qwen3_5Tokenizer): letters include \p{M}.
QWEN35_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3-style ChatML. `enable_thinking=false` pre-fills an empty think block like Qwen3/3.5; an
# undefined `enable_thinking` adds nothing, so each rendered conversation is a prefix of the next.
CHAT_TEMPLATE = """\
{%- for message in messages %}
    {%- if message.role == 'system' and not loop.first %}
        {{- raise_exception('The system message must come first.') }}
    {%- elif message.role not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('Unknown role: ' + message.role) }}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\\n' }}
    {%- if message.role == 'assistant' and message.reasoning_content %}
        {{- '<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}
    {%- endif %}
    {{- message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

# Non-ASCII text so the BPE learns multi-byte merges (streaming decode must cope with split chars).
_MULTILINGUAL = (
    "Grüße aus Köln — naïve café, señor, façade. Привет, как дела? Ελληνικά γράμματα. "
    "我想在苹果公司工作，今天天气很好。日本語のテキストです。한국어 문장입니다. "
    "مرحبا بالعالم. שלום עולם. नमस्ते दुनिया. ❤️ 🚀 😶‍🌫️ ✅ 🦙 1234567890 3.14159 "
)
_CORPUS_MODULES = ("textwrap", "json.decoder", "string", "argparse", "dataclasses")


@dataclass(frozen=True)
class TargetSpec:
    """Qwen3.5-27B's structure scaled down. 27B: hidden 5120, 64 layers (every 4th full attention),
    24 q / 4 kv heads of 256 (rope 64 = 0.25, M-RoPE [11,11,10]), DeltaNet 16 k / 48 v heads of 128."""
    hidden_size: int = 64
    intermediate_size: int = 96
    num_hidden_layers: int = 8
    full_attention_interval: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64  # 64: a head size every ggml flash-attention backend supports
    partial_rotary_factor: float = 0.25  # rope dims = 16
    mrope_section: tuple = (3, 3, 2)  # sums to rope dims / 2, like [11, 11, 10] for 64
    rope_theta: float = 10_000_000.0
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 32  # ggml's gated delta net needs key dim == value dim
    linear_value_head_dim: int = 32
    linear_conv_kernel_dim: int = 4
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    pad_vocab_to: int = 64  # real Qwen pads its embedding rows past the tokenizer (248320 > 248077)
    seed: int = 1234


@dataclass(frozen=True)
class DraftSpec:
    """z-lab DFlash draft scaled down (27B draft: 5 Qwen3 layers, 32 q / 8 kv heads of 128)."""
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64  # a flash-attention head size on every ggml backend
    intermediate_size: int = 96
    target_layer_ids: tuple = (1, 3, 5)
    block_size: int = 16
    layer_types: tuple | None = None  # None: all full_attention (Qwen3.5 drafts)
    sliding_window: int | None = None
    seed: int = 4321


# Qwen3.6-style draft: sliding-window layers (causal, see dflash.model) then full attention.
SLIDING_DRAFT = DraftSpec(layer_types=("sliding_attention", "full_attention"), sliding_window=8, seed=987)


# --- tokenizer ----------------------------------------------------------------------------------
def _corpus() -> list[str]:
    import importlib

    texts = [_MULTILINGUAL * 20]
    for name in _CORPUS_MODULES:
        texts.append(Path(importlib.import_module(name).__file__).read_text(encoding="utf-8"))
    return texts


def train_tokenizer(vocab_size: int = 600):
    """-> tokenizers.Tokenizer: byte-level BPE with Qwen3.5's normalizer/pre-tokenizer/decoder."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return tok


def build_tokenizer(out_dir: str | Path, vocab_size: int = 600) -> Path:
    """Write tokenizer.json + tokenizer_config.json (with the chat template) into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab_size)
    tok.save(str(out / "tokenizer.json"))
    added = {}
    for tid, t in sorted(tok.get_added_tokens_decoder().items()):
        added[str(tid)] = {"content": t.content, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": t.special}
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 8192,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "TokenizersBackend",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return out


def load_hf_tokenizer(model_dir: str | Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


# --- target -------------------------------------------------------------------------------------
def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def target_config(spec: TargetSpec, vocab_size: int, eos_token_id: int, pad_token_id: int):
    from transformers.models.qwen3_5 import Qwen3_5TextConfig

    interval = spec.full_attention_interval
    layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                   for i in range(spec.num_hidden_layers)]
    rot = int(spec.head_dim * spec.partial_rotary_factor)
    if 2 * sum(spec.mrope_section) != rot:
        raise ValueError(f"mrope_section {spec.mrope_section} must sum to rope dims / 2 = {rot // 2}")
    return Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads, head_dim=spec.head_dim,
        linear_conv_kernel_dim=spec.linear_conv_kernel_dim,
        linear_key_head_dim=spec.linear_key_head_dim, linear_value_head_dim=spec.linear_value_head_dim,
        linear_num_key_heads=spec.linear_num_key_heads, linear_num_value_heads=spec.linear_num_value_heads,
        layer_types=layer_types, max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps, tie_word_embeddings=False,
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=None,
        rope_parameters={
            "rope_type": "default", "rope_theta": spec.rope_theta,
            "partial_rotary_factor": spec.partial_rotary_factor,
            "mrope_section": list(spec.mrope_section), "mrope_interleaved": True,
        },
    )


def _randomize_target(model, spec: TargetSpec, n_used_vocab: int) -> None:
    import torch

    g = torch.Generator().manual_seed(spec.seed)

    def normal(shape, std):
        return torch.randn(shape, generator=g) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p.copy_(normal(p.shape, 1.0))
            elif name.endswith("lm_head.weight"):
                w = normal(p.shape, 8.0 / math.sqrt(p.shape[1]))  # logits std ~8: clear argmax margins
                w[n_used_vocab:] *= 0.05  # padding rows: like a trained model, almost never the argmax
                p.copy_(w)
            elif name.endswith(".A_log"):
                p.copy_(uniform(p.shape, 1.0, 16.0).log())
            elif name.endswith(".dt_bias"):
                p.copy_(normal(p.shape, 0.5))
            elif name.endswith("linear_attn.norm.weight"):  # gated RMSNorm: plain multiplier
                p.copy_(uniform(p.shape, 0.7, 1.3))
            elif name.endswith("norm.weight"):  # Qwen3.5 RMSNorm multiplies by (1 + w): the converter adds 1
                p.copy_(uniform(p.shape, -0.3, 0.3))
            elif "conv1d" in name:
                p.copy_(normal(p.shape, 0.5))
            elif p.ndim == 2:
                fan_in = p.shape[1]
                scale = 0.7 if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")) else 1.0
                p.copy_(normal(p.shape, scale / math.sqrt(fan_in)))
            else:
                raise RuntimeError(f"tiny target: no init rule for {name} {tuple(p.shape)}")


def build_target(out_dir: str | Path, spec: TargetSpec = TargetSpec(), tokenizer_vocab: int = 600) -> Path:
    """Random Qwen3_5ForCausalLM (f32 safetensors) + tokenizer files in out_dir."""
    import torch
    from transformers import Qwen3_5ForCausalLM

    out = Path(out_dir)
    build_tokenizer(out, tokenizer_vocab)
    tok = load_hf_tokenizer(out)
    n_used = tok.get_vocab_size()
    vocab = _round_up(n_used, spec.pad_vocab_to)
    config = target_config(spec, vocab, tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"))
    torch.manual_seed(spec.seed)
    model = Qwen3_5ForCausalLM(config).to(torch.float32).eval()
    _randomize_target(model, spec, n_used)
    model.save_pretrained(out, safe_serialization=True)
    (out / "lucebox_tiny.json").write_text(json.dumps({"target": asdict(spec), "n_tokens": n_used}) + "\n")
    return out


def load_target(model_dir: str | Path, dtype=None):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype or torch.float32).eval()


# --- GGUF ---------------------------------------------------------------------------------------
OUTTYPES = ("f32", "f16", "bf16", "q8_0")


def materialize_vendor() -> None:
    """vendor/materialize.py is idempotent (checks its stamp), so calling it every time is cheap."""
    done = subprocess.run([sys.executable, str(ROOT / "vendor" / "materialize.py")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"vendor/materialize.py failed:\n{done.stdout}\n{done.stderr}")


def convert(model_dir: str | Path, outtype: str = "f32", out_path: str | Path | None = None) -> Path:
    """HF folder -> GGUF via the pinned convert_hf_to_gguf.py (see tests/convert_tiny.py)."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r}: use one of {', '.join(OUTTYPES)}")
    model_dir = Path(model_dir)
    out = Path(out_path) if out_path else model_dir.parent / f"{model_dir.name}-{outtype}.gguf"
    materialize_vendor()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(LLAMA_DIR / "gguf-py"), str(LLAMA_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("HF_HUB_OFFLINE", "1")
    tmp = out.with_name(out.name + ".part")
    cmd = [sys.executable, str(CONVERT_WRAPPER), str(model_dir), "--outtype", outtype,
           "--outfile", str(tmp), "--no-mtp"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not tmp.exists():
        raise RuntimeError(f"converter failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-4000:]}")
    tmp.replace(out)
    return out


# --- draft --------------------------------------------------------------------------------------
def draft_config(spec: DraftSpec, target_dir: str | Path, dtype: str = "bfloat16") -> dict:
    """config.json as z-lab publish it (Qwen3 config + block_size + dflash_config)."""
    tcfg = json.loads((Path(target_dir) / "config.json").read_text())
    tok = load_hf_tokenizer(target_dir)
    n_target = tcfg["num_hidden_layers"]
    if max(spec.target_layer_ids) >= n_target:
        raise ValueError(f"target_layer_ids {spec.target_layer_ids} outside the target's {n_target} layers")
    layer_types = list(spec.layer_types or ["full_attention"] * spec.num_hidden_layers)
    if len(layer_types) != spec.num_hidden_layers:
        raise ValueError("layer_types must have one entry per draft layer")
    sliding = "sliding_attention" in layer_types
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": spec.block_size,
        "bos_token_id": None,
        "dflash_config": {
            "mask_token_id": tok.token_to_id(MASK_TOKEN),
            "target_layer_ids": list(spec.target_layer_ids),
        },
        "dtype": dtype,
        "eos_token_id": tcfg.get("eos_token_id"),
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": tcfg["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": spec.intermediate_size,
        "layer_types": layer_types,
        "max_position_embeddings": tcfg["max_position_embeddings"],
        "max_window_layers": spec.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": spec.num_attention_heads,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_key_value_heads": spec.num_key_value_heads,
        "num_target_layers": n_target,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": tcfg["rope_parameters"]["rope_theta"],
        "sliding_window": spec.sliding_window if sliding else None,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.1",
        "use_cache": True,
        "use_sliding_window": sliding,
        "vocab_size": tcfg["vocab_size"],
    }


def _draft_state_dict(config: dict, seed: int) -> dict:
    """Random weights with the DFlashDraftModel names (no `model.` prefix), shapes from the config."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, hd = config["hidden_size"], config["head_dim"]
    nq, nkv, ff = config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]
    n_feat = len(config["dflash_config"]["target_layer_ids"]) * h

    def lin(n_out, n_in, scale=1.0):
        return torch.randn((n_out, n_in), generator=g) * (scale / math.sqrt(n_in))

    def norm(n):  # Qwen3RMSNorm multiplies by w (no 1+w): keep it near 1 but not all equal
        return 0.7 + 0.6 * torch.rand((n,), generator=g)

    sd = {"fc.weight": lin(h, n_feat), "hidden_norm.weight": norm(h), "norm.weight": norm(h)}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        sd.update({
            p + "input_layernorm.weight": norm(h),
            p + "post_attention_layernorm.weight": norm(h),
            p + "self_attn.q_proj.weight": lin(nq * hd, h),
            p + "self_attn.k_proj.weight": lin(nkv * hd, h),
            p + "self_attn.v_proj.weight": lin(nkv * hd, h),
            p + "self_attn.o_proj.weight": lin(h, nq * hd, 0.7),
            p + "self_attn.q_norm.weight": norm(hd),
            p + "self_attn.k_norm.weight": norm(hd),
            p + "mlp.gate_proj.weight": lin(ff, h),
            p + "mlp.up_proj.weight": lin(ff, h),
            p + "mlp.down_proj.weight": lin(h, ff, 0.7),
        })
    return sd


def build_draft(out_dir: str | Path, target_dir: str | Path, spec: DraftSpec = DraftSpec(),
                dtype: str = "bf16") -> Path:
    """z-lab DFlash draft files for the tiny target: config.json + model.safetensors (bf16 or f32)."""
    import torch
    from safetensors.torch import save_file

    torch_dtype = {"bf16": torch.bfloat16, "f32": torch.float32}.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"draft dtype {dtype!r}: use 'bf16' or 'f32'")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = draft_config(spec, target_dir, "bfloat16" if dtype == "bf16" else "float32")
    sd = {k: v.to(torch_dtype).contiguous() for k, v in _draft_state_dict(config, spec.seed).items()}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def load_draft(draft_dir: str | Path, dtype=None):
    import torch
    from dflash.model import DFlashDraftModel

    return DFlashDraftModel.from_pretrained(str(draft_dir), dtype=dtype or torch.float32).eval()


# --- cache --------------------------------------------------------------------------------------
DRAFT_KINDS = {  # name -> (spec, dtype)
    "bf16": (DraftSpec(), "bf16"),
    "f32": (DraftSpec(), "f32"),
    "sliding": (SLIDING_DRAFT, "bf16"),
}


def cache_key() -> str:
    """Changes whenever anything that shapes the files changes (this code, the converter, versions)."""
    import hashlib

    import tokenizers
    import transformers

    h = hashlib.sha256()
    for p in (Path(__file__), CONVERT_WRAPPER, ROOT / "vendor" / "materialize.py"):
        h.update(p.read_bytes())
    h.update(f"{transformers.__version__} {tokenizers.__version__} {sys.version_info[:2]}".encode())
    return h.hexdigest()[:12]


class TinyModels:
    """Builds each artifact once under `root` (a folder per cache key) and returns its path.

    Each artifact is built beside its final name and renamed into place, so an interrupted build
    never leaves a half-written file that a later run would trust.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root) / f"tiny-{cache_key()}"
        self.root.mkdir(parents=True, exist_ok=True)

    def _build(self, name: str, make) -> Path:
        import shutil

        final = self.root / name
        if final.exists():
            return final
        part = self.root / f"{name}.part{os.getpid()}"
        shutil.rmtree(part, ignore_errors=True)
        make(part)
        try:
            part.replace(final)
        except OSError:  # another process won the race (a folder cannot replace a non-empty one)
            shutil.rmtree(part, ignore_errors=True)
        return final

    def target_dir(self) -> Path:
        return self._build("target", build_target)

    def gguf(self, outtype: str = "f32") -> Path:
        target = self.target_dir()
        return self._build(f"target-{outtype}.gguf", lambda p: convert(target, outtype, p))

    def draft_dir(self, kind: str = "bf16") -> Path:
        if kind not in DRAFT_KINDS:
            raise ValueError(f"draft kind {kind!r}: use one of {', '.join(DRAFT_KINDS)}")
        spec, dtype = DRAFT_KINDS[kind]
        target = self.target_dir()
        return self._build(f"draft-{kind}", lambda p: build_draft(p, target, spec, dtype))


if __name__ == "__main__":
    # Build everything into a folder (e.g. to copy to a GPU box): python tests/tiny_models.py OUT_DIR
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/tiny_models.py OUT_DIR")
    models = TinyModels(sys.argv[1])
    print(f"target_dir {models.target_dir()}")
    for t in OUTTYPES:
        print(f"gguf_{t} {models.gguf(t)}")
    for kind in DRAFT_KINDS:
        print(f"draft_{kind} {models.draft_dir(kind)}")
