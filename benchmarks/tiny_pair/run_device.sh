#!/usr/bin/env bash
# Train the embedded default pair on the lent GPU machine: every stage in one command (~9 min).
#   bash benchmarks/tiny_pair/run_device.sh [--preset full|calib]
# Carry `.whl` (transformers 5.23.0, dflash 0.1.0, gguf wheels) and `vendor/src/llama.cpp` (the
# materialized converter). Outputs go to $OUT (the device channel's folder; else build/tiny_pair):
# target.gguf, draft/{config.json,model.safetensors}, tokenizer.json, heldout_prompts.jsonl,
# train_log.json, MODEL_CARD.md. Place target.gguf and draft/ under lucebox/models/default/.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
source "$ROOT/benchmarks/usage.sh"
help_if_asked "$0" "$@"
cd "$ROOT"
OUT="${OUT:-$ROOT/build/tiny_pair}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if [ ! -f vendor/src/llama.cpp/convert_hf_to_gguf.py ]; then
    echo "vendor/src/llama.cpp is missing: run python3 vendor/materialize.py here, then carry it" >&2
    exit 1
fi
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
exec python3 -m benchmarks.tiny_pair.train_all --out "$OUT" --work /tmp/tiny_pair_work "$@"
