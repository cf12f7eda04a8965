"""The runs: `full` (one H100, all stages inside ~9 minutes), `calib` (the same in ~3.5), `cpu`
(2 CPU cores, ~36 minutes: the shipped default when no GPU time is left) and `smoke` (2 CPU cores,
~2 minutes).

Every size lives here; the stage modules take them as arguments. Stage seconds are upper bounds:
the driver shrinks them to what is left of the overall time budget.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .draft import DraftShape, DraftSpec
from .target import TargetShape, TrainSpec


@dataclass
class Preset:
    name: str
    time_budget: float             # seconds for the whole run, from process start
    max_files: int | None          # stdlib subset (None: every stdlib file)
    site_chars: int                # site-packages characters added to the stdlib
    vocab_size: int
    tokenizer_chars: int           # characters the BPE trainer sees
    chat_share: float              # chat snippets, as a share of the raw characters
    target: TargetShape
    target_train: TrainSpec
    gen_prompt_len: int
    gen_new_tokens: int
    gen_batch: int
    gen_max_sequences: int
    gen_chat_share: float
    gen_seconds: float
    draft: DraftShape
    draft_train: DraftSpec
    n_heldout_prompts: int = 20
    n_eval_prompts: int = 20
    eval_n_gen: int = 128
    eval_budget: int = 22
    eval_top_k: int = 8
    eval_seconds: float = 40.0
    prompt_max_chars: int = 1000   # held-out prompt length cap: prompt + eval_n_gen within training length
    gen_dtype: str = "bfloat16"    # the target copy that writes the draft data (CPU: float32)
    tail_reserve: float = 75.0     # save + convert + eval, kept free after draft training
    seed: int = 1234
    notes: dict = field(default_factory=dict)


FULL = Preset(
    name="full", time_budget=520.0, max_files=None, site_chars=60_000_000, vocab_size=4096,
    tokenizer_chars=12_000_000, chat_share=0.25,
    target=TargetShape(),
    target_train=TrainSpec(seq_len=512, batch=64, lr=2e-3, seconds=190.0, log_every=100),
    gen_prompt_len=160, gen_new_tokens=144, gen_batch=2048, gen_max_sequences=32768,
    gen_chat_share=0.3, gen_seconds=65.0,
    draft=DraftShape(ff=1536),
    draft_train=DraftSpec(batch=256, anchors=8, seconds=150.0, log_every=250),
    eval_seconds=45.0, tail_reserve=70.0,
)

SMOKE = Preset(
    name="smoke", time_budget=300.0, max_files=150, site_chars=400_000, vocab_size=512,
    tokenizer_chars=1_000_000, chat_share=0.25,
    target=TargetShape(hidden=64, layers=4, ff=128, heads=2, kv_heads=1, head_dim=32,
                       lin_k_heads=1, lin_v_heads=3, lin_head_dim=32, mrope_section=(2, 1, 1)),
    target_train=TrainSpec(seq_len=128, batch=8, lr=3e-3, seconds=25.0, log_every=10),
    gen_prompt_len=32, gen_new_tokens=48, gen_batch=32, gen_max_sequences=64,
    gen_chat_share=0.3, gen_seconds=20.0,
    draft=DraftShape(layers=1, heads=2, kv_heads=1, head_dim=32, ff=128, target_layer_ids=(0, 1, 2)),
    draft_train=DraftSpec(batch=8, anchors=2, seconds=15.0, log_every=10),
    n_eval_prompts=3, eval_n_gen=32, eval_seconds=60.0,
    tail_reserve=60.0,
)

# 2 CPU cores, all stages in ~36 minutes. Sized from measured steps (bf16 autocast, ~3.3k tok/s for
# this target): seq 256 so prompts (<= 400 chars, ~130 tokens) + 128 generated tokens stay near the
# trained length; stdlib only, since ~3M trained tokens see a fraction of it anyway.
# Attention head_dim 64 keeps the pair on CUDA flash-attention's supported head sizes.
CPU = Preset(
    name="cpu", time_budget=2160.0, max_files=None, site_chars=0, vocab_size=4096,
    tokenizer_chars=4_000_000, chat_share=0.25,
    target=TargetShape(hidden=256, layers=8, ff=512, heads=4, kv_heads=2, head_dim=64,
                       lin_k_heads=2, lin_v_heads=6, lin_head_dim=32, mrope_section=(3, 3, 2)),
    target_train=TrainSpec(seq_len=256, batch=16, lr=3e-3, seconds=900.0, log_every=25),
    gen_prompt_len=64, gen_new_tokens=96, gen_batch=64, gen_max_sequences=8192,
    gen_chat_share=0.3, gen_seconds=300.0, gen_dtype="float32",
    draft=DraftShape(layers=2, heads=4, kv_heads=2, head_dim=64, ff=512, target_layer_ids=(1, 3, 5, 6)),
    draft_train=DraftSpec(batch=32, anchors=4, lr=2e-3, seconds=540.0, log_every=50),
    eval_seconds=100.0, tail_reserve=150.0, prompt_max_chars=400,
)

# FULL at a third of the time: every stage on the GPU, for timing and a dry run before the real one
CALIB = replace(
    FULL, name="calib", time_budget=200.0,
    target_train=replace(FULL.target_train, seconds=45.0, log_every=50),
    gen_seconds=15.0, draft_train=replace(FULL.draft_train, seconds=40.0, log_every=100),
    eval_seconds=25.0, tail_reserve=45.0,
)

PRESETS = {"full": FULL, "calib": CALIB, "cpu": CPU, "smoke": SMOKE}

# the cpu preset's target (reused: train_all --target-from) with a 1-layer draft, ~0.7M parameters or a
# tenth of the target, as DFlash drafts are of theirs; a 2-layer draft on this looping target is right
# so often (top-1 84-97% per position) that a DDTree has almost nothing left to recover.
CPU_D1 = replace(
    CPU, name="cpu-d1", time_budget=900.0, gen_max_sequences=3456,
    draft=replace(CPU.draft, layers=1),
    draft_train=replace(CPU.draft_train, seconds=150.0),
)
PRESETS["cpu-d1"] = CPU_D1
