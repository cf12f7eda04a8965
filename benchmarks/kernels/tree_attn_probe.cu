// tree_attn_probe: how fast can a verify tree's attention over a deep Q4_0 cache run with the block structure the
// invariant attention lacks? A probe for issue 19's last goal (verify at 128K within 1.25x of its 4K time needs the
// 23-node tree call at ~290 us on an H100; the invariant kernel takes ~705 us, attn_check): not a ggml op and not
// batch-invariant as it stands, only the shape of a candidate:
//   - a block per (KV head, segment of keys, group of m-tiles): a tree's 138 rows (23 queries x 6 heads, 9 m-tiles
//     of 16, a warp each) take 2 blocks of 5, so each K / V tile is copied and converted twice, not 3 times (5 warps:
//     at most 2 on a scheduler, so 255 registers a thread; 9 warps would cap them at 168 and spill);
//   - each warp owns whole rows: S, the online softmax (FlashAttention-2's rescale per tile of keys) and P stay in
//     registers (S's accumulators are P V's A fragments), O (16 rows x 256 dims) too; no row reduction through shared
//     memory, no running values through L2, one or two barriers a tile;
//   - a wave or two of blocks over segments of the keys, merged in segment order by a second kernel.
// A row's arithmetic here depends only on its own keys, the tile length and the segment length, so with those fixed a
// one-query call gives a tree row's bits (the property a rewrite of the invariant attention needs: checked). Three
// ways to fill the f16 tiles (Mode): Q4_0 converted by every warp between two barriers, Q4_0 converted by two producer
// warps a tile ahead (FlashAttention-3's split, on mma.sync), and an F16 cache of the same values copied straight
// (what the conversion costs; ggml's own F16 kernel takes ~400 us for the tree at 128K, attn_check). The shapes
// (kShapes): 64-key tiles, one block a multiprocessor, the tree in 2 blocks of 5 m-tiles or 3 of 3, one query in a
// block of 4 warps (3 idle in the math) or of 1; 32-key tiles, where 2 tree blocks or 3 one-query blocks fit a
// multiprocessor; and on Hopper a warpgroup of 64 rows on wgmma (probe_attn_wg: the MMA pipe asynchronous and
// ~1.8x mma.sync's rate, wgmma_check), the same block for a tree and for one query, and FlashAttention-3's shape
// around it (a producer warpgroup converting a tile ahead, 1 or 2 consumer warpgroups), with its variants (Fa3): the
// producer threads owning a K or V row each, loaded into registers a tile ahead (the fastest: ~300 us for the tree at
// 128K, ~115 for one query, twenty-ninth session), 1 or 2 producer warpgroups, 3 stages, raw rows through a cp.async
// ring, and timing-only cuts (no conversion, no consumer math) that say which side bounds a tile; and the tree's 3
// row groups as a cluster converting a third of each tile each (probe_attn_cluster, part `cluster`: 2.6x slower than
// the 2-producer block for the tree at 128K, 927.9 us against 352.7, H200, thirty-first session). Checks each tile
// length against a CPU reference (double) and every shape bit for bit against the others at 2K keys, then times each
// shape at 4K / 32K / 128K keys (23 queries, or one), with its registers, spills and blocks a multiprocessor, and the
// best shape at fixed segment lengths (what a kernel whose bits cannot depend on the call would take). Then keys by
// rank (probe_attn_ranked: the masks and gathered tails of a real tree on the register-producer block), checked bit
// for bit against one-query calls over each node's path and timed. `profile` runs two shapes a few times for Nsight
// Compute; `trace` stamps the phases of a tile; `cluster` checks and times the cluster shape against the 2-producer
// block.
// A 64-key tree block takes 147-214 KB of shared memory (H100 / H200 / A100; an RTX 3090-5090 gives a block 99 KB: a
// real kernel would take 32-key tiles there).
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a benchmarks/kernels/tree_attn_probe.cu -o tree_attn_probe
//   (or -arch=sm_80 and up, without the wgmma shapes); -DPROBE_LEAN=0: the softmax of the twenty-eighth session
//   (`run.sh probe` runs it.)
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_common.cuh"
#include "wgmma_ops.cuh"

constexpr int kLd = D + 8;                           // halves per f16 row in shared memory (ldmatrix: no conflicts)

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#ifndef PROBE_LEAN
#define PROBE_LEAN 1  // the softmax in fewer instructions (its own bits: every shape here shares it)
#endif

// One tile's online softmax for a warp's 16 rows (log2 units): rows gid (h 0) and gid + 8 (h 1) of the S fragments
// (m16n8 accumulators, n-tile nt's 4 values in s[nt]: mma.sync's, and wgmma's D n-tile by n-tile), each row over the
// 4 threads of a quad; the running max m and sum l updated, P packed as the A fragments of O += P V (k-step j = keys
// 16 j ..) and corr, the factor O is to be scaled by (softmax_p); then O rescaled (rescale_o; both: online_softmax).
template <int KT>
__device__ __forceinline__ void softmax_p(const float (&acc)[KT / 8][4], float (&m)[2], float (&l)[2],
                                          unsigned (&pa)[KT / 16][4], float (&corr)[2], float scale_log2) {
#if PROBE_LEAN
    // the row max of the raw scores, scaled once (rounding is monotonic: the same as the max of the scaled ones), and
    // each P as ex2.approx.ftz of one FFMA: 2 instructions a score where the plain form takes 4 and exp2f's fixups
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], acc[nt][e]);
    }
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFF, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFF, mx[h], 2));
        mx[h] = fmaxf(m[h], mx[h] * scale_log2);
        // 0 on a row's first visible tile (m = -inf); 1 while it has seen none (a masked row of probe_attn_ranked:
        // its tile then adds exact zeros)
        corr[h] = mx[h] == -INFINITY ? 1.0f : ex2_ftz(m[h] - mx[h]);
        m[h] = mx[h];
    }
    const float nm[2] = {m[0] == -INFINITY ? 0.0f : -m[0], m[1] == -INFINITY ? 0.0f : -m[1]};
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
        const float p0 = ex2_ftz(fmaf(acc[nt][0], scale_log2, nm[0]));
        const float p1 = ex2_ftz(fmaf(acc[nt][1], scale_log2, nm[0]));
        const float p2 = ex2_ftz(fmaf(acc[nt][2], scale_log2, nm[1]));
        const float p3 = ex2_ftz(fmaf(acc[nt][3], scale_log2, nm[1]));
#else
    float mx[2] = {m[0], m[1]}, s[KT / 8][4];  // S scaled, apart from the accumulators (wgmma may own them)
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[nt][e] = acc[nt][e] * scale_log2;
            mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
        }
    }
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFF, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFF, mx[h], 2));
        corr[h] = exp2f(m[h] - mx[h]);  // 0 on the first tile (m = -inf)
        m[h] = mx[h];
    }
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
        const float p0 = exp2f(s[nt][0] - m[0]), p1 = exp2f(s[nt][1] - m[0]);
        const float p2 = exp2f(s[nt][2] - m[1]), p3 = exp2f(s[nt][3] - m[1]);
#endif
        rs[0] += p0 + p1;
        rs[1] += p2 + p3;
        pa[nt / 2][(nt % 2) * 2 + 0] = pack2(p0, p1);
        pa[nt / 2][(nt % 2) * 2 + 1] = pack2(p2, p3);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        rs[h] += __shfl_xor_sync(0xFFFFFFFF, rs[h], 1);
        rs[h] += __shfl_xor_sync(0xFFFFFFFF, rs[h], 2);
        l[h] = l[h] * corr[h] + rs[h];
    }
}

template <int NT>  // O's n-tiles of 8 dimensions a thread holds (D / 8, or half of them: a split-D warpgroup)
__device__ __forceinline__ void rescale_o(float (&o)[NT][4], const float (&corr)[2]) {
#if PROBE_LEAN
    // no row of the warp's max moved: O times 1 is O (bit for bit), so the 128 multiplies are skipped (at depth,
    // nearly every tile)
    if (__all_sync(0xFFFFFFFF, corr[0] == 1.0f && corr[1] == 1.0f)) return;
#endif
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        o[nt][0] *= corr[0];
        o[nt][1] *= corr[0];
        o[nt][2] *= corr[1];
        o[nt][3] *= corr[1];
    }
}

template <int KT>
__device__ __forceinline__ void online_softmax(const float (&s)[KT / 8][4], float (&m)[2], float (&l)[2],
                                               float (&o)[D / 8][4], unsigned (&pa)[KT / 16][4], float scale_log2) {
    float corr[2];
    softmax_p<KT>(s, m, l, pa, corr, scale_log2);
    rescale_o(o, corr);
}

// A warp's 16 rows from row r0 into part ([rows][D + 2]: O unnormalized, then the row's max m and its sum l)
// (O's dimensions d0 .. d0 + 8 NT; a split-D warpgroup holds half)
template <int NT>
__device__ __forceinline__ void store_partial(float * part, int r0, const float (&o)[NT][4], const float (&m)[2],
                                              const float (&l)[2], int d0 = 0) {
    const int lane = threadIdx.x % 32, gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float * out = part + size_t(r0 + gid + 8 * h) * (D + 2);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            *(float2 *) (out + d0 + nt * 8 + 2 * tig) = make_float2(o[nt][2 * h], o[nt][2 * h + 1]);
        }
        if (tig == 0) {
            out[D] = m[h];
            out[D + 1] = l[h];
        }
    }
}

// How a block gets its f16 tiles: Q4_0 rows copied and converted by every warp between two barriers (kSerial); F16
// rows copied straight into two f16 stages (kF16: one barrier a tile, no conversion); Q4_0 rows copied and converted
// by 2 producer warps into two f16 stages while the NW consumer warps compute the tile before (kProducers: one
// barrier a tile, the conversion off the consumers' path); on wgmma (Hopper), Q4_0 converted as kSerial does
// (kWgmma: probe_attn_wg) or by a producer warpgroup (kFa3: probe_attn_fa3; kFa3Ahead: with the next tile's S issued
// before this tile's softmax).
// kFa3NoConvert / kFa3NoMath: kFa3 with the producer's conversion / the consumers' MMAs and softmax left out, timed
// only (their output is meaningless): which side of the block bounds a tile.
// kFa3Regs: kFa3 with each producer thread loading one K or V row of the next tile into registers (no raw slots in
// shared memory, no bank conflicts reading them back, no barrier among the producers) and converting it from there.
// kFa3Regs3: with 3 stages (one consumer warpgroup: 224 KB of shared memory); kFa3RegsNoMath: timing only.
// kFa3Regs2P: two register producer warpgroups taking the tiles (and the 2 stages) in turn. kFa3Ring: the register
// producer's rows through a ring of raw slots (cp.async, 3 slots); kFa3Ring2P: 2 producers, 1 slot each.
// kFa3PingPong: the register producer and 2 consumer warpgroups taking the tensor cores in turn. kFa3SplitD: the
// register producer and 2 consumer warpgroups on the same 64 rows, each computing S and the softmax (the same bits)
// and O for half of V's dimensions (m64n128k16): twice the warps on each row's latency chain, half of O a thread.
// kFa3Cluster (probe_attn_cluster): the tree's 3 row groups of a KV head and segment as a cluster of 3 blocks, each
// block's producer warpgroup converting a third of every tile into the stages of all three (distributed shared memory).
// (fa3_of reads the order: the FA3 shapes from kFa3 on, the register producers from kFa3Regs on)
enum Mode { kSerial, kF16, kProducers, kWgmma, kFa3, kFa3Ahead, kFa3NoConvert, kFa3NoMath, kFa3Regs, kFa3Regs3,
            kFa3RegsNoMath, kFa3Regs2P, kFa3Ring, kFa3Ring2P, kFa3PingPong, kFa3SplitD, kFa3Cluster };
