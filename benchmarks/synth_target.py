#!/usr/bin/env python3
"""Write a Qwen3.5-27B-shaped Q4_K_M GGUF with random weights: a benchmark target that needs no download.

Names, shapes, metadata keys and tensor order are those of llama.cpp's converter (arch `qwen35`)
followed by `llama-quantize Q4_K_M` (tensors sorted by layer then name; Q6_K for output.weight and for
the attn_v / attn_qkv and ffn_down tensors that Q4_K_M's use_more_bits() picks, Q4_K for the other
matrices, F32 for norms, ssm_a, ssm_dt, ssm_conv1d). The tokenizer is a synthetic byte-level BPE of the
full vocabulary size with Qwen's special-token ids. Weights are random but scaled like a trained model's
(std ~ 1/sqrt(fan_in), zero mean), so activations stay finite through all layers.

    python benchmarks/synth_target.py --out /tmp/q27.gguf            # full size, ~16 GB
    python benchmarks/synth_target.py --out t.gguf --layers 4 --scale 0.1 --no-mtp
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("synth_target: error: the gguf package is missing; pip install gguf "
             "(or put vendor/src/llama.cpp/gguf-py on PYTHONPATH)")

Q4_K, Q6_K, F32 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.F32
FTYPE_Q4_K_M = 15          # llama_ftype LLAMA_FTYPE_MOSTLY_Q4_K_M
QK_K = 256                 # values per K-quant super-block
CHUNK_BYTES = 32 << 20     # one generation job; bounds memory to ~2 x threads x this


@dataclass(frozen=True)
class Shape:
    n_layer: int = 64            # trunk blocks; the MTP block, when present, is block n_layer
    n_embd: int = 5120
    n_ff: int = 17408
    n_head: int = 24
    n_head_kv: int = 4
    head_dim: int = 256
    ssm_k_heads: int = 16
    ssm_v_heads: int = 48
    ssm_head_dim: int = 128      # key and value head dim of the Gated DeltaNet layers (state size)
    d_conv: int = 4
    n_vocab: int = 248320
    rope_dim: int = 64
    full_attn_interval: int = 4
    mtp: bool = True

    @property
    def n_layer_all(self) -> int:
        return self.n_layer + (1 if self.mtp else 0)

    def is_recurrent(self, il: int) -> bool:
        return il < self.n_layer and (il + 1) % self.full_attn_interval != 0


def round_up(x: float, m: int) -> int:
    return max(m, int(-(-x // m)) * m)


def scaled_shape(scale: float, n_layer: int, mtp: bool) -> Shape:
    """27B shape with widths times `scale`, kept valid for Q4_K (multiples of 256) and for the
    CUDA delta-net kernel (state size 32/64/128)."""
    if not 0 < scale <= 1:
        raise ValueError(f"--scale must be in (0, 1], got {scale}")
    if n_layer < 1:
        raise ValueError(f"--layers must be >= 1, got {n_layer}")
    s = Shape(n_layer=n_layer, mtp=mtp)
    if scale == 1:
        return s
    pick = lambda full, options: max([o for o in options if o <= full * scale] or [min(options)])  # noqa: E731
    return replace(s, n_embd=round_up(s.n_embd * scale, QK_K), n_ff=round_up(s.n_ff * scale, QK_K),
                   head_dim=pick(s.head_dim, (64, 128, 256)), ssm_head_dim=pick(s.ssm_head_dim, (32, 64, 128)),
                   n_vocab=round_up(max(s.n_vocab * scale, 2048), QK_K))


# ---- tensor plan -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tensor:
    name: str
    ne: tuple[int, ...]          # ggml order: ne[0] is the row length (fan-in of a matrix)
    qtype: gguf.GGMLQuantizationType
    init: str                    # how to fill an F32 tensor: norm, ssm_a, dt, conv


def use_more_bits(i: int, n: int) -> bool:
    # llama-quant.cpp's rule for where Q4_K_M spends Q6_K (C integer division).
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def block_tensors(s: Shape, il: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name suffix, ne) of block `il`, as the qwen35 loader creates them."""
    e, f, hd = s.n_embd, s.n_ff, s.head_dim
    t = [("attn_norm.weight", (e,)), ("post_attention_norm.weight", (e,)),
         ("ffn_gate.weight", (e, f)), ("ffn_up.weight", (e, f)), ("ffn_down.weight", (f, e))]
    if s.is_recurrent(il):
        key_dim, value_dim = s.ssm_k_heads * s.ssm_head_dim, s.ssm_v_heads * s.ssm_head_dim
        conv_dim = 2 * key_dim + value_dim
        t += [("attn_qkv.weight", (e, conv_dim)), ("attn_gate.weight", (e, value_dim)),
              ("ssm_conv1d.weight", (s.d_conv, conv_dim)), ("ssm_dt.bias", (s.ssm_v_heads,)),
              ("ssm_a", (s.ssm_v_heads,)), ("ssm_beta.weight", (e, s.ssm_v_heads)),
              ("ssm_alpha.weight", (e, s.ssm_v_heads)), ("ssm_norm.weight", (s.ssm_head_dim,)),
              ("ssm_out.weight", (value_dim, e))]
    else:  # full attention; q carries its output gate, hence 2x
        t += [("attn_q.weight", (e, 2 * s.n_head * hd)), ("attn_k.weight", (e, s.n_head_kv * hd)),
              ("attn_v.weight", (e, s.n_head_kv * hd)), ("attn_output.weight", (s.n_head * hd, e)),
              ("attn_q_norm.weight", (hd,)), ("attn_k_norm.weight", (hd,))]
    if il >= s.n_layer:  # MTP block: a full-attention block plus the nextn projection and norms
        t += [("nextn.eh_proj.weight", (2 * e, e)), ("nextn.enorm.weight", (e,)),
              ("nextn.hnorm.weight", (e,)), ("nextn.shared_head_norm.weight", (e,))]
    return t


