// tree_attn_transposed: the tree's attention with the roles of queries and keys swapped, a probe for issue 19 (verify
// at 128K within 1.25x of its 4K time). The invariant attention's Hopper path gives a block 64 query-head rows (wgmma's
// M), so a 23-node tree's 138 rows take 3 blocks a KV head and segment, and each converts every K / V tile: 3 times the
// conversion, which bounds it with the softmax (tree_attn_probe's trace: ~3,100 cycles a tile either side). Here keys
// are M and query-head rows are N: S^T = K Q^T (m64n72k16: A the K tile, B Q^T, both in shared memory), the online
// softmax down each column (a column's max over the 64 keys through shared memory, the 4 warps' partial maxima; its
// sum kept a thread until the end), P^T stored to shared memory as f16, O^T += V^T P^T (m64n72k16 a 64-dimension
// slice: A the V tile read MN-major, B P^T). A block takes 72 columns (12 queries of 6 heads), so the tree is 2 blocks
// (72 + 66 columns) and one query 1 (6 live columns of 72): conversion twice for the tree, not 3 times. One consumer
// warpgroup (O^T: 4 x 36 registers), two producer warpgroups copying a tile's rows into a raw slot each (cp.async,
// coalesced) and converting them into the f16 stage of their tile, as patch 0049 (wip) does.
// A column's arithmetic depends on its own Q and keys only (the other columns, live or zero, do not enter it: MMA
// outputs are per element, the softmax per column, the sums' order fixed), so a one-query call gives a tree column's
// bits: checked, with the result against double precision. Timed for the tree and one query at 4K / 32K / 128K keys
// with the Hopper path's segment rule (at least 4 tiles, at most 32 segments: 256 / 1,024 / 4,096 keys a segment), the
// last two comparable with tree_attn_probe's fixed-segment table.
// Written in the thirty-first session; not run yet.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a benchmarks/kernels/tree_attn_transposed.cu \
//        -o tree_attn_transposed        (sm_90a only: on other builds the kernel traps and the run says so)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "probe_common.cuh"
#include "wgmma_ops.cuh"

constexpr int kCols = 72, kTile = 64;  // query-head columns a block (wgmma's N), keys a tile (its M)
// Layouts wgmma reads (8 x 8 core matrices, no swizzle):
// - a stage's K (A, K-major: keys as M) and V (A, MN-major: dimensions as M, keys as K) as in the fork: key n's
//   dimensions 8 j .. 8 j + 7 at j kLbo + (n / 8) 128 + (n % 8) 16;
// - Q^T (B, K-major: columns as N): column c's dimensions 8 j .. at j kQLbo + (c / 8) 128 + (c % 8) 16;
// - P^T (B, MN-major: keys as K, columns as N): key k's columns 8 i .. 8 i + 7 at i kPSbo + (k / 8) 128 + (k % 8) 16.
constexpr unsigned kLbo = kTile / 8 * 128, kQLbo = kCols / 8 * 128, kPSbo = kTile / 8 * 128;
constexpr unsigned kQBytes = kCols * D * 2, kStageBytes = 2 * kTile * D * 2, kRawBytes = 2 * kTile * kRowBytes;
constexpr unsigned kPBytes = kTile * kCols * 2, kRedBytes = 4 * kCols * 4;
constexpr size_t kSmem = kQBytes + 2 * kStageBytes + 2 * kRawBytes + kPBytes + kRedBytes;  // 210 KiB
constexpr int kThreads = 384;  // the consumer warpgroup, then 2 producers (warpgroup w > 0 fills stage w - 1)
// registers: the consumer's O^T (144), S^T (36), a column's m and l (2 x 18); the producers' row (36)
constexpr int kProducerRegs = 120, kConsumerRegs = 240;
// named barriers: stage s full (producer -> consumer) and empty (consumer -> producer), a producer's raw slot (its
// 128 threads), the consumer's own (its 128: the column maxima, P^T written)
constexpr int kBarFull = 1, kBarEmpty = 3, kBarRaw = 5, kBarCons = 7, kPair = 256;

