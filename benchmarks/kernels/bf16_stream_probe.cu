// A candidate for the draft's BF16 products at a draft block's 16 columns (and a committed token's one): ggml's mmf
// kernel, which batch-invariant mode gives them, streams the 27B-shaped draft's matrices at 49-76% of a device copy
// (mmf_split_probe.cu: o 49%, qkv 59%, down 59%, gate|up 76%; 1.15 ms of a draft's 2.2), and neither k splits nor
// wider row blocks helped it. Its warps load 4 bytes a lane a row and wait for them before the MMAs. This kernel keeps
// a few stages of 16-byte asynchronous copies in flight instead:
//   - a block of 4 warps owns 64 rows (16 a warp) and walks a contiguous range of units (a row tile's 128 k-values),
//     the ranges dealt evenly over the blocks the GPU holds at once (a unit range may cross row tiles or start inside
//     one); each stage holds the unit's weights and the columns' activations as bf16, both swizzled by 16-byte chunk
//     so that ldmatrix reads them without bank conflicts; mma.sync m16n8k16 bf16 with f32 accumulation;
//   - a row tile cut between two blocks leaves partial sums; a pass adds a tile's pieces in k order. The cuts come
//     from the matrix shape and the SM count alone, and a column's MMAs do not depend on the other columns: a column
//     has the same bits alone or among 16;
//   - the activations go to bf16 once a launch (a first pass; ggml's mmf converts them as it reads them too), or
//     (FX) are staged as f32 and rounded where the B fragments are formed (the same bits, one pass fewer);
//   - FOLD, for a prefill's many column groups: a block a (row tile, group) adds its tile's pieces in registers.
// Checked against a float64 product of the bf16-rounded inputs, against mmf, a column alone against the same column
// among 16 and among 512 (bit for bit); timed against mmf on the draft's shapes with the weights cycled over 1 GiB
// (from DRAM, as in the engine), its passes included and apart, and at 512 columns against mmf's grouped launch.
// The fifty-first session ran the bf16-pass variant (its "passes" and "product" columns); the FX and FOLD variants
// were written after its device time was spent.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I vendor/src/ggml/include -I vendor/src/ggml/src \
//        -I vendor/src/ggml/src/ggml-cuda benchmarks/kernels/bf16_stream_probe.cu -o bf16_stream_probe
#include "mmf.cuh"
#include "probe_common.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace bfs {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBM = 16 * kWarps;  // rows a tile
constexpr int kBK = 128;          // k-values a unit
constexpr int kChunks = kBK / 8;  // 16-byte chunks a row of a unit

// where chunk c of row r of a stage sits (in chunks): the chunk index xor the row's low bits, so that the 8 rows an
// ldmatrix phase reads land on 8 distinct 16-byte bank groups
__device__ __forceinline__ int swz(int r, int c) { return r * kChunks + (c ^ (r & 7)); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void * p) {
    const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const void * p) {
    const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// the plan: units (tile, k-unit) in tile order, dealt as `workers` contiguous ranges of nearly equal length (as
// lbq::Split deals a K-quant product's units, with this kernel's 64-row tiles and 128-value units)
struct Plan {
    int tiles, n_units_k, workers;
    __host__ __device__ int64_t units() const { return int64_t(tiles) * n_units_k; }
    __host__ __device__ int64_t bound(int g) const { return int64_t(g) * units() / workers; }
    __host__ __device__ int worker_of(int64_t u) const { return int(((u + 1) * workers - 1) / units()); }
};

// activations: x f32 [n][k] (column stride ldx) -> xb bf16 [n_pad][k], zeros past n
__global__ void to_bf16(const float * x, int64_t ldx, int n, int k, int n_pad, __nv_bfloat16 * xb) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(n_pad) * k) return;
    const int c = int(i / k), kk = int(i % k);
    xb[i] = __float2bfloat16_rn(c < n ? x[int64_t(c) * ldx + kk] : 0.0f);
}

