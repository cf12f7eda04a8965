"""The public benchmark: AR vs DFlash + DDTree on HumanEval / Math500 / GSM8K prompt suites.

Each prompt runs once per configuration on a fresh cache (AR first: it is the baseline and the
losslessness reference), after one excluded warm-up per configuration. A suite's tok/s is its
total new tokens over its total decode time; AL is the mean tokens committed per verify step.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

SUITE_NAMES = {"he": "HumanEval", "humaneval": "HumanEval", "math": "Math500", "math500": "Math500",
               "gsm": "GSM8K", "gsm8k": "GSM8K"}
DEFAULT_FILES = ("humaneval.jsonl", "math500.jsonl", "gsm8k.jsonl")
MODE_LABELS = {"ar": "AR", "chain": "DFlash chain", "ddtree": "DFlash+DDTree"}


@dataclass
class Suite:
    name: str
    path: Path
    prompts: list  # each a list of chat messages, or a raw string


@dataclass(frozen=True)
class RunSpec:
    mode: str      # "chain" or "ddtree"
    budget: int


# --- prompts -------------------------------------------------------------------------------
# The default suites ship inside the package (package data), so an installed lucebox finds them too.
PROMPT_DIR = Path(__file__).resolve().parent / "prompts"


def default_prompt_files() -> list[Path]:
    files = [PROMPT_DIR / f for f in DEFAULT_FILES]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"the default prompt suites ({', '.join(missing)}) are missing from {PROMPT_DIR} "
                                "(a broken install?); reinstall lucebox or pass --prompts FILE.jsonl")
    return files


def load_suite(path: str | Path, limit: int | None = None) -> Suite:
    """A JSONL file: one object per line with `messages` (chat) or `prompt` (raw text)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise FileNotFoundError(f"cannot read prompt file {path}: {getattr(e, 'strerror', None) or e}") from None
    prompts, suite_field = [], None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not JSON ({e.msg}); each line must be one JSON object") from None
        prompts.append(_prompt_of(item, f"{path}:{number}"))
        suite_field = suite_field or (item.get("suite") if isinstance(item, dict) else None)
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise ValueError(f"{path} holds no prompts; expected JSONL lines with `messages`")
    stem = path.stem.lower().removeprefix("bench_")
    name = SUITE_NAMES.get(stem) or SUITE_NAMES.get(str(suite_field).lower()) or path.stem
    return Suite(name, path, prompts)