// One block per (KV head, group of kCols columns, segment), the head fastest. Column c of group grp: row r = grp kCols
// + c of the head's n_q G (query r / G, head kvh G + r % G). k, v: [n_kv][HKV][kRowBytes] Q4_0; part as probe_merge
// reads it (n_rows = n_grp kCols).
__global__ void __launch_bounds__(kThreads, 1)
probe_attn_t(const half * q, const uint8_t * k, const uint8_t * v, float * part, int n_q, int n_grp, int n_tiles,
             int seg_tiles, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint4 smem_u4[];
    uint8_t * q_sh = (uint8_t *) smem_u4;
    uint8_t * kv_sh = q_sh + kQBytes;            // [stage][K, V][kTile x D]
    uint8_t * raw_sh = kv_sh + 2 * kStageBytes;  // [producer][K, V][kTile][kRowBytes]
    uint8_t * p_sh = raw_sh + 2 * kRawBytes;     // P^T
    float * red = (float *) (p_sh + kPBytes);    // [warp][kCols]
    const int kvh = blockIdx.x % HKV, grp = blockIdx.x / HKV % n_grp, seg = blockIdx.x / (HKV * n_grp);
    const int tid = threadIdx.x, wg = tid / 128, wtid = tid % 128, warp = wtid / 32, lane = wtid % 32;
    const int col0 = grp * kCols, cols = min(kCols, n_q * G - col0);
    const int t0 = seg * seg_tiles, n_local = max(min(t0 + seg_tiles, n_tiles) - t0, 0);
    for (int i = tid; i < kCols * (D / 8); i += kThreads) {  // Q^T; columns past the last zero
        const int c = i % kCols, j = i / kCols, r = col0 + c;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (c < cols) x = *(const uint4 *) (q + (size_t(r / G) * H + kvh * G + r % G) * D + 8 * j);
        *(uint4 *) (q_sh + j * kQLbo + (c / 8) * 128 + (c % 8) * 16) = x;
    }
    fence_proxy_async();
    __syncthreads();

    if (wg > 0) {  // producer p: tiles p, p + 2, ..: copy the rows (9 threads a row), then a thread converts one row
        setmaxnreg_dec<kProducerRegs>();
        const int p = wg - 1, which = wtid / kTile, key = wtid % kTile;
        uint8_t * raw = raw_sh + p * kRawBytes;
        uint8_t * dst = kv_sh + p * kStageBytes + which * kTile * D * 2 + (key / 8) * 128 + (key % 8) * 16;
        constexpr int kChunks = kRowBytes / 16;
        for (int i = p; i < n_local; i += 2) {
            named_sync(kBarRaw + p, 128);  // every thread has read its row of the last tile
            const size_t row0 = size_t(t0 + i) * kTile * HKV + kvh;  // tile's first key, this head: row index
            for (int c = wtid; c < 2 * kTile * kChunks; c += 128) {
                const int wh = c / (kTile * kChunks), ky = c / kChunks % kTile, sg = c % kChunks;
                cp_async16(raw + (wh * kTile + ky) * kRowBytes + 16 * sg,
                           (wh ? v : k) + (row0 + size_t(ky) * HKV) * kRowBytes + 16 * sg);
            }
            cp_commit();
            cp_wait<0>();
            named_sync(kBarRaw + p, 128);  // the tile's rows in
            unsigned cur[kRowBytes / 4];
            const uint4 * row = (const uint4 *) (raw + (which * kTile + key) * kRowBytes);
#pragma unroll
            for (int j = 0; j < kChunks; ++j) {
                const uint4 x = row[j];
                cur[4 * j] = x.x, cur[4 * j + 1] = x.y, cur[4 * j + 2] = x.z, cur[4 * j + 3] = x.w;
            }
            if (i >= 2) named_sync(kBarEmpty + p, kPair);  // the consumer is done with tile i - 2
            q4_0_row_to_f16(cur, dst, kLbo);
            fence_proxy_async();
            named_arrive(kBarFull + p, kPair);
        }
        return;
    }

    setmaxnreg_inc<kConsumerRegs>();
    const int g = lane / 4, t = lane % 4;
    // this thread's accumulators: rows (keys, or dimensions of a 64-slice) 16 warp + g (+ 8), columns 8 jn + 2 t + e
    // at [4 jn + 2 h + e] (h: + 8 rows)
    float o[4][36], m[9][2], l[9][2];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int i = 0; i < 36; ++i) o[mi][i] = 0.0f;
    }
#pragma unroll
    for (int jn = 0; jn < 9; ++jn) m[jn][0] = m[jn][1] = -INFINITY, l[jn][0] = l[jn][1] = 0.0f;
    for (int i = 0; i < n_local; ++i) {
        const int stage = i % 2;
        const uint8_t * kt = kv_sh + stage * kStageBytes, * vt = kt + kTile * D * 2;
        named_sync(kBarFull + stage, kPair);
        float s[36];
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < D / 16; ++j) {  // S^T = K Q^T, dimensions in order
            wgmma_ss<0>(s, wgmma_desc(kt + 2 * j * kLbo, kLbo, 128),
                        wgmma_desc(q_sh + 2 * j * kQLbo, kQLbo, 128), j > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        // each column's max over the tile's keys: the thread's 2, its 8 lanes of the same t, then the 4 warps
#pragma unroll
        for (int jn = 0; jn < 9; ++jn) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float x = fmaxf(s[4 * jn + e], s[4 * jn + 2 + e]);
                x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFF, x, 4));
                x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFF, x, 8));
                x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFF, x, 16));
                if (g == 0) red[warp * kCols + 8 * jn + 2 * t + e] = x;
            }
        }
        named_sync(kBarCons, 128);
        // the running max; O^T's column and the column's sum scaled by corr (0 on the first tile; 1 where the max
        // stayed: O^T's multiplies skipped where no lane's column moved, the same bits)