constexpr int kProducerWarps = 2;
const char * mode_name(int mode) {
    return mode == kF16 ? "f16" : mode == kSerial ? "q4_0 serial" : mode == kProducers ? "q4_0 producers"
         : mode == kWgmma ? "q4_0 wgmma" : mode == kFa3 ? "q4_0 wgmma + producer warpgroup"
         : mode == kFa3NoConvert ? "(timing) wgmma + producer warpgroup, no conversion"
         : mode == kFa3NoMath ? "(timing) wgmma + producer warpgroup, no consumer math"
         : mode == kFa3Regs ? "q4_0 wgmma + producer warpgroup from registers"
         : mode == kFa3Regs3 ? "q4_0 wgmma + producer warpgroup from registers, 3 stages"
         : mode == kFa3Regs2P ? "q4_0 wgmma + 2 producer warpgroups from registers"
         : mode == kFa3Ring ? "q4_0 wgmma + producer warpgroup, raw ring of 3"
         : mode == kFa3Ring2P ? "q4_0 wgmma + 2 producer warpgroups, raw slot each"
         : mode == kFa3PingPong ? "q4_0 wgmma ping-pong + producer warpgroup from registers"
         : mode == kFa3SplitD ? "q4_0 wgmma split-D + producer warpgroup from registers"
         : mode == kFa3Cluster ? "q4_0 wgmma, a cluster of the 3 row groups converting a third each"
         : mode == kFa3RegsNoMath ? "(timing) wgmma + producer warpgroup from registers, no consumer math"
         : "q4_0 wgmma + producer warpgroup, S ahead";
}
// How an FA3-shaped mode builds its block: producer warpgroups; f16 stages; whether a producer thread converts one row
// from registers (else the warpgroup converts raw slots block by block); the raw slots a register producer copies its
// rows through (0: loaded straight into registers); S ahead; and the timing-only cuts.
struct Fa3 {
    int producers = 1, stages = 2;
    bool regs = false;
    int ring = 0;
    bool ahead = false, no_convert = false, no_math = false, pingpong = false, split_d = false;
};
__host__ __device__ constexpr bool is_fa3(int mode) { return mode >= kFa3; }
__host__ __device__ constexpr Fa3 fa3_of(int mode) {
    Fa3 f;
    f.ahead = mode == kFa3Ahead;
    f.no_convert = mode == kFa3NoConvert;
    f.no_math = mode == kFa3NoMath || mode == kFa3RegsNoMath;
    f.regs = mode >= kFa3Regs;
    f.stages = mode == kFa3Regs3 ? 3 : 2;
    f.producers = mode == kFa3Regs2P || mode == kFa3Ring2P ? 2 : 1;
    f.ring = mode == kFa3Ring ? 3 : mode == kFa3Ring2P ? 1 : 0;
    f.pingpong = mode == kFa3PingPong;
    f.split_d = mode == kFa3SplitD;
    return f;
}
// query-head rows a block takes: a warp's 16 a consumer warp, or a split-D pair of warpgroups' 64
__host__ __device__ constexpr int block_rows(int nw, int mode) {
    return is_fa3(mode) && fa3_of(mode).split_d ? 64 : nw * 16;
}
__host__ __device__ constexpr int producer_warps(int mode) {
    return mode == kProducers ? kProducerWarps : is_fa3(mode) ? 4 * fa3_of(mode).producers : 0;
}

size_t smem_bytes(int nw, int mode, int kt) {
    if (mode == kWgmma || is_fa3(mode)) {  // Q; one (two) f16 stages of K and V; 2 raw slots
        const Fa3 f = fa3_of(mode);
        const size_t stages = mode == kWgmma ? 1 : f.stages;
        const size_t raw = (!f.regs ? 2 : f.ring * f.producers) * 2 * size_t(kt) * kRowBytes;
        return size_t(block_rows(nw, mode)) * D * 2 + stages * 2 * size_t(kt) * D * 2 + raw;
    }
    const size_t q = size_t(nw) * 16 * kLd * 2, tile = 2 * size_t(kt) * kLd * 2;  // Q; a K and a V f16 tile
    const size_t raw = 2 * 2 * size_t(kt) * kRowBytes;                            // 2 slots of K and V rows
    return mode == kF16 ? q + 2 * tile : mode == kProducers ? q + 2 * tile + raw : q + tile + raw;
}

// One block per (KV head, group of NW m-tiles, segment), the head varying fastest: warp w < NW the rows 16 (NW grp +
// w) .. of the head's n_q * G (row r: query r / G, head kvh * G + r % G). q: f16 [n_q][H][D]; k, v: [n_kv][HKV][row]
// (Q4_0 rows of kRowBytes, or F16 rows: kF16); part: [seg][HKV][n_grp * NW * 16][D + 2] (O unnormalized, then the
// row's max m in log2 units and its sum l).
template <int NW, int kMode, int kTile, int kMinBlocks>
__global__ void __launch_bounds__((NW + producer_warps(kMode)) * 32, kMinBlocks)
probe_attn(const half * q, const uint8_t * k, const uint8_t * v, float * part, int n_q, int n_grp, int n_tiles,
           int seg_tiles, float scale_log2) {
    constexpr int kThreads = (NW + producer_warps(kMode)) * 32, kStages = kMode == kSerial ? 1 : 2;
    extern __shared__ uint4 smem_u4[];
    half * q_sh = (half *) smem_u4;                                   // [NW * 16][kLd]
    half * kv_sh = q_sh + NW * 16 * kLd;                              // [kStages][K, V][kTile][kLd]
    uint8_t * raw_sh = (uint8_t *) (kv_sh + kStages * 2 * kTile * kLd);  // Q4_0: [2 slots][K, V][kTile][kRowBytes]
    const int kvh = blockIdx.x % HKV, grp = blockIdx.x / HKV % n_grp, seg = blockIdx.x / (HKV * n_grp);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int row0 = grp * NW * 16, rows = n_q * G - row0, t0 = seg * seg_tiles, t1 = min(t0 + seg_tiles, n_tiles);
    constexpr int kBytes = kMode == kF16 ? D * 2 : kRowBytes;        // a row of one KV head
    constexpr size_t kStride = size_t(HKV) * kBytes;                  // bytes a cache row (all KV heads)
    // the threads that copy and convert: the producers, or all
    const int pt = kMode == kProducers ? tid - NW * 32 : tid;
    constexpr int kPn = kMode == kProducers ? kProducerWarps * 32 : kThreads;
    const bool producer = pt >= 0;

    for (int i = tid; i < NW * 16 * (D / 8); i += kThreads) {
        const int r = i / (D / 8), d = (i % (D / 8)) * 8;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (r < rows) x = *(const uint4 *) (q + (size_t((row0 + r) / G) * H + kvh * G + (row0 + r) % G) * D + d);
        *(uint4 *) (q_sh + r * kLd + d) = x;
    }
    auto issue = [&](int t, int slot) {  // tile t's rows into raw slot (Q4_0) or f16 stage (F16) `slot`
        const size_t off = size_t(t) * kTile * kStride + size_t(kvh) * kBytes;
        constexpr int kSegs = kBytes / 16;  // Q4_0 9, F16 32
        for (int i = pt; i < 2 * kTile * kSegs; i += kPn) {
            const int which = i / (kTile * kSegs), j = i % (kTile * kSegs), key = j / kSegs, s = j % kSegs;
            const uint8_t * src = (which ? v : k) + off + size_t(key) * kStride + s * 16;
            if constexpr (kMode == kF16) {
                cp_async16(kv_sh + ((slot * 2 + which) * kTile + key) * kLd + s * 8, src);
            } else {
                cp_async16(raw_sh + ((slot * 2 + which) * kTile + key) * kRowBytes + s * 16, src);
            }
        }
        cp_commit();
    };
    auto convert = [&](int slot, int stage) {  // raw slot -> f16 stage
        const uint8_t * raw = raw_sh + slot * 2 * kTile * kRowBytes;
        for (int b = pt; b < 2 * kTile * (D / 32); b += kPn) {
            const int which = b / (kTile * (D / 32)), j = b % (kTile * (D / 32)), key = j / (D / 32);
            const int qb = j % (D / 32);
            q4_0_to_f16(raw + (which * kTile + key) * kRowBytes + qb * 18,
                        (uint8_t *) (kv_sh + ((stage * 2 + which) * kTile + key) * kLd + qb * 32), 16);
        }
    };
    auto producers_sync = [] {  // the producer warps alone (named barrier 1): their copies landed for all of them
        named_sync(1, kProducerWarps * 32);
    };

    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const bool live = warp < NW && warp * 16 < rows;
    const unsigned q_lane = smem_addr(q_sh) + 2 * ((warp * 16 + lane % 16) * kLd + (lane / 16) * 8);
    // stage 0's K tile; V is kTile rows after K, stage 1 2 kTile rows after stage 0
    const unsigned k_lane = smem_addr(kv_sh) + 2 * ((lane % 8 + (lane / 16) * 8) * kLd + ((lane / 8) % 2) * 8);
    const unsigned v_lane = smem_addr(kv_sh) + 2 * ((kTile + lane % 16) * kLd + (lane / 16) * 8);
    constexpr unsigned kStageBytes = 2 * kTile * kLd * 2;

    if constexpr (kMode == kProducers) {  // tile t0 converted before the loop, t0 + 1 on its way
        if (producer && t0 < t1) {
            issue(t0, 0);
            if (t0 + 1 < t1) {
                issue(t0 + 1, 1);
                cp_wait<1>();
            } else {
                cp_wait<0>();
            }
            producers_sync();
            convert(0, 0);
        }
    } else {
        if (t0 < t1) issue(t0, 0);
    }
    for (int t = t0; t < t1; ++t) {
        const int i = t - t0, stage = kStages == 2 ? i & 1 : 0;
        if constexpr (kMode == kProducers) {
            __syncthreads();  // tile t converted (stage i & 1); every consumer done with tile t - 1 (the other stage)
            if (producer) {
                if (t + 1 < t1) {  // tile t + 1 into the other stage, while the consumers compute tile t
                    // tile t's raw slot was converted before the barrier: it takes tile t + 2
                    if (t + 2 < t1) {
                        issue(t + 2, i & 1);
                        cp_wait<1>();
                    } else {
                        cp_wait<0>();
                    }
                    producers_sync();
                    convert((i + 1) & 1, (i + 1) & 1);
                }
                continue;
            }
        } else {
            cp_wait<0>();
            __syncthreads();  // tile t's rows in; every warp done with the f16 tile before (and Q written)
            if (t + 1 < t1) issue(t + 1, kMode == kF16 ? stage ^ 1 : (i + 1) & 1);
            if constexpr (kMode == kSerial) {
                convert(i & 1, 0);
                __syncthreads();
            }
        }
        if (!live) continue;
        const unsigned k_tile = k_lane + stage * kStageBytes, v_tile = v_lane + stage * kStageBytes;
        // S = Q K^T: 16 rows x 64 keys (8 n-tiles), k-steps in dimension order
        float s[kTile / 8][4];
#pragma unroll
        for (int nt = 0; nt < kTile / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int d0 = 0; d0 < D; d0 += 16) {
            unsigned a[4];
            ldsm_x4(a, q_lane + 2 * d0);
#pragma unroll
            for (int nt = 0; nt < kTile / 8; nt += 2) {
                unsigned b[4];
                ldsm_x4(b, k_tile + 2 * (nt * 8 * kLd + d0));
                mma16816(s[nt], a, b[0], b[1]);
                mma16816(s[nt + 1], a, b[2], b[3]);
            }
        }
        unsigned pa[kTile / 16][4];
        online_softmax<kTile>(s, m, l, o, pa, scale_log2);
        // O += P V, keys in order
#pragma unroll
        for (int j = 0; j < kTile / 16; ++j) {
#pragma unroll
            for (int nt = 0; nt < D / 8; nt += 2) {
                unsigned b[4];
                ldsm_x4_t(b, v_tile + 2 * (j * 16 * kLd + nt * 8));
                mma16816(o[nt], pa[j], b[0], b[1]);
                mma16816(o[nt + 1], pa[j], b[2], b[3]);
            }
        }
    }
    if (live) {
        store_partial(part + (size_t(seg) * HKV + kvh) * (n_grp * NW * 16) * (D + 2), row0 + warp * 16, o, m, l);
    }
}

