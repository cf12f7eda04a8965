#!/usr/bin/env bash
# The test command (README, CI): set up a venv, build liblucebox + its tools, run pytest.
#   bash tests/run.sh [pytest args...]
# Environment: LUCEBOX_CUDA=ON builds for the GPU too; LUCEBOX_VENV overrides the venv folder;
# LUCEBOX_TEST_BACKEND=cuda runs the native tests on the GPU.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
VENV="${LUCEBOX_VENV:-$ROOT/.venv}"
BUILD="${LUCEBOX_BUILD_DIR:-$ROOT/build/$([ "${LUCEBOX_CUDA:-OFF}" = ON ] && echo cuda || echo cpu)}"
JOBS="${JOBS:-$(nproc)}"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
if [ "${LUCEBOX_SKIP_INSTALL:-0}" != 1 ]; then
    # torch 2.13.0 CPU is what the test oracles need (transformers' Qwen3.5, the dflash draft).
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q "torch==2.13.0" "transformers==5.23.0" numpy gguf safetensors huggingface_hub \
        tokenizers click tqdm jinja2 fastapi uvicorn pytest hypothesis openai anthropic httpx
    # dflash pins heavyweight extras it does not need for its model code.
    "$PY" -m pip install -q --no-deps "dflash==0.1.0"
fi

cmake -S "$ROOT" -B "$BUILD" -G Ninja -DLUCEBOX_CUDA="${LUCEBOX_CUDA:-OFF}" \
    ${LUCEBOX_CUDA_ARCHS:+-DLUCEBOX_CUDA_ARCHS="$LUCEBOX_CUDA_ARCHS"} -DLUCEBOX_BUILD_TOOLS=ON >/dev/null
cmake --build "$BUILD" -j "$JOBS"

export LUCEBOX_LIB="$BUILD/liblucebox.so" LUCEBOX_TOOLS_DIR="$BUILD"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
set +e
"$PY" -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
    echo "tests/run.sh: pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$rc"
