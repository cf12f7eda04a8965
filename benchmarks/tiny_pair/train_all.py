"""Train the embedded default pair end to end in one process, inside one time budget.

    python -m benchmarks.tiny_pair.train_all --out DIR [--preset full|calib|cpu|cpu-d1|smoke] [--device cuda|cpu]
        [--target-from WORK/target_hf --target-log OUT/train_log.json]

Stages: corpus + tokenizer, target, the target's greedy continuations, DFlash draft, export
(draft folder, Q8_0 GGUF), evaluation, model card. Deliverables are written before the evaluation,
and train_log.json after every stage, so a run cut short still leaves what it finished.
Outputs (flat, for the device channel's 8-file limit): target.gguf (or target.gguf.partN when over
the size cap), draft/config.json, draft/model.safetensors, tokenizer.json, heldout_prompts.jsonl,
train_log.json, MODEL_CARD.md.
With --target-from the tokenizer and target of an earlier run are reused (its --work folder's
target_hf, its train_log.json for their records) and only the stages from the draft data on run.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import platform
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import Qwen3_5ForCausalLM

from . import data, draft as draft_mod, generate, target as target_mod, tokenizer as tok_mod
from .convert import convert
from .evaluate import evaluate
from .presets import PRESETS

PART_BYTES = 31 * 512 * 1024   # 15.5 MiB: the device channel returns files of at most 16 MiB
START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {msg}", flush=True)


class Run:
    """The time budget and the JSON record, rewritten after every stage."""

    def __init__(self, out: Path, budget: float):
        self.out, self.budget = out, budget
        self.record: dict = {"timings": {}}

    def remaining(self) -> float:
        return self.budget - (time.perf_counter() - START)

    def seconds_for(self, want: float, reserve: float, floor: float = 5.0) -> float:
        return max(floor, min(want, self.remaining() - reserve))

    def done(self, stage: str, t0: float, **info) -> None:
        self.record["timings"][stage] = round(time.perf_counter() - t0, 1)
        self.record.update(info)
        (self.out / "train_log.json").write_text(json.dumps(self.record, indent=1, default=str) + "\n")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def split_if_large(path: Path) -> list[Path]:
    if path.stat().st_size <= PART_BYTES:
        return [path]
    blob = path.read_bytes()
    parts = []
    for i in range(0, len(blob), PART_BYTES):
        part = path.with_name(f"{path.name}.part{i // PART_BYTES}")
        part.write_bytes(blob[i:i + PART_BYTES])
        parts.append(part)
    path.unlink()
    log(f"{path.name} split into {len(parts)} parts; reassemble with: cat {path.name}.part* > {path.name}")
    return parts


def token_stream(tok, docs: list[str]) -> torch.Tensor:
    ids = tok_mod.encode_documents(tok, docs)
    return torch.from_numpy(np.concatenate([np.asarray(d, dtype=np.int64) for d in ids]))


def stage_corpus(p, run: Run, device, prior: dict | None = None, hf_dir: Path | None = None):
    """With `hf_dir`, its tokenizer instead of a new one (`prior`: the run that trained it)."""
    t0 = time.perf_counter()
    corpus = data.load_corpus(max_files=p.max_files, site_chars=p.site_chars)
    docs = data.training_documents(corpus, p.chat_share, p.seed)
    site_chars = sum(len(t) for _, t in corpus.site)
    log(f"corpus: stdlib {len(corpus.train)} train / {len(corpus.heldout)} held-out files under {corpus.root}; "
        f"site-packages {len(corpus.site)} files, {site_chars:,} chars from {len(corpus.site_packages)} packages "
        f"({time.perf_counter() - t0:.1f}s)")
    if hf_dir is None:
        tok, tstats = tok_mod.train_tokenizer(docs, p.vocab_size, p.tokenizer_chars)
    else:
        tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
        if tok.get_vocab_size() != p.vocab_size:
            raise SystemExit(f"--target-from tokenizer has {tok.get_vocab_size()} tokens, preset {p.name} wants "
                             f"{p.vocab_size}: pass the target_hf of a run of the same target preset")
        tstats = {**prior["tokenizer"], "from": str(hf_dir / "tokenizer.json")}
    ids = tok_mod.special_ids(tok)
    tok.save(str(run.out / "tokenizer.json"))
    stream = token_stream(tok, docs)
    val_stream = token_stream(tok, [text + data.DOC_END for _, text in corpus.heldout])
    prompts = data.heldout_prompts(corpus, p.n_heldout_prompts, p.seed, max_chars=p.prompt_max_chars)
    with open(run.out / "heldout_prompts.jsonl", "w") as f:
        for q in prompts:
            f.write(json.dumps(q) + "\n")
    stdlib_chars = sum(len(t) for _, t in corpus.train)
    train_chars = stdlib_chars + site_chars
    log(f"tokenizer: {tok.get_vocab_size()} tokens in {tstats['seconds']:.1f}s; stream {stream.numel():,} "
        f"tokens ({train_chars / max(1, stream.numel()):.2f} chars/token incl. chat copies), "
        f"held-out {val_stream.numel():,}")
    run.done("corpus_tokenizer", t0, corpus={
        "root": str(corpus.root), "train_files": len(corpus.train), "heldout_files": len(corpus.heldout),
        "stdlib_train_chars": stdlib_chars, "site_roots": corpus.site_roots, "site_files": len(corpus.site),
        "site_chars": site_chars, "site_packages_top": dict(list(corpus.site_packages.items())[:25]),
        "train_chars": train_chars, "chat_share": p.chat_share, "train_tokens": stream.numel(),
        "heldout_tokens": val_stream.numel(), "heldout_percent": data.HELDOUT_PERCENT},
        tokenizer={**tstats, "special_ids": ids})
    return tok, ids, stream.to(device), val_stream.to(device), prompts


def stage_target(p, run: Run, tok, ids, stream, val_stream, device, work: Path):
    t0 = time.perf_counter()
    model = target_mod.build(p.target, tok.get_vocab_size(), ids[tok_mod.IM_END], ids[tok_mod.EOS], p.seed)
    n = target_mod.n_params(model)
    log(f"target: {n:,} parameters")
    reserve = p.gen_seconds + p.draft_train.seconds * 0.5 + p.tail_reserve
    spec = p.target_train
    spec.seconds = run.seconds_for(spec.seconds, reserve)
    stats = target_mod.train(model, stream, val_stream, spec, device, p.seed, log)
    hf_dir = work / "target_hf"
    model.save_pretrained(str(hf_dir))
    tok_mod.save_tokenizer(tok, hf_dir)
    run.done("target_train", t0, target={"params": n, "shape": asdict(p.target), **stats})
    return model, hf_dir


def load_target(p, run: Run, prior: dict, hf_dir: Path, device):
    """An earlier run's trained target instead of stage_target; its record comes from that run's log."""
    t0 = time.perf_counter()
    model = Qwen3_5ForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).to(device)
    c, s = model.config, p.target
    have = (c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.num_attention_heads, c.head_dim)
    if have != (s.hidden, s.layers, s.ff, s.heads, s.head_dim):
        raise SystemExit(f"--target-from {hf_dir} is not preset {p.name}'s target shape (hidden, layers, ffn, heads, "
                         f"head dim {have}): pass the target_hf of a run of the same target preset")
    weights = hf_dir / "model.safetensors"
    log(f"target: {target_mod.n_params(model):,} parameters, trained earlier ({hf_dir})")
    run.done("target_load", t0, target={**prior["target"], "from": str(hf_dir),
                                        "safetensors_sha256": sha256(weights)})
    return model, hf_dir


def stage_draft_data(p, run: Run, tok, ids, model, stream):
    t0 = time.perf_counter()
    assistant = tok.encode("assistant\n", add_special_tokens=False).ids
    starts = generate.reply_starts(stream, ids[tok_mod.IM_START], assistant)
    seconds = run.seconds_for(p.gen_seconds, p.draft_train.seconds * 0.5 + p.tail_reserve)
    d = generate.make_draft_data(
        model, stream, starts, list(p.draft.target_layer_ids), n_max=p.gen_max_sequences,
        batch=p.gen_batch, plen=p.gen_prompt_len, n_new=p.gen_new_tokens, chat_share=p.gen_chat_share,
        seconds=seconds, seed=p.seed + 1, log=log, dtype=getattr(torch, p.gen_dtype))
    d["stats"]["feature_gib"] = round(d["features"].numel() * 2 / 2**30, 2)
    run.done("draft_data", t0, draft_data=d["stats"])
    return d


def stage_draft(p, run: Run, ids, model, d):
    t0 = time.perf_counter()
    draft = draft_mod.build(p.draft, model.config, ids[tok_mod.MASK], p.seed + 2)
    n = sum(x.numel() for x in draft.parameters())
    log(f"draft: {n:,} parameters")
    spec = p.draft_train
    spec.seconds = run.seconds_for(spec.seconds, p.tail_reserve)
    for prm in model.parameters():
        prm.requires_grad_(False)
    stats = draft_mod.train(draft, model, d["tokens"], d["features"], d["stats"]["prompt_len"], spec,
                            p.seed + 3, log)
    run.done("draft_train", t0, draft={"params": n, "shape": asdict(p.draft), **stats})
    return draft


def stage_export(p, run: Run, draft, hf_dir: Path, llama_dir: Path):
    t0 = time.perf_counter()
    draft_dir = run.out / "draft"
    draft_mod.save(draft, draft_dir)
    draft.float()   # evaluate what ships: the weights rounded to bf16
    summary = convert(hf_dir, run.out / "target.gguf", llama_dir, "q8_0")
    log(f"GGUF: {summary['bytes']:,} bytes, {summary['n_tensors']} tensors {summary['tensor_types']}, "
        f"pre-tokenizer {summary['pre_tokenizer']}, {summary['n_tokens']} tokens")
    parts = split_if_large(run.out / "target.gguf")
    files = [*parts, draft_dir / "config.json", draft_dir / "model.safetensors"]
    shipped = {str(f.relative_to(run.out)): {"bytes": f.stat().st_size, "sha256": sha256(f)} for f in files}
    run.done("export", t0, gguf=summary, files=shipped,
             shipped_bytes=summary["bytes"] + (draft_dir / "model.safetensors").stat().st_size)


def stage_eval(p, run: Run, model, draft, tok, prompts):
    t0 = time.perf_counter()
    model.float()
    chosen = prompts[:p.n_eval_prompts]
    res = evaluate(model, draft, tok, chosen, p.eval_n_gen, p.eval_budget, p.eval_top_k,
                   run.seconds_for(p.eval_seconds, 15.0), log)
    run.done("eval", t0, eval=res)


def write_card(p, run: Run) -> None:
    r = run.record
    tgt, drf = r.get("target", {}), r.get("draft", {})
    ev = r.get("eval", {})
    what = {"target.gguf": "target, Q8_0 GGUF (arch qwen35, tokenizer and chat template inside)",
            "draft/config.json": "draft config (dflash_config: mask token, target layers, block size)",
            "draft/model.safetensors": "draft weights, BF16"}
    files = "\n".join(f"| `{k}` | {what.get(k, 'part of target.gguf (cat the parts in order)')} | "
                      f"{v['bytes']:,} | `{v['sha256'][:16]}...` |" for k, v in r.get("files", {}).items())
    shape = p.target
    d = p.draft
    values = {
        "preset": p.name, "device": r["env"]["device"], "date": r["env"]["date"],
        "python": r["env"]["python"], "torch": r["env"]["torch"], "transformers": r["env"]["transformers"],
        "dflash": r["env"]["dflash"], "files_table": files, "corpus_root": r["corpus"]["root"],
        "heldout_percent": r["corpus"]["heldout_percent"], "heldout_files": r["corpus"]["heldout_files"],
        "train_files": r["corpus"]["train_files"], "stdlib_chars": f"{r['corpus']['stdlib_train_chars']:,}",
        "site_files": r["corpus"]["site_files"], "site_chars": f"{r['corpus']['site_chars']:,}",
        "site_roots": ", ".join(f"`{x}`" for x in r["corpus"]["site_roots"]) or "(none)",
        "site_packages": ", ".join(f"{k} ({v / 1e6:.1f} M)"
                                   for k, v in list(r["corpus"]["site_packages_top"].items())[:12]),
        "chat_share": p.chat_share, "vocab_size": p.vocab_size,
        "tokenizer_chars": f"{r['tokenizer']['train_chars']:,}",
        "special_tokens": ", ".join(f"`{k}` = {v}" for k, v in r["tokenizer"]["special_ids"].items()),
        "target_params": f"{tgt.get('params', 0):,}",
        "target_shape": (f"hidden {shape.hidden}, {shape.layers} layers, FFN {shape.ff}, attention "
                         f"{shape.heads} q / {shape.kv_heads} kv heads of {shape.head_dim}, DeltaNet head "
                         f"{shape.lin_head_dim}, rope theta {shape.rope_theta:g}"),
        "target_groups": shape.layers // 4, "mrope_section": list(shape.mrope_section),
        "lin_k_heads": shape.lin_k_heads, "lin_v_heads": shape.lin_v_heads,
        "target_origin": (f"Trained by an earlier run and reused here (`--target-from`, weights sha256 "
                          f"`{tgt['safetensors_sha256'][:16]}...`). " if "from" in tgt else ""),
        "target_steps": tgt.get("steps"), "target_batch": p.target_train.batch,
        "target_seq_len": p.target_train.seq_len, "target_tokens": f"{tgt.get('tokens', 0):,}",
        "target_seconds": tgt.get("seconds"), "target_lr": p.target_train.lr,
        "target_train_loss": tgt.get("final_train_loss"), "target_heldout_loss": tgt.get("heldout_loss"),
        "gguf_bytes": f"{r.get('gguf', {}).get('bytes', 0):,}",
        "draft_params": f"{drf.get('params', 0):,}",
        "draft_shape": (f"{d.layers} layer(s), hidden {shape.hidden}, {d.heads} q / {d.kv_heads} kv heads of "
                        f"{d.head_dim}, FFN {d.ff}"),
        "block_size": d.block_size, "mask_id": r["tokenizer"]["special_ids"][tok_mod.MASK],
        "target_layer_ids": list(d.target_layer_ids),
        "gen_sequences": r.get("draft_data", {}).get("sequences"), "gen_prompt_len": p.gen_prompt_len,
        "gen_chat_pct": int(100 * p.gen_chat_share), "gen_new_tokens": p.gen_new_tokens,
        "anchors": p.draft_train.anchors, "block_minus_1": d.block_size - 1, "gamma": p.draft_train.gamma,
        "draft_steps": drf.get("steps"), "draft_batch": p.draft_train.batch, "draft_seconds": drf.get("seconds"),
        "draft_heldout_loss": drf.get("heldout_loss"), "draft_kept_step": drf.get("kept_step"),
        "draft_val": drf.get("heldout_sequences"),
        "draft_acc": ", ".join(f"{a:.2f}" for a in drf.get("heldout_acc_by_pos", [])),
        "eval_prompts": ev.get("n_prompts"), "eval_n_gen": p.eval_n_gen, "eval_budget": p.eval_budget,
        "eval_top_k": p.eval_top_k, "chain_al": ev.get("chain_al"), "ddtree_al": ev.get("ddtree_al"),
        "ddtree_ratio": ev.get("ddtree_over_chain"),
        "timings": "\n".join(f"- {k}: {v}" for k, v in r["timings"].items()),
    }
    template = (Path(__file__).with_name("MODEL_CARD.md")).read_text()
    (run.out / "MODEL_CARD.md").write_text(template.format_map(values))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="output folder (deliverables + log)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/tiny_pair_work"), help="scratch folder")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full")
    ap.add_argument("--target-from", type=Path, default=None,
                    help="reuse an earlier run's tokenizer and target: its --work folder's target_hf")
    ap.add_argument("--target-log", type=Path, default=None,
                    help="with --target-from: that run's train_log.json (the records of its tokenizer and target)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (device cpu)")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run")
    ap.add_argument("--llama-dir", type=Path, default=Path("vendor/src/llama.cpp"),
                    help="materialized converter (vendor/materialize.py)")
    args = ap.parse_args(argv)
    if (args.target_from is None) != (args.target_log is None):
        ap.error("--target-from and --target-log go together (the earlier run's target_hf and train_log.json)")
    prior = json.loads(args.target_log.read_text()) if args.target_log else None
    p = copy.deepcopy(PRESETS[args.preset])   # stages shrink its seconds to the budget
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    run = Run(args.out, args.time_budget or p.time_budget)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    run.record["env"] = {
        "preset": p.name, "device": name,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": version("transformers"), "dflash": version("dflash"),
        "time_budget": run.budget}
    log(f"preset {p.name} on {run.record['env']['device']}, budget {run.budget:.0f}s")
    tok, ids, stream, val_stream, prompts = stage_corpus(p, run, device, prior, args.target_from)
    if args.target_from is None:
        model, hf_dir = stage_target(p, run, tok, ids, stream, val_stream, device, args.work)
    else:
        model, hf_dir = load_target(p, run, prior, args.target_from, device)
    d = stage_draft_data(p, run, tok, ids, model, stream)
    draft = stage_draft(p, run, ids, model, d)
    del d
    stage_export(p, run, draft, hf_dir, args.llama_dir)
    stage_eval(p, run, model, draft, tok, prompts)
    write_card(p, run)
    run.done("total", START)
    log(f"done in {time.perf_counter() - START:.0f}s; outputs in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
