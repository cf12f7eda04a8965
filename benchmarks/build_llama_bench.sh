#!/usr/bin/env bash
# Build stock llama.cpp's llama-bench from the pinned sdist (the AR baseline of the GPU benchmark).
#   bash benchmarks/build_llama_bench.sh BUILD_DIR [--cpu]
# CUDA for sm_90 by default; --cpu builds a CPU-only binary (a local check that the tree compiles).
# Source: vendor/src/llama.cpp from `python3 vendor/materialize.py --with-llama`, whose ggml/ is the
# pin's own, unpatched ggml (vendor/src/ggml carries our patches and is not used here).
# Prints the path of the built binary last. Jobs: $JOBS, else all cores.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="$ROOT/vendor/src/llama.cpp"
source "$ROOT/benchmarks/usage.sh"
help_if_asked "$0" "$@"

usage() { echo "usage: $0 BUILD_DIR [--cpu]" >&2; exit 2; }
[ $# -ge 1 ] || usage
BUILD="$1"; shift
backend=cuda
for a in "$@"; do
    case "$a" in
        --cpu) backend=cpu ;;
        *) echo "build_llama_bench: unknown option $a" >&2; usage ;;
    esac
done

if [ ! -f "$SRC/CMakeLists.txt" ] || [ ! -f "$SRC/ggml/CMakeLists.txt" ]; then
    # The GPU machine is offline: materialize where the sdist is cached and carry vendor/src.
    if [ -f "$ROOT/vendor/cache/llama_cpp_python-0.3.36.tar.gz" ] || [ -n "${LUCEBOX_SDIST:-}" ]; then
        python3 "$ROOT/vendor/materialize.py" --with-llama
    else
        echo "build_llama_bench: $SRC is incomplete; run 'python3 vendor/materialize.py --with-llama'" \
             "and carry vendor/src" >&2
        exit 1
    fi
fi

backend_flags=(-DGGML_CUDA=OFF)
if [ "$backend" = cuda ]; then
    nvcc="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
    [ -x "$nvcc" ] || { echo "build_llama_bench: nvcc not found; set CUDACXX or pass --cpu" >&2; exit 1; }
    export CUDACXX="$nvcc"
    backend_flags=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
fi
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)

# Only what llama-bench needs: no tests, examples, server, unified app, HTTPS; the build number
# and commit are fixed so the version line names the pin, not whatever git repository encloses it.
cmake -S "$SRC" -B "$BUILD" ${generator[@]+"${generator[@]}"} -DCMAKE_BUILD_TYPE=Release "${backend_flags[@]}" \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_NUMBER=0 -DLLAMA_BUILD_COMMIT=llama-cpp-python-0.3.36
cmake --build "$BUILD" --target llama-bench -j "${JOBS:-$(nproc)}"

bin="$BUILD/bin/llama-bench"
[ -x "$bin" ] || { echo "build_llama_bench: build finished but $bin is missing" >&2; exit 1; }
echo "$bin"