def _prompt_of(item, where: str):
    if isinstance(item, dict) and isinstance(item.get("prompt"), str):
        return item["prompt"]
    messages = item.get("messages") if isinstance(item, dict) else None
    if (not isinstance(messages, list) or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                       and isinstance(m.get("content"), str) for m in messages)):
        raise ValueError(f"{where}: expected {{\"messages\": [{{\"role\": ..., \"content\": ...}}, ...]}} "
                         "or {\"prompt\": \"...\"}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def encode(tokenizer, prompt) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    return tokenizer.encode(tokenizer.apply_chat_template(prompt, add_generation_prompt=True))


def parse_budgets(text: str) -> list[int]:
    try:
        budgets = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--budgets takes comma-separated integers like 1,8,16,22,32; got {text!r}") from None
    if not budgets or any(b < 1 for b in budgets):
        raise ValueError(f"--budgets must list integers >= 1; got {text!r}")
    return budgets


# --- running -------------------------------------------------------------------------------
def run(engine, suites: list[Suite], specs: list[RunSpec], *, n_gen: int = 256, draft_top_k: int = 8,
        ignore_eos: bool = True, progress: bool = True, temperature: float = 0.0, seed: int = 0) -> dict:
    """Run every prompt under AR and each spec; return the JSON-ready result.

    temperature > 0 samples (seed + prompt index as the seed of each prompt, the same in every mode,
    so speculative runs still match AR token for token)."""
    from tqdm import tqdm

    tok = engine.tokenizer
    encoded = [[encode(tok, p) for p in s.prompts] for s in suites]
    all_modes = [("ar", 0)] + [(s.mode, s.budget) for s in specs]
    sampling = {"temperature": temperature} if temperature > 0 else {}
    _warm_up(engine, encoded[0][0], all_modes, draft_top_k, sampling)
    total = sum(len(e) for e in encoded) * len(all_modes)
    bar = tqdm(total=total, desc="bench", unit="run", disable=None if progress else True, leave=False)
    out_suites = []
    for suite, prompts in zip(suites, encoded):
        gens = {m: [] for m in all_modes}
        for i, ids in enumerate(prompts):
            if sampling:
                sampling["seed"] = seed + i
            for mode, budget in all_modes:
                bar.set_postfix_str(f"{suite.name} {mode}" + (f" b{budget}" if budget else ""))
                engine.reset()
                gens[(mode, budget)].append(engine.generate(ids, n_gen, mode=mode, budget=max(budget, 1),
                                                            draft_top_k=draft_top_k, ignore_eos=ignore_eos,
                                                            **sampling))
                bar.update(1)
        ar = _aggregate(gens[("ar", 0)])
        runs = []
        for mode, budget in all_modes[1:]:
            agg = _aggregate(gens[(mode, budget)])
            pairs = list(zip(prompts, gens[("ar", 0)], gens[(mode, budget)]))
            runs.append({"mode": mode, "budget": budget, **agg,
                         "speedup": agg["tok_s"] / ar["tok_s"] if ar["tok_s"] > 0 else 0.0,
                         "identical": sum(a.tokens == g.tokens for _, a, g in pairs),
                         "divergence_gaps": [divergence_gap(engine, ids, a.tokens, g.tokens)
                                             for ids, a, g in pairs if a.tokens != g.tokens]})
        out_suites.append({"name": suite.name, "file": str(suite.path), "n_prompts": len(prompts),
                           "prompt_tokens": [len(ids) for ids in prompts], "ar": ar, "runs": runs})
    bar.close()
    return {"settings": {"n_gen": n_gen, "draft_top_k": draft_top_k, "ignore_eos": ignore_eos, "concurrency": 1,
                         "temperature": temperature, "seed": seed},
            "suites": out_suites}


def divergence_gap(engine, prompt: list[int], ar_tokens: list[int], spec_tokens: list[int]) -> float:
    """AR's logit lead of its own token over the speculative run's at their first difference (a
    diagnostic for a bug report: with batch-invariant kernels the outputs never differ)."""
    j = next((i for i, (a, b) in enumerate(zip(ar_tokens, spec_tokens)) if a != b), None)
    if j is None:  # one is a prefix of the other: a stop decided differently, no token differs
        return 0.0
    row = engine.next_logits(prompt + ar_tokens[:j])
    return float(row[ar_tokens[j]] - row[spec_tokens[j]])


def _warm_up(engine, ids: list[int], modes, draft_top_k: int, sampling: dict) -> None:
    # first calls pay for allocations, graph builds and kernel loads: keep them out of the numbers
    for mode, budget in modes:
        engine.reset()
        engine.generate(ids, 8, mode=mode, budget=max(budget, 1), draft_top_k=draft_top_k, ignore_eos=True,
                        **sampling)
    engine.reset()


def _aggregate(gens) -> dict:
    stats = [g.stats for g in gens]
    new_tokens = sum(s.new_tokens for s in stats)
    decode_s = sum(s.decode_s for s in stats)
    lengths = [n for s in stats for n in s.accept_lengths]
    histogram: list[int] = []
    for n in lengths:
        histogram += [0] * (n + 1 - len(histogram))
        histogram[n] += 1
    steps = max(len(lengths), 1)
    return {
        "tok_s": new_tokens / decode_s if decode_s > 0 else 0.0,
        "new_tokens": new_tokens, "decode_s": decode_s,
        "prefill_s": sum(s.prefill_s for s in stats),
        "al": sum(lengths) / len(lengths) if lengths else 0.0, "al_histogram": histogram,
        "per_step_ms": {k: 1e3 * sum(getattr(s, f"{k}_s") for s in stats) / steps
                        for k in ("draft", "verify", "commit", "host")},
        "finish_reasons": [g.finish_reason for g in gens],
    }


# --- reporting -----------------------------------------------------------------------------
def to_markdown(result: dict) -> str:
    """One table: the public layout for a single configuration, one row per run for a sweep."""
    suites = result["suites"]
    n_specs = len(suites[0]["runs"]) if suites else 0
    lines = []
    if n_specs == 1:
        label = MODE_LABELS[suites[0]["runs"][0]["mode"]]
        lines += [f"| Suite | AR tok/s | {label} tok/s | AL | Speedup |", "| --- | ---: | ---: | ---: | ---: |"]
        for s in suites:
            r = s["runs"][0]
            lines.append(f"| {s['name']} | {s['ar']['tok_s']:.1f} | {r['tok_s']:.1f} | {r['al']:.2f} "
                         f"| {r['speedup']:.2f}x |")
    else:
        lines += ["| Suite | Mode | Budget | tok/s | AL | Speedup |", "| --- | --- | ---: | ---: | ---: | ---: |"]
        for s in suites:
            lines.append(f"| {s['name']} | AR | - | {s['ar']['tok_s']:.1f} | 1.00 | 1.00x |")
            for r in s["runs"]:
                lines.append(f"| {s['name']} | {MODE_LABELS[r['mode']]} | {r['budget']} | {r['tok_s']:.1f} "
                             f"| {r['al']:.2f} | {r['speedup']:.2f}x |")
    temperature = result.get("settings", {}).get("temperature", 0.0)
    if temperature:
        lines.insert(0, f"Sampled at temperature {temperature:g} (seed {result['settings']['seed']} + prompt index, "
                        "the same in every mode)\n")
    differ = sum(s["n_prompts"] - r["identical"] for s in suites for r in s["runs"])
    if differ:
        gaps = [abs(g) for s in suites for r in s["runs"] for g in r.get("divergence_gaps", [])]
        widest = max(gaps, default=float("nan"))
        lines.append(f"\nerror: {differ} speculative run(s) produced tokens different from AR greedy "
                     f"(AR's logit lead at the first difference: at most {widest:.4f}); speculative output "
                     "should equal AR bit for bit: please report this with the JSON result")
    return "\n".join(lines)


def save_json(result: dict, path: str | Path) -> None:
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


def stamp(result: dict, **meta) -> dict:
    """Add what was measured, on what, when."""
    from . import __version__

    return {"meta": {"lucebox": __version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **meta}, **result}