// ---- The blocks on wgmma (sm_90a) ----
// Layouts wgmma reads (8 x 8 core matrices, no swizzle): a warpgroup's Q (A, K-major, 64 rows): row r's dimensions
// 8 j .. 8 j + 7 at j kWgQLbo + (r / 8) 128 + (r % 8) 16; a tile's K (B, K-major, the keys as N) and V (B, MN-major,
// the keys as K) alike: key n's dimensions 8 j .. at j (kTile / 8 128) + (n / 8) 128 + (n % 8) 16.
constexpr unsigned kWgQLbo = 64 / 8 * 128, kWgQBytes = 64 * D * 2;

// Q rows row0 .. row0 + n_rows (zeros past `rows`) of KV head kvh, warpgroup c's 64 in q_sh + c kWgQBytes
__device__ __forceinline__ void wg_load_q(const half * q, uint8_t * q_sh, int kvh, int row0, int rows, int n_rows,
                                          int tid, int n_threads) {
    for (int i = tid; i < n_rows * (D / 8); i += n_threads) {
        const int r = i % n_rows, j = i / n_rows;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (r < rows) x = *(const uint4 *) (q + (size_t((row0 + r) / G) * H + kvh * G + (row0 + r) % G) * D + 8 * j);
        *(uint4 *) (q_sh + (r / 64) * kWgQBytes + j * kWgQLbo + (r % 64 / 8) * 128 + (r % 8) * 16) = x;
    }
}

// The K / V caches' layout the wgmma blocks read (part `layout`): 0, the engine's ([n_kv][HKV][row]: a key of one head
// is a 144-byte run, 576 bytes from the next), or n, head-major with n keys a head ([HKV][n][row]: a tile is one run).
// The mma.sync blocks read the engine's layout only.
__device__ int g_head_major_keys;

// tile t's Q4_0 rows of KV head kvh (K, then V) into raw ([K, V][kTile][kRowBytes]), one cp.async group
template <int kTile>
__device__ __forceinline__ void wg_issue(const uint8_t * k, const uint8_t * v, uint8_t * raw, int t, int kvh, int tid,
                                         int n_threads) {
    const int head_keys = g_head_major_keys;
    const size_t kStride = head_keys ? size_t(kRowBytes) : size_t(HKV) * kRowBytes;
    constexpr int kSegs = kRowBytes / 16;
    const size_t off = head_keys ? (size_t(kvh) * head_keys + size_t(t) * kTile) * kRowBytes
                                 : size_t(t) * kTile * kStride + size_t(kvh) * kRowBytes;
    for (int i = tid; i < 2 * kTile * kSegs; i += n_threads) {
        const int which = i / (kTile * kSegs), j = i % (kTile * kSegs), key = j / kSegs, sg = j % kSegs;
        cp_async16(raw + (which * kTile + key) * kRowBytes + sg * 16,
                   (which ? v : k) + off + size_t(key) * kStride + sg * 16);
    }
    cp_commit();
}

// raw rows -> the K and V layouts at kv (V kTile D halves after K); consecutive threads take consecutive keys, so
// their 16-byte stores land side by side
template <int kTile>
__device__ __forceinline__ void wg_convert(const uint8_t * raw, uint8_t * kv, int tid, int n_threads) {
    constexpr unsigned kLbo = kTile / 8 * 128;
    for (int b = tid; b < 2 * kTile * (D / 32); b += n_threads) {
        const int key = b % kTile, qb = b / kTile % (D / 32), which = b / (kTile * (D / 32));
        q4_0_to_f16(raw + (which * kTile + key) * kRowBytes + qb * 18,
                    kv + which * kTile * D * 2 + 4 * qb * kLbo + (key / 8) * 128 + (key % 8) * 16, kLbo);
    }
}

// One tile for a warpgroup's 64 rows in two halves. wg_s: S = Q K^T (m64nKTk16, both from shared memory, dimensions
// in order) issued as one wgmma group, not waited for. wg_pv, once that group is done: the online softmax (probe_attn's
// function), then O += P V (m64n256k16, P from registers, keys in order) issued as one group. Per element the MMAs run
// in probe_attn's order and wgmma rounds as mma.sync does (wgmma_check), so a row gets probe_attn's bits.
// (S starts from scale-d = 0, not from zeroed registers: ptxas makes the same code of both where nothing is in flight,
// wgmma_check, and serializes the wgmma where the zeroing would fall while another group runs)
template <int kTile>
__device__ __forceinline__ void wg_s(const uint8_t * q_sh, const uint8_t * kv, float (&s)[kTile / 8][4]) {
    constexpr unsigned kLbo = kTile / 8 * 128;
    float (&s_flat)[kTile / 2] = *reinterpret_cast<float (*)[kTile / 2]>(&s[0][0]);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
        wgmma_ss<0>(s_flat, wgmma_desc(q_sh + 2 * j * kWgQLbo, kWgQLbo, 128), wgmma_desc(kv + 2 * j * kLbo, kLbo, 128),
                    j > 0);
    }
    wgmma_commit();
}
// O += P V (m64n256k16, P from registers, keys in order) issued as one group
// (NT: O's n-tiles, D / 8, or D / 16 for the half of V's dimensions from d0 on: m64n128k16)
template <int kTile, int NT = D / 8>
__device__ __forceinline__ void wg_pv_issue(const uint8_t * kv, const unsigned (&pa)[kTile / 16][4],
                                            float (&o)[NT][4], int d0 = 0) {
    constexpr unsigned kLbo = kTile / 8 * 128;
    const uint8_t * v_sh = kv + kTile * D * 2 + d0 / 8 * kLbo;  // dimensions 8 j .. at j kLbo
    float (&o_flat)[NT * 4] = *reinterpret_cast<float (*)[NT * 4]>(&o[0][0]);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kTile / 16; ++j) wgmma_rs<1>(o_flat, pa[j], wgmma_desc(v_sh + j * 2 * 128, 128, kLbo), 1);
    wgmma_commit();
}
// kDrain: the softmax's P half runs while the newest wgmma group (the next tile's S) does, which is waited for before
// O is rescaled (ptxas serializes wgmma where ordinary instructions write an accumulator with a group in flight)
template <int kTile, bool kDrain = false, int NT = D / 8>
__device__ __forceinline__ void wg_pv(const uint8_t * kv, const float (&s)[kTile / 8][4], float (&o)[NT][4],
                                      float (&m)[2], float (&l)[2], float scale_log2, int d0 = 0) {
    unsigned pa[kTile / 16][4];
    float corr[2];
    softmax_p<kTile>(s, m, l, pa, corr, scale_log2);
    if constexpr (kDrain) wgmma_wait<0>();
    rescale_o(o, corr);
    wg_pv_issue<kTile, NT>(kv, pa, o, d0);
}
// the two halves one after the other
template <int kTile>
__device__ __forceinline__ void wg_tile(const uint8_t * q_sh, const uint8_t * kv, float (&o)[D / 8][4], float (&m)[2],
                                        float (&l)[2], float scale_log2) {
    float s[kTile / 8][4];
    wg_s<kTile>(q_sh, kv, s);
    wgmma_wait<0>();
    wg_pv<kTile>(kv, s, o, m, l, scale_log2);
    wgmma_wait<0>();
}

// One warpgroup a block, 64 rows (warp w the 16 from 16 w, as in probe_attn), each tile's Q4_0 rows converted by the
// warpgroup between two barriers while the next tile's rows copy (as kSerial). All 4 warps run the MMAs whatever the
// live rows (one query: 6 of 64). A tree's 138 rows take 3 blocks, one query 1.
template <int kTile, int kMinBlocks>
__global__ void __launch_bounds__(128, kMinBlocks)
probe_attn_wg(const half * q, const uint8_t * k, const uint8_t * v, float * part, int n_q, int n_grp, int n_tiles,
              int seg_tiles, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint4 smem_u4[];
    uint8_t * q_sh = (uint8_t *) smem_u4;       // 64 rows x D halves
    uint8_t * kv_sh = q_sh + kWgQBytes;         // K, then V: kTile keys x D each
    uint8_t * raw_sh = kv_sh + 2 * kTile * D * 2;  // [2 slots][K, V][kTile][kRowBytes]
    const int kvh = blockIdx.x % HKV, grp = blockIdx.x / HKV % n_grp, seg = blockIdx.x / (HKV * n_grp);
    const int tid = threadIdx.x, warp = tid / 32;
    const int row0 = grp * 64, rows = n_q * G - row0, t0 = seg * seg_tiles, t1 = min(t0 + seg_tiles, n_tiles);
    wg_load_q(q, q_sh, kvh, row0, rows, 64, tid, 128);
    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    if (t0 < t1) wg_issue<kTile>(k, v, raw_sh, t0, kvh, tid, 128);
    for (int t = t0; t < t1; ++t) {
        const int i = t - t0;
        cp_wait<0>();
        __syncthreads();  // tile t's rows in (and Q written); every warp's MMAs on tile t - 1 done (wg_tile waits)
        if (t + 1 < t1) wg_issue<kTile>(k, v, raw_sh + ((i + 1) & 1) * 2 * kTile * kRowBytes, t + 1, kvh, tid, 128);
        wg_convert<kTile>(raw_sh + (i & 1) * 2 * kTile * kRowBytes, kv_sh, tid, 128);
        fence_proxy_async();  // the converted tile (and Q), written by ordinary stores, read by wgmma
        __syncthreads();
        wg_tile<kTile>(q_sh, kv_sh, o, m, l, scale_log2);
    }
    if (warp * 16 < rows) {
        store_partial(part + (size_t(seg) * HKV + kvh) * (n_grp * 64) * (D + 2), row0 + warp * 16, o, m, l);
    }
#else
    __trap();  // built without sm_90a: the table skips this shape
#endif
}

// `trace`: block 0's warpgroups stamp clock64 at the phases of each tile (thread 0 of each warpgroup): a consumer
// after the stage is full (0), S in (1), the softmax done and P V issued (2), P V in (3); a register producer at the
// tile's start (0), the stage free (1), the stage converted and handed over (2). Off (null) otherwise.
constexpr int kTraceTiles = 512;
__device__ long long * g_trace = nullptr;  // [warpgroup][tile][4]
// where this thread stamps (its warpgroup's rows of g_trace), or null: read once a kernel, so a stamp off the trace
// costs one compare
__device__ __forceinline__ long long * trace_rows(int wg) {
    return g_trace != nullptr && blockIdx.x == 0 && threadIdx.x % 128 == 0 ? g_trace + wg * kTraceTiles * 4 : nullptr;
}
__device__ __forceinline__ void stamp(long long * tr, int i, int e) {
    if (tr != nullptr && i < kTraceTiles) tr[i * 4 + e] = clock64();
}

