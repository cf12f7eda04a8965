"""The shipped pair measured by the native engine: AR vs chain vs DDTree on the held-out prompts.

    PYTHONPATH=. LUCEBOX_LIB=build/cpu/liblucebox.so python -m benchmarks.tiny_pair.native_eval \
        --models lucebox/models/default --prompts benchmarks/tiny_pair/heldout_prompts.jsonl --out R.json

Greedy, end-of-sequence ignored (as `lucebox bench`), so every run emits n_gen tokens and the
speculative outputs can be compared with AR token for token. PyTorch's numbers (evaluate.py) come
from the float weights; these come from the Q8_0 GGUF that ships.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from lucebox import Engine


def measure(engine: Engine, prompts: list[dict], n_gen: int, budget: int, draft_top_k: int) -> dict:
    rows = []
    for p in prompts:
        row = {"id": p["id"]}
        outs = {}
        for mode in ("ar", "chain", "ddtree"):
            engine.reset()
            g = engine.generate(p["prompt"], n_gen, mode=mode, budget=budget, draft_top_k=draft_top_k, ignore_eos=True)
            outs[mode] = g.tokens
            row[f"{mode}_tok_s"] = round(g.stats.decode_tok_s, 1)
            if mode != "ar":
                row[f"{mode}_al"] = round(g.stats.al_mean, 3)
                row[f"{mode}_identical"] = g.tokens == outs["ar"]
        row["prompt_tokens"] = len(engine.encode_prompt(p["prompt"]))
        rows.append(row)
    chain = float(np.mean([r["chain_al"] for r in rows]))
    tree = float(np.mean([r["ddtree_al"] for r in rows]))
    return {"n_prompts": len(rows), "n_gen": n_gen, "budget": budget, "draft_top_k": draft_top_k,
            "chain_al": round(chain, 3), "ddtree_al": round(tree, 3), "ddtree_over_chain": round(tree / chain, 3),
            "identical": all(r["chain_identical"] and r["ddtree_identical"] for r in rows),
            "ar_tok_s": round(float(np.mean([r["ar_tok_s"] for r in rows])), 1),
            "chain_tok_s": round(float(np.mean([r["chain_tok_s"] for r in rows])), 1),
            "ddtree_tok_s": round(float(np.mean([r["ddtree_tok_s"] for r in rows])), 1),
            "per_prompt": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("lucebox/models/default"))
    ap.add_argument("--prompts", type=Path, default=Path("benchmarks/tiny_pair/heldout_prompts.jsonl"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--budget", type=int, default=22)
    ap.add_argument("--draft-top-k", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    t0 = time.perf_counter()
    with Engine(args.models / "target.gguf", draft=args.models / "draft", device="cpu",
                n_threads=args.threads, max_ctx=1024) as engine:
        res = measure(engine, prompts, args.n_gen, args.budget, args.draft_top_k)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"{res['n_prompts']} prompts, n_gen {res['n_gen']}: chain AL {res['chain_al']}, DDTree AL "
          f"{res['ddtree_al']} ({res['ddtree_over_chain']}x), identical to AR: {res['identical']}, "
          f"{res['seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
