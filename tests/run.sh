#!/usr/bin/env bash
# The test command (README, CI): set up a venv, build liblucebox + its tools, run pytest.
#   bash tests/run.sh [pytest args...]
# With no arguments it also runs the lossless tests on a second CPU build without AVX-512 (see below).
# Environment: LUCEBOX_CUDA=ON builds for the GPU too; LUCEBOX_VENV overrides the venv folder;
# LUCEBOX_TEST_BACKEND=cuda runs the native tests on the GPU; LUCEBOX_CPU_VARIANTS=0 skips the second build.
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
    # torch 2.13.0 CPU is what the test oracles need (transformers' Qwen3.5, the dflash draft);
    # gguf and safetensors are test-only (pyproject's `test` extra): the package reads both formats itself;
    # matplotlib is the `plot` extra (bench's PNG).
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q "torch==2.13.0" "transformers==5.23.0" numpy huggingface_hub \
        tokenizers click tqdm jinja2 fastapi uvicorn pytest hypothesis openai anthropic httpx gguf safetensors \
        matplotlib
    # dflash pins heavyweight extras it does not need for its model code.
    "$PY" -m pip install -q --no-deps "dflash==0.1.0"
fi

build() {  # build DIR [cmake options...]
    cmake -S "$ROOT" -B "$1" -G Ninja -DLUCEBOX_CUDA="${LUCEBOX_CUDA:-OFF}" \
        ${LUCEBOX_CUDA_ARCHS:+-DLUCEBOX_CUDA_ARCHS="$LUCEBOX_CUDA_ARCHS"} -DLUCEBOX_BUILD_TOOLS=ON "${@:2}" >/dev/null
    cmake --build "$1" -j "$JOBS"
}

run_pytest() {  # run_pytest BUILD_DIR [pytest args...]
    set +e
    LUCEBOX_LIB="$1/liblucebox.so" LUCEBOX_TOOLS_DIR="$1" "$PY" -m pytest -q "${@:2}"
    local rc=$?
    set -e
    if [ "$rc" = 5 ]; then
        echo "tests/run.sh: pytest collected no tests: that is a failure here" >&2
        return 1
    fi
    return "$rc"
}

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
build "$BUILD"
rc=0
run_pytest "$BUILD" "$@" || rc=$?

# Speculative output must equal AR bit for bit on every CPU, and CI hosts differ (some lack AVX-512):
# a full run (no pytest arguments) also builds the portable AVX2/FMA variant (ggml's non-native x86
# build: no AVX-512, no VNNI) and runs the lossless tests against it. LUCEBOX_CPU_VARIANTS=0 skips it.
if [ $# -eq 0 ] && [ "${LUCEBOX_CUDA:-OFF}" != ON ] && [ "${LUCEBOX_CPU_VARIANTS:-1}" = 1 ] \
        && [ "$(uname -m)" = x86_64 ]; then
    VARIANT="${BUILD}-avx2"
    echo "tests/run.sh: lossless tests again on the AVX2 build (no AVX-512) in $VARIANT"
    build "$VARIANT" -DGGML_NATIVE=OFF
    run_pytest "$VARIANT" tests/test_tree_ops.py tests/test_target.py tests/test_engine.py tests/test_draft.py \
        tests/test_default_pair.py tests/test_engine_sampling.py tests/test_state.py tests/test_draft_window.py \
        tests/test_kv_types.py tests/test_prefill_chunks.py || rc=$?
fi
exit "$rc"