// y [n][m] (column stride ldy) = W [m][k] (row stride ldw, elements) x xb; part: a worker's partial sums of the tiles
// it shares with another (slot 0 its first tile, 1 its last), [group][worker][slot][8 NT][kBM]. Block (worker, group):
// column group blockIdx.y (8 NT columns of the n).
// FX: the activations staged as f32 straight from x (column stride ldx; columns past n read column n - 1, zeroed when
// the B fragments are formed) and rounded to bf16 there, as to_bf16 rounds them: no pass of their own, the same bits.
// FOLD (many column groups, a prefill's draft append): block (tile, group) walks its row tile's whole k, each piece of
// the plan summed from zero as its worker would, and adds the pieces in k order in registers: the bits of the split
// path and its sum pass, with no partial sums in memory.
template <int NT, int STAGES, bool FX, bool FOLD = false>
__global__ void __launch_bounds__(kThreads) gemm(const __nv_bfloat16 * __restrict__ w, int64_t ldw, int m, int k,
                                                 const __nv_bfloat16 * __restrict__ xb, const float * __restrict__ xf,
                                                 int64_t ldx, int n, float * y, int64_t ldy, float * part,
                                                 const Plan p) {
    constexpr int XF_CHUNKS = kBK / 4;  // 16-byte chunks of a column's f32 unit
    constexpr int W_CHUNKS = kBM * kChunks, X_CHUNKS = 8 * NT * (FX ? XF_CHUNKS : kChunks);
    constexpr int STAGE = (W_CHUNKS + X_CHUNKS) * 16;
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int worker = blockIdx.x, col0 = blockIdx.y * 8 * NT;
    n = min(8 * NT, n - col0);
    xb += int64_t(col0) * k;
    xf += int64_t(col0) * ldx;
    y += int64_t(col0) * ldy;
    part += int64_t(blockIdx.y) * p.workers * 2 * (8 * NT) * kBM;
    // FOLD: block x is a row tile
    const int64_t u0 = FOLD ? int64_t(worker) * p.n_units_k : p.bound(worker);
    const int64_t u1 = FOLD ? u0 + p.n_units_k : p.bound(worker + 1);
    const int n_it = int(u1 - u0);
    int64_t ld_u = u0;
    auto load = [&](int st) {
        const int tile = int(ld_u / p.n_units_k), ku = int(ld_u % p.n_units_k);
        uint8_t * s = smem + st * STAGE;
        const __nv_bfloat16 * wt = w + int64_t(tile) * kBM * ldw + int64_t(ku) * kBK;
#pragma unroll
        for (int i = tid; i < W_CHUNKS; i += kThreads) {
            const int r = i / kChunks, c = i % kChunks;
            const int row = min(tile * kBM + r, m - 1) - tile * kBM;  // rows past the end read the last one
            cp_async16(s + 16 * swz(r, c), wt + int64_t(row) * ldw + 8 * c);
        }
        if constexpr (FX) {
            const float * xt = xf + int64_t(ku) * kBK;
#pragma unroll
            for (int i = tid; i < X_CHUNKS; i += kThreads) {
                const int r = i / XF_CHUNKS, c = i % XF_CHUNKS;
                const float * src = xt + int64_t(min(r, n - 1)) * ldx + 4 * c;
                cp_async16(s + 16 * (W_CHUNKS + r * XF_CHUNKS + (c ^ (r & 7))), src);
            }
        } else {
            const __nv_bfloat16 * xt = xb + int64_t(ku) * kBK;
#pragma unroll
            for (int i = tid; i < X_CHUNKS; i += kThreads) {
                const int r = i / kChunks, c = i % kChunks;
                cp_async16(s + 16 * (W_CHUNKS + swz(r, c)), xt + int64_t(r) * k + 8 * c);
            }
        }
        ++ld_u;
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < n_it) load(i);
        cp_commit();
    }
    // f(nt, i, r, col): accumulator element i of n-tile nt is row r of the tile (of its 64) and column col of the group
    auto each_out = [&](auto && f) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) f(nt, i, 16 * warp + g + 8 * (i >> 1), 8 * nt + 2 * t + (i & 1));
    };
    float acc[NT][4] = {};
    float tot[FOLD ? NT : 1][4];  // FOLD: the tile's pieces so far
    bool first_piece = true;
    int64_t u = u0;
    int tile = int(u0 / p.n_units_k);
    auto flush = [&]() {
        // a tile wholly inside this worker's range goes to y, else to its partial slot
        const int64_t t0 = int64_t(tile) * p.n_units_k, t1 = t0 + p.n_units_k;
        const bool whole = t0 >= u0 && t1 <= u1;
        const int slot = t0 < u0 ? 0 : 1;
        each_out([&](int nt, int i, int r, int col) {
            const int row = tile * kBM + r;
            if (whole) {
                if (row < m && col < n) y[int64_t(col) * ldy + row] = acc[nt][i];
            } else {
                part[((int64_t(worker) * 2 + slot) * (8 * NT) + col) * kBM + r] = acc[nt][i];
            }
            acc[nt][i] = 0.0f;
        });
    };
    for (int it = 0; it < n_it; ++it) {
        cp_wait<STAGES - 2>();
        __syncthreads();
        if (it + STAGES - 1 < n_it) load((it + STAGES - 1) % STAGES);
        cp_commit();
        const uint8_t * s = smem + (it % STAGES) * STAGE;
#pragma unroll
        for (int ks = 0; ks < kBK / 16; ++ks) {
            uint32_t a[4];
            {
                const int mi = lane >> 3, r = 16 * warp + (mi & 1) * 8 + (lane & 7), c = 2 * ks + (mi >> 1);
                ldsm_x4(a, s + 16 * swz(r, c));
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                uint32_t b[2];
                if constexpr (FX) {
                    // column 8 nt + g's k-values 16 ks + 2 t, + 1 (b0) and those + 8 (b1), rounded as to_bf16 does
                    const int col = 8 * nt + g;
                    const float * xs = reinterpret_cast<const float *>(s + 16 * W_CHUNKS) + col * kBK;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int kk = 16 * ks + 2 * t + 8 * h;
                        float2 v = *reinterpret_cast<const float2 *>(xs + 4 * ((kk / 4) ^ (col & 7)) + kk % 4);
                        if (col >= n) v = make_float2(0.0f, 0.0f);
                        const __nv_bfloat162 bv = __floats2bfloat162_rn(v.x, v.y);
                        b[h] = *reinterpret_cast<const uint32_t *>(&bv);
                    }
                } else {
                    const int r = 8 * nt + (lane & 7), c = 2 * ks + ((lane >> 3) & 1);
                    ldsm_x2(b, s + 16 * (W_CHUNKS + swz(r, c)));
                }
                mma_bf16(acc[nt], a, b[0], b[1]);
            }
        }
        ++u;
        if constexpr (FOLD) {
            // a piece ends where a worker's range of the plan ends (or the tile does)
            if (u == u1 || p.bound(p.worker_of(u)) == u) {
                each_out([&](int nt, int i, int, int) {
                    tot[nt][i] = first_piece ? acc[nt][i] : tot[nt][i] + acc[nt][i];
                    acc[nt][i] = 0.0f;
                });
                first_piece = false;
            }
        } else if (u % p.n_units_k == 0 || u == u1) {
            flush();
            tile = int(u / p.n_units_k);
        }
    }
    cp_wait<0>();
    if constexpr (FOLD) {
        each_out([&](int nt, int i, int r, int col) {
            const int row = worker * kBM + r;
            if (row < m && col < n) y[int64_t(col) * ldy + row] = tot[nt][i];
        });
    }
}

