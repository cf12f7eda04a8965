#!/usr/bin/env bash
# GPU benchmark tables, all measured in one run on one machine:
#   copy bandwidth, llama.cpp llama-bench tg128 vs lucebox AR on a 27B-shaped synthetic Q4_K_M,
#   per-step speculative timings (27B-shaped random BF16 draft) at 8K and 32K with each GGML_CUDA_LBQ
#   mode, and (LUCEBOX_BENCH_FULL=1, the default) Q8_0-KV AR and tree-op timings.
#   bash benchmarks/device/bench.sh BUILD_DIR WORK_DIR OUT_DIR
set -uo pipefail
BUILD="$1"; WORK="$2"; OUT="$3"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
T="$WORK/synth-27b-q4_k_m.gguf"; D="$WORK/synth-27b-dflash"

log() { echo "== $(date +%T) $*"; }

[ -f "$T" ] || bash benchmarks/device/synth.sh "$WORK" >"$WORK/synth.log" 2>&1 || tail "$WORK/synth.log"

log "copy bandwidth"
COPY_GBS=$(python3 - <<'PY'
import torch
n = 1 << 30  # 4 GiB of f32 per buffer
a = torch.randn(n, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    s.record(); b.copy_(a); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
ts.sort()
print(f"{2 * a.numel() * 4 / ts[len(ts) // 2] / 1e9:.0f}")
PY
)
echo "copy bandwidth (read + write): $COPY_GBS GB/s"

log "llama.cpp llama-bench tg128 (same pin, same ggml build)"
LB="$(find "$BUILD" -name llama-bench -type f -perm -u+x | head -1)"
"$LB" -m "$T" -ngl 99 -p 0 -n 128 -r 3 -fa 0,1 -o md 2>"$WORK/llama_bench.err"

log "lucebox AR + speculative step timings (small-batch K-quant kernel on verify batches: GGML_CUDA_LBQ=1)"
python3 benchmarks/step_bench.py --target "$T" --draft "$D" --ctx "${LUCEBOX_BENCH_CTX:-8192,32768}" --n-gen 128 --steps 10 \
    --copy-gbs "$COPY_GBS" --json "$OUT/step_bench.json" 2>&1

# the same step with ggml's own kernels only (0) and with the small-batch kernel on one-token steps too (2)
for mode in 0 2; do
    log "lucebox AR + speculative step, GGML_CUDA_LBQ=$mode"
    GGML_CUDA_LBQ=$mode python3 benchmarks/step_bench.py --target "$T" --draft "$D" --ctx 8192 --n-gen 64 \
        --steps 10 --copy-gbs "$COPY_GBS" 2>&1 | grep "^|"
done

if [ "${LUCEBOX_BENCH_FULL:-1}" = 1 ]; then
    log "lucebox AR with a Q8_0 KV cache (head size 256)"
    python3 benchmarks/step_bench.py --target "$T" --kv q8_0 --n-gen 64 2>&1 | tail -3
    log "tree ops"
    "$BUILD/tree_ops_check" bench --backend cuda 2>&1
fi