// FlashAttention-3's block shape on the same arithmetic: a producer warpgroup copies each tile's Q4_0 rows (cp.async,
// two raw slots) and converts them into two f16 stages a tile ahead, kNc consumer warpgroups of 64 rows each run
// wg_tile on the stage the producer filled; named barriers hand the stages over (full: producer -> consumers, empty:
// consumers -> producer). With 2 consumer warpgroups the producer gives up registers (setmaxnreg 56) so that the
// consumers get 224. A tree's 138 rows take 2 blocks of 2 warpgroups (the second with 10 live rows) or 3 of 1; one
// query 1 of 1. kAhead: S of the next tile issued before this tile's softmax. The same bits as probe_attn_wg (checked).
template <int kNc, int kTile, int kMode>
__global__ void __launch_bounds__((kNc + fa3_of(kMode).producers) * 128, 1)
probe_attn_fa3(const half * q, const uint8_t * k, const uint8_t * v, float * part, int n_q, int n_grp, int n_tiles,
               int seg_tiles, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr Fa3 kF = fa3_of(kMode);
    constexpr bool kRegs = kF.regs, kAhead = kF.ahead;
    constexpr int kStages = kF.stages, kNp = kF.producers, kRing = kF.ring;
    // a register producer holds two tiles' rows (72 registers): more for it, less for the consumers
    // (two register producers with one consumer warpgroup: 120 / 240; two consumers and two producers do not compile:
    // ptxas allocates within the launch bounds, 128 registers at 512 threads, whatever setmaxnreg says)
    constexpr int kProducerRegs = !kRegs ? 56 : kNp == 1 ? 104 : kNc == 1 ? 120 : 88;
    constexpr int kConsumerRegs = !kRegs ? 224 : kNp == 1 ? 200 : kNc == 1 ? 240 : 168;
    // named barriers (0 is __syncthreads's); full and empty: one a stage
    constexpr int kBarProducers = 1, kBarFull = 2, kBarEmpty = 2 + kStages;
    static_assert(kStages == 2 || (kRegs && !kAhead), "3 stages: the register producer, not the S-ahead loop");
    // kAll: the block; kPair: a stage's barrier (the consumers and the one producer warpgroup that fills it)
    constexpr int kRows = block_rows(4 * kNc, kMode), kAll = (kNc + kNp) * 128, kPair = (kNc + 1) * 128;
    static_assert(!kF.split_d || (kNc == 2 && !kF.ahead && !kF.pingpong), "split D: two warpgroups, the plain loop");
    static_assert(kNp == 1 || (kRegs && kStages >= kNp), "producer warpgroups take the tiles in turn");
    constexpr unsigned kStageBytes = 2 * kTile * D * 2;  // K, then V
    extern __shared__ uint4 smem_u4[];
    uint8_t * q_sh = (uint8_t *) smem_u4;             // [kRows / 64][64 rows x D] (split D: one 64 for both)
    uint8_t * kv_sh = q_sh + kRows / 64 * kWgQBytes;  // [stages][K, V][kTile x D]
    uint8_t * raw_sh = kv_sh + kStages * kStageBytes; // [2 slots][K, V][kTile][kRowBytes]
    const int kvh = blockIdx.x % HKV, grp = blockIdx.x / HKV % n_grp, seg = blockIdx.x / (HKV * n_grp);
    const int tid = threadIdx.x, wg = tid / 128, wtid = tid % 128, warp = wtid / 32;
    const int row0 = grp * kRows, rows = n_q * G - row0, t0 = seg * seg_tiles, t1 = min(t0 + seg_tiles, n_tiles);
    const int n_local = max(t1 - t0, 0);
    long long * const tr = trace_rows(wg);
    wg_load_q(q, q_sh, kvh, row0, rows, kRows, tid, kAll);
    fence_proxy_async();
    __syncthreads();

    if (wg >= kNc && kRegs) {  // producer warpgroup pw: tiles pw, pw + kNp, ..; thread wtid one row (K keys, then V)
        static_assert(!kRegs || kTile == 64, "a row a producer thread: 2 x 64 rows");
        if constexpr (kNc + kNp > 2) setmaxnreg_dec<kProducerRegs>();
        const int pw = wg - kNc;
        // the cache's layout as wg_issue reads it (g_head_major_keys)
        const int head_keys = g_head_major_keys;
        const size_t key_stride = head_keys ? size_t(kRowBytes) : size_t(HKV) * kRowBytes;
        constexpr unsigned kLbo = kTile / 8 * 128;
        const int which = wtid / kTile, key = wtid % kTile;
        const uint8_t * base = (which ? v : k) + size_t(kvh) * (head_keys ? size_t(head_keys) : size_t(1)) * kRowBytes +
                               size_t(key) * key_stride;
        unsigned cur[kRowBytes / 4], nxt[kRowBytes / 4];
        if constexpr (kRing > 0) {
            // the rows copied whole-tile by cp.async (consecutive threads, consecutive 16 bytes: coalesced, past L1)
            // into this warpgroup's ring of kRing raw slots, kRing - 1 of its tiles ahead; each thread then reads its
            // own row back as 9 16-byte loads (rows 144 bytes apart: 8 threads cover the 32 banks, no conflicts)
            constexpr int kRawTile = 2 * kTile * kRowBytes, kBarRing = 8;
            uint8_t * ring = raw_sh + pw * kRing * kRawTile;
            auto issue = [&](int i, int slot) {
                if (i < n_local) {
                    wg_issue<kTile>(k, v, ring + slot * kRawTile, t0 + i, kvh, wtid, 128);
                } else {
                    cp_commit();  // an empty group keeps the count wait_group relies on
                }
            };
#pragma unroll
            for (int u = 0; u < kRing - 1; ++u) issue(pw + u * kNp, u);
            for (int i = pw, u = 0; i < n_local; i += kNp, ++u) {
                const int stage = i % kStages;
                if constexpr (kRing == 1) {
                    named_sync(kBarRing + pw, 128);  // every thread done reading the slot (the last tile)
                    issue(i, 0);
                    cp_wait<0>();
                } else {
                    cp_wait<kRing - 2>();
                }
                named_sync(kBarRing + pw, 128);  // tile i's rows in for all; (kRing > 1) slot u - 1 read by all
                if constexpr (kRing > 1) issue(i + (kRing - 1) * kNp, (u + kRing - 1) % kRing);
                const uint4 * row = (const uint4 *) (ring + (u % kRing) * kRawTile + (which * kTile + key) * kRowBytes);
#pragma unroll
                for (int j = 0; j < kRowBytes / 16; ++j) {
                    const uint4 x = row[j];
                    cur[4 * j] = x.x, cur[4 * j + 1] = x.y, cur[4 * j + 2] = x.z, cur[4 * j + 3] = x.w;
                }
                if (i >= kStages) named_sync(kBarEmpty + stage, kPair);
                uint8_t * dst = kv_sh + stage * kStageBytes + which * kTile * D * 2 + (key / 8) * 128 + (key % 8) * 16;
                q4_0_row_to_f16(cur, dst, kLbo);
                fence_proxy_async();
                named_arrive(kBarFull + stage, kPair);
            }
            return;
        }
        auto load = [&](unsigned (&r)[kRowBytes / 4], int t) {
            const uint4 * p = (const uint4 *) (base + size_t(t) * kTile * key_stride);
#pragma unroll
            for (int j = 0; j < kRowBytes / 16; ++j) {
                const uint4 x = __ldg(p + j);
                r[4 * j] = x.x, r[4 * j + 1] = x.y, r[4 * j + 2] = x.z, r[4 * j + 3] = x.w;
            }
        };
        if (pw < n_local) load(cur, t0 + pw);
        for (int i = pw; i < n_local; i += kNp) {
            const int stage = i % kStages;
            stamp(tr, i, 0);
            if (i + kNp < n_local) load(nxt, t0 + i + kNp);
            if (i >= kStages) named_sync(kBarEmpty + stage, kPair);  // the consumers are done with its last tile
            stamp(tr, i, 1);
            uint8_t * dst = kv_sh + stage * kStageBytes + which * kTile * D * 2 + (key / 8) * 128 + (key % 8) * 16;
            q4_0_row_to_f16(cur, dst, kLbo);
            fence_proxy_async();
            named_arrive(kBarFull + stage, kPair);
            stamp(tr, i, 2);
#pragma unroll
            for (int j = 0; j < kRowBytes / 4; ++j) cur[j] = nxt[j];
        }
        return;
    }
    if (wg == kNc) {  // the producer warpgroup
        if constexpr (kNc > 1) setmaxnreg_dec<kProducerRegs>();
        if (n_local > 0) wg_issue<kTile>(k, v, raw_sh, t0, kvh, wtid, 128);
        for (int i = 0; i < n_local; ++i) {
            const int stage = i & 1;
            if (i + 1 < n_local) {
                wg_issue<kTile>(k, v, raw_sh + ((i + 1) & 1) * 2 * kTile * kRowBytes, t0 + i + 1, kvh, wtid, 128);
                cp_wait<1>();
            } else {
                cp_wait<0>();
            }
            named_sync(kBarProducers, 128);                  // tile i's raw rows in, for all producer threads
            if (i >= 2) named_sync(kBarEmpty + stage, kPair);  // the consumers are done with tile i - 2's stage
            if constexpr (!kF.no_convert) {
                wg_convert<kTile>(raw_sh + (i & 1) * 2 * kTile * kRowBytes, kv_sh + stage * kStageBytes, wtid, 128);
            }
            fence_proxy_async();
            named_arrive(kBarFull + stage, kPair);
            named_sync(kBarProducers, 128);  // all producers done reading raw slot i & 1 (tile i + 2 lands there)
        }
        return;
    }
    if constexpr (kNc + kNp > 2) setmaxnreg_inc<kConsumerRegs>();
    constexpr int kOnt = kF.split_d ? D / 16 : D / 8;  // O's n-tiles a thread holds
    const int wrow = kF.split_d ? 0 : wg * 64, d0 = kF.split_d ? wg * (D / 2) : 0;  // its rows, its dimensions
    float o[kOnt][4];
#pragma unroll
    for (int nt = 0; nt < kOnt; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const uint8_t * qc = q_sh + (kF.split_d ? 0 : wg * kWgQBytes);
    const bool live = wrow < rows;  // a warpgroup past the last row only keeps the barriers' counts
    if constexpr (!kAhead) {
        // ping-pong (2 consumer warpgroups, both with rows): the warpgroups issue their S in turn, each handing the
        // turn over as soon as its S is issued, so one's softmax runs while the other's MMAs do (FlashAttention-3's
        // schedule between warpgroups; the arithmetic is wg_tile's)
        constexpr int kBarTurn = 10;
        const bool turns = kF.pingpong && rows > 64;
        if (turns && wg == 1) named_arrive(kBarTurn, 256);  // warpgroup 0 goes first
        for (int i = 0; i < n_local; ++i) {
            const int stage = i % kStages;
            named_sync(kBarFull + stage, kPair);  // the producer filled this stage with tile i
            stamp(tr, i, 0);
            if (!kF.no_math && live) {  // wg_tile, with the turns
                const uint8_t * kv = kv_sh + stage * kStageBytes;
                float sc[kTile / 8][4];
                if (turns) named_sync(kBarTurn + wg, 256);
                wg_s<kTile>(qc, kv, sc);
                if (turns && (wg == 0 || i + 1 < n_local)) named_arrive(kBarTurn + 1 - wg, 256);  // (0 takes no more)
                wgmma_wait<0>();
                stamp(tr, i, 1);
                wg_pv<kTile, false, kOnt>(kv, sc, o, m, l, scale_log2, d0);
                stamp(tr, i, 2);
                wgmma_wait<0>();
                stamp(tr, i, 3);
            }
            if (i + kStages < n_local) named_arrive(kBarEmpty + stage, kPair);  // the producer's next tile here waits
        }
    } else {
        // S of tile i + 1 issued before tile i's softmax, so the tensor cores run it while the softmax does its math
        // (FlashAttention-3's overlap within a warpgroup); two S accumulators, taken in turn (one consumer warpgroup:
        // under two, capped at 168 registers, the second accumulator spills)
        float sa[kTile / 8][4], sb[kTile / 8][4];
        auto step = [&](float (&cur)[kTile / 8][4], float (&next)[kTile / 8][4], int i) {
            if (i + 1 < n_local) {
                named_sync(kBarFull + ((i + 1) & 1), kPair);
                wg_s<kTile>(qc, kv_sh + ((i + 1) & 1) * kStageBytes, next);
                wgmma_wait<1>();  // tile i's S done; tile i + 1's may run on
            } else {
                wgmma_wait<0>();
            }
            if (i + 1 < n_local) {
                wg_pv<kTile, true>(kv_sh + (i & 1) * kStageBytes, cur, o, m, l, scale_log2);
            } else {
                wg_pv<kTile>(kv_sh + (i & 1) * kStageBytes, cur, o, m, l, scale_log2);
            }
            wgmma_wait<0>();
            if (i + 2 < n_local) named_arrive(kBarEmpty + (i & 1), kPair);
        };
        if (n_local > 0) {
            named_sync(kBarFull, kPair);
            wg_s<kTile>(qc, kv_sh, sa);
        }
        for (int i = 0; i < n_local; i += 2) {
            step(sa, sb, i);
            if (i + 1 < n_local) step(sb, sa, i + 1);
        }
    }
    const int r0 = wrow + warp * 16;
    if (r0 < rows) store_partial(part + (size_t(seg) * HKV + kvh) * (n_grp * kRows) * (D + 2), row0 + r0, o, m, l, d0);
#else
    __trap();  // built without sm_90a: the table skips this shape
#endif
}

// ---- The tree's 3 row groups as a cluster (distributed shared memory) ----
// The 3 blocks of a tree's KV head and segment read and convert the same K / V tiles; in probe_attn_fa3 each converts
// all of every tile, so conversion is 3 times the tree's (the one-query call's tree of one block takes a third of the
// time). Here they run as a cluster of 3: block r's producer warpgroup converts a third of each tile's quant blocks
// (items r 128 + thread + 384 j: 3 a thread in blocks 0 and 1, 2 in block 2; consecutive threads consecutive keys) and
// stores each 16 bytes into the stage of all three blocks (their shared memory as generic pointers), while its
// consumer warpgroup computes the tile before from the other stage (wg_tile: the bits of probe_attn_wg). One cluster
// barrier a tile hands both stages over (arrive.release / wait.acquire over the 768 threads; the stores' proxy fence
// before it, wgmma reading them after). A thread loads its next tile's quant blocks (5 words each) into registers
// while converting this one's. 256 threads, no setmaxnreg. Block index: cluster rank (row group) fastest, then the
// KV head, then the segment. The tree only (3 row groups). Measured (H200, session 31): all ok, but 2.6x slower than
// the 2-producer block at 128K (927.9 us against 352.7), 318.6 against 102.4 at 32K: kept as the record, not pursued.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define PROBE_CLUSTER_OF_3 __cluster_dims__(3, 1, 1)
#else
#define PROBE_CLUSTER_OF_3  // (no clusters before sm_90: the body traps there)
#endif
template <int kTile>
__global__ void PROBE_CLUSTER_OF_3 __launch_bounds__(256, 1)
probe_attn_cluster(const half * q, const uint8_t * k, const uint8_t * v, float * part, int n_q, int n_grp, int n_tiles,
                   int seg_tiles, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    constexpr unsigned kStageBytes = 2 * kTile * D * 2, kLbo = kTile / 8 * 128;
    constexpr int kItems = 2 * kTile * (D / 32);    // quant blocks a tile: K's, then V's
    constexpr int kPer = (kItems + 383) / 384;      // a producer thread's quant blocks a tile (the most)
    constexpr size_t kStride = size_t(HKV) * kRowBytes;
    extern __shared__ uint4 smem_u4[];
    uint8_t * q_sh = (uint8_t *) smem_u4;  // 64 rows x D
    uint8_t * kv_sh = q_sh + kWgQBytes;    // [2 stages][K, V][kTile x D]
    const int cr = int(cluster.block_rank());
    const int kvh = blockIdx.x / 3 % HKV, seg = blockIdx.x / (3 * HKV);
    const int tid = threadIdx.x, wg = tid / 128, wtid = tid % 128, warp = wtid / 32;
    const int row0 = cr * 64, rows = n_q * G - row0, t0 = seg * seg_tiles, t1 = min(t0 + seg_tiles, n_tiles);
    const int n_local = max(t1 - t0, 0);
    if (n_grp != 3) __trap();  // (launched for the tree only)
    wg_load_q(q, q_sh, kvh, row0, rows, 64, tid, 256);
    fence_proxy_async();
    uint8_t * kv_of[3];  // each block's stages, as generic pointers
#pragma unroll
    for (int b = 0; b < 3; ++b) kv_of[b] = cluster.map_shared_rank(kv_sh, b);
    cluster.sync();  // Q in; every block of the cluster running (its shared memory may be written)

    // the producer's items: quant block qb of key `key` of K or V; its tile-0 source and its stage offset
    const uint8_t * src[kPer];
    int dst_off[kPer];
    bool has[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int item = cr * 128 + wtid + 384 * j;
        has[j] = item < kItems;
        const int which = item / (kTile * (D / 32)), within = item % (kTile * (D / 32));
        const int key = within % kTile, qb = within / kTile;
        src[j] = (which ? v : k) + size_t(key) * kStride + kvh * kRowBytes + qb * 18;
        dst_off[j] = which * kTile * D * 2 + 4 * qb * kLbo + (key / 8) * 128 + (key % 8) * 16;
    }
    unsigned cur[kPer][5], nxt[kPer][5];
    auto load = [&](unsigned (&w)[kPer][5], int t) {  // the 5 words around each item's quant block in tile t
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            if (!has[j]) continue;
            const uint8_t * p = src[j] + size_t(t) * kTile * kStride;
            const unsigned * w4 = (const unsigned *) (p - (uintptr_t(p) & 2));
#pragma unroll
            for (int i = 0; i < 5; ++i) w[j][i] = __ldg(w4 + i);
        }
    };

    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    if (wg == 1 && n_local > 0) load(cur, t0);
    for (int i = 0; i <= n_local; ++i) {
        if (wg == 1) {
            if (i < n_local) {  // tile i's third into stage i & 1 of the three blocks
                if (i + 1 < n_local) load(nxt, t0 + i + 1);
                const unsigned stage = (i & 1) * kStageBytes;
#pragma unroll
                for (int j = 0; j < kPer; ++j) {
                    if (!has[j]) continue;
                    unsigned out[16];
                    q4_0_words_to_halves(cur[j], unsigned(uintptr_t(src[j]) & 2), out);
#pragma unroll
                    for (int b = 0; b < 3; ++b) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            *(uint4 *) (kv_of[b] + stage + dst_off[j] + e * kLbo) =
                                make_uint4(out[4 * e], out[4 * e + 1], out[4 * e + 2], out[4 * e + 3]);
                        }
                    }
                }
                asm volatile("fence.proxy.async.shared::cluster;\n" ::: "memory");
#pragma unroll
                for (int j = 0; j < kPer; ++j) {
#pragma unroll
                    for (int e = 0; e < 5; ++e) cur[j][e] = nxt[j][e];
                }
            }
        } else if (i > 0 && rows > 0) {  // the consumer: tile i - 1
            wg_tile<kTile>(q_sh, kv_sh + ((i - 1) & 1) * kStageBytes, o, m, l, scale_log2);
        }
        cluster.sync();  // tile i in all three blocks' stage i & 1; tile i - 1's stage free
    }
    if (wg == 0 && warp * 16 < rows) {
        store_partial(part + (size_t(seg) * HKV + kvh) * (n_grp * 64) * (D + 2), row0 + warp * 16, o, m, l);
    }
