#!/usr/bin/env bash
# One script for the lent GPU machine: build (CUDA, sm_90a, all cores), GPU tests, benchmarks.
#   bash benchmarks/device/run.sh [stage...]     stages: synth build kernels mulmat mmcheck test bench pair profile
#                                                profab serverbench attnprof ab lbqprof lbqprefprof lbqsass stock
#                                                patchab libab wgmma probe kprobes attn depth all (default: all)
# LUCEBOX_CUDA_ARCHS: the architecture the build and stock stages compile for (default 90a: Hopper-only
# instructions such as wgmma, the invariant attention's H100 path; 90 leaves them out).
# The machine has no network: carry vendor/src (materialized ggml + llama.cpp) and .whl (wheels:
# gguf, dflash, transformers) with the call. Results go under $OUT in few files (at most 8 come back).
# The call's 64 MiB: with the repo's own files (~24 MB) they no longer fit whole; the stock copy of ggml in
# vendor/src/llama.cpp/ggml (for benchmarks/build_llama_bench.sh) can stay behind but for its cmake/, which
# llama.cpp's CMake includes: `rm -rf vendor/src/llama.cpp/ggml/{src,include}` (materialize.py --force restores it).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
source "$ROOT/benchmarks/usage.sh"
help_if_asked "$0" "$@"
cd "$ROOT"
OUT="${OUT:-$ROOT/build/device-out}"
mkdir -p "$OUT"
# Everything printed also goes to $OUT/run.log: a call cut off at the lease's limit still brings back what ran
# (a pipe to `tail` in the call's command returns nothing then).
exec > >(tee -a "$OUT/run.log") 2>&1
JOBS="$(nproc)"
ARCHS="${LUCEBOX_CUDA_ARCHS:-90a}"
BUILD="$ROOT/build/cuda"
WORK="${LUCEBOX_DEVICE_WORK:-/tmp/lucebox-device}"   # big generated files (not brought back)
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1

log() { echo "== $(date +%T) $*"; }

setup_python() {
    if [ -d .whl ] && [ ! -d /tmp/site ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl || exit 1
    fi
    # the pinned gguf-py (newer than the wheel) first: the synthetic-model writer uses it
    export PYTHONPATH="$ROOT/vendor/src/llama.cpp/gguf-py:/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
}

stage_build() {
    log "build liblucebox (CUDA $ARCHS, $JOBS jobs)"
    # llama-bench (the baseline) builds in the same tree against the same ggml targets.
    cmake -S . -B "$BUILD" -G Ninja -DLUCEBOX_CUDA=ON -DLUCEBOX_CUDA_ARCHS="$ARCHS" -DLUCEBOX_BUILD_TOOLS=ON \
        -DLUCEBOX_GGML_DIR="$ROOT/vendor/src/ggml" -DLUCEBOX_LLAMA_DIR="$ROOT/vendor/src/llama.cpp" \
        >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; return 1; }
    local t0=$SECONDS
    # -k 0: a failing baseline build must not stop ours (and vice versa); checked below.
    cmake --build "$BUILD" -j "$JOBS" --target ${LUCEBOX_BUILD_TARGETS:-all llama-bench} -- -k 0 >>"$OUT/build.log" 2>&1 \
        || grep -m5 -B2 -A8 "error" "$OUT/build.log"
    local slow
    slow="$(slowest_jobs)"
    echo "$slow" >>"$OUT/build.log"
    echo "$slow" | head -6
    [ -f "$BUILD/liblucebox.so" ] || return 1
    echo "build wall $((SECONDS - t0)) s"
}

# The build's ten longest jobs (ninja's log: start and end in ms, then the output), which bound its wall time
slowest_jobs() {
    echo "slowest build jobs (s, output):"
    awk -F'\t' 'NR > 1 { printf "%8.1f %s\n", ($2 - $1) / 1000, $4 }' "$BUILD/.ninja_log" 2>/dev/null | sort -rn | head -10
}

