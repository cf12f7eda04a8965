#!/usr/bin/env bash
# Reproduce the public table: HumanEval / Math500 / GSM8K, 10 prompts each, n_gen 256, concurrency 1,
# AR vs DFlash+DDTree (budget 22): tok/s, AL, speedup. Markdown on stdout; JSON, .md and a .png plot
# (with matplotlib: pip install 'lucebox[plot]') saved.
#   bash benchmarks/reproduce.sh [--sweep] [lucebox bench options, e.g. --kv q8_0 --device cuda:0]
# --sweep adds the budget sweep 1,8,16,22,32 with chain vs tree; the other options: `lucebox bench --help`.
# Models: --target/--draft, else $LUCEBOX_TARGET/$LUCEBOX_DRAFT, else the 27B pair from `lucebox pull`
# (pulled here when nothing else is given). Results: $LUCEBOX_BENCH_OUT (default benchmarks/results/).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/benchmarks/usage.sh"
help_if_asked "$0" "$@"
OUT="${LUCEBOX_BENCH_OUT:-$ROOT/benchmarks/results}"
STAMP="$(date +%Y%m%d-%H%M%S)"

sweep=0
args=()
for a in "$@"; do
    if [ "$a" = --sweep ]; then sweep=1; else args+=("$a"); fi
done

if command -v lucebox >/dev/null 2>&1; then
    LB=(lucebox)
else  # a source checkout without `pip install .`
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    LB=("${PYTHON:-python3}" -m lucebox)
fi

named_target=0
for a in "${args[@]+"${args[@]}"}"; do [ "$a" = --target ] && named_target=1; done
if [ "$named_target" = 0 ] && [ -z "${LUCEBOX_TARGET:-}" ]; then
    "${LB[@]}" pull qwen3.5-27b   # a no-op when already in the HF cache
fi

mkdir -p "$OUT"

# run NAME BENCH_OPTIONS...: lucebox bench saves NAME-STAMP.json, .md and .png (written only when the run
# succeeds); the suites are its defaults (lucebox/prompts/, shipped with the package)
run() {
    local name="$1"
    shift
    "${LB[@]}" bench --n-prompts 10 --n-gen 256 --json "$OUT/$name-$STAMP.json" "$@" "${args[@]+"${args[@]}"}"
}

echo "## AR vs DFlash+DDTree (n_gen 256, budget 22)"
run public --budgets 22
if [ "$sweep" = 1 ]; then
    echo
    echo "## Budget sweep, chain vs tree"
    run sweep --budgets 1,8,16,22,32 --chain
fi
echo "results in $OUT" >&2