#else
    __trap();  // built without sm_90a: the table skips this shape
#endif
}

// ---- Ranked keys (what the invariant attention must keep, on the block above) ----
// A row sees its query's visible cache rows in slot order, numbered by rank: a dense run [0, f) and then scattered
// slots (a tree node's ancestors). A tree node's ranks are those of an AR step at the end of its path, so a block that
// works by rank gives the node the AR step's bits. probe_attn_ranked: probe_attn_fa3's register-producer block (one
// consumer warpgroup of 64 rows, one producer warpgroup) over passes of 64 ranks: the tiles below the block's
// smallest dense run, shared by its rows, then for each of its queries the tiles from there to the end of its ranks,
// gathered from its slots (ranks past its end as zero rows), with the other queries' rows masked. A masked row's pass
// adds exact zeros (P = 0, corr = 1), and a row's S, softmax and P V do not depend on the other rows, so a row's bits
// depend only on its ranks, the tile and the segment length: checked against one-query calls over a cache holding each
// node's path contiguously.
constexpr int kMaxAnc = 32;  // scattered slots a query may have (a tree node's ancestors, itself included)
struct Ranks {
    const int * dense;   // [n_q]: f, the dense run [0, f)
    const int * n_vis;   // [n_q]: visible ranks in all
    const int * sparse;  // [n_q][kMaxAnc]: the scattered slots, ascending
};
// The block's passes: the shared tiles [t0, ts), then query by query its tiles [max(t0, ts), its end); pass i's tile
// and query (-1: shared), or t = -1 past the last
struct Passes {
    int t0, ts, t1, q_lo, q_hi;
    const Ranks * rk;
    __device__ int tail_end(int qi) const { return min(t1, (rk->n_vis[qi] + 63) / 64); }
    __device__ int count() const {
        int n = max(ts - t0, 0);
        for (int qi = q_lo; qi < q_hi; ++qi) n += max(tail_end(qi) - max(t0, ts), 0);
        return n;
    }
    __device__ void at(int i, int & t, int & qi) const {
        if (i < ts - t0) {
            t = t0 + i, qi = -1;
            return;
        }
        i -= max(ts - t0, 0);
        const int tb = max(t0, ts);
        for (qi = q_lo; qi < q_hi; ++qi) {
            const int n = max(tail_end(qi) - tb, 0);
            if (i < n) {
                t = tb + i;
                return;
            }
            i -= n;
        }
        t = -1;
    }
};

__global__ void __launch_bounds__(256, 1)
probe_attn_ranked(const half * q, const uint8_t * k, const uint8_t * v, float * part, int n_q, int n_grp, int n_tiles,
                  int seg_tiles, float scale_log2, Ranks rk) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && PROBE_LEAN
    constexpr int kTile = 64, kStages = 2, kPair = 256;
    constexpr int kBarFull = 2, kBarEmpty = 4;
    constexpr unsigned kStageBytes = 2 * kTile * D * 2, kLbo = kTile / 8 * 128;
    extern __shared__ uint4 smem_u4[];
    uint8_t * q_sh = (uint8_t *) smem_u4;  // 64 rows x D
    uint8_t * kv_sh = q_sh + kWgQBytes;    // [2 stages][K, V][kTile x D]
    const int kvh = blockIdx.x % HKV, grp = blockIdx.x / HKV % n_grp, seg = blockIdx.x / (HKV * n_grp);
    const int tid = threadIdx.x, wg = tid / 128, wtid = tid % 128, warp = wtid / 32;
    const int row0 = grp * 64, rows = n_q * G - row0;
    const int q_lo = row0 / G, q_hi = min(n_q, (row0 + 63) / G + 1);
    int f_min = INT_MAX;
    for (int qi = q_lo; qi < q_hi; ++qi) f_min = min(f_min, rk.dense[qi]);
    const int t0 = seg * seg_tiles, t1 = min(t0 + seg_tiles, n_tiles);
    const Passes ps{t0, min(t1, f_min / kTile), t1, q_lo, q_hi, &rk};
    wg_load_q(q, q_sh, kvh, row0, rows, 64, tid, 256);
    fence_proxy_async();
    __syncthreads();
    if (wg == 1) {  // the producer: thread wtid one row (K: keys 0 .., then V) of each pass's tile
        const int which = wtid / kTile, key = wtid % kTile;
        constexpr size_t kStride = size_t(HKV) * kRowBytes;
        const uint8_t * src = (which ? v : k) + size_t(kvh) * kRowBytes;
        unsigned cur[kRowBytes / 4], nxt[kRowBytes / 4];
        auto load = [&](unsigned (&r)[kRowBytes / 4], int i) {
            int t, qi;
            ps.at(i, t, qi);
            const int rank = t * kTile + key;
            int slot = rank;  // a shared tile: the dense run
            if (qi >= 0) {
                const int f = rk.dense[qi];
                slot = rank < f ? rank : rank < rk.n_vis[qi] ? rk.sparse[qi * kMaxAnc + rank - f] : -1;
            }
            const uint4 * p = (const uint4 *) (src + size_t(max(slot, 0)) * kStride);
#pragma unroll
            for (int j = 0; j < kRowBytes / 16; ++j) {
                const uint4 x = slot >= 0 ? __ldg(p + j) : make_uint4(0, 0, 0, 0);  // (d = 0: the values are 0)
                r[4 * j] = x.x, r[4 * j + 1] = x.y, r[4 * j + 2] = x.z, r[4 * j + 3] = x.w;
            }
        };
        const int n_pass = ps.count();
        if (n_pass > 0) load(cur, 0);
        for (int i = 0; i < n_pass; ++i) {
            const int stage = i % kStages;
            if (i + 1 < n_pass) load(nxt, i + 1);
            if (i >= kStages) named_sync(kBarEmpty + stage, kPair);
            q4_0_row_to_f16(cur, kv_sh + stage * kStageBytes + which * kTile * D * 2 + (key / 8) * 128 + (key % 8) * 16,
                            kLbo);
            fence_proxy_async();
            named_arrive(kBarFull + stage, kPair);
#pragma unroll
            for (int j = 0; j < kRowBytes / 4; ++j) cur[j] = nxt[j];
        }
        return;
    }
    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int lane = tid % 32, gid = lane >> 2, tig = lane & 3;
    int my_q[2], my_nv[2];  // this thread's two rows: their query and visible ranks
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + warp * 16 + gid + 8 * h;
        my_q[h] = r < n_q * G ? r / G : -2;
        my_nv[h] = r < n_q * G ? rk.n_vis[my_q[h]] : 0;
    }
    for (int i = 0;; ++i) {
        int t, qi;
        ps.at(i, t, qi);
        if (t < 0) break;
        int t_next, q_next;
        ps.at(i + kStages, t_next, q_next);
        const int stage = i % kStages;
        named_sync(kBarFull + stage, kPair);
        const uint8_t * kv = kv_sh + stage * kStageBytes;
        float sc[kTile / 8][4];
        wg_s<kTile>(q_sh, kv, sc);
        wgmma_wait<0>();
        if (qi >= 0) {  // a query's own pass: its rows, up to its last rank; the others masked
#pragma unroll
            for (int nt = 0; nt < kTile / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e / 2, rank = t * kTile + nt * 8 + 2 * tig + e % 2;
                    if (my_q[h] != qi || rank >= my_nv[h]) sc[nt][e] = -INFINITY;
                }
            }
        }
        wg_pv<kTile>(kv, sc, o, m, l, scale_log2);
        wgmma_wait<0>();
        if (t_next >= 0) named_arrive(kBarEmpty + stage, kPair);
    }
    const int r0 = warp * 16;
    if (r0 < rows) store_partial(part + (size_t(seg) * HKV + kvh) * (n_grp * 64) * (D + 2), row0 + r0, o, m, l);
