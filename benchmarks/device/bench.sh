#!/usr/bin/env bash
# GPU benchmark tables, all measured in one run on one machine:
#   copy bandwidth, llama.cpp llama-bench tg128 (on our patched ggml, and on the stock one where `run.sh stock`
#   built it) vs lucebox AR on a 27B-shaped synthetic Q4_K_M,
#   per-step speculative timings (27B-shaped random BF16 draft) at 8K and 32K with the batch-invariant
#   kernels (the default) and at 8K without them, and (LUCEBOX_BENCH_FULL=1, the default) Q8_0-KV AR and
#   tree-op timings; (LUCEBOX_BENCH_LONG=1, the default) memory at 128K / 256K, the plan at 256K by part,
#   llama.cpp's pp32768 and the planner at 24 GiB; (LUCEBOX_BENCH_DEPTH=1) the step with 128K filled;
#   (LUCEBOX_BENCH_FILLED_256K=save, then =resume in the next call on the same warm machine) the peak memory
#   of a filled 256K context with a Q8_0 draft.
#   (LUCEBOX_BENCH_MAIN=0 skips all but the optional parts.)
#   bash benchmarks/device/bench.sh BUILD_DIR WORK_DIR OUT_DIR
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
source "$ROOT/benchmarks/usage.sh"
help_if_asked "$0" "$@"
[ $# -eq 3 ] || { print_usage "$0" >&2; exit 2; }
BUILD="$1"; WORK="$2"; OUT="$3"
cd "$ROOT"
T="$WORK/synth-27b-q4_k_m.gguf"; D="$WORK/synth-27b-dflash"

log() { echo "== $(date +%T) $*"; }

[ -f "$T" ] || bash benchmarks/device/synth.sh "$WORK" >"$WORK/synth.log" 2>&1 || tail "$WORK/synth.log"

LB="$(find "$BUILD" -name llama-bench -type f -perm -u+x | head -1)"
# llama-bench on the pin's stock ggml, where `run.sh stock` built it earlier on this machine (LB links our
# patched ggml, whose kernels llama.cpp then runs too)
LB_STOCK="$(find "$ROOT/build/stock" -name llama-bench -type f -perm -u+x 2>/dev/null | head -1)"

if [ "${LUCEBOX_BENCH_MAIN:-1}" = 1 ]; then
    log "copy bandwidth"
    COPY_GBS=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks')
from step_bench import copy_bandwidth_gbs
print(f'{copy_bandwidth_gbs():.0f}')")
    echo "copy bandwidth (read + write): $COPY_GBS GB/s"

    log "llama.cpp llama-bench tg128 (same pin, same ggml build)"
    "$LB" -m "$T" -ngl 99 -p 0 -n 128 -r 3 -fa 0,1 -o md 2>"$WORK/llama_bench.err"
    if [ -n "$LB_STOCK" ]; then
        log "llama.cpp llama-bench tg128 on the pin's stock ggml"
        "$LB_STOCK" -m "$T" -ngl 99 -p 0 -n 128 -r 3 -fa 0,1 -o md 2>>"$WORK/llama_bench.err"
    fi

    log "lucebox AR + speculative step timings (batch-invariant kernels, the default)"
    python3 benchmarks/step_bench.py --target "$T" --draft "$D" --ctx "${LUCEBOX_BENCH_CTX:-8192,32768}" --n-gen 128 --steps 10 \
        --copy-gbs "$COPY_GBS" --json "$OUT/step_bench.json" 2>&1

    # the same step with the faster batch-dependent kernels (outputs may then part from AR at near-ties)
    log "lucebox AR + speculative step, batch_invariant = 0"
    python3 benchmarks/step_bench.py --target "$T" --draft "$D" --ctx 8192 --n-gen 64 --steps 10 --no-invariant \
        --copy-gbs "$COPY_GBS" --json "$OUT/step_bench_fast.json" 2>&1 | grep "^|"

    # the cost of device-side sampling (Qwen's top-p 0.95 / top-k 20 at temperature 0.6, repeat penalty 1.1)
    log "lucebox speculative step, sampling at temperature 0.6"
    python3 benchmarks/step_bench.py --target "$T" --draft "$D" --ctx 8192 --n-gen 64 --steps 10 --temperature 0.6 \
        --repeat-penalty 1.1 --copy-gbs "$COPY_GBS" --json "$OUT/step_bench_t06.json" --profile-host \
        2>"$OUT/host_profile.txt" | grep "^|"
fi

if [ "${LUCEBOX_BENCH_FULL:-1}" = 1 ]; then
    log "lucebox AR with a Q8_0 KV cache (head size 256)"
    python3 benchmarks/step_bench.py --target "$T" --kv q8_0 --n-gen 64 2>&1 | tail -3
    log "tree ops"
    "$BUILD/tree_ops_check" bench --backend cuda 2>&1
fi

if [ "${LUCEBOX_BENCH_LONG:-1}" = 1 ]; then
    # memory at 128K and 256K with a q4_0 cache: the caches are allocated at load, the compute buffers grow
    # with the rows filled (the plan counts them full; the depth part below measures a filled 128K)
    log "long context: GPU memory held vs planned at 128K / 256K, q4_0 KV (prompt 4096 tokens)"
    python3 benchmarks/step_bench.py --target "$T" --draft "$D" --ctx 131072,262144 --kv q4_0 --prompt-tokens 4096 \
        --n-gen 32 --steps 6 --json "$OUT/step_bench_long.json" 2>&1 | grep "^|"
    log "the memory plan at 256K by part (q4_0 KV, budget 22, greedy)"
    python3 - "$T" "$D" <<'PY' 2>&1 | grep -v "^$"
import sys
from lucebox._native import memory_plan
p = memory_plan(sys.argv[1], sys.argv[2], max_ctx=262144, kv_type="q4_0", device=0, max_tree=64, verify_nodes=23,
                draft_top_k=8, log_level="debug")
print(" ".join(f"{k} {v / 2**20:.1f}" for k, v in p.items()), f"total {sum(p.values()) / 2**20:.1f} MiB")
PY
    log "llama.cpp prefill at 32K (pp32768, f16 KV, flash attention) vs lucebox's 32K row above"
    "$LB" -m "$T" -ngl 99 -p 32768 -n 0 -r 1 -fa 1 -o md 2>>"$WORK/llama_bench.err"
    [ -z "$LB_STOCK" ] || "$LB_STOCK" -m "$T" -ngl 99 -p 32768 -n 0 -r 1 -fa 1 -o md 2>>"$WORK/llama_bench.err" | grep pp
    log "the memory planner's choice for a 24 GiB card (max_ctx auto, --vram 24)"
    python3 -m lucebox run --target "$T" --draft "$D" --device cuda --vram 24 --max-ctx auto -n 4 -p "hello" 2>&1 | tail -15
fi

FILL_256K=(--target "$T" --draft "$D" --ctx 262144 --kv q4_0 --draft-weights q8_0 --n-gen 16 --steps 4)
case "${LUCEBOX_BENCH_FILLED_256K:-0}" in
    # the 24 GiB goal at 256K, context filled, with the draft stored as Q8_0. The ~262K-token prefill outlasts
    # one device call (10 min), so it runs in two calls on one warm machine: `save` prefills 160K tokens and
    # writes the engine state under $WORK (~3 GB), `resume` loads it, prefills the rest and measures.
    save)
        log "a filled 256K context, part 1: prefill 160K tokens, save the state"
        python3 benchmarks/step_bench.py "${FILL_256K[@]}" --save-state "$WORK/fill-256k.state" --save-at 160000 \
            2>&1 | grep "^|" ;;
    resume)
        log "a filled 256K context, q4_0 KV, Q8_0 draft, part 2: the rest of the prompt, peak GPU memory"
        python3 benchmarks/step_bench.py "${FILL_256K[@]}" --load-state "$WORK/fill-256k.state" \
            --json "$OUT/step_bench_256k.json" 2>&1 | grep "^|" ;;
esac

if [ "${LUCEBOX_BENCH_DEPTH:-0}" = 1 ]; then
    # the step with the context filled (~130K-token prompt: ~2 min) vs at 4K, q4_0 KV; GPU MiB is the peak at depth
    log "at depth: AR and verify with a 4K vs a 128K context filled, q4_0 KV"
    python3 benchmarks/step_bench.py --target "$T" --draft "$D" --ctx 4096,131072 --kv q4_0 --n-gen 32 --steps 6 \
        --json "$OUT/step_bench_depth.json" 2>&1 | grep "^|"
fi