def f32_init(name: str) -> str:
    for key, init in (("ssm_a", "ssm_a"), ("ssm_dt", "dt"), ("ssm_conv1d", "conv")):
        if key in name:
            return init
    return "norm"


def tensor_plan(s: Shape) -> list[Tensor]:
    """Every tensor in llama-quantize's output order, with its Q4_K_M type."""
    named = [("output.weight", (s.n_embd, s.n_vocab)), ("output_norm.weight", (s.n_embd,)),
             ("token_embd.weight", (s.n_embd, s.n_vocab))]
    for il in range(s.n_layer_all):
        named += sorted((f"blk.{il}.{suffix}", ne) for suffix, ne in block_tensors(s, il))
    plan, i_wv, i_down = [], 0, 0
    for name, ne in named:
        if len(ne) == 1 or "ssm_conv1d" in name or not name.endswith("weight"):
            qtype = F32
        elif name == "output.weight":
            qtype = Q6_K
        elif "attn_v.weight" in name or "attn_qkv.weight" in name:
            qtype = Q6_K if use_more_bits(i_wv, s.n_layer_all) else Q4_K
            i_wv += 1
        elif "ffn_down" in name:
            qtype = Q6_K if use_more_bits(i_down, s.n_layer_all) else Q4_K
            i_down += 1
        else:
            qtype = Q4_K
        plan.append(Tensor(name, ne, qtype, f32_init(name) if qtype == F32 else ""))
    return plan


def check_quantizable(plan: list[Tensor]) -> None:
    # llama-quantize would fall back to Q5_0/Q8_0 for such rows; this writer only makes K-quants.
    for t in plan:
        if t.qtype != F32 and t.ne[0] % QK_K:
            raise ValueError(f"{t.name}: row length {t.ne[0]} is not a multiple of {QK_K}; "
                             "pick another --scale")