// y of the cut tiles: the pieces in worker (k) order; a thread a row, all columns' pieces loaded before the sums
template <int NT>
__global__ void add_pieces(const float * __restrict__ part, const Plan p, int m, int n, float * __restrict__ y,
                           int64_t ldy) {
    const int tile = blockIdx.x, r = threadIdx.x, row = tile * kBM + r, col0 = blockIdx.y * 8 * NT;
    n = min(8 * NT, n - col0);
    y += int64_t(col0) * ldy;
    part += int64_t(blockIdx.y) * p.workers * 2 * (8 * NT) * kBM;
    const int64_t t0 = int64_t(tile) * p.n_units_k, t1 = t0 + p.n_units_k;
    const int first = p.worker_of(t0), last = p.worker_of(t1 - 1);
    if (first == last || row >= m) return;
    float sum[8 * NT];
    for (int g = first; g <= last; ++g) {
        // g's range starts inside the tile: the tile is g's first (slot 0); else it starts the tile or before: its last
        const int slot = p.bound(g) > t0 ? 0 : 1;
        const float * src = part + (int64_t(g) * 2 + slot) * (8 * NT) * kBM + r;
        float v[8 * NT];
#pragma unroll
        for (int col = 0; col < 8 * NT; ++col) v[col] = col < n ? src[col * kBM] : 0.0f;
#pragma unroll
        for (int col = 0; col < 8 * NT; ++col) sum[col] = g == first ? v[col] : sum[col] + v[col];
    }
#pragma unroll
    for (int col = 0; col < 8 * NT; ++col) {
        if (col < n) y[int64_t(col) * ldy + row] = sum[col];
    }
}

}  // namespace bfs