#else
    __trap();  // built without sm_90a (or with PROBE_LEAN=0: the masked rows need its guards)
#endif
}

// 1 where this build runs the wgmma block (sm_90a)
__global__ void has_wgmma(int * out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}


// A block shape: consumer warps (m-tiles), how the tiles are filled, keys a tile, and the blocks a multiprocessor the
// registers are capped for (__launch_bounds__; shared memory may allow fewer: the table prints what runs)
struct Config {
    int nw, mode, kt, minb;
};

struct Case {
    int n_q, n_kv, seg_tiles;  // queries, keys (a multiple of the tile), tiles a segment
    Config cfg;                // kF16 reads the F16 cache, the other modes the Q4_0 one
};

struct Run {
    float attn_us = 0, merge_us = 0;
    int regs = 0, local_bytes = 0, blocks_per_sm = 0;
};

template <int NW, int kMode, int KT, int MINB>
Run launch(const Case & c, const half * q, const uint8_t * k, const uint8_t * v, float * part, float * dst, int iters) {
    auto * kernel = [] {
        if constexpr (kMode == kWgmma) {
            return probe_attn_wg<KT, MINB>;
        } else if constexpr (kMode == kFa3Cluster) {
            return probe_attn_cluster<KT>;
        } else if constexpr (is_fa3(kMode)) {
            return probe_attn_fa3<NW / 4, KT, kMode>;
        } else {
            return probe_attn<NW, kMode, KT, MINB>;
        }
    }();
    const int n_tiles = c.n_kv / KT, seg_tiles = c.seg_tiles, threads = (NW + producer_warps(kMode)) * 32;
    constexpr int kBlockRows = block_rows(NW, kMode);
    const int n_seg = (n_tiles + seg_tiles - 1) / seg_tiles, n_grp = (c.n_q * G + kBlockRows - 1) / kBlockRows;
    const size_t smem = smem_bytes(NW, kMode, KT);
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    Run r;
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, kernel));
    r.regs = fa.numRegs;
    r.local_bytes = int(fa.localSizeBytes);
    if (kMode == kFa3Cluster) {
        r.blocks_per_sm = 1;  // (a cluster kernel: the occupancy query is cudaOccupancyMaxActiveClusters's)
    } else {
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks_per_sm, kernel, threads, smem));
    }
    const float scale_log2 = 1.0f / std::sqrt(float(D)) * 1.4426950408889634f;
    cudaEvent_t e0, e1, e2;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaEventCreate(&e2));
    for (int it = -2; it < iters; ++it) {  // two warm-up runs
        CHECK(cudaEventRecord(e0));
        kernel<<<n_seg * HKV * n_grp, threads, smem>>>(q, k, v, part, c.n_q, n_grp, n_tiles, seg_tiles, scale_log2);
        CHECK(cudaEventRecord(e1));
        probe_merge<<<dim3(c.n_q * G, HKV), D>>>(part, dst, c.n_q, n_seg, n_grp * kBlockRows);
        CHECK(cudaEventRecord(e2));
        CHECK(cudaEventSynchronize(e2));
        if (it >= 0) {
            float a, b;
            CHECK(cudaEventElapsedTime(&a, e0, e1));
            CHECK(cudaEventElapsedTime(&b, e1, e2));
            r.attn_us += 1000.0f * a / iters;
            r.merge_us += 1000.0f * b / iters;
        }
    }
    CHECK(cudaGetLastError());
    for (cudaEvent_t e : {e0, e1, e2}) CHECK(cudaEventDestroy(e));
    return r;
}

using LaunchFn = Run (*)(const Case &, const half *, const uint8_t *, const uint8_t *, float *, float *, int);
struct Shape {
    Config cfg;
    int n_q;  // what it is for: a 23-node tree or one query
    LaunchFn fn;
};
#define SHAPE(nw, mode, kt, minb, n_q) {{nw, mode, kt, minb}, n_q, launch<nw, mode, kt, minb>}
// the shapes compiled: a tree's 9 m-tiles in 2 blocks of 5 (or 3 of 3, as the invariant kernel splits them); one
// query's m-tile in a block of 4 warps (3 idle in the math, copying with it) or of 1; 64-key tiles, and 32-key ones
// where two or three blocks fit a multiprocessor's shared memory (for 2 blocks of 5 warps nvcc 13.0 caps the
// registers at 168 and spills ~60 bytes a thread; 2 blocks of 3 warps compile to 219-223 registers, no spills); and
// the wgmma warpgroup (Hopper), 64 rows a block: a tree in 3 blocks, one query in 1, the same block for both; and
// FlashAttention-3's shape (a producer warpgroup, 1 or 2 consumer warpgroups: m-tiles 4 or 8; with 1 and 32-key
// tiles, also the next tile's S ahead of this tile's softmax: 64-key tiles there run out of registers, and ptxas
// serializes the wgmma: C7512), its timing-only cuts, and its register-producer variants at 64-key tiles (2 consumer
// warpgroups with 2 producers do not compile: 128 registers at 512 threads)
const Shape kShapes[] = {
    SHAPE(5, kSerial, 64, 1, 23), SHAPE(5, kProducers, 64, 1, 23), SHAPE(5, kF16, 64, 1, 23),
    SHAPE(3, kProducers, 64, 1, 23),
    SHAPE(5, kSerial, 32, 2, 23), SHAPE(5, kProducers, 32, 1, 23), SHAPE(5, kF16, 32, 2, 23),
    SHAPE(3, kSerial, 32, 2, 23), SHAPE(3, kF16, 32, 2, 23),
    SHAPE(4, kWgmma, 64, 1, 23), SHAPE(4, kWgmma, 32, 2, 23),
    SHAPE(8, kFa3, 32, 1, 23), SHAPE(4, kFa3, 32, 1, 23), SHAPE(4, kFa3, 64, 1, 23),
    SHAPE(4, kFa3Ahead, 32, 1, 23), SHAPE(4, kFa3NoConvert, 64, 1, 23), SHAPE(4, kFa3NoMath, 64, 1, 23),
    SHAPE(4, kFa3Regs, 64, 1, 23), SHAPE(8, kFa3Regs, 64, 1, 23), SHAPE(4, kFa3Regs3, 64, 1, 23),
    SHAPE(4, kFa3RegsNoMath, 64, 1, 23), SHAPE(4, kFa3Regs2P, 64, 1, 23), SHAPE(4, kFa3Ring, 64, 1, 23),
    SHAPE(4, kFa3Ring2P, 64, 1, 23), SHAPE(8, kFa3PingPong, 64, 1, 23), SHAPE(8, kFa3SplitD, 64, 1, 23),
    SHAPE(4, kFa3Cluster, 64, 1, 23),
    SHAPE(4, kSerial, 64, 1, 1), SHAPE(4, kProducers, 64, 1, 1), SHAPE(4, kF16, 64, 1, 1),
    SHAPE(1, kSerial, 64, 2, 1), SHAPE(1, kProducers, 64, 1, 1), SHAPE(1, kF16, 64, 1, 1),
    SHAPE(1, kSerial, 32, 3, 1), SHAPE(1, kProducers, 32, 2, 1), SHAPE(1, kF16, 32, 3, 1),
    SHAPE(4, kWgmma, 64, 1, 1), SHAPE(4, kWgmma, 32, 2, 1), SHAPE(4, kFa3, 32, 1, 1), SHAPE(4, kFa3, 64, 1, 1),
    SHAPE(4, kFa3Ahead, 32, 1, 1), SHAPE(4, kFa3Regs, 64, 1, 1), SHAPE(4, kFa3Regs3, 64, 1, 1),
    SHAPE(4, kFa3Regs2P, 64, 1, 1), SHAPE(4, kFa3Ring, 64, 1, 1), SHAPE(4, kFa3Ring2P, 64, 1, 1),
    SHAPE(8, kFa3SplitD, 64, 1, 1),
};
#undef SHAPE

// k, v: the Q4_0 cache, or the F16 one where the mode is kF16
Run run_case(const Case & c, const half * q, const uint8_t * k, const uint8_t * v, float * part, float * dst,
             int iters) {
    for (const Shape & s : kShapes) {
        if (s.cfg.nw == c.cfg.nw && s.cfg.mode == c.cfg.mode && s.cfg.kt == c.cfg.kt && s.cfg.minb == c.cfg.minb) {
            return s.fn(c, q, k, v, part, dst, iters);
        }
    }
    std::fprintf(stderr, "tree_attn_probe: no shape nw %d mode %d kt %d minb %d compiled\n", c.cfg.nw, c.cfg.mode,
                 c.cfg.kt, c.cfg.minb);
    std::exit(2);
}

bool on_wgmma(int mode) { return mode == kWgmma || is_fa3(mode); }
bool timing_only(int mode) { return fa3_of(mode).no_convert || fa3_of(mode).no_math; }
// the blocks a KV head takes for n_q queries (groups of a block's rows)
int row_groups(const Config & g, int n_q) {
    return (n_q * G + block_rows(g.nw, g.mode) - 1) / block_rows(g.nw, g.mode);
}
// tiles a segment so that n_tiles fill `waves` waves of blocks (g.minb a multiprocessor), at most max_seg segments
int wave_seg_tiles(const Config & g, int n_q, int n_tiles, int n_sm, int waves, int max_seg) {
    const int want = std::min({std::max(1, waves * g.minb * n_sm / (HKV * row_groups(g, n_q))), max_seg, n_tiles});
    return (n_tiles + want - 1) / want;
}

