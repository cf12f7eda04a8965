#!/usr/bin/env python3
"""`lucebox serve` against `Engine.generate` on one model: streamed decode speed, per-request overhead, and
time to first token for a long agent-style prompt with and without a prefix-cache hit.

    python benchmarks/server_bench.py --target T.gguf --draft D [--prompt-tokens 16384] [--n-gen 128]

Prints one markdown table. The server runs as a subprocess on 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from lucebox.bench import PROMPT_DIR
from lucebox.engine import Engine

CODE = (PROMPT_DIR / "humaneval.jsonl").read_text().splitlines()


def agent_messages(tokenizer, n_tokens: int) -> list[dict]:
    """A system prompt of repository code (an agent's context) of about n_tokens, then a question."""
    parts, total = [], 0
    for line in CODE * 100:
        text = json.loads(line)["messages"][-1]["content"]
        parts.append(text)
        total += len(tokenizer.encode(text))
        if total >= n_tokens:
            break
    return [{"role": "system", "content": "You are a coding agent. The repository:\n" + "\n".join(parts)},
            {"role": "user", "content": "Write a function that sorts a list."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream_chat(client: httpx.Client, messages: list[dict], n_gen: int) -> dict:
    body = {"model": "lucebox", "messages": messages, "max_tokens": n_gen, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    text, usage = [], None
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                if c["delta"].get("content"):
                    last = time.perf_counter()
                    first = first or last
                    text.append(c["delta"]["content"])
    n = usage["completion_tokens"]
    return {"ttft_s": (first or last or t0) - t0, "total_s": time.perf_counter() - t0, "tokens": n,
            "tok_s": (n - 1) / (last - first) if first and last and last > first else 0.0,
            "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "prompt_tokens": usage["prompt_tokens"], "text": "".join(text)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prompt-tokens", type=int, default=16384)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    max_ctx = args.prompt_tokens + 4 * args.n_gen + 1024
    short = [{"role": "user", "content": "def fibonacci(n):"}]

    # the engine alone: the same requests, no HTTP
    with Engine(args.target, draft=args.draft, device=args.device, max_ctx=max_ctx) as engine:
        messages = agent_messages(engine.tokenizer, args.prompt_tokens)
        engine.generate(short, 16)  # warm-up
        g = engine.generate(short, args.n_gen, ignore_eos=True)
        engine_tok_s = g.stats.new_tokens / g.stats.decode_s
        engine.reset()
        t0 = time.perf_counter()
        engine.generate(short, 1)
        engine_one_s = time.perf_counter() - t0

    port = free_port()
    cmd = [sys.executable, "-m", "lucebox", "serve", "--port", str(port), "--target", args.target,
           "--device", args.device, "--max-ctx", str(max_ctx)] + (["--draft", args.draft] if args.draft else [])
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=os.environ)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            deadline = time.time() + 300
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.time() > deadline:
                    sys.exit(f"server_bench: the server did not start: {server.stderr.read()[-2000:]}")
                time.sleep(0.5)
            stream_chat(client, short, 16)  # warm-up
            served = stream_chat(client, short, args.n_gen)
            t0 = time.perf_counter()
            stream_chat(client, short, 1)
            served_one_s = time.perf_counter() - t0
            cold = stream_chat(client, messages, args.n_gen)
            turn2 = messages + [{"role": "assistant", "content": cold["text"]},
                                {"role": "user", "content": "Now add type hints."}]
            warm = stream_chat(client, turn2, args.n_gen)
    finally:
        server.terminate()
        server.wait(timeout=60)

    rows = [("streamed decode tok/s (short prompt)", f"{served['tok_s']:.1f}", f"{engine_tok_s:.1f} (Engine.generate)",
             f"{served['tok_s'] / engine_tok_s:.3f}"),
            ("one-token request, s", f"{served_one_s:.3f}", f"{engine_one_s:.3f} (Engine.generate)",
             f"+{1e3 * (served_one_s - engine_one_s):.1f} ms"),
            (f"TTFT, {cold['prompt_tokens']}-token prompt, cold", f"{cold['ttft_s']:.2f}", f"cached {cold['cached']}", ""),
            (f"TTFT, next turn ({warm['prompt_tokens']} tokens)", f"{warm['ttft_s']:.2f}", f"cached {warm['cached']}",
             f"{cold['ttft_s'] / max(warm['ttft_s'], 1e-9):.1f}x faster")]
    print("| measure | server | reference | ratio |\n| --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"served": served, "engine_tok_s": engine_tok_s, "cold": cold,
                                               "warm": warm, "served_one_s": served_one_s,
                                               "engine_one_s": engine_one_s}, indent=1, default=str))


if __name__ == "__main__":
    main()