def nbytes(t: Tensor) -> int:
    n = int(np.prod(t.ne))
    if t.qtype == F32:
        return 4 * n
    block, size = gguf.GGML_QUANT_SIZES[t.qtype]
    return n // block * size


# ---- metadata and tokenizer --------------------------------------------------------------------

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
           "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
           "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
           "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
           "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
N_TAIL = 276  # Qwen3.5 puts <|endoftext|> at n_vocab - 276 (248044); the specials follow it

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}{%- endif -%}")


def byte_alphabet() -> list[str]:
    """GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to U+0100 upwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + extra)
            extra += 1
    return [out[b] for b in sorted(out, key=lambda b: (b not in printable, b))]


def vocab(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges of a synthetic byte-level BPE: the 256 byte symbols, then
    two- and three-symbol merges of common ones (so prompts tokenize to sensible lengths), then
    Qwen's special tokens at their real ids, then unused padding."""
    n_text = n_vocab - N_TAIL
    base = byte_alphabet()
    common = [c for c in "etaoinsrhldcumfpgwybvkxjqz" + "\u0120" + "ETAOINSRHLDCUMFPGWYBVKXJQZ"
              + "0123456789" + "\u010a.,:;()[]{}_-=+*/'\"<>!?#%&|\\$@^`~"]
    tokens, merges = list(base), []
    pairs = ((a, b) for a in common for b in common)
    triples = ((a + b, c) for a in common for b in common for c in common)
    for left, right in (*pairs, *triples):
        if len(tokens) >= n_text:
            break
        tokens.append(left + right)
        merges.append(f"{left} {right}")
    types = [1] * len(tokens)                           # NORMAL
    for tok in SPECIAL:                                 # CONTROL for <|..|>, USER_DEFINED otherwise
        tokens.append(tok)
        types.append(3 if tok.startswith("<|") else 4)
    while len(tokens) < n_vocab:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(5)                                 # UNUSED
    return tokens[:n_vocab], types[:n_vocab], merges


def add_metadata(w: gguf.GGUFWriter, s: Shape, n_params: int) -> None:
    a = "qwen35"
    w.add_type("model")
    w.add_name("Qwen3.5 27B synthetic (random weights)")
    w.add_basename("Qwen3.5-synthetic")
    w.add_size_label(gguf.size_label(n_params, 0, 0, 0))
    w.add_uint32(f"{a}.block_count", s.n_layer_all)
    w.add_uint32(f"{a}.context_length", 262144)
    w.add_uint32(f"{a}.embedding_length", s.n_embd)
    w.add_uint32(f"{a}.feed_forward_length", s.n_ff)
    w.add_uint32(f"{a}.attention.head_count", s.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    w.add_array(f"{a}.rope.dimension_sections", [11, 11, 10, 0])
    w.add_float32(f"{a}.rope.freq_base", 10000000.0)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{a}.attention.key_length", s.head_dim)
    w.add_uint32(f"{a}.attention.value_length", s.head_dim)
    if s.mtp:
        w.add_uint32(f"{a}.nextn_predict_layers", 1)
    w.add_uint32(f"{a}.ssm.conv_kernel", s.d_conv)
    w.add_uint32(f"{a}.ssm.state_size", s.ssm_head_dim)
    w.add_uint32(f"{a}.ssm.group_count", s.ssm_k_heads)
    w.add_uint32(f"{a}.ssm.time_step_rank", s.ssm_v_heads)
    w.add_uint32(f"{a}.ssm.inner_size", s.ssm_v_heads * s.ssm_head_dim)
    w.add_array(f"{a}.attention.recurrent_layers", [s.is_recurrent(i) for i in range(s.n_layer_all)])
    w.add_uint32(f"{a}.full_attention_interval", s.full_attn_interval)
    w.add_uint32(f"{a}.rope.dimension_count", s.rope_dim)
    tokens, types, merges = vocab(s.n_vocab)
    first_special = s.n_vocab - N_TAIL
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen35")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.eos_token_id", first_special + SPECIAL.index("<|im_end|>"))
    w.add_uint32("tokenizer.ggml.padding_token_id", first_special + SPECIAL.index("<|vision_pad|>"))
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", CHAT_TEMPLATE)
    # llama-quantize re-sets these two, which moves them last
    w.add_uint32("general.quantization_version", 2)
    w.add_uint32("general.file_type", FTYPE_Q4_K_M)


