#!/usr/bin/env bash
# Write the 27B-shaped synthetic target (Q4_K_M, with an MTP block like recent conversions) and
# the 27B-shaped random BF16 DFlash draft into WORK_DIR.   bash benchmarks/device/synth.sh WORK_DIR
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
source "$ROOT/benchmarks/usage.sh"
help_if_asked "$0" "$@"
[ $# -eq 1 ] || { print_usage "$0" >&2; exit 2; }
WORK="$1"
mkdir -p "$WORK"
T="$WORK/synth-27b-q4_k_m.gguf"; D="$WORK/synth-27b-dflash"
[ -f "$T" ] || python3 "$ROOT/benchmarks/synth_target.py" --out "$T" --seed 1 --threads 4
[ -f "$D/model.safetensors" ] || python3 "$ROOT/benchmarks/synth_draft.py" --out "$D" --seed 1 --threads 4
ls -la "$T" "$D"