stage_test() {
    log "GPU tests"
    export LUCEBOX_LIB="$BUILD/liblucebox.so" LUCEBOX_TOOLS_DIR="$BUILD" LUCEBOX_TEST_BACKEND=cuda
    # the native modules (tree ops, target oracle, errors, draft parity) and the lossless engine tests
    # (the lossless engine tests first: a short lease cuts the tail)
    local tests=${LUCEBOX_DEVICE_TESTS:-"tests/test_engine.py tests/test_kv_types.py tests/test_draft_window.py
        tests/test_prefill_chunks.py tests/test_memory_plan.py tests/test_default_pair.py tests/test_engine_sampling.py
        tests/test_state.py tests/test_sampling.py tests/test_sample_draw.py tests/test_penalty_window.py
        tests/test_tree_ops.py tests/test_target.py
        tests/test_native_errors.py tests/test_draft.py tests/test_mask_stage.py tests/test_lbq_layout.py
        tests/test_cuda_fusions.py tests/test_cuda_early_loads.py tests/test_call_times.py tests/test_commit_overlap.py
        tests/test_draft_products.py"}
    # shellcheck disable=SC2086
    export LUCEBOX_TEST_CACHE="$WORK/tiny-models"  # the tiny random models, shared with backend_diff
    timeout "${LUCEBOX_TEST_TIMEOUT:-300}" python3 -m pytest -q -rf $tests 2>&1 | tee "$OUT/tests.log" \
        | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300
    log "CUDA vs CPU logits on the tiny target"
    timeout 120 python3 benchmarks/device/backend_diff.py --cache "$LUCEBOX_TEST_CACHE" 2>&1 | grep -v "^\[trans"
}

# the standalone checker of lbq's kernels (it includes them from the materialized tree; nothing is linked)
build_lbq_check() {
    # -use_fast_math as ggml-cuda's kernels build (the SwiGLU values' expf and division round as the library's)
    nvcc -O3 -arch=sm_90 -std=c++17 -use_fast_math -I vendor/src/ggml/include -I vendor/src/ggml/src \
        -I vendor/src/ggml/src/ggml-cuda benchmarks/kernels/lbq_check.cu -o "$WORK/lbq_check"
}

# Whether Hopper's warpgroup MMA rounds as mma.sync does, and its speed against mma.sync (standalone, sm_90a)
stage_wgmma() {
    log "wgmma against mma.sync: bits and throughput (wgmma_check)"
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a benchmarks/kernels/wgmma_check.cu -o "$WORK/wgmma_check" \
        && "$WORK/wgmma_check" 2>&1 | tee "$OUT/wgmma_check.txt"
    return "${PIPESTATUS[0]}"
}

# A candidate structure for the verify tree's attention at depth, timed against nothing but itself (standalone; run
# attn_check's bench in the same call to compare)
stage_probe() {
    log "tree attention probe: rows owned by warps, the online softmax in registers, mma.sync and wgmma"
    # Hopper's wgmma shapes need the arch-specific target (sm_90a); other GPUs run the mma.sync shapes
    local arch=(-arch="sm_$ARCHS")
    [ "${ARCHS%a}" = 90 ] && arch=(-gencode arch=compute_90a,code=sm_90a)
    nvcc -O3 -std=c++17 "${arch[@]}" benchmarks/kernels/tree_attn_probe.cu -o "$WORK/tree_attn_probe" || return 1
    # the mma.sync shapes, then the wgmma ones in a process of their own (a fault or a hang there keeps the first
    # table), then where the wgmma block's tile time goes (clock64 phases), then the cluster shape against the
    # 2-producer block (2.6x slower for the tree at 128K, session 31), then the 2-producer block over a head-major
    # cache against the engine's layout (head-major 4.5% faster for the tree at 128K, session 34)
    local rc=0 part st
    : >"$OUT/tree_attn_probe.txt"
    for part in mma wgmma trace cluster layout; do
        timeout 180 "$WORK/tree_attn_probe" "$part" 2>&1 | tee -a "$OUT/tree_attn_probe.txt"
        st="${PIPESTATUS[0]}"
        [ "$st" = 0 ] && continue
        echo "tree_attn_probe $part: exit $st (124: timed out)" | tee -a "$OUT/tree_attn_probe.txt"
        rc=1
    done
    return $rc
}

# Standalone probes on ggml's headers (no build; LUCEBOX_KPROBES picks): a verify's delta net a token
# (gdn_chain_probe), the draft's BF16 products on ggml's mmf with k cut in pieces (mmf_split_probe), and a pipelined
# BF16 product against mmf (bf16_stream_probe); not by default: 8-bit integer MMA products of 8- and 4-bit weights
# (q8_stream_probe), and patch 0076's q8s kernels checked and timed (q8s_check). Each prints its table to $OUT/NAME.txt
stage_kprobes() {
    log "standalone kernel probes: ${LUCEBOX_KPROBES:-gdn_chain_probe mmf_split_probe bf16_stream_probe}"
    local arch=(-gencode arch=compute_90a,code=sm_90a) p rc=0
    [ "${ARCHS%a}" = 90 ] || arch=(-arch="sm_$ARCHS")
    local inc=(-I vendor/src/ggml/include -I vendor/src/ggml/src -I vendor/src/ggml/src/ggml-cuda)
    for p in ${LUCEBOX_KPROBES:-gdn_chain_probe mmf_split_probe bf16_stream_probe}; do
        nvcc -O3 -std=c++17 "${arch[@]}" "${inc[@]}" "benchmarks/kernels/$p.cu" -o "$WORK/$p" || { rc=1; continue; }
        timeout 240 "$WORK/$p" >"$OUT/$p.txt" 2>&1 || rc=1
        grep -E "DIFFERENT|FAIL|all ok|same bits" "$OUT/$p.txt"
    done
    return $rc
}

stage_kernels() {
    log "small-batch K-quant kernels: exactness, batch invariance, bandwidth (lbq_check)"
    build_lbq_check >"$OUT/lbq.txt" 2>&1 && "$WORK/lbq_check" >>"$OUT/lbq.txt" 2>&1
    local rc=$?
    # the 27B's shapes at 1 / 8 / 23 / 512 columns (random weights) against the other plan, and back to back
    "$WORK/lbq_check" engine >>"$OUT/lbq.txt" 2>&1 || rc=1
    # the layer chain again without programmatic dependent launch, for comparison
    GGML_CUDA_PDL=0 "$WORK/lbq_check" chain >>"$OUT/lbq.txt" 2>&1 || rc=1
    # the chains' timelines: when each kernel's blocks end (the tail of a product)
    "$WORK/lbq_check" trace >>"$OUT/lbq.txt" 2>&1 || rc=1
    # the pipeline an RTX 3090 / 4090 / 5090 takes (99 KiB of shared memory per block)
    GGML_CUDA_INVARIANT_SMEM=101376 "$WORK/lbq_check" check >"$WORK/lbq_99k.txt" 2>&1 || rc=1
    sed 's/^/99k: /' "$WORK/lbq_99k.txt" >>"$OUT/lbq.txt"
    grep -E "FAIL|bench|chain|shared memory|engine shapes" "$OUT/lbq.txt"
    return $rc
}

# mat-mul on ggml-cuda against the CPU backend (mul_mat_check), in both modes and with a 3090's shared memory
stage_mmcheck() {
    log "ggml-cuda vs the CPU backend: mat-mul (mul_mat_check)"
    local rc=0 mode
    for mode in default invariant; do
        echo "mul_mat_check $mode"
        "$BUILD/mul_mat_check" $mode >"$OUT/mul_mat_check_$mode.txt" 2>&1 || rc=1
        grep -E "FAIL|all ok|FAILED" "$OUT/mul_mat_check_$mode.txt"
    done
    # the kernels' shallower pipelines, taken where a GPU gives a block 99 KiB (RTX 3090 / 4090 / 5090)
    echo "mul_mat_check invariant with 99 KiB of shared memory per block"
    GGML_CUDA_INVARIANT_SMEM=101376 "$BUILD/mul_mat_check" invariant >"$WORK/mul_mat_check_99k.txt" 2>&1 || rc=1
    sed 's/^/99k: /' "$WORK/mul_mat_check_99k.txt" >>"$OUT/mul_mat_check_invariant.txt"
    grep -E "FAIL|all ok|FAILED" "$WORK/mul_mat_check_99k.txt"
    return $rc
}

stage_mulmat() {
    log "ggml-cuda vs the CPU backend: mat-mul, top-k (top_k_check), copies, concat, argmax, the residual add + norm"
    local rc=0
    stage_mmcheck || rc=1
    "$BUILD/top_k_check" 2>&1 | tee -a "$OUT/mul_mat_check_default.txt" | grep -E "FAIL|all ok" || rc=1
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    "$BUILD/small_ops_check" 2>&1 | tee -a "$OUT/mul_mat_check_default.txt" | grep -E "FAIL|all ok" || rc=1
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    log "batch-invariant flash attention: tree == AR, prefill == one query, vs CPU, timings (attn_check)"
    timeout "${LUCEBOX_ATTN_TIMEOUT:-240}" "$BUILD/attn_check" ${LUCEBOX_ATTN_ARGS-bench} >"$OUT/attn_check.txt" 2>&1 || rc=1
    grep -E "BAD|FAIL|all ok|^\|" "$OUT/attn_check.txt"
    # the ring an RTX 3090 / 4090 / 5090 takes (99 KiB of shared memory per block), checked here too
    echo "attn_check with 99 KiB of shared memory per block"
    GGML_CUDA_INVARIANT_SMEM=101376 timeout 120 "$BUILD/attn_check" >"$OUT/attn_check_99k.txt" 2>&1 || rc=1
    grep -E "BAD|FAIL|all ok" "$OUT/attn_check_99k.txt"
    return $rc
}

# ab_run NAME DIR TARGET BENCH PATCH...: the A/B loop of patchab and libab, on one machine. BENCH a (A: the tree as it
# is); then for each PATCH (a file; several are each measured alone): applied in DIR as materialize.py applies the
# series, TARGET rebuilt (only what the patch touches recompiles), BENCH b (b1, b2, ... with several), the patch
# reversed. TARGET is left built from the last patched tree: the caller rebuilds it if later stages need A.
ab_run() {
    local name=$1 dir=$2 target=$3 bench=$4 patches=() p i=0 tag t0 rc=0
    shift 4
    for p in "$@"; do
        [ -f "$p" ] || { echo "$name: no patch file '$p'"; return 1; }
        patches+=("$(cd "$(dirname "$p")" && pwd)/$(basename "$p")")
    done
    [ ${#patches[@]} -gt 0 ] || { echo "$name: no patch file given"; return 1; }
    ab_apply() {  # ab_apply PATCH [-R]; git looks for no repository above DIR (plain patching)
        (cd "$dir" && GIT_CEILING_DIRECTORIES="$(dirname "$dir")" git apply ${2:-} -p1 --whitespace=nowarn "$1")
    }
    log "$name: without / with $*"
    echo "A: without"
    "$bench" a || rc=1
    for p in "${patches[@]}"; do
        i=$((i + 1))
        tag=b
        [ ${#patches[@]} -gt 1 ] && tag=b$i
        ab_apply "$p" || { echo "$name: $p does not apply"; rc=1; continue; }
        t0=$SECONDS
        if cmake --build "$BUILD" -j "$JOBS" --target "$target" >>"$OUT/${name}_build.log" 2>&1; then
            echo "B$i: with $(basename "$p") ($tag; $target rebuilt in $((SECONDS - t0)) s)"
            "$bench" "$tag" || rc=1
        else
            grep -m5 -B2 -A8 "error" "$OUT/${name}_build.log"
            rc=1
        fi
        ab_apply "$p" -R || { echo "$name: cannot reverse $p: $dir keeps it (materialize / check out again)"; return 1; }
    done
    return $rc
}

# attn_check bench without and with one more ggml patch, on one machine (attention kernels move by a few percent,
# about what separates two machines): LUCEBOX_AB_PATCH names the patch, a file in the working tree (say a wip
# branch's, `git show BRANCH:vendor/patches/X.patch > ab.patch`), or several (space-separated), each measured alone
# (ab_run; results attn_ab_a.txt, attn_ab_b.txt or attn_ab_b1.txt, attn_ab_b2.txt, ...). liblucebox.so is not
# rebuilt, so later stages run A; the next `build` rebuilds what B left.
stage_patchab() {
    [ -n "${LUCEBOX_AB_PATCH:-}" ] || { echo "patchab: set LUCEBOX_AB_PATCH to one or more patch files"; return 1; }
    [ -x "$BUILD/attn_check" ] || { echo "patchab: run the build stage first"; return 1; }
    attn_bench() {
        timeout "${LUCEBOX_ATTN_TIMEOUT:-240}" "$BUILD/attn_check" bench >"$OUT/attn_ab_$1.txt" 2>&1
        local rc=$?
        grep -E "BAD|FAIL|all ok|^\|" "$OUT/attn_ab_$1.txt"
        return $rc
    }
    # attn_check from the tree as it is first: a patchab before this one reversed its patch in the tree, not in the
    # binary it built (a no-op build otherwise)
    cmake --build "$BUILD" -j "$JOBS" --target attn_check >"$OUT/patchab_build.log" 2>&1 || { echo "patchab: build failed"; return 1; }
    # shellcheck disable=SC2086
    ab_run patchab "$ROOT/vendor/src/ggml" attn_check attn_bench ${LUCEBOX_AB_PATCH:-}
}

# The invariant attention's checks and bench (attn_check: tree == AR, prefill == one query, vs CPU; times against
# ggml's own kernels) with its Hopper path (attn_wg.txt) and without (GGML_CUDA_INVARIANT_WGMMA=0: the mma.sync kernel
# everywhere, attn_mma.txt), on one machine. Needs `build` (LUCEBOX_BUILD_TARGETS may be "lucebox attn_check").
stage_attn() {
    local rc=0 name
    for name in wg mma; do
        echo "attn_check bench, ${name}:"
        # (GGML_CUDA_INVARIANT_WGMMA=1 leaves the Hopper path on where the build has it)
        GGML_CUDA_INVARIANT_WGMMA=$([ "$name" = wg ] && echo 1 || echo 0) timeout "${LUCEBOX_ATTN_TIMEOUT:-240}" \
            "$BUILD/attn_check" bench >"$OUT/attn_$name.txt" 2>&1 || rc=1
        grep -E "BAD|FAIL|all ok|q4_0 \| (4096|131072)" "$OUT/attn_$name.txt"
    done
    return $rc
}

# The depth bench: the decode step at 4K and 128K over a q4_0 cache (issue 19's ratios: AR and verify at 128K against
# 4K), step_bench with LUCEBOX_DEPTH_ARGS, results in depth.json
stage_depth() {
    export LUCEBOX_LIB="$BUILD/liblucebox.so"
    synth_ready || return 1
    local args=(${LUCEBOX_DEPTH_ARGS:---ctx 4096,131072 --kv q4_0 --n-gen 32 --steps 6})
    python3 benchmarks/step_bench.py --target "$WORK/synth-27b-q4_k_m.gguf" --draft "$WORK/synth-27b-dflash" \
        "${args[@]}" --json "$OUT/depth.json" 2>&1 | tee "$OUT/depth.txt" | grep "^|"
    return "${PIPESTATUS[0]}"
}

# The decode step without and with a patch to lucebox's own sources (native/, the engine: say `git diff main
# BRANCH -- native > lib.patch`), or several, on one machine: after `build` (and `synth`), step_bench
# (LUCEBOX_LIBAB_ARGS, default the depth bench's 4K and 128K rows) for the tree as it is (libab_a.json), then for each
# patch applied, liblucebox rebuilt (libab_b.json, or libab_b1.json, ...); liblucebox is rebuilt from the tree after.
stage_libab() {
    [ -n "${LUCEBOX_LIBAB_PATCH:-}" ] || { echo "libab: set LUCEBOX_LIBAB_PATCH to one or more patch files"; return 1; }
    export LUCEBOX_LIB="$BUILD/liblucebox.so"
    synth_ready || return 1
    local args=(${LUCEBOX_LIBAB_ARGS:---ctx 4096,131072 --kv q4_0 --n-gen 32 --steps 6}) rc=0
    libab_bench() {
        python3 benchmarks/step_bench.py --target "$WORK/synth-27b-q4_k_m.gguf" --draft "$WORK/synth-27b-dflash" \
            "${args[@]}" --json "$OUT/libab_$1.json" 2>&1 | grep "^|"
    }
    # shellcheck disable=SC2086
    ab_run libab "$ROOT" lucebox libab_bench ${LUCEBOX_LIBAB_PATCH:-} || rc=1
    cmake --build "$BUILD" -j "$JOBS" --target lucebox >>"$OUT/libab_build.log" 2>&1 || rc=1
    return $rc
}

stage_profile() {
    log "per-kernel profile of the decode stages (27B-shaped synthetic pair)"
    export LUCEBOX_LIB="$BUILD/liblucebox.so"
    synth_ready || return 1
    # without dependent launch: kernels then run one after another, so their times add up
    GGML_CUDA_PDL=0 python3 benchmarks/profile_step.py --target "$WORK/synth-27b-q4_k_m.gguf" --draft "$WORK/synth-27b-dflash" \
        --ctx 8192 2>&1 | tee "$OUT/profile.md"
    # with it, as users run: what each component adds to the device time once kernels overlap (exposed time)
    python3 benchmarks/profile_step.py --target "$WORK/synth-27b-q4_k_m.gguf" --draft "$WORK/synth-27b-dflash" \
        --ctx 8192 --overlap 2>&1 | grep -v -E "Warning|_warn_once" | tee -a "$OUT/profile.md"
    log "llama.cpp batch sweep: time to process 1..32 tokens in one batch"
    "$(find "$BUILD" -name llama-bench -type f -perm -u+x | head -1)" -m "$WORK/synth-27b-q4_k_m.gguf" -ngl 99 \
        -p 1,8,16,23,32 -n 0 -r 3 -fa 1 -o md 2>/dev/null | tee "$OUT/llama_batch.md"
}

stage_attnprof() {
    log "Nsight Compute on the invariant attention kernels (attn_check profile)"
    # durations and occupancy of each kernel (scan, index, mma, merge); LUCEBOX_ATTNPROF=hot adds the hottest SASS
    # lines of the two deepest mma launches (~2 min), =full also the memory and source sections and a stall-reason
    # pass over every mma launch (several minutes more)
    local sections=(--section SpeedOfLight --section Occupancy --section LaunchStats)
    [ "${LUCEBOX_ATTNPROF:-}" = full ] && sections+=(--section WarpStateStats --section SourceCounters
                                                     --section MemoryWorkloadAnalysis)
    timeout 300 ncu -k regex:fattn_invariant "${sections[@]}" "$BUILD/attn_check" profile >"$OUT/attn_ncu.txt" 2>&1
    grep -E "fattn_invariant|Duration|Achieved Occupancy|Registers Per|Stall" "$OUT/attn_ncu.txt" | head -80
    case "${LUCEBOX_ATTNPROF:-}" in hot|full) ;; *) return 0 ;; esac
    # where the warps wait (stall reasons per kernel)
    [ "${LUCEBOX_ATTNPROF:-}" = full ] && { timeout 200 ncu -k regex:"fattn_invariant_(mma|wg)" --section WarpStateStats \
        --print-details body "$BUILD/attn_check" profile >"$OUT/attn_ncu_stalls.txt" 2>&1 || true; }
    # ... and by SASS line for the last two launches of the Q4_0 block of `attn_check profile` (LUCEBOX_ATTNPROF_KERNEL:
    # fattn_invariant_wg where the build has the Hopper path, else fattn_invariant_mma): the last is one query at 128K,
    # the one before it (part of) the 23-node tree at 128K (the launches of the first pass, in order, say which)
    # (the name up to its template or parameter list: fattn_invariant_wg, not fattn_invariant_wg_merge)
    local n_mma name skip kernel=${LUCEBOX_ATTNPROF_KERNEL:-fattn_invariant_wg}
    grep -qE "$kernel[<(].*Context" "$OUT/attn_ncu.txt" || kernel=fattn_invariant_mma
    n_mma=$(grep -cE "$kernel[<(].*Context" "$OUT/attn_ncu.txt")
    for name in tree_128k 1q_128k; do
        if [ "$name" = tree_128k ]; then skip=$((n_mma - 2)); else skip=$((n_mma - 1)); fi
        [ "$skip" -ge 0 ] || continue
        timeout 150 ncu --kernel-name-base demangled -k regex:"$kernel[<(]" --launch-skip "$skip" --launch-count 1 \
            --section WarpStateStats \
            --section SourceCounters -f -o "$WORK/attn_$name" "$BUILD/attn_check" profile >/dev/null 2>&1 &&
            ncu -i "$WORK/attn_$name.ncu-rep" --page source --csv --print-source sass >"$WORK/attn_sass.csv" 2>&1 &&
            python3 benchmarks/device/sass_hot.py "$WORK/attn_sass.csv" 80 >"$OUT/attn_sass_hot_$name.txt" 2>&1 || true
    done
}

stage_lbqprof() {
    log "Nsight Compute on lbq's products at 1 and 23 columns (lbq_check profile)"
    [ -x "$WORK/lbq_check" ] || build_lbq_check || return 1
    timeout 300 ncu -k regex:gemm --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats "$WORK/lbq_check" profile \
        >"$OUT/lbq_ncu.txt" 2>&1
    grep -E "lbq::gemm|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Waves Per SM|Stall|Issued Warp" \
        "$OUT/lbq_ncu.txt" | head -120
}

# The instruction mix of lbq's unit loop (benchmarks/device/sass_mix.py: by opcode and by pipe) in the decode kernels
# lbq_check compiles: the fused one-column Q4_K and Q6_K launches, the staged ones of 3 n-tiles (a verify's 23
# columns). No GPU work: cuobjdump reads the binary. (Shorter unit loops made the one-column product faster, NOTES.)
stage_lbqsass() {
    log "SASS mix of lbq's unit loop (lbq_check, cuobjdump)"
    [ -x "$WORK/lbq_check" ] || build_lbq_check || return 1
    cuobjdump -sass "$WORK/lbq_check" >"$WORK/lbq_check.sass" || return 1
    local k
    for k in gemmILNS_4KindE0ELi1ELb1ELi3ELb0ELb0EEEv gemmILNS_4KindE1ELi1ELb1ELi2ELb0ELb0EEEv \
        gemmILNS_4KindE0ELi3ELb0ELi3ELb0ELb0EEEv gemmILNS_4KindE1ELi3ELb0ELi2ELb0ELb0EEEv; do
        python3 benchmarks/device/sass_mix.py "$k" <"$WORK/lbq_check.sass"
    done | tee "$OUT/lbq_sass_mix.txt"
}

stage_lbqprefprof() {
    log "Nsight Compute on lbq's prefill products at kMaxLaunchN columns (lbq_check profile_prefill)"
    [ -x "$WORK/lbq_check" ] || build_lbq_check || return 1
    timeout 300 ncu --clock-control none -k regex:gemm --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section InstructionStats "$WORK/lbq_check" profile_prefill >"$OUT/lbq_prefill_ncu.txt" 2>&1
    grep -E "lbq::gemm|Duration|Throughput|Pipe|Achieved Occupancy|Registers Per|Waves Per SM|Stall|Issued Warp|Active" \
        "$OUT/lbq_prefill_ncu.txt" | head -120
    # the hottest SASS lines of the first (ffn gate|up) launch
    timeout 200 ncu --clock-control none -k regex:gemm --launch-count 1 --section WarpStateStats --section SourceCounters -f \
        -o "$WORK/lbq_prefill" "$WORK/lbq_check" profile_prefill >/dev/null 2>&1 &&
        ncu -i "$WORK/lbq_prefill.ncu-rep" --page source --csv --print-source sass >"$WORK/lbq_prefill_sass.csv" 2>&1 &&
        python3 benchmarks/device/sass_hot.py "$WORK/lbq_prefill_sass.csv" 60 >"$OUT/lbq_prefill_sass_hot.txt" 2>&1 || true
}

wait_synth() { if [ -n "${synth_pid:-}" ]; then wait "$synth_pid"; synth_pid=; fi; }

# the synthetic pair on disk: the background writer's, else written now
synth_ready() {
    wait_synth
    [ -f "$WORK/synth-27b-q4_k_m.gguf" ] || bash benchmarks/device/synth.sh "$WORK" >"$WORK/synth.log" 2>&1 \
        || { tail "$WORK/synth.log"; return 1; }
}

stage_bench() {
    log "benchmarks"
    export LUCEBOX_LIB="$BUILD/liblucebox.so"
    wait_synth
    bash benchmarks/device/bench.sh "$BUILD" "$WORK" "$OUT"
}

stage_serverbench() {
    log "lucebox serve vs Engine.generate (27B-shaped synthetic pair): streamed tok/s, overhead, TTFT at 16K"
    export LUCEBOX_LIB="$BUILD/liblucebox.so"
    synth_ready || return 1
    python3 benchmarks/server_bench.py --target "$WORK/synth-27b-q4_k_m.gguf" --draft "$WORK/synth-27b-dflash" \
        --device cuda --prompt-tokens 16384 --n-gen 128 --json "$OUT/server_bench.json" 2>&1 | tail -12
}

# Interleaved A/B of the decode step on one warm machine (ratios hold only within one): step_bench at 8K once per
# configuration per round. LUCEBOX_AB: configurations separated by ';', each environment assignments, then
# step_bench flags (an empty one: the defaults), e.g. LUCEBOX_AB='GGML_CUDA_CPY_MEMCPY=1;' ; LUCEBOX_AB_ROUNDS
# (default 3). The default compares lbq's classic split-K (wave_plan) with its default plan (slot_plan). Flags come
# after the 8K ones and win, so a configuration may bench another depth:
# 'LUCEBOX_KV_LAYOUT=key --ctx 131072 --kv q4_0'.
# each_config FN CONFIGS: $FN INDEX ENV... FLAG... for each ';'-separated configuration of CONFIGS (its leading
# NAME=VALUE words, then step_bench's or profile_step's flags and their values; a trailing ';': an empty one). FN may
# hold words of its own before INDEX (unquoted: no spaces inside them). Fails where any call failed.
each_config() {
    local fn=$1 configs=$2 i=0 cfg rc=0
    local -a cfgs
    IFS=';' read -ra cfgs <<< "$configs"
    [ "${configs: -1}" = ";" ] && cfgs+=("")  # a trailing ';' is an empty configuration (read drops it)
    for cfg in "${cfgs[@]}"; do
        # shellcheck disable=SC2086
        $fn "$i" $cfg || rc=1
        i=$((i + 1))
    done
    return $rc
}

# config_run CMD... -- CONFIG...: CMD under a configuration (as each_config passes it): its NAME=VALUE words as
# environment, its other words appended to CMD
config_run() {
    local -a cmd=() envs=() flags=()
    local w
    while [ "$1" != -- ]; do cmd+=("$1"); shift; done
    shift
    for w in "$@"; do
        if [ ${#flags[@]} = 0 ] && [[ $w == [A-Za-z_]*=* ]]; then envs+=("$w"); else flags+=("$w"); fi
    done
    env ${envs[@]+"${envs[@]}"} "${cmd[@]}" ${flags[@]+"${flags[@]}"}
}

# ab_one ROUND INDEX CONFIG...: one step_bench at 8K under a configuration, its result rows
ab_one() {
    local round=$1
    shift 2
    echo "round $round: ${*:-defaults}"
    config_run python3 benchmarks/step_bench.py --target "$WORK/synth-27b-q4_k_m.gguf" \
        --draft "$WORK/synth-27b-dflash" --ctx 8192 --n-gen 128 --steps 10 -- "$@" 2>&1 \
        | grep -E "^\| (AR decode|[0-9]+ \|)"
}

stage_ab() {
    local configs="${LUCEBOX_AB-GGML_CUDA_LBQ_WAVES=1;}" r rc=0
    log "interleaved A/B, step_bench at 8K: $configs"
    export LUCEBOX_LIB="$BUILD/liblucebox.so"
    synth_ready || return 1  # a fresh machine (a call without `synth` after the last one went back) writes it now
    for r in $(seq "${LUCEBOX_AB_ROUNDS:-3}"); do
        each_config "ab_one $r" "$configs" || rc=1
    done
    return $rc
}

# profab_one INDEX CONFIG...: the per-kernel profile under a configuration into $OUT/profab_INDEX.md; its draft,
# commit and prefill tables (LUCEBOX_PROFAB_TOP: the kernels a table lists, default 12)
profab_one() {
    local i=$1
    shift
    echo "profile $i: ${*:-defaults}"
    GGML_CUDA_PDL=0 config_run python3 benchmarks/profile_step.py --target "$WORK/synth-27b-q4_k_m.gguf" \
        --draft "$WORK/synth-27b-dflash" --ctx 8192 --calls 3 --top "${LUCEBOX_PROFAB_TOP:-12}" -- "$@" \
        >"$OUT/profab_$i.md" 2>&1
    grep -E -A8 "^### (draft|commit|prefill)" "$OUT/profab_$i.md" | cut -c1-160
}

# The per-kernel profile (dependent launch off: kernels one after another, their times add up) once for each
# configuration of LUCEBOX_AB (as stage ab reads it, default: the defaults and GGML_CUDA_BF16_STREAM=0): the draft,
# commit and prefill kernels of each, to see where an A/B's difference comes from. $OUT/profab_N.md has it all.
stage_profab() {
    local configs="${LUCEBOX_AB-;GGML_CUDA_BF16_STREAM=0}"
    log "per-kernel profiles, one for each configuration: $configs"
    export LUCEBOX_LIB="$BUILD/liblucebox.so"
    synth_ready || return 1
    each_config profab_one "$configs"
}

stage_pair() {
    log "embedded default pair: AR vs chain vs DDTree (real acceptance)"
    export LUCEBOX_LIB="$BUILD/liblucebox.so"
    python3 -m lucebox bench --device cuda --n-gen 128 --chain --json "$OUT/tiny_pair.json" 2>&1
}

# llama.cpp as its users have it: llama-bench built on the pin's stock ggml (our patches reversed; ~4.5 min).
# bench's llama-bench links our patched ggml, whose kernels (the delta net's among them) llama.cpp then uses too;
# `run.sh stock all` puts the stock numbers next to them (bench then runs both).
stage_stock() {
    log "llama-bench on the pin's stock ggml: prefill 4K / 32K at ub 512, tg128"
    local stock="$WORK/stock" t0=$SECONDS p
    rm -rf "$stock" && mkdir -p "$stock" && cp -r vendor/src/ggml "$stock/ggml" && ln -s "$ROOT/vendor/src/llama.cpp" "$stock/llama.cpp"
    for p in $(ls -r vendor/patches/*.patch); do
        (cd "$stock/ggml" && GIT_CEILING_DIRECTORIES="$WORK" git apply -R -p1 --whitespace=nowarn "$ROOT/$p") \
            || { echo "cannot reverse $p"; return 1; }
    done
    cmake -S . -B "$ROOT/build/stock" -G Ninja -DLUCEBOX_CUDA=ON -DLUCEBOX_CUDA_ARCHS="$ARCHS" -DLUCEBOX_BUILD_TOOLS=ON \
        -DLUCEBOX_GGML_DIR="$stock/ggml" -DLUCEBOX_LLAMA_DIR="$stock/llama.cpp" >"$OUT/stock_build.log" 2>&1 &&
        cmake --build "$ROOT/build/stock" -j "$JOBS" --target llama-bench >>"$OUT/stock_build.log" 2>&1 \
        || { tail -20 "$OUT/stock_build.log"; return 1; }
    echo "stock build wall $((SECONDS - t0)) s"
    synth_ready || return 1
    local lb t="$WORK/synth-27b-q4_k_m.gguf"
    lb="$(find "$ROOT/build/stock" -name llama-bench -type f -perm -u+x | head -1)"
    "$lb" -m "$t" -p 4096 -n 0 -r 3 -fa 1 -b 2048 -ub 512 -o md 2>/dev/null | tee "$OUT/llama_stock.md"
    "$lb" -m "$t" -p 32768 -n 0 -r 1 -fa 1 -b 2048 -ub 512 -o md 2>/dev/null | grep pp | tee -a "$OUT/llama_stock.md"
    "$lb" -m "$t" -p 0 -n 128 -r 3 -fa 1 -o md 2>/dev/null | grep tg | tee -a "$OUT/llama_stock.md"
}

setup_python
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(all)
# the machine is offline: a carried vendor/src older than vendor/patches would build old sources (and the
# tests' own materialize call would fail), so stop before spending the lease; the standalone kernels need none
for s in "${stages[@]}"; do
    case "$s" in
        wgmma|probe) ;;
        *) python3 vendor/materialize.py --check || exit 2; break ;;
    esac
done
rc=0
for s in "${stages[@]}"; do
    case "$s" in
        all)
            # the synthetic 27B files are written while the CUDA code compiles
            bash benchmarks/device/synth.sh "$WORK" >"$WORK/synth.log" 2>&1 &
            synth_pid=$!
            stage_kernels >"$WORK/kernels.log" 2>&1 &
            kernels_pid=$!
            stage_build || rc=1
            [ $rc = 0 ] && { stage_mulmat || rc=1; }
            wait_synth
            wait "$kernels_pid" || rc=1
            cat "$WORK/kernels.log"
            # benchmarks before tests: on a short lease the numbers matter most
            [ $rc = 0 ] && { stage_bench || rc=1; }
            [ $rc = 0 ] && { stage_pair || rc=1; }
            [ $rc = 0 ] && { stage_test || rc=1; } ;;
        build|kernels|stock|wgmma|probe|kprobes|lbqsass) "stage_$s" || rc=1 ;;
        mulmat|mmcheck|test|bench|pair|profile|profab|serverbench|attnprof|ab|lbqprof|lbqprefprof|patchab|libab|attn|depth)
            # attn and attnprof run attn_check alone (LUCEBOX_BUILD_TARGETS=attn_check builds just that)
            need="$BUILD/liblucebox.so"
            case $s in attn|attnprof) need="$BUILD/attn_check" ;; esac
            if [ -f "$need" ]; then "stage_$s" || rc=1; else
                # a machine that went back between calls comes fresh, without the last call's build
                echo "run.sh: stage $s needs $need and has none: put the build stage first in this call"
                rc=1
            fi ;;
        synth) bash benchmarks/device/synth.sh "$WORK" >"$WORK/synth.log" 2>&1 & synth_pid=$! ;;  # background
        *) echo "unknown stage $s"; exit 2 ;;
    esac
done
exit $rc