constexpr size_t kPool = size_t(1) << 30;
constexpr int kPrefillCols = 512;  // a prefill micro-batch's draft append
// a variant: its stages, the blocks an SM its plan deals units to, whether the activations are staged as f32 (FX)
template <int NT, int STAGES, int BPS, bool FX>
struct Run {
    Run(int m, int k, int nsm) : m(m), k(k) {
        smem = STAGES * (bfs::kBM * bfs::kChunks + 8 * NT * (FX ? bfs::kBK / 4 : bfs::kChunks)) * 16;
        CHECK(cudaFuncSetAttribute(bfs::gemm<NT, STAGES, FX>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CHECK(cudaFuncSetAttribute(bfs::gemm<NT, STAGES, FX, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bfs::gemm<NT, STAGES, FX>, bfs::kThreads, smem));
        if (per_sm < BPS) {
            fprintf(stderr, "%d blocks an SM fit, the plan wants %d\n", per_sm, BPS);
            exit(1);
        }
        // the cuts from the shape and the SM count alone (not from the occupancy of this NT): the same bits at any
        // column count
        p.tiles = (m + bfs::kBM - 1) / bfs::kBM;
        p.n_units_k = k / bfs::kBK;
        p.workers = int(std::min<int64_t>(p.units(), int64_t(BPS) * nsm));
    }
    // the passes (to_bf16 unless FX, the product, the sum of cut tiles' pieces), or the product alone; a column group
    // of 8 NT columns a grid row
    void operator()(const __nv_bfloat16 * w, const float * x, int n, __nv_bfloat16 * xb, float * part, float * y,
                    bool product_only = false) {
        const int groups = (n + 8 * NT - 1) / (8 * NT), n_pad = 8 * NT * groups;
        if (!FX && !product_only) bfs::to_bf16<<<(n_pad * k + 255) / 256, 256>>>(x, k, n, k, n_pad, xb);
        bfs::gemm<NT, STAGES, FX><<<dim3(p.workers, groups), bfs::kThreads, smem>>>(w, k, m, k, xb, x, k, n, y, m,
                                                                                   part, p);
        if (!product_only) bfs::add_pieces<NT><<<dim3(p.tiles, groups), bfs::kBM>>>(part, p, m, n, y, m);
    }
    // FOLD: a block a (row tile, column group), the plan's pieces added in registers (no partial sums)
    void fold(const __nv_bfloat16 * w, const float * x, int n, __nv_bfloat16 * xb, float * y) {
        const int groups = (n + 8 * NT - 1) / (8 * NT), n_pad = 8 * NT * groups;
        if (!FX) bfs::to_bf16<<<(n_pad * k + 255) / 256, 256>>>(x, k, n, k, n_pad, xb);
        bfs::gemm<NT, STAGES, FX, true><<<dim3(p.tiles, groups), bfs::kThreads, smem>>>(w, k, m, k, xb, x, k, n, y, m,
                                                                                       nullptr, p);
    }
    int m, k, smem = 0, per_sm = 0;
    bfs::Plan p{};
};

template <int COLS>
void mmf_launch(const nv_bfloat162 * w, const float * x, float * dst, int64_t m, int64_t k) {
    constexpr int NW = 8;
    const int smem = std::max(NW * 16 * (32 + 4) * 4, ((COLS + 7) / 8 * 8) * (NW * 32 + 4) * 4);
    mul_mat_f<nv_bfloat162, 32, COLS, NW, false><<<dim3(m / 32, 1, 1), dim3(32, NW, 1), smem>>>(
        w, x, nullptr, dst, int(k / 2), COLS, 1, int(k / 2), int(k / 2), int(m), 0, 0, 1, 0, 0, 0, 1, 0, 0, 0);
}

// mmf as batch-invariant mode launches a prefill's whole 16-column groups: a group a grid channel, the weights shared
void mmf_groups(const nv_bfloat162 * w, const float * x, float * dst, int64_t m, int64_t k, int groups) {
    constexpr int NW = 8;
    const int smem = std::max(NW * 16 * (32 + 4) * 4, 16 * (NW * 32 + 4) * 4);
    mul_mat_f<nv_bfloat162, 32, 16, NW, false><<<dim3(m / 32, groups, 1), dim3(32, NW, 1), smem>>>(
        w, x, nullptr, dst, int(k / 2), 16, groups, int(k / 2), int(k / 2), int(m), 0, 0, groups, 0, int(16 * k),
        int(16 * m), 1, 0, 0, 0);
}

// back-to-back launches of f(i), us each
template <typename F> double time_us(F && f, int reps = 50) { return time_back_to_back_us(f, 5, reps); }

static float bf16_round(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&v, &u, 4);
    return v;
}

int main() {
    int nsm = 0;
    CHECK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    uint16_t * pool;
    float * x, * y, * y2, * part;
    __nv_bfloat16 * xb;
    CHECK(cudaMalloc(&pool, kPool));
    CHECK(cudaMalloc(&x, sizeof(float) * kPrefillCols * 25600));
    CHECK(cudaMalloc(&xb, sizeof(uint16_t) * kPrefillCols * 25600));
    CHECK(cudaMalloc(&y, sizeof(float) * kPrefillCols * 34816));
    CHECK(cudaMalloc(&y2, sizeof(float) * kPrefillCols * 34816));
    CHECK(cudaMalloc(&part, sizeof(float) * 2048 * 2 * 16 * bfs::kBM));
    // weights: bf16 bits of varied sign and size over the whole pool; activations likewise
    {
        std::vector<uint16_t> hw(kPool / 2);
        for (size_t i = 0; i < hw.size(); ++i) {
            const uint32_t h = uint32_t(i * 2654435761u) ^ uint32_t(i >> 13);
            hw[i] = uint16_t(0x3800 + h % 0x0800) | uint16_t((h >> 20 & 1) << 15);  // |w| in [2^-15, 2^-4)
        }
        CHECK(cudaMemcpy(pool, hw.data(), kPool, cudaMemcpyHostToDevice));
        std::vector<float> hx(size_t(kPrefillCols) * 25600);
        for (size_t i = 0; i < hx.size(); ++i) hx[i] = 0.01f * float(int(i * 2246822519u % 401) - 200);
        CHECK(cudaMemcpy(x, hx.data(), sizeof(float) * hx.size(), cudaMemcpyHostToDevice));
    }
    const double copy = copy_gbs();
    printf("copy %.0f GB/s, %d SMs\n", copy, nsm);

    struct Shape { const char * name; int m, k; };
    const Shape shapes[] = { {"o", 5120, 4096}, {"qkv", 6144, 5120}, {"gate|up", 34816, 5120}, {"down", 5120, 17408},
                             {"fc", 5120, 25600}, {"k|v", 2048, 5120} };
    // correctness at 16 and 1 columns: against float64 of the bf16-rounded inputs, against
    // mmf, and a column alone against the same column among 16 (bit for bit)
    bool ok = true;
    for (const Shape & s : shapes) {
        if (int64_t(s.m) * s.k > 64ll << 20) continue;  // the float64 check on the smaller matrices
        std::vector<uint16_t> hw(size_t(s.m) * s.k);
        CHECK(cudaMemcpy(hw.data(), pool, hw.size() * 2, cudaMemcpyDeviceToHost));
        std::vector<float> hx(size_t(16) * s.k);
        CHECK(cudaMemcpy(hx.data(), x, hx.size() * 4, cudaMemcpyDeviceToHost));
        Run<2, 4, 2, false> r16(s.m, s.k, nsm);
        Run<1, 4, 2, false> r1(s.m, s.k, nsm);
        Run<2, 4, 2, true> f16(s.m, s.k, nsm);  // activations staged as f32: the bits of r16
        Run<1, 3, 3, true> f1(s.m, s.k, nsm);   // another plan: only near the reference
        r16((const __nv_bfloat16 *) pool, x, 16, xb, part, y);
        std::vector<float> got(size_t(16) * s.m), alone(s.m), ref_mmf(size_t(16) * s.m), fused(got.size()), other(s.m);
        CHECK(cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost));
        r1((const __nv_bfloat16 *) pool, x, 1, xb, part, y);
        CHECK(cudaMemcpy(alone.data(), y, alone.size() * 4, cudaMemcpyDeviceToHost));
        f16((const __nv_bfloat16 *) pool, x, 16, xb, part, y);
        CHECK(cudaMemcpy(fused.data(), y, fused.size() * 4, cudaMemcpyDeviceToHost));
        f1((const __nv_bfloat16 *) pool, x, 1, xb, part, y);
        CHECK(cudaMemcpy(other.data(), y, other.size() * 4, cudaMemcpyDeviceToHost));
        mmf_launch<16>((const nv_bfloat162 *) pool, x, y2, s.m, s.k);
        CHECK(cudaMemcpy(ref_mmf.data(), y2, ref_mmf.size() * 4, cudaMemcpyDeviceToHost));
        double max_rel = 0, max_rel_mmf = 0, max_rel_other = 0;
        for (int c = 0; c < 16; ++c)
            for (int r = 0; r < s.m; r += 7) {
                double ref = 0, mag = 0;
                for (int kk = 0; kk < s.k; ++kk) {
                    uint32_t u = uint32_t(hw[size_t(r) * s.k + kk]) << 16;
                    float wv;
                    memcpy(&wv, &u, 4);
                    const double prod = double(wv) * bf16_round(hx[size_t(c) * s.k + kk]);
                    ref += prod;
                    mag += std::fabs(prod);
                }
                max_rel = std::max(max_rel, std::fabs(got[size_t(c) * s.m + r] - ref) / (mag + 1e-30));
                max_rel_mmf = std::max(max_rel_mmf, std::fabs(ref_mmf[size_t(c) * s.m + r] - ref) / (mag + 1e-30));
                if (c == 0) max_rel_other = std::max(max_rel_other, std::fabs(other[r] - ref) / (mag + 1e-30));
            }
        const bool same = memcmp(alone.data(), got.data(), alone.size() * 4) == 0;
        const bool same_fx = memcmp(fused.data(), got.data(), got.size() * 4) == 0;
        ok = ok && max_rel < 1e-5 && max_rel_other < 1e-5 && same && same_fx;
        printf("check %s %d x %d: max |err| / sum |terms| %.2e (mmf %.2e, 3 stages 3 an SM %.2e); column 0 alone == "
               "among 16: %s; f32-staged == bf16 pass: %s; plan %d workers over %lld units\n", s.name, s.m, s.k,
               max_rel, max_rel_mmf, max_rel_other, same ? "same bits" : "DIFFERENT",
               same_fx ? "same bits" : "DIFFERENT", r16.p.workers, (long long) r16.p.units());
    }
    // us a product: mmf; this kernel with its passes (bf16 pass, product, sum of pieces) and its product alone, 4
    // stages and 2 blocks an SM; staged as f32 (no bf16 pass) with 4 stages, 2 an SM and with 3 stages, 3 an SM.
    // Launched back to back without dependent launch: each pass pays a launch gap that the engine's graphs would
    // mostly hide.
    printf("\n| matrix | rows x k | columns | mmf | passes | product | f32 4x2 | f32 4x2 product | f32 3x3 | "
           "f32 3x3 product | best product %% of copy |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Shape & s : shapes) {
        const int64_t bytes = int64_t(s.m) * s.k * 2, copies = std::max<int64_t>(1, int64_t(kPool) / bytes);
        auto wat = [&](int i) { return (const __nv_bfloat16 *) (pool + (i % copies) * (bytes / 2)); };
        for (int cols : {16, 1}) {
            double t[7];
            auto variants = [&](auto bf, auto f42, auto f33, int n) {
                t[1] = time_us([&](int i) { bf(wat(i), x, n, xb, part, y); });
                t[2] = time_us([&](int i) { bf(wat(i), x, n, xb, part, y, true); });
                t[3] = time_us([&](int i) { f42(wat(i), x, n, xb, part, y); });
                t[4] = time_us([&](int i) { f42(wat(i), x, n, xb, part, y, true); });
                t[5] = time_us([&](int i) { f33(wat(i), x, n, xb, part, y); });
                t[6] = time_us([&](int i) { f33(wat(i), x, n, xb, part, y, true); });
            };
            if (cols == 16) {
                t[0] = time_us([&](int i) { mmf_launch<16>((const nv_bfloat162 *) wat(i), x, y2, s.m, s.k); });
                variants(Run<2, 4, 2, false>(s.m, s.k, nsm), Run<2, 4, 2, true>(s.m, s.k, nsm),
                         Run<2, 3, 3, true>(s.m, s.k, nsm), 16);
            } else {
                t[0] = time_us([&](int i) { mmf_launch<1>((const nv_bfloat162 *) wat(i), x, y2, s.m, s.k); });
                variants(Run<1, 4, 2, false>(s.m, s.k, nsm), Run<1, 4, 2, true>(s.m, s.k, nsm),
                         Run<1, 3, 3, true>(s.m, s.k, nsm), 1);
            }
            const double best = std::min({t[2], t[4], t[6]});
            printf("| %s | %d x %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f%% |\n", s.name, s.m,
                   s.k, cols, t[0], t[1], t[2], t[3], t[4], t[5], t[6], 100.0 * bytes / (best * 1e3) / copy);
        }
    }
    // A prefill's 512 columns: mmf's grouped launch against FOLD (f32-staged, 4 stages); a column of FOLD's result
    // against the same column alone through the split path (the same plan: the same bits)
    printf("\n| matrix | rows x k | columns | mmf groups us | fold us | fold GB/s of weights | column 77 fold == alone "
           "|\n|---|---|---|---|---|---|---|\n");
    for (const Shape & s : shapes) {
        const int64_t bytes = int64_t(s.m) * s.k * 2, copies = std::max<int64_t>(1, int64_t(kPool) / bytes);
        auto wat = [&](int i) { return (const __nv_bfloat16 *) (pool + (i % copies) * (bytes / 2)); };
        Run<2, 4, 2, true> run(s.m, s.k, nsm);
        Run<1, 4, 2, true> one(s.m, s.k, nsm);
        const double t_mmf = time_us([&](int i) {
            mmf_groups((const nv_bfloat162 *) wat(i), x, y2, s.m, s.k, kPrefillCols / 16); }, 10);
        const double t_fold = time_us([&](int i) { run.fold(wat(i), x, kPrefillCols, xb, y); }, 10);
        run.fold(wat(0), x, kPrefillCols, xb, y);
        const int c = 77;
        std::vector<float> a(s.m), b(s.m);
        CHECK(cudaMemcpy(a.data(), y + int64_t(c) * s.m, s.m * 4, cudaMemcpyDeviceToHost));
        one(wat(0), x + int64_t(c) * s.k, 1, xb, part, y);
        CHECK(cudaMemcpy(b.data(), y, s.m * 4, cudaMemcpyDeviceToHost));
        const bool same = memcmp(a.data(), b.data(), s.m * 4) == 0;
        ok = ok && same;
        printf("| %s | %d x %d | %d | %.1f | %.1f | %.0f | %s |\n", s.name, s.m, s.k, kPrefillCols, t_mmf, t_fold,
               bytes / (t_fold * 1e3), same ? "same bits" : "DIFFERENT");
    }
    printf("%s\n", ok ? "all ok" : "FAIL");
    return ok ? 0 : 1;
}