#pragma unroll
        for (int jn = 0; jn < 9; ++jn) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = 8 * jn + 2 * t + e;
                float x = red[c];
#pragma unroll
                for (int w = 1; w < 4; ++w) x = fmaxf(x, red[w * kCols + c]);
                const float m_new = fmaxf(m[jn][e], x * scale_log2);  // (the max before scaling: scale > 0)
                const float corr = m[jn][e] == -INFINITY ? 0.0f : ex2_ftz(m[jn][e] - m_new);
                m[jn][e] = m_new;
                l[jn][e] *= corr;
                if (__any_sync(0xFFFFFFFF, corr != 1.0f)) {
#pragma unroll
                    for (int mi = 0; mi < 4; ++mi) {
                        o[mi][4 * jn + e] *= corr;
                        o[mi][4 * jn + 2 + e] *= corr;
                    }
                }
            }
        }
        // P = exp2(S scale - m) as f16 pairs of columns into P^T; each column's sum, this thread's keys, in order
#pragma unroll
        for (int jn = 0; jn < 9; ++jn) {
            float pv[2][2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int e = 0; e < 2; ++e) pv[h][e] = ex2_ftz(fmaf(s[4 * jn + 2 * h + e], scale_log2, -m[jn][e]));
                *(unsigned *) (p_sh + jn * kPSbo + (2 * warp + h) * 128 + g * 16 + 4 * t) = pack2(pv[h][0], pv[h][1]);
            }
#pragma unroll
            for (int e = 0; e < 2; ++e) l[jn][e] = l[jn][e] + pv[0][e] + pv[1][e];
        }
        fence_proxy_async();
        named_sync(kBarCons, 128);  // P^T written by all (and every warp past reading red)
        wgmma_fence();
#pragma unroll
        for (int mi = 0; mi < 4; ++mi) {  // O^T += V^T P^T: dimensions 64 mi .., keys in order
#pragma unroll
            for (int j = 0; j < kTile / 16; ++j) {
                wgmma_ss<1, 1>(o[mi], wgmma_desc(vt + 8 * mi * kLbo + 2 * j * 128, 128, kLbo),
                               wgmma_desc(p_sh + 2 * j * 128, 128, kPSbo), 1);
            }
        }
        wgmma_commit();
        wgmma_wait<0>();
        if (i + 2 < n_local) named_arrive(kBarEmpty + stage, kPair);  // the producer's tile i + 2 goes here
    }
    // each column's sum: the thread's, its 8 lanes, then the 4 warps in order; then O^T, m and l out
#pragma unroll
    for (int jn = 0; jn < 9; ++jn) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float x = l[jn][e];
            x += __shfl_xor_sync(0xFFFFFFFF, x, 4);
            x += __shfl_xor_sync(0xFFFFFFFF, x, 8);
            x += __shfl_xor_sync(0xFFFFFFFF, x, 16);
            if (g == 0) red[warp * kCols + 8 * jn + 2 * t + e] = x;
        }
    }
    named_sync(kBarCons, 128);
    const size_t n_rows = size_t(n_grp) * kCols;
    float * out = part + ((size_t(seg) * HKV + kvh) * n_rows + col0) * (D + 2);  // column c at c (D + 2)
#pragma unroll
    for (int jn = 0; jn < 9; ++jn) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int c = 8 * jn + 2 * t + e;
            if (c >= cols) continue;
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    out[c * (D + 2) + 64 * mi + 16 * warp + g + 8 * h] = o[mi][4 * jn + 2 * h + e];
                }
            }
            if (warp == 0 && g == 0) {
                out[c * (D + 2) + D] = m[jn][e];
                out[c * (D + 2) + D + 1] = ((red[c] + red[kCols + c]) + red[2 * kCols + c]) + red[3 * kCols + c];
            }
        }
    }
#else
    __trap();  // built without sm_90a
#endif
}

__global__ void has_wgmma(int * out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}