// argv[1]: "mma" (the mma.sync shapes), "wgmma" (the wgmma ones, checked against the serial mma.sync tree), none
// (both), or "profile" / "trace" (below)
int main(int argc, char ** argv) {
    const char * only = argc > 1 ? argv[1] : "";
    // profile: the first FA3 shape and the two-producer one, 64-key tiles, a tree then one query, each at 128K and
    // launched 3 times (two warm-ups), for ncu: probe_attn_fa3 launches 0-2, 3-5 (the trees), 6-8, 9-11
    const bool profile = std::strcmp(only, "profile") == 0;
    // trace: the register-producer shapes' phases per tile (block 0, the tree at 128K), in cycles
    const bool trace = std::strcmp(only, "trace") == 0;
    // cluster: the cluster shape and the 2-producer block it is measured against (a process of their own: a cluster
    // launch that faults keeps the other tables)
    const bool cluster_part = std::strcmp(only, "cluster") == 0;
    // layout: the 2-producer block over the engine's cache layout and over a head-major one (the same values)
    const bool layout_part = std::strcmp(only, "layout") == 0;
    if (*only && std::strcmp(only, "mma") != 0 && std::strcmp(only, "wgmma") != 0 && !profile && !trace &&
        !cluster_part && !layout_part) {
        std::fprintf(stderr, "usage: tree_attn_probe [mma|wgmma|cluster|layout|profile|trace]\n");
        return 2;
    }
    // a shape this run measures (the serial tree, every check's reference, runs either way)
    auto wanted = [&](int mode) {
        if (!*only) return true;
        if (cluster_part) return mode == kFa3Cluster || mode == kFa3Regs2P;
        if (layout_part) return false;  // (its own table below)
        return (std::strcmp(only, "wgmma") == 0) == on_wgmma(mode) && mode != kFa3Cluster;
    };
    constexpr int kMaxKv = 131072, kMaxQ = 23, kMaxSeg = 264;
    ProbeData data = probe_data(kMaxKv, kMaxQ);
    const std::vector<uint8_t> &hk = data.k, &hv = data.v;
    const std::vector<half> & hq = data.q;
    Xorshift & rnd = data.rnd;  // (the ranked check's tree, from the stream after the data)
    // the F16 cache: the Q4_0 one's values, as the kernel converts them (so both give the same bits)
    const std::vector<half> hkf = q4_0_values(hk, kMaxKv), hvf = q4_0_values(hv, kMaxKv);
    half * q;
    uint8_t *k, *v, *kf, *vf;
    float *part, *dst;
    CHECK(cudaMalloc(&q, hq.size() * sizeof(half)));
    CHECK(cudaMalloc(&k, hk.size()));
    CHECK(cudaMalloc(&v, hv.size()));
    CHECK(cudaMalloc(&kf, hkf.size() * sizeof(half)));
    CHECK(cudaMalloc(&vf, hvf.size() * sizeof(half)));
    CHECK(cudaMalloc(&part, size_t(kMaxSeg) * HKV * 16 * 16 * (D + 2) * sizeof(float)));  // up to 16 m-tiles a KV head
    CHECK(cudaMalloc(&dst, size_t(kMaxQ) * H * D * sizeof(float)));
    CHECK(cudaMemcpy(q, hq.data(), hq.size() * sizeof(half), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(k, hk.data(), hk.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(v, hv.data(), hv.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(kf, hkf.data(), hkf.size() * sizeof(half), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(vf, hvf.data(), hvf.size() * sizeof(half), cudaMemcpyHostToDevice));

    // the checks at 2K keys in 3 uneven segments (704, 704 and 640 keys), for each tile length: the serial Q4_0 tree
    // block's 23 queries against double precision from the same f16 values; then, bit for bit against it, every other
    // shape of that tile length: one query (query 0), the F16 cache, the producer warps; and at one-tile segments
    bool ok = true;
    constexpr int kCheckKv = 2048;
    int dev = 0, n_sm = 0, major = 0;
    CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    int * flag;
    CHECK(cudaMalloc(&flag, sizeof(int)));
    has_wgmma<<<1, 1>>>(flag);
    int built_wgmma = 0;
    CHECK(cudaMemcpy(&built_wgmma, flag, sizeof(int), cudaMemcpyDeviceToHost));
    const bool hopper = major == 9 && built_wgmma;  // the wgmma shapes run (built for sm_90a, as run.sh does)
    if (!hopper) std::printf("(the wgmma shapes skipped: not an sm_90a build on a Hopper GPU)\n");
    if (profile) {
        for (const Shape & s : kShapes) {
            const Config & g = s.cfg;
            if ((g.mode != kFa3 && g.mode != kFa3Regs2P) || g.kt != 64 || !hopper) continue;
            const int seg_tiles = wave_seg_tiles(g, s.n_q, 131072 / g.kt, n_sm, 1, kMaxSeg);
            const Run r = run_case({s.n_q, 131072, seg_tiles, g}, q, k, v, part, dst, 1);
            std::printf("profile: %s, %d queries, 128K keys: %.1f us\n", mode_name(g.mode), s.n_q, r.attn_us);
        }
        return 0;
    }
    if (trace && !hopper) return 0;  // (the stamps are in the wgmma blocks only)
    if (trace) {
        long long * tr;
        const size_t n_tr = size_t(4) * kTraceTiles * 4;
        CHECK(cudaMalloc(&tr, n_tr * sizeof(long long)));
        CHECK(cudaMemcpyToSymbol(g_trace, &tr, sizeof(tr)));
        std::printf("| shape | warpgroup | tiles | phase cycles a tile (mean over the middle tiles) |\n"
                    "|---|---|---|---|\n");
        for (const Shape & s : kShapes) {
            const Config & g = s.cfg;
            const Fa3 f = fa3_of(g.mode);
            const bool traced = is_fa3(g.mode) && f.regs && !f.ring && !f.no_math && f.stages == 2 &&
                                g.mode != kFa3Cluster;
            if (!traced || g.kt != 64 || s.n_q != 23) continue;
            const int seg_tiles = wave_seg_tiles(g, s.n_q, 131072 / g.kt, n_sm, 1, kMaxSeg);
            CHECK(cudaMemset(tr, 0, n_tr * sizeof(long long)));
            run_case({s.n_q, 131072, seg_tiles, g}, q, k, v, part, dst, 1);  // (the last of 3 launches stays)
            std::vector<long long> h(n_tr);
            CHECK(cudaMemcpy(h.data(), tr, n_tr * sizeof(long long), cudaMemcpyDeviceToHost));
            const int n_wg = g.nw / 4 + f.producers, lo = 4, hi = std::min(seg_tiles, kTraceTiles) - 4;
            for (int w = 0; w < n_wg; ++w) {
                const bool consumer = w < g.nw / 4;
                auto at = [&](int i, int e) { return h[(size_t(w) * kTraceTiles + i) * 4 + e]; };
                double d[4] = {0, 0, 0, 0};
                int n = 0;
                for (int i = lo; i < hi; ++i) {
                    if (!consumer && (i % f.producers) != w - g.nw / 4) continue;
                    if (consumer) {  // wait for the stage, S, softmax + issue, P V
                        d[0] += double(at(i, 0) - at(i - 1, 3));
                        d[1] += double(at(i, 1) - at(i, 0));
                        d[2] += double(at(i, 2) - at(i, 1));
                        d[3] += double(at(i, 3) - at(i, 2));
                    } else {  // issue the next loads, wait for the stage, convert + hand over, to the next tile
                        d[0] += double(at(i, 1) - at(i, 0));
                        d[1] += double(at(i, 2) - at(i, 1));
                        const int nx = i + f.producers;
                        d[2] += nx < seg_tiles ? double(at(nx, 0) - at(i, 2)) : 0.0;
                    }
                    ++n;
                }
                if (n == 0 || at(lo, 0) == 0) {
                    std::printf("| %s | %d | %d | (no rows) |\n", mode_name(g.mode), w, seg_tiles);
                    continue;
                }
                if (consumer) {
                    std::printf("| %s, %d consumer wg | %d | %d | wait %.0f, S %.0f, softmax + issue %.0f, "
                                "P V %.0f |\n", mode_name(g.mode), g.nw / 4, w, seg_tiles, d[0] / n, d[1] / n,
                                d[2] / n, d[3] / n);
                } else {
                    std::printf("| %s, %d consumer wg | %d (producer) | %d | loads + stage wait %.0f, convert %.0f, "
                                "to next %.0f |\n", mode_name(g.mode), g.nw / 4, w, seg_tiles, d[0] / n, d[1] / n,
                                d[2] / n);
                }
            }
        }
        return 0;
    }
    auto run_get = [&](const Case & c) {
        const bool f16 = c.cfg.mode == kF16;
        run_case(c, q, f16 ? kf : k, f16 ? vf : v, part, dst, 1);
        std::vector<float> got(size_t(c.n_q) * H * D);
        CHECK(cudaMemcpy(got.data(), dst, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
        return got;
    };
    auto same_bits = [&](const Config & g, const char * what, const std::vector<float> & x,
                         const std::vector<float> & y) {
        int differ = 0;  // over x's values (a one-query call: query 0's of y)
        for (size_t i = 0; i < x.size(); ++i) differ += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
        std::printf("%s  %d-key tiles, %d m-tiles, %s, %d blocks/SM: %s: %d of %zu values differ\n",
                    differ ? "BAD " : "ok  ", g.kt, block_rows(g.nw, g.mode) / 16, mode_name(g.mode), g.minb, what,
                    differ, x.size());
        ok &= differ == 0;
    };
    for (int kt : {64, 32}) {
        const int seg = 704 / kt;
        const Config ref = kt == 64 ? Config{5, kSerial, 64, 1} : Config{5, kSerial, 32, 2};
        const std::vector<float> tree = run_get({23, kCheckKv, seg, ref});
        const double worst = worst_vs_double(hq, hkf, hvf, 23, kCheckKv, tree);
        ok &= worst < 2e-3;
        std::printf("%s  %d-key tiles: 23 queries over Q4_0, %d keys: max abs error vs double %.3g\n",
                    worst < 2e-3 ? "ok  " : "BAD ", kt, kCheckKv, worst);
        for (const Shape & s : kShapes) {
            const Config & g = s.cfg;
            if (g.kt != kt || (g.nw == ref.nw && g.mode == ref.mode && g.minb == ref.minb)) continue;
            const int n_q = s.n_q;
            if ((on_wgmma(g.mode) && !hopper) || !wanted(g.mode) || timing_only(g.mode)) continue;
            same_bits(g, n_q == 1 ? "one query == query 0 of the tree" : "23 queries == the serial tree",
                      run_get({n_q, kCheckKv, seg, g}), tree);
        }
        if (wanted(kProducers)) {
            same_bits({5, kProducers, kt, 1}, "one-tile segments == the serial tree's",
                      run_get({23, kCheckKv, 1, {5, kProducers, kt, 1}}), run_get({23, kCheckKv, 1, ref}));
        }
    }

    std::printf("\n| cache, block | queries | m-tiles a block | keys a tile | regs | local bytes | blocks/SM | keys | "
                "segments | blocks | attention us | merge us | total us |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Shape & s : kShapes) {
        const Config & g = s.cfg;
        const int n_q = s.n_q, n_grp = row_groups(g, n_q);
        if ((on_wgmma(g.mode) && !hopper) || !wanted(g.mode)) continue;
        for (int n_kv : {4096, 32768, 131072}) {
            // one wave of blocks (as many a multiprocessor as the registers are capped for), and two
            for (int waves : {1, 2}) {
                const int n_tiles = n_kv / g.kt;
                Case c{n_q, n_kv, wave_seg_tiles(g, n_q, n_tiles, n_sm, waves, kMaxSeg), g};
                const int n_seg = (n_tiles + c.seg_tiles - 1) / c.seg_tiles;
                const bool f16 = g.mode == kF16;
                const Run r = run_case(c, q, f16 ? kf : k, f16 ? vf : v, part, dst, 20);
                std::printf("| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %.1f | %.1f | %.1f |\n",
                            mode_name(g.mode), n_q, block_rows(g.nw, g.mode) / 16, g.kt, r.regs, r.local_bytes,
                            r.blocks_per_sm, n_kv, n_seg,
                            n_seg * HKV * n_grp, r.attn_us, r.merge_us, r.attn_us + r.merge_us);
            }
        }
    }
    // Ranked keys (probe_attn_ranked): a 23-node tree (random parents, node i's K / V rows at slot p + i) at depth p,
    // each node's rows == a one-query call over a cache holding [0, p) and then its path contiguously; then the tree
    // at 128K timed against the same block without ranks (kFa3Regs)
    if (hopper && wanted(kFa3Regs) && !cluster_part) {
        constexpr int kNodes = 23;
        int parent[kNodes];
        std::vector<int> anc[kNodes];  // root .. node, ascending
        for (int i = 0; i < kNodes; ++i) {
            parent[i] = i == 0 ? -1 : int(rnd() * i);
            if (i > 0) anc[i] = anc[parent[i]];
            anc[i].push_back(i);
        }
        int *d_dense, *d_vis, *d_sparse;
        CHECK(cudaMalloc(&d_dense, kNodes * sizeof(int)));
        CHECK(cudaMalloc(&d_vis, kNodes * sizeof(int)));
        CHECK(cudaMalloc(&d_sparse, kNodes * kMaxAnc * sizeof(int)));
        uint8_t *k2, *v2;  // one node's AR cache
        CHECK(cudaMalloc(&k2, hk.size()));
        CHECK(cudaMalloc(&v2, hv.size()));
        const size_t row_bytes = size_t(HKV) * kRowBytes;  // a cache row: the 4 KV heads
        auto launch_ranked = [&](const half * qp, const uint8_t * kp, const uint8_t * vp, int n_q, int max_vis,
                                 int seg_tiles, int iters) {
            const int n_tiles = (max_vis + 63) / 64, n_seg = (n_tiles + seg_tiles - 1) / seg_tiles;
            const int n_grp = (n_q * G + 63) / 64;
            const size_t smem = kWgQBytes + 2 * 2 * 64 * D * 2;
            CHECK(cudaFuncSetAttribute(probe_attn_ranked, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
            const float scale_log2 = 1.0f / std::sqrt(float(D)) * 1.4426950408889634f;
            const Ranks rk{d_dense, d_vis, d_sparse};
            return time_us([&] {
                probe_attn_ranked<<<n_seg * HKV * n_grp, 256, smem>>>(qp, kp, vp, part, n_q, n_grp, n_tiles, seg_tiles,
                                                                      scale_log2, rk);
                probe_merge<<<dim3(n_q * G, HKV), D>>>(part, dst, n_q, n_seg, n_grp * 64);
            }, 1, iters);
        };
        auto set_tree = [&](int p) {
            std::vector<int> dn(kNodes, p), vis(kNodes), sp(kNodes * kMaxAnc, -1);
            for (int i = 0; i < kNodes; ++i) {
                vis[i] = p + int(anc[i].size());
                for (size_t a = 0; a < anc[i].size(); ++a) sp[i * kMaxAnc + a] = p + anc[i][a];
            }
            CHECK(cudaMemcpy(d_dense, dn.data(), kNodes * sizeof(int), cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(d_vis, vis.data(), kNodes * sizeof(int), cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(d_sparse, sp.data(), sp.size() * sizeof(int), cudaMemcpyHostToDevice));
        };
        int max_depth = 0;
        for (auto & a : anc) max_depth = std::max(max_depth, int(a.size()));
        // the check: p = 2,043 (the tree's ranks cross a tile edge), 4 tiles a segment
        const int p = 2043, seg_tiles = 4;
        set_tree(p);
        launch_ranked(q, k, v, kNodes, p + max_depth, seg_tiles, 0);
        std::vector<float> tree(size_t(kNodes) * H * D);
        CHECK(cudaMemcpy(tree.data(), dst, tree.size() * sizeof(float), cudaMemcpyDeviceToHost));
        int differ = 0;
        for (int i = 0; i < kNodes; ++i) {
            const int nv = p + int(anc[i].size());
            CHECK(cudaMemcpy(k2, k, size_t(p) * row_bytes, cudaMemcpyDeviceToDevice));
            CHECK(cudaMemcpy(v2, v, size_t(p) * row_bytes, cudaMemcpyDeviceToDevice));
            for (size_t a = 0; a < anc[i].size(); ++a) {
                CHECK(cudaMemcpy(k2 + (p + a) * row_bytes, k + size_t(p + anc[i][a]) * row_bytes, row_bytes,
                                 cudaMemcpyDeviceToDevice));
                CHECK(cudaMemcpy(v2 + (p + a) * row_bytes, v + size_t(p + anc[i][a]) * row_bytes, row_bytes,
                                 cudaMemcpyDeviceToDevice));
            }
            CHECK(cudaMemcpy(d_dense, &nv, sizeof(int), cudaMemcpyHostToDevice));  // one query: all dense
            CHECK(cudaMemcpy(d_vis, &nv, sizeof(int), cudaMemcpyHostToDevice));
            launch_ranked(q + size_t(i) * H * D, k2, v2, 1, nv, seg_tiles, 0);
            std::vector<float> one(size_t(H) * D);
            CHECK(cudaMemcpy(one.data(), dst, one.size() * sizeof(float), cudaMemcpyDeviceToHost));
            for (size_t j = 0; j < one.size(); ++j) {
                differ += std::memcmp(&one[j], &tree[size_t(i) * H * D + j], sizeof(float)) != 0;
            }
        }
        std::printf("%s  ranked keys: a 23-node tree (depth %d) at 2,043 keys == each node's one-query call over its "
                    "path: %d of %zu values differ\n", differ ? "BAD " : "ok  ", max_depth, differ, tree.size());
        ok &= differ == 0;
        // the timing: the tree at ~128K, one wave, against the block without ranks
        const int p_deep = kMaxKv - kNodes, n_tiles = (p_deep + max_depth + 63) / 64;
        const int seg_deep = wave_seg_tiles({4, kFa3Regs, 64, 1}, kNodes, n_tiles, n_sm, 1, kMaxSeg);
        set_tree(p_deep);
        const float us = launch_ranked(q, k, v, kNodes, p_deep + max_depth, seg_deep, 20);
        const Run plain = run_case({kNodes, kMaxKv, seg_deep, {4, kFa3Regs, 64, 1}}, q, k, v, part, dst, 20);
        std::printf("ranked keys, 23-node tree at %d keys, %d tiles a segment: %.1f us (attention + merge); the same "
                    "block without ranks at 131,072: %.1f us\n", p_deep, seg_deep, us, plain.attn_us + plain.merge_us);
        for (auto * b : {d_dense, d_vis, d_sparse}) CHECK(cudaFree(b));
        CHECK(cudaFree(k2));
        CHECK(cudaFree(v2));
    }
    // A kernel whose bits may not depend on the call can fix its segment length only by the row's own depth, not by
    // the wave the call fills: the best shape at fixed segment lengths (64-key tiles: 1,024 / 2,048 / 4,096 keys)
    if (hopper && wanted(kFa3Regs2P) && !cluster_part) {
        std::printf("\n| fixed segments: cache, block | queries | keys | keys a segment | blocks | attention us | "
                    "merge us | total us |\n|---|---|---|---|---|---|---|---|\n");
        for (int n_q : {23, 1}) {
            const Config g{4, kFa3Regs2P, 64, 1};
            const int n_grp = (n_q * G + 63) / 64;
            for (int n_kv : {4096, 32768, 131072}) {
                for (int seg_tiles : {16, 32, 64}) {
                    const int n_seg = (n_kv / 64 + seg_tiles - 1) / seg_tiles;
                    if (n_seg > kMaxSeg) continue;
                    const Run r = run_case({n_q, n_kv, seg_tiles, g}, q, k, v, part, dst, 20);
                    std::printf("| %s | %d | %d | %d | %d | %.1f | %.1f | %.1f |\n", mode_name(g.mode), n_q, n_kv,
                                seg_tiles * 64, n_seg * HKV * n_grp, r.attn_us, r.merge_us, r.attn_us + r.merge_us);
                }
            }
        }
    }
    // The cache's layout: the engine keeps a key's heads side by side ([n_kv][HKV][row]), so a tile of one KV head is
    // 64 runs of 144 bytes 576 apart, and the 3 row groups of a tree each read it; stored head-major the tile is one
    // 9 KB run (benchmarks/kernels/stream_probe.cu: such runs stream ~1.4x faster). Each result bit for bit as the
    // engine's layout gives it.
    if (hopper && layout_part) {
        std::vector<uint8_t> hk_hm(hk.size()), hv_hm(hv.size());
        for (int t = 0; t < kMaxKv; ++t)
            for (int h = 0; h < HKV; ++h) {
                const size_t from = (size_t(t) * HKV + h) * kRowBytes, to = (size_t(h) * kMaxKv + t) * kRowBytes;
                std::memcpy(&hk_hm[to], &hk[from], kRowBytes);
                std::memcpy(&hv_hm[to], &hv[from], kRowBytes);
            }
        uint8_t *k_hm, *v_hm;
        CHECK(cudaMalloc(&k_hm, hk_hm.size()));
        CHECK(cudaMalloc(&v_hm, hv_hm.size()));
        CHECK(cudaMemcpy(k_hm, hk_hm.data(), hk_hm.size(), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(v_hm, hv_hm.data(), hv_hm.size(), cudaMemcpyHostToDevice));
        std::printf("\n| cache layout, 2-producer block | queries | keys | keys a segment | attention us | merge us | "
                    "total us | bits as the engine's layout |\n|---|---|---|---|---|---|---|---|\n");
        const Config g{4, kFa3Regs2P, 64, 1};
        std::vector<float> want(size_t(kMaxQ) * H * D), got(want.size());
        for (int n_q : {23, 1}) {
            for (int n_kv : {32768, 131072}) {
                const int seg_tiles = 32;  // the fork's 2,048-key segments
                int head_keys = 0;
                CHECK(cudaMemcpyToSymbol(g_head_major_keys, &head_keys, sizeof head_keys));
                const Run a = run_case({n_q, n_kv, seg_tiles, g}, q, k, v, part, dst, 20);
                CHECK(cudaMemcpy(want.data(), dst, size_t(n_q) * H * D * sizeof(float), cudaMemcpyDeviceToHost));
                head_keys = kMaxKv;
                CHECK(cudaMemcpyToSymbol(g_head_major_keys, &head_keys, sizeof head_keys));
                const Run b = run_case({n_q, n_kv, seg_tiles, g}, q, k_hm, v_hm, part, dst, 20);
                CHECK(cudaMemcpy(got.data(), dst, size_t(n_q) * H * D * sizeof(float), cudaMemcpyDeviceToHost));
                head_keys = 0;
                CHECK(cudaMemcpyToSymbol(g_head_major_keys, &head_keys, sizeof head_keys));
                const bool same = std::memcmp(want.data(), got.data(), size_t(n_q) * H * D * sizeof(float)) == 0;
                ok &= same;
                for (const auto & [name, r] : {std::pair{"engine's [key][head][row]", a}, std::pair{"head-major", b}}) {
                    std::printf("| %s | %d | %d | %d | %.1f | %.1f | %.1f | %s |\n", name, n_q, n_kv, seg_tiles * 64,
                                r.attn_us, r.merge_us, r.attn_us + r.merge_us, same ? "yes" : "NO");
                }
            }
        }
        CHECK(cudaFree(k_hm));
        CHECK(cudaFree(v_hm));
    }
    std::printf("tree_attn_probe: %s\n", ok ? "all ok" : "FAILED");
    return ok ? 0 : 1;
}