# ---- random data -------------------------------------------------------------------------------

def f16_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float16).view(np.uint16))


def q4_k_blocks(raw: np.ndarray, std: float) -> np.ndarray:
    """Turn random bytes [n, 144] into Q4_K blocks (d, dmin, scales[12], qs[128]) whose weights
    sc*d*q - m*dmin have mean 0 and the given std: scale == min in every sub-block (sc in 8..15,
    packed so that get_scale_min_k4 returns the same 6-bit value for both) and dmin = 7.5 d."""
    d = std / np.sqrt(137.5 * 21.25)           # E[sc^2] for sc in 8..15; Var(q) for q in 0..15
    head = raw.view(np.uint32)[:, :4]          # bytes 0..15, four at a time (little endian)
    head[:, 0] = f16_bits(d) | f16_bits(7.5 * d) << 16
    lo = (head[:, 1] & 0x07070707) | 0x08080808
    head[:, 1] = lo                            # sc of sub-blocks 0..3 (upper 2 bits 0) ...
    head[:, 2] = lo                            # ... and their mins, equal
    hi = (head[:, 3] & 0x07070707) | 0x08080808
    head[:, 3] = hi | (hi << 4)                # sub-blocks 4..7: low nibble sc, high nibble m
    return raw


def q6_k_blocks(raw: np.ndarray, std: float) -> np.ndarray:
    """Random bytes [n, 210] -> Q6_K blocks (ql[128], qh[64], scales[16] int8, d): d*sc*(q-32) is
    zero-mean; sc in 1..4 keeps d a normal f16 even for the widest rows."""
    d = std / np.sqrt(7.5 * 341.25)            # E[sc^2] for sc in 1..4; Var(q) for q in 0..63
    words = raw.view(np.uint16)                # 105 per block: scales are 96..103, d is 104
    words[:, 96:104] = (words[:, 96:104] & 0x0303) + 0x0101
    words[:, 104] = f16_bits(d)
    return raw