int main() {
    int major = 0, n_sm = 0;
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    int * flag;
    CHECK(cudaMalloc(&flag, sizeof(int)));
    has_wgmma<<<1, 1>>>(flag);
    int built = 0;
    CHECK(cudaMemcpy(&built, flag, sizeof(int), cudaMemcpyDeviceToHost));
    if (major != 9 || !built) {
        std::printf("tree_attn_transposed: needs an sm_90a build on a Hopper GPU (skipped)\n");
        return 0;
    }
    constexpr int kMaxKv = 131072, kMaxQ = 23, kMaxSeg = 128;
    const ProbeData data = probe_data(kMaxKv, kMaxQ);
    const std::vector<uint8_t> &hk = data.k, &hv = data.v;
    const std::vector<half> & hq = data.q;
    half * q;
    uint8_t *k, *v;
    float *part, *dst;
    const int max_grp = (kMaxQ * G + kCols - 1) / kCols;
    CHECK(cudaMalloc(&q, hq.size() * sizeof(half)));
    CHECK(cudaMalloc(&k, hk.size()));
    CHECK(cudaMalloc(&v, hv.size()));
    CHECK(cudaMalloc(&part, size_t(kMaxSeg) * HKV * max_grp * kCols * (D + 2) * sizeof(float)));
    CHECK(cudaMalloc(&dst, size_t(kMaxQ) * H * D * sizeof(float)));
    CHECK(cudaMemcpy(q, hq.data(), hq.size() * sizeof(half), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(k, hk.data(), hk.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(v, hv.data(), hv.size(), cudaMemcpyHostToDevice));
    CHECK(cudaFuncSetAttribute(probe_attn_t, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, probe_attn_t));
    const float scale_log2 = 1.0f / std::sqrt(float(D)) * 1.4426950408889634f;
    // queries q0 .. q0 + n_q over n_kv keys, seg_tiles tiles a segment; the time of the attention and the merge, us
    auto run = [&](int q0, int n_q, int n_kv, int seg_tiles, int iters) {
        const int n_tiles = n_kv / kTile, n_seg = (n_tiles + seg_tiles - 1) / seg_tiles;
        const int n_grp = (n_q * G + kCols - 1) / kCols;
        return time_us([&] {
            probe_attn_t<<<n_seg * HKV * n_grp, kThreads, kSmem>>>(q + size_t(q0) * H * D, k, v, part, n_q, n_grp,
                                                                   n_tiles, seg_tiles, scale_log2);
            probe_merge<<<dim3(n_q * G, HKV), D>>>(part, dst, n_q, n_seg, n_grp * kCols);
        }, 2, iters);
    };
    auto fetch = [&](int n_q) {
        std::vector<float> out(size_t(n_q) * H * D);
        CHECK(cudaMemcpy(out.data(), dst, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
        return out;
    };
    bool ok = true;
    // the checks at 2K keys, 11 tiles a segment (3 segments, the last short): the tree against double precision from
    // the f16 values the kernel converts, and each query alone (its columns 0 .. 5 of block 0) against the tree's
    constexpr int kCheckKv = 2048, kCheckSeg = 11;
    run(0, kMaxQ, kCheckKv, kCheckSeg, 0);
    const std::vector<float> tree = fetch(kMaxQ);
    const double worst = worst_vs_double(hq, q4_0_values(hk, kCheckKv), q4_0_values(hv, kCheckKv), kMaxQ, kCheckKv,
                                         tree);
    ok &= worst < 2e-3;
    std::printf("%s  23 queries over Q4_0, %d keys: max abs error vs double %.3g\n", worst < 2e-3 ? "ok  " : "BAD ",
                kCheckKv, worst);
    int differ = 0;
    for (int qi = 0; qi < kMaxQ; ++qi) {
        run(qi, 1, kCheckKv, kCheckSeg, 0);
        const std::vector<float> one = fetch(1);
        for (size_t j = 0; j < one.size(); ++j) {
            differ += std::memcmp(&one[j], &tree[size_t(qi) * H * D + j], sizeof(float)) != 0;
        }
    }
    ok &= differ == 0;
    std::printf("%s  each query alone == its rows of the 23-query call: %d of %zu values differ\n",
                differ ? "BAD " : "ok  ", differ, tree.size());
    std::printf("\n(%d registers, %d local bytes, %zu bytes of shared memory a block)\n"
                "| queries | keys | keys a segment | blocks | attention + merge us |\n|---|---|---|---|---|\n",
                fa.numRegs, int(fa.localSizeBytes), kSmem);
    for (int n_q : {23, 1}) {
        for (int n_kv : {4096, 32768, 131072}) {
            // the landed rule: at least 4 tiles a segment, at most 32 segments
            int seg_tiles = 4;
            while (seg_tiles * 32 < n_kv / kTile) seg_tiles *= 2;
            const int n_seg = (n_kv / kTile + seg_tiles - 1) / seg_tiles;
            const float us = run(0, n_q, n_kv, seg_tiles, 20);
            std::printf("| %d | %d | %d | %d | %.1f |\n", n_q, n_kv, seg_tiles * kTile,
                        n_seg * HKV * ((n_q * G + kCols - 1) / kCols), us);
        }
    }
    std::printf("tree_attn_transposed: %s\n", ok ? "all ok" : "FAILED");
    return ok ? 0 : 1;
}