def quant_chunk(qtype: gguf.GGMLQuantizationType, n_blocks: int, std: float,
                seed: tuple[int, ...]) -> np.ndarray:
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    words = np.random.PCG64(np.random.SeedSequence(seed)).random_raw(-(-n_blocks * size // 8))
    raw = words.view(np.uint8)[:n_blocks * size].reshape(n_blocks, size)
    return (q4_k_blocks if qtype == Q4_K else q6_k_blocks)(raw, std)


def f32_tensor(t: Tensor, seed: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    shape = t.ne[::-1]
    if t.init == "ssm_a":       # -exp(A_log), A ~ U(1, 16): per-head decay rates
        return -rng.uniform(1.0, 16.0, shape).astype(np.float32)
    if t.init == "dt":
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if t.init == "conv":
        return rng.uniform(-0.5, 0.5, shape).astype(np.float32)
    return (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32)


def chunks(plan: list[Tensor], seed: int):
    """(tensor index, job) pairs in file order; every job is deterministic in (seed, tensor, chunk)."""
    for ti, t in enumerate(plan):
        if t.qtype == F32:
            yield ti, (lambda t=t, ti=ti: f32_tensor(t, (seed, ti)))
            continue
        block, size = gguf.GGML_QUANT_SIZES[t.qtype]
        total = int(np.prod(t.ne)) // block
        per = max(1, CHUNK_BYTES // size)
        std = 1.0 / np.sqrt(t.ne[0])
        for ci, start in enumerate(range(0, total, per)):
            n = min(per, total - start)
            yield ti, (lambda q=t.qtype, n=n, std=std, key=(seed, ti, ci): quant_chunk(q, n, std, key))


def write(out: str, s: Shape, seed: int, threads: int, quiet: bool = False, zeros: bool = False) -> int:
    plan = tensor_plan(s)
    check_quantizable(plan)
    n_params = sum(int(np.prod(t.ne)) for t in plan)
    part = out + ".part"        # renamed when complete: an existing `out` is always a whole file
    w = gguf.GGUFWriter(part, "qwen35")
    add_metadata(w, s, n_params)
    for t in plan:
        n = nbytes(t)
        byte_shape = t.ne[::-1] if t.qtype == F32 else (*t.ne[:0:-1], n // int(np.prod(t.ne[1:])))
        w.add_tensor_info(t.name, byte_shape, np.dtype(np.float32 if t.qtype == F32 else np.uint8), n,
                          raw_dtype=t.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    total = sum(nbytes(t) for t in plan)
    done, current, t0 = 0, -1, time.time()
    if zeros:                   # a sparse file: all-zero blocks are valid weights (scale 0) and cost no disk
        for t in plan:
            w.write_padding(fout, fout.tell())
            fout.seek(nbytes(t), os.SEEK_CUR)
        w.write_padding(fout, fout.tell())
        fout.truncate()
        w.close()
        os.replace(part, out)
        return total
    with ThreadPoolExecutor(threads) as pool:
        pending: collections.deque = collections.deque()

        def drain_one() -> None:
            nonlocal done, current
            ti, fut = pending.popleft()
            if ti != current:           # a new tensor: align its start, as GGUFWriter does
                w.write_padding(fout, fout.tell())
                current = ti
            data = fut.result()
            fout.write(memoryview(np.ascontiguousarray(data)).cast("B"))
            done += data.nbytes
            if not quiet and sys.stderr.isatty():
                print(f"\rsynth_target: {done / 2**30:6.2f} / {total / 2**30:.2f} GiB", end="", file=sys.stderr)

        for ti, job in chunks(plan, seed):
            pending.append((ti, pool.submit(job)))
            if len(pending) >= 2 * threads:
                drain_one()
        while pending:
            drain_one()
    w.write_padding(fout, fout.tell())
    w.close()
    os.replace(part, out)
    if not quiet:
        dt = time.time() - t0
        print(f"\nsynth_target: wrote {out}: {len(plan)} tensors, {total / 2**30:.2f} GiB of weights, "
              f"{dt:.1f} s ({total / 2**30 / max(dt, 1e-9):.2f} GiB/s)", file=sys.stderr)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output .gguf path")
    ap.add_argument("--layers", type=int, default=64, help="trunk layers (default 64)")
    ap.add_argument("--scale", type=float, default=1.0, help="width factor in (0, 1] for quick tests")
    mtp = ap.add_mutually_exclusive_group()
    mtp.add_argument("--mtp", dest="mtp", action="store_true", default=True,
                     help="add the MTP block (block_count = layers + 1, nextn_predict_layers 1; default)")
    mtp.add_argument("--no-mtp", dest="mtp", action="store_false", help="trunk blocks only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--zeros", action="store_true",
                    help="all-zero weights as a sparse file (instant, no disk): for memory plans, not speed")
    args = ap.parse_args()
    try:
        shape = scaled_shape(args.scale, args.layers, args.mtp)
    except ValueError as e:
        ap.error(str(e))
    try:
        write(args.out, shape, args.seed, max(1, args.threads), zeros=args.zeros)
    except OSError as e:
        sys.exit(f"synth_target: error: cannot write {args.out}: {e.strerror or e}; "
                 "check the path and the free space")


if __name__ == "__main__":
    main()
