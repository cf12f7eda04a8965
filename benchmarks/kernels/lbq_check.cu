// Standalone check of the small-batch K-quant kernels that patch 0006 adds to ggml-cuda
// (src/ggml-cuda/lbq-kernels.cuh in the materialized tree): results against a CPU dequantize-and-multiply
// reference, batch invariance (a column computes to the same bits alone and in a batch), and weight
// bandwidth at decode shapes. Correctness runs with k split 1..3, with k cut where 7 and 2 x tiles + 1 even worker
// ranges of the matrix's units cross its row tiles, and with the shape's own plan; launches of at most
// 8 columns run both ways (fused: one kernel; separate: prepare_x, gemm, reduce_splits) and must agree bit for bit;
// a SwiGLU input (lbq::Ups) gives the bits of its values formed apart (check_glu).
//   nvcc -O3 -arch=sm_90 -std=c++17 -use_fast_math -I vendor/src/ggml/include -I vendor/src/ggml/src \
//        -I vendor/src/ggml/src/ggml-cuda benchmarks/kernels/lbq_check.cu -o lbq_check
// (-use_fast_math as ggml-cuda builds its kernels: the SwiGLU values' expf and division round as the library's)
// The kernels launch through ggml-cuda's common.cuh (its headers only: nothing of ggml is linked).
//   lbq_check [check | chain | decode | engine | l2 | pair | profile | profile_prefill | trace]: the checks only, the layer
//   chains only, the decode shapes' benches at 1 and 23 columns and the chains, the 27B's shapes against the other plan
//   and back to back (engine_shapes), a product's time from DRAM against L2 (l2_bench), the 27B's pairs of products in
//   one launch (patches 0057-0058) checked and timed, one
//   launch per decode shape at 1 and 23 columns, or per prefill shape at kMaxLaunchN columns (both for Nsight
//   Compute), or the one- and 23-column chains with a timeline of their kernels' blocks;
//   default: checks, benches (decode shapes at 1..32 columns, prefill products at 512 and kMaxLaunchN), chains
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

// `trace`: each gemm block's start, return from its dependent-launch wait and end (%globaltimer, ns) through patch
// 0032's hooks, recorded while g_trace_on (a device flag, off in every other mode).
struct TraceRec { unsigned long long t0, t1, t2; int m_rows, grid; long long row_bytes; };
constexpr unsigned kTraceMax = 1u << 16;
__device__ TraceRec g_trace[kTraceMax];
__device__ unsigned int g_trace_n;
__device__ bool g_trace_on;
__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void trace_record(unsigned long long t0, unsigned long long t1, int m_rows, long long row_bytes) {
    const unsigned long long t2 = gtimer();
    if (threadIdx.x == 0 && g_trace_on) {
        const unsigned int i = atomicAdd(&g_trace_n, 1u);
        if (i < kTraceMax) g_trace[i] = TraceRec{t0, t1, t2, m_rows, int(gridDim.x * gridDim.y), row_bytes};
    }
}
#define LBQ_TRACE_BEGIN const unsigned long long lbq_t0 = gtimer();
#define LBQ_TRACE_SYNC const unsigned long long lbq_t1 = gtimer();
#define LBQ_TRACE_END trace_record(lbq_t0, lbq_t1, m_rows, row_bytes);

#include "lbq-kernels.cuh"

// common.cuh's CUDA_CHECK and device query are defined in ggml-cuda.cu, which this checker does not link.
#include "ggml_cuda_links.cuh"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1); } } while (0)

using lbq::Kind;

static float h2f(uint16_t h) { __half_raw r; r.x = h; return __half2float(__half(r)); }
static uint16_t f2h(float f) { __half h = __float2half_rn(f); return __half_raw(h).x; }

// FNV-1a over bytes: `check` prints its results' digest, so that two builds' lines show whether a change kept the bits
static uint64_t fnv1a(const void * data, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t *>(data)[i]) * 1099511628211ull;
    return h;
}

static int block_bytes(Kind k) { return k == Kind::Q4_K ? lbq::kQ4KBytes : lbq::kQ6KBytes; }
// a row of kl weights in ggml's block layout, unpadded
static int64_t packed_row_bytes(Kind k, int64_t kl) { return kl / 256 * block_bytes(k); }

// random blocks with finite, modest scales
static std::vector<uint8_t> random_blocks(Kind k, int64_t m, int64_t kl, std::mt19937 & rng) {
    const int bb = block_bytes(k);
    std::vector<uint8_t> w(size_t(m * (kl / 256) * bb));
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (auto & b : w) b = uint8_t(byte(rng));
    for (size_t off = 0; off < w.size(); off += bb) {
        if (k == Kind::Q4_K) {
            const uint16_t d = f2h(2e-3f * u(rng)), dmin = f2h(1e-3f * u(rng));
            std::memcpy(&w[off], &d, 2);
            std::memcpy(&w[off + 2], &dmin, 2);
        } else {
            const uint16_t d = f2h(3e-4f * u(rng));
            std::memcpy(&w[off + 208], &d, 2);
        }
    }
    return w;
}

static void dequant_row(Kind k, const uint8_t * row, int64_t kl, float * out) {
    for (int64_t sb = 0; sb < kl / 256; ++sb) {
        float * y = out + sb * 256;
        if (k == Kind::Q4_K) {
            const uint8_t * b = row + sb * lbq::kQ4KBytes;
            uint16_t dh, mh; std::memcpy(&dh, b, 2); std::memcpy(&mh, b + 2, 2);
            const float d = h2f(dh), dmin = h2f(mh);
            const uint8_t * sc = b + 4; const uint8_t * q = b + 16;
            for (int j = 0; j < 4; ++j) {
                for (int half = 0; half < 2; ++half) {
                    const int i = 2 * j + half; int s, m;
                    if (i < 4) { s = sc[i] & 63; m = sc[i + 4] & 63; }
                    else { s = (sc[i + 4] & 0xF) | ((sc[i - 4] >> 6) << 4); m = (sc[i + 4] >> 4) | ((sc[i] >> 6) << 4); }
                    for (int l = 0; l < 32; ++l) {
                        const int qv = half ? (q[32 * j + l] >> 4) : (q[32 * j + l] & 0xF);
                        y[64 * j + 32 * half + l] = d * s * qv - dmin * m;
                    }
                }
            }
        } else {
            const uint8_t * b = row + sb * lbq::kQ6KBytes;
            const uint8_t * ql = b; const uint8_t * qh = b + 128; const int8_t * sc = (const int8_t *)(b + 192);
            uint16_t dh; std::memcpy(&dh, b + 208, 2); const float d = h2f(dh);
            for (int n = 0; n < 2; ++n) {
                for (int l = 0; l < 32; ++l) {
                    const int is = l / 16;
                    const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    y[128 * n + l] = d * sc[is] * q1; y[128 * n + l + 32] = d * sc[is + 2] * q2;
                    y[128 * n + l + 64] = d * sc[is + 4] * q3; y[128 * n + l + 96] = d * sc[is + 6] * q4;
                }
                ql += 64; qh += 32; sc += 8;
            }
        }
    }
}

// The matrix stored unit by unit (lbq::kByUnit, what lbq::store_by_unit writes on the GPU), made here on the host
// from lbq::by_unit_block alone.
static std::vector<uint8_t> by_unit(Kind k, const uint8_t * w, int64_t m, int64_t kl, int64_t row_bytes) {
    const int bb = block_bytes(k);
    const int64_t n_sb = kl / 256;
    std::vector<uint8_t> out(size_t(m * n_sb * bb));
    for (int64_t r = 0; r < m; ++r)
        for (int64_t sb = 0; sb < n_sb; ++sb)
            std::memcpy(&out[size_t(lbq::by_unit_block(r, sb, n_sb, m) * bb)], w + r * row_bytes + sb * bb, size_t(bb));
    return out;
}

struct Dev {
    uint8_t * w = nullptr; float * x = nullptr; float * y = nullptr; __half * xp = nullptr; float * part = nullptr;
    unsigned int * tickets = nullptr;  // null: the separate kernels only
};

static unsigned int * alloc_tickets() {
    unsigned int * t; CK(cudaMalloc(&t, lbq::kTicketSlots * sizeof(unsigned int)));
    CK(cudaMemset(t, 0, lbq::kTicketSlots * sizeof(unsigned int))); return t;
}

static void free_dev(Dev & d) {
    cudaFree(d.w); cudaFree(d.x); cudaFree(d.y); cudaFree(d.xp); cudaFree(d.part); cudaFree(d.tickets);
    d = Dev{};
}

static int g_n_sm = 132;
static size_t g_smem_limit = 0;  // shared memory per block; GGML_CUDA_INVARIANT_SMEM lowers it as in ggml-cuda

static void run(Kind k, const lbq::Plan & p, const Dev & d, int64_t m, int64_t kl, int n, int64_t row_bytes, bool fused) {
    unsigned int * t = fused ? d.tickets : nullptr;
    if (k == Kind::Q4_K) lbq::launch<Kind::Q4_K>(p, d.w, row_bytes, int(m), int(kl), d.x, kl, n, d.xp, d.part, t, d.y, m, g_smem_limit, 0);
    else lbq::launch<Kind::Q6_K>(p, d.w, row_bytes, int(m), int(kl), d.x, kl, n, d.xp, d.part, t, d.y, m, g_smem_limit, 0);
}

// A wide launch (Q4_K: 8 n-tiles, Q6_K: 6) with the plan's splits through memory: the launch lbq's wide_apart picks,
// forced (the checks' forced plans always fold a wide launch).
template <Kind K>
static void run_wide_apart_k(const lbq::Plan & p, const Dev & d, int64_t m, int64_t kl, int n, int64_t row_bytes) {
    lbq::launch_staged<K, lbq::Traits<K>::wide_tiles, false, false>(g_smem_limit, d.w, row_bytes, int(m), int(kl), d.x, kl,
                                                                   n, p, d.xp, d.part, nullptr, d.y, m, 0);
}
static void run_wide_apart(Kind k, const lbq::Plan & p, const Dev & d, int64_t m, int64_t kl, int n, int64_t row_bytes) {
    if (k == Kind::Q4_K) run_wide_apart_k<Kind::Q4_K>(p, d, m, kl, n, row_bytes);
    else run_wide_apart_k<Kind::Q6_K>(p, d, m, kl, n, row_bytes);
}

// Whether a launch of n columns with the plan's splits can run wide with them through memory (run_wide_apart).
static bool can_wide_apart(Kind k, const lbq::Plan & p, int n) {
    return p.cut() && (k == Kind::Q4_K ? lbq::wide_possible<Kind::Q4_K>(n, g_smem_limit)
                                             : lbq::wide_possible<Kind::Q6_K>(n, g_smem_limit));
}

// How lbq::launch runs a launch of n > kMaxN columns.
static const char * launch_kind(Kind k, const lbq::Plan & p, int64_t m, int n) {
    const bool wide = k == Kind::Q4_K ? lbq::wide<Kind::Q4_K>(p, int(m), n, g_smem_limit)
                                      : lbq::wide<Kind::Q6_K>(p, int(m), n, g_smem_limit);
    const bool apart = k == Kind::Q4_K ? lbq::wide_apart<Kind::Q4_K>(p, int(m), n, g_smem_limit)
                                       : lbq::wide_apart<Kind::Q6_K>(p, int(m), n, g_smem_limit);
    if (wide) return "wide, folded";
    if (apart) return "wide, through memory";
    return lbq::folds(p, int(m), n) ? "4 n-tiles, folded" : "4 n-tiles, through memory";
}

// How a plan cuts k: "split=s" for s even pieces a tile, else its worker ranges and the most pieces a tile has.
static std::string plan_label(const lbq::Plan & p) {
    char buf[64];
    if (p.split.workers == p.split.tiles * p.max_pieces) std::snprintf(buf, sizeof buf, "split=%d", p.max_pieces);
    else std::snprintf(buf, sizeof buf, "workers=%d pieces<=%d", p.split.workers, p.max_pieces);
    return buf;
}

static float * alloc_part(const lbq::Plan & p, int64_t m, int n_max = 32) {
    float * part; CK(cudaMalloc(&part, size_t(std::max<int64_t>(1, lbq::part_floats(p, int(m), n_max))) * 4)); return part;
}

// Columns the checks multiply at most: past kMaxN a launch has several column groups, and with a forced split
// (a Plan without slots) it folds its splits in each block (gemm's FOLD); past wide_cols a launch with a forced
// split runs wide (Q4_K: 8 n-tiles a block, Q6_K: 6) where the GPU's shared memory allows it.
constexpr int kCheckN = 96;

// Buffers for checking an m x kl product of up to kCheckN columns: the weights `w` uploaded, room for the
// activations, the result and prepare_x's halves, the tickets; the caller adds the plan's partial sums.
static Dev check_dev(const std::vector<uint8_t> & w, int64_t m, int64_t kl) {
    Dev d;
    CK(cudaMalloc(&d.w, w.size())); CK(cudaMalloc(&d.x, size_t(kCheckN * kl * 4)));
    CK(cudaMalloc(&d.y, size_t(kCheckN * m * 4))); CK(cudaMalloc(&d.xp, lbq::xp_halfs(int(kl), kCheckN) * 2));
    d.tickets = alloc_tickets();
    CK(cudaMemcpy(d.w, w.data(), w.size(), cudaMemcpyHostToDevice));
    return d;
}

static int check(Kind k, int64_t m, int64_t kl, int64_t row_pad, std::mt19937 & rng) {
    // row_pad > 0 puts rows at a stride that is not a whole number of blocks (Q6_K: 2-byte aligned rows)
    const int64_t packed_bytes = packed_row_bytes(k, kl), row_bytes = packed_bytes + row_pad;
    std::vector<uint8_t> packed = random_blocks(k, m, kl, rng);
    std::vector<uint8_t> w(size_t(m * row_bytes), 0);
    for (int64_t r = 0; r < m; ++r) std::memcpy(&w[size_t(r * row_bytes)], &packed[size_t(r * packed_bytes)], size_t(packed_bytes));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(kCheckN * kl));
    for (auto & v : x) v = nd(rng);
    std::vector<float> wf(static_cast<size_t>(kl));
    std::vector<double> ref(static_cast<size_t>(kCheckN * m));
    for (int64_t r = 0; r < m; ++r) {
        dequant_row(k, w.data() + r * row_bytes, kl, wf.data());
        for (int c = 0; c < kCheckN; ++c) {
            double s = 0;
            for (int64_t i = 0; i < kl; ++i) s += double(wf[i]) * x[size_t(c * kl + i)];
            ref[size_t(c * m + r)] = s;
        }
    }
    Dev d = check_dev(w, m, kl);
    CK(cudaMemcpy(d.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    // the weights stored by unit, by the GPU's lbq::store_by_unit (as ggml_backend_cuda_lbq_store_by_unit does) and
    // checked against the host's order
    const std::vector<uint8_t> wu = by_unit(k, w.data(), m, kl, row_bytes);
    Dev du = d;  // the same buffers but the weights
    CK(cudaMalloc(&du.w, wu.size()));
    const int n_sb_all = int(kl / 256);
    const unsigned grid = unsigned((m * n_sb_all + 255) / 256);
    if (k == Kind::Q4_K) lbq::store_by_unit<Kind::Q4_K><<<grid, 256>>>(d.w, row_bytes, int(m), n_sb_all, du.w);
    else lbq::store_by_unit<Kind::Q6_K><<<grid, 256>>>(d.w, row_bytes, int(m), n_sb_all, du.w);
    CK(cudaGetLastError());
    std::vector<uint8_t> wu_gpu(wu.size());
    CK(cudaMemcpy(wu_gpu.data(), du.w, wu.size(), cudaMemcpyDeviceToHost));
    int bad = 0;
    const bool stored_ok = wu_gpu == wu;
    bad += !stored_ok;
    std::printf("check %s m=%lld k=%lld row+%lld: stored by unit on the GPU as on the host: %s\n",
                k == Kind::Q4_K ? "q4_K" : "q6_K", (long long)m, (long long)kl, (long long)row_pad,
                stored_ok ? "ok" : "FAIL");
    const int tiles = int((m + lbq::kRows - 1) / lbq::kRows), n_sb = int(kl / lbq::kQK);
    std::vector<lbq::Plan> plans;
    for (int split : {1, 2, 3}) {
        if (split <= n_sb) plans.push_back(lbq::uniform_plan(int(m), int(kl), split));
    }
    for (int workers : {7, 2 * tiles + 1}) {
        if (workers <= tiles * n_sb) plans.push_back(lbq::stream_plan(int(m), int(kl), workers));
    }
    plans.push_back(lbq::plan(int(m), int(kl), g_n_sm));
    for (const lbq::Plan & plan : plans) {
        d.part = alloc_part(plan, m, kCheckN);
        std::vector<float> col0_alone;
        for (int n : {1, 2, 7, 8, 9, 16, 23, 32, 33, 57, 96}) {
            std::vector<float> y(static_cast<size_t>(n * m)), y_sep(y.size());
            for (bool fused : {false, true}) {  // fused: one kernel where n <= 8 (the same call as ggml's)
                CK(cudaMemset(d.y, 0xff, ref.size() * 4));
                run(k, plan, d, m, kl, n, row_bytes, fused);
                CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
                CK(cudaMemcpy((fused ? y : y_sep).data(), d.y, y.size() * 4, cudaMemcpyDeviceToHost));
            }
            bool same_paths = std::memcmp(y.data(), y_sep.data(), y.size() * 4) == 0;
            if (can_wide_apart(k, plan, n)) {
                CK(cudaMemset(d.y, 0xff, ref.size() * 4));
                run_wide_apart(k, plan, d, m, kl, n, row_bytes);
                CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(y_sep.data(), d.y, y.size() * 4, cudaMemcpyDeviceToHost));
                same_paths = same_paths && std::memcmp(y.data(), y_sep.data(), y.size() * 4) == 0;
            }
            double maxd = 0, maxr = 0;
            for (int c = 0; c < n; ++c)
                for (int64_t r = 0; r < m; ++r) {
                    maxd = std::fmax(maxd, std::fabs(y[size_t(c * m + r)] - ref[size_t(c * m + r)]));
                    maxr = std::fmax(maxr, std::fabs(ref[size_t(c * m + r)]));
                }
            const double rel = maxd / maxr;
            bool inv = true;
            if (n == 1) col0_alone.assign(y.begin(), y.begin() + m);
            else inv = std::memcmp(col0_alone.data(), y.data(), size_t(m) * 4) == 0;
            // the same product with the matrix stored by unit (the fused launch where it is one): the same bits
            du.part = d.part;
            CK(cudaMemset(d.y, 0xff, ref.size() * 4));
            run(k, plan, du, m, kl, n, lbq::kByUnit, true);
            CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(y_sep.data(), d.y, y.size() * 4, cudaMemcpyDeviceToHost));
            same_paths = same_paths && std::memcmp(y.data(), y_sep.data(), y.size() * 4) == 0;
            const bool ok = rel < 3e-3 && inv && same_paths && std::isfinite(rel);
            bad += !ok;
            std::printf("check %s m=%lld k=%lld row+%lld %s n=%2d%s%s%s: max rel err %.2e, column 0 bitwise equal to "
                        "n=1: %s, fused == separate (and wide folded == through memory, == stored by unit): %s %s"
                        " (bits %016llx)\n",
                        k == Kind::Q4_K ? "q4_K" : "q6_K", (long long)m, (long long)kl, (long long)row_pad,
                        plan_label(plan).c_str(), n,
                        n > lbq::kMaxN ? " (" : "", n > lbq::kMaxN ? launch_kind(k, plan, m, n) : "", n > lbq::kMaxN ? ")" : "",
                        rel, inv ? "yes" : "NO", same_paths ? "yes" : "NO", ok ? "ok" : "FAIL",
                        (unsigned long long)fnv1a(y.data(), y.size() * 4));
        }
        cudaFree(d.part);
        d.part = nullptr;
    }
    cudaFree(du.w);
    free_dev(d);
    return bad;
}

// Q4_K's dequantization as it was before patch 0059 (a byte permute of the masked nibbles a pair), for dequant_check.
__device__ void dequant_q4k_prmt(const lbq::RowChunk<Kind::Q4_K> & rc, int w, int r, uint32_t & lo, uint32_t & hi) {
    const uint32_t v = ((w == 0 ? rc.qs.x : rc.qs.y) >> (4 * r)) & 0x0f0f0f0fu;
    const __half2 q02 = lbq::bytes_to_h2(v, 0x4240u);
    const __half2 q13 = lbq::bytes_to_h2(v, 0x4341u);
    lo = lbq::h2_bits(__hfma2(q02, rc.s[r], __hneg2(rc.o[r])));
    hi = lbq::h2_bits(__hfma2(q13, rc.s[r], __hneg2(rc.o[r])));
}

// Thread i: a chunk of words (word i's bytes all i for i < 256: every byte value in every place; random past that) and
// random f16 scale and min pairs (any bits but NaN / inf); counts the A-fragment words lbq::dequant and the former
// way give differently, over both words and both nibble planes.
__global__ void dequant_diff(const uint32_t * words, const uint32_t * scales, int n, unsigned * bad) {
    const int i = int(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    lbq::RowChunk<Kind::Q4_K> rc;
    rc.qs = make_uint2(words[2 * i], words[2 * i + 1]);
    for (int j = 0; j < 2; ++j) {
        rc.s[j] = lbq::bits_h2(scales[4 * i + j]);
        rc.o[j] = lbq::bits_h2(scales[4 * i + 2 + j]);
    }
    for (int w = 0; w < 2; ++w)
        for (int r = 0; r < 2; ++r) {
            uint32_t lo, hi, lo0, hi0;
            lbq::dequant(rc, w, r, lo, hi);
            dequant_q4k_prmt(rc, w, r, lo0, hi0);
            if (lo != lo0 || hi != hi0) atomicAdd(bad, 1u);
        }
}

static int dequant_check(std::mt19937 & rng) {
    const int n = 1 << 20;
    std::vector<uint32_t> words(size_t(2 * n)), scales(size_t(4 * n));
    auto finite_half = [&] {  // any f16 bit pattern but the exponent 31 (inf, NaN)
        uint16_t h;
        do { h = uint16_t(rng()); } while ((h & 0x7c00u) == 0x7c00u);
        return uint32_t(h);
    };
    for (int i = 0; i < n; ++i) {
        words[size_t(2 * i)] = i < 256 ? uint32_t(i) * 0x01010101u : uint32_t(rng());
        words[size_t(2 * i + 1)] = i < 256 ? uint32_t(255 - i) * 0x01010101u : uint32_t(rng());
        for (int j = 0; j < 4; ++j) scales[size_t(4 * i + j)] = finite_half() | (finite_half() << 16);
    }
    uint32_t * dw, * ds; unsigned * dbad;
    CK(cudaMalloc(&dw, words.size() * 4)); CK(cudaMalloc(&ds, scales.size() * 4)); CK(cudaMalloc(&dbad, 4));
    CK(cudaMemcpy(dw, words.data(), words.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, scales.data(), scales.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dbad, 0, 4));
    dequant_diff<<<(n + 255) / 256, 256>>>(dw, ds, n, dbad);
    CK(cudaGetLastError());
    unsigned bad = 0;
    CK(cudaMemcpy(&bad, dbad, 4, cudaMemcpyDeviceToHost));
    std::printf("check q4_K dequant (patch 0059's LOP3 against the former byte permutes): %d chunks x 4 k16-steps, "
                "every byte value: %u differ: %s\n", n, bad, bad ? "FAIL" : "ok");
    cudaFree(dw); cudaFree(ds); cudaFree(dbad);
    return bad ? 1 : 0;
}

// The SwiGLU values as ggml's swiglu kernel forms them (unary_gated_op_kernel: op_silu(gate) * up), one a thread.
__global__ void glu_apart(const float * gate, int64_t ldg, const float * up, int64_t ldu, int64_t kl, int n, float * x) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < kl * n) x[i] = ggml_cuda_op_silu_single(gate[(i / kl) * ldg + i % kl]) * up[(i / kl) * ldu + i % kl];
}

// A product of SwiGLU activations (lbq::launch's `up`: the gates in x, the ups apart) against the GLU's values
// formed apart (glu_apart) and multiplied as plain activations: bit for bit, through the fused launch (at most
// kFusedMaxN / 2 columns), prepare_x (more columns, or gates not 16-byte aligned) and the plan's k splits. The gates
// sit in a wider matrix (a view's row stride, as lucebox's delta net gate z), the ups in their own.
static int check_glu(Kind k, int64_t m, int64_t kl, std::mt19937 & rng) {
    const int64_t row_bytes = packed_row_bytes(k, kl), ldg = kl + 8, ldu = kl;
    const std::vector<uint8_t> w = random_blocks(k, m, kl, rng);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> gate(size_t(kCheckN * ldg + 1)), up(size_t(kCheckN * ldu));
    for (auto & v : gate) v = nd(rng);
    for (auto & v : up) v = nd(rng);
    Dev d = check_dev(w, m, kl);
    float * g_d, * u_d;
    CK(cudaMalloc(&g_d, gate.size() * 4)); CK(cudaMalloc(&u_d, up.size() * 4));
    CK(cudaMemcpy(g_d, gate.data(), gate.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(u_d, up.data(), up.size() * 4, cudaMemcpyHostToDevice));
    // the weights stored by unit too (how the engine stores lbq's matrices)
    const std::vector<uint8_t> wu = by_unit(k, w.data(), m, kl, row_bytes);
    uint8_t * wu_d; CK(cudaMalloc(&wu_d, wu.size()));
    CK(cudaMemcpy(wu_d, wu.data(), wu.size(), cudaMemcpyHostToDevice));
    int bad = 0;
    const lbq::Plan plans[2] = {lbq::plan(int(m), int(kl), g_n_sm), lbq::uniform_plan(int(m), int(kl), std::min(3, int(kl / 256)))};
    for (const lbq::Plan & plan : plans) {
        d.part = alloc_part(plan, m, kCheckN);
        for (int shift : {0, 1}) {  // 1: gates one float past 16-byte alignment (no fused launch)
            const float * gs = g_d + shift;
            for (int n : {1, 2, 4, 5, 8, 9, 23, 33, 96}) {
                std::vector<float> y_apart(size_t(n * m)), y_glu(y_apart.size());
                glu_apart<<<unsigned((kl * n + 255) / 256), 256>>>(gs, ldg, u_d, ldu, kl, n, d.x);
                CK(cudaGetLastError());
                CK(cudaMemset(d.y, 0xff, size_t(n * m * 4)));
                run(k, plan, d, m, kl, n, row_bytes, true);
                CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(y_apart.data(), d.y, y_apart.size() * 4, cudaMemcpyDeviceToHost));
                // the product of the SwiGLU's inputs with the weights at w (row_bytes apart, or by unit) equals y_apart
                auto same_as_apart = [&](const uint8_t * w, int64_t rb) {
                    CK(cudaMemset(d.y, 0xff, size_t(n * m * 4)));
                    if (k == Kind::Q4_K) lbq::launch<Kind::Q4_K>(plan, w, rb, int(m), int(kl), gs, ldg, n, d.xp, d.part,
                                                                 d.tickets, d.y, m, g_smem_limit, 0, lbq::Ups{u_d, ldu});
                    else lbq::launch<Kind::Q6_K>(plan, w, rb, int(m), int(kl), gs, ldg, n, d.xp, d.part, d.tickets, d.y,
                                                 m, g_smem_limit, 0, lbq::Ups{u_d, ldu});
                    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
                    CK(cudaMemcpy(y_glu.data(), d.y, y_glu.size() * 4, cudaMemcpyDeviceToHost));
                    return std::memcmp(y_apart.data(), y_glu.data(), y_glu.size() * 4) == 0;
                };
                const bool fused = lbq::fused(gs, ldg, int(m), n, d.tickets, lbq::Ups{u_d, ldu});
                const bool rows_ok = same_as_apart(d.w, row_bytes);
                const bool unit_ok = same_as_apart(wu_d, lbq::kByUnit);
                bad += !(rows_ok && unit_ok);
                std::printf("check glu %s m=%lld k=%lld %s gates+%d n=%2d (%s): SwiGLU inside == apart: %s, stored by "
                            "unit too: %s\n", k == Kind::Q4_K ? "q4_K" : "q6_K", (long long)m, (long long)kl,
                            plan_label(plan).c_str(), shift, n, fused ? "fused" : "prepare_x", rows_ok ? "ok" : "FAIL",
                            unit_ok ? "ok" : "FAIL");
            }
        }
        cudaFree(d.part);
        d.part = nullptr;
    }
    cudaFree(g_d); cudaFree(u_d); cudaFree(wu_d);
    free_dev(d);
    return bad;
}

// Buffers for timing an m x kl product of up to n columns with the shape's own plan: random weights (512 rows
// repeated), zero activations.
static Dev timing_dev(Kind k, int64_t m, int64_t kl, const lbq::Plan & plan, std::mt19937 & rng, int n = 32) {
    const int64_t row_bytes = packed_row_bytes(k, kl);
    Dev d;
    CK(cudaMalloc(&d.w, size_t(m * row_bytes))); CK(cudaMalloc(&d.x, size_t(n * kl * 4)));
    CK(cudaMalloc(&d.y, size_t(n * m * 4))); CK(cudaMalloc(&d.xp, lbq::xp_halfs(int(kl), n) * 2));
    d.part = alloc_part(plan, m, n);
    d.tickets = alloc_tickets();
    const std::vector<uint8_t> w = random_blocks(k, std::min<int64_t>(m, 512), kl, rng);
    for (int64_t r0 = 0; r0 < m; r0 += 512) {
        const int64_t nr = std::min<int64_t>(512, m - r0);
        CK(cudaMemcpy(d.w + r0 * row_bytes, w.data(), size_t(nr * row_bytes), cudaMemcpyHostToDevice));
    }
    CK(cudaMemset(d.x, 0, size_t(n * kl * 4)));
    return d;
}

// Of two plans, the one whose partial sums take more memory at n columns (buffers that serve both).
static const lbq::Plan & larger_part(const lbq::Plan & a, const lbq::Plan & b, int64_t m, int n) {
    return lbq::part_floats(a, int(m), n) > lbq::part_floats(b, int(m), n) ? a : b;
}

// The fastest of `iters` timed runs of `fn` after two untimed ones, in ms; `before` runs ahead of each, untimed.
template <class F, class B> static float best_ms(int iters, F && fn, B && before) {
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    float best = 1e30f;
    for (int it = 0; it < iters + 2; ++it) {
        before(it);
        cudaEventRecord(a);
        fn();
        cudaEventRecord(b);
        CK(cudaEventSynchronize(b));
        float ms; cudaEventElapsedTime(&ms, a, b);
        if (it >= 2) best = std::fmin(best, ms);
    }
    cudaEventDestroy(a); cudaEventDestroy(b);
    return best;
}

// `l2`: whether a product whose weights wait in L2 runs faster than one streaming them from DRAM, and whether a bulk
// prefetch issued in the gap before it (the kernels between two products: norms, attention, the delta net, during
// which DRAM idles) gets them there in time. Each run: L2 flushed, then the prefetch (or none, or a kernel reading
// every weight), a kernel spinning `gap` us, then the product alone timed (by unit, as the engine stores it).
__global__ void l2_prefetch(const char * p, size_t bytes) {
    const size_t n_threads = size_t(gridDim.x) * blockDim.x, t = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t slice = ((bytes + n_threads - 1) / n_threads + 15) / 16 * 16;
    if (t * slice >= bytes) return;
    const size_t left = bytes - t * slice, len = (slice < left ? slice : left) / 16 * 16;
#if __CUDA_ARCH__ >= 900
    if (len) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p + t * slice), "r"(unsigned(len)) : "memory");
#else
    for (size_t o = 0; o < len; o += 128) asm volatile("prefetch.global.L2 [%0];" :: "l"(p + t * slice + o));
#endif
}
__global__ void l2_touch(const int4 * p, size_t n, int * sink) {
    int acc = 0;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        acc ^= p[i].x;
    }
    if (acc == 0x7fffffff) *sink = acc;  // keeps the loads
}
__global__ void spin_us(int us) {
    const unsigned long long t0 = gtimer();
    while (gtimer() - t0 < 1000ull * unsigned(us)) {}
}
static void l2_bench(Kind k, int64_t m, int64_t kl, std::mt19937 & rng) {
    const int64_t row_bytes = packed_row_bytes(k, kl);
    const size_t wbytes = size_t(m * row_bytes);
    const lbq::Plan plan = lbq::slot_plan(int(m), int(kl), g_n_sm);
    Dev d = timing_dev(k, m, kl, plan, rng);
    void * flush; const size_t fl = 256u << 20; CK(cudaMalloc(&flush, fl));
    int * sink; CK(cudaMalloc(&sink, sizeof(int)));
    for (int n : {1, 23}) {
        const bool fused = n <= lbq::kFusedMaxN;
        // how: 0 none, 1 prefetch, 2 every weight read; what runs before the product is not timed (best_ms's before)
        auto time_us = [&](int how, int gap) {
            return 1e3f * best_ms(10, [&] { run(k, plan, d, m, kl, n, lbq::kByUnit, fused); }, [&](int it) {
                CK(cudaMemsetAsync(flush, it, fl));
                if (how == 1) l2_prefetch<<<g_n_sm, 32>>>(reinterpret_cast<const char *>(d.w), wbytes);
                if (how == 2) l2_touch<<<g_n_sm * 4, 256>>>(reinterpret_cast<const int4 *>(d.w), wbytes / 16, sink);
                if (gap > 0) spin_us<<<1, 1>>>(gap);
            });
        };
        const float cold = time_us(0, 0), warm = time_us(2, 0);
        std::printf("l2 %s m=%6lld k=%5lld n=%2d (%.1f MB): from DRAM %6.1f us, from L2 (read before) %6.1f us;"
                    " prefetched, then a gap of", k == Kind::Q4_K ? "q4_K" : "q6_K", (long long)m, (long long)kl, n,
                    wbytes / 1e6, cold, warm);
        for (int gap : {0, 2, 5, 10, 20}) std::printf(" %d us: %.1f,", gap, time_us(1, gap));
        std::printf(" us (no prefetch, gap 10 us: %.1f)\n", time_us(0, 10));
    }
    cudaFree(sink);
    cudaFree(flush);
    free_dev(d);
}

// Column counts bench() times (`decode`: an AR step's and a verify's only, the one-column launch fused only).
static std::vector<int> g_bench_ns = {1, 2, 4, 8, 16, 23, 32};
static bool g_fused_only = false;

// The shape's plan (slot_plan) and the fifteenth session's (wave_plan), one after the other at each column count.
static void bench(Kind k, int64_t m, int64_t kl, std::mt19937 & rng) {
    const int64_t row_bytes = packed_row_bytes(k, kl);
    const size_t wbytes = size_t(m * row_bytes);
    const lbq::Plan plans[2] = {lbq::slot_plan(int(m), int(kl), g_n_sm), lbq::wave_plan(int(m), int(kl), g_n_sm)};
    Dev d = timing_dev(k, m, kl, larger_part(plans[0], plans[1], m, 32), rng);
    // a 256 MB buffer written between runs keeps the weights out of L2 (50 MB)
    void * flush; const size_t fl = 256u << 20; CK(cudaMalloc(&flush, fl));
    Dev du = d;  // the matrix stored by unit (zero blocks: the timing does not depend on their values)
    CK(cudaMalloc(&du.w, size_t(m * row_bytes)));
    CK(cudaMemset(du.w, 0, size_t(m * row_bytes)));
    for (int n : g_bench_ns) {
        for (bool fused : {false, true}) {
            if (fused && n > lbq::kFusedMaxN) continue;
            if (g_fused_only && !fused && n <= lbq::kFusedMaxN) continue;
            for (const lbq::Plan & plan : plans) {
                const float best = best_ms(10, [&] { run(k, plan, d, m, kl, n, row_bytes, fused); },
                                           [&](int it) { CK(cudaMemsetAsync(flush, it, fl)); });
                std::printf("bench %s %-22s m=%6lld k=%5lld n=%2d %s: %8.1f us  %6.0f GB/s of weights\n",
                            k == Kind::Q4_K ? "q4_K" : "q6_K", plan_label(plan).c_str(), (long long)m, (long long)kl, n,
                            n > lbq::kFusedMaxN ? "        " : fused ? "fused   " : "separate", best * 1e3, wbytes / (best * 1e-3) / 1e9);
            }
        }
        const float best = best_ms(10, [&] { run(k, plans[0], du, m, kl, n, lbq::kByUnit, true); },
                                   [&](int it) { CK(cudaMemsetAsync(flush, it, fl)); });
        std::printf("bench %s %-22s m=%6lld k=%5lld n=%2d by unit: %8.1f us  %6.0f GB/s of weights\n",
                    k == Kind::Q4_K ? "q4_K" : "q6_K", plan_label(plans[0]).c_str(), (long long)m, (long long)kl, n,
                    best * 1e3, wbytes / (best * 1e-3) / 1e9);
    }
    cudaFree(du.w);
    cudaFree(flush);
    free_dev(d);
}

// Two products of one input in one launch (lbq::launch_pair, patches 0057-0058: ggml-cuda's pairs of an AR step and a
// verify) against each launched alone: bit for bit at every column count 1..32, fused (at most 8 columns) and staged
// (random weights and activations, ggml's rows and stored by unit, each shape's own plan); a pair that does not fit the
// GPU's shared memory (lbq::pair_fits) must refuse and write nothing, any other must run. With `timed`, then
// the pair at one column (fused) and at 23 (staged) against the two launched back to back (dependent launch
// overlapping them, as in ggml's graph), by unit, L2 flushed before each run.
template <Kind KA, Kind KB>
static int pair(int64_t ma, int64_t mb, int64_t kl, bool timed, std::mt19937 & rng) {
    static_assert(KA != KB, "matrices of one kind go in one stack");
    const lbq::Plan pa = lbq::plan(int(ma), int(kl), g_n_sm), pb = lbq::plan(int(mb), int(kl), g_n_sm);
    const int64_t rba = packed_row_bytes(KA, kl), rbb = packed_row_bytes(KB, kl);
    const std::vector<uint8_t> wa = random_blocks(KA, ma, kl, rng), wb = random_blocks(KB, mb, kl, rng);
    Dev da = check_dev(wa, ma, kl), db = check_dev(wb, mb, kl);
    da.part = alloc_part(pa, ma, lbq::kMaxN);
    db.part = alloc_part(pb, mb, lbq::kMaxN);
    std::vector<float> x(size_t(lbq::kMaxN * kl));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float & v : x) v = nd(rng);
    CK(cudaMemcpy(da.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    uint8_t * ua; uint8_t * ub;  // the matrices stored by unit
    const std::vector<uint8_t> wua = by_unit(KA, wa.data(), ma, kl, rba), wub = by_unit(KB, wb.data(), mb, kl, rbb);
    CK(cudaMalloc(&ua, wua.size())); CK(cudaMalloc(&ub, wub.size()));
    CK(cudaMemcpy(ua, wua.data(), wua.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ub, wub.data(), wub.size(), cudaMemcpyHostToDevice));
    float * ya; float * yb;  // the pair's results (da.y and db.y hold each product's alone)
    CK(cudaMalloc(&ya, size_t(lbq::kMaxN * ma * 4))); CK(cudaMalloc(&yb, size_t(lbq::kMaxN * mb * 4)));
    uint2 * xpa; uint2 * xpb;
    CK(cudaMalloc(&xpa, lbq::xp_halfs(int(kl), lbq::kMaxN) * 2)); CK(cudaMalloc(&xpb, lbq::xp_halfs(int(kl), lbq::kMaxN) * 2));
    unsigned int * t = alloc_tickets();
    auto members = [&](bool unit, bool fused, lbq::PairMember & a, lbq::PairMember & b) {
        a = lbq::PairMember{unit ? ua : da.w, unit ? lbq::kByUnit : rba, int(ma), pa.split, pa.cut(), ya, ma, da.part,
                            fused ? t : nullptr, fused ? nullptr : xpa};
        b = lbq::PairMember{unit ? ub : db.w, unit ? lbq::kByUnit : rbb, int(mb), pb.split, pb.cut(), yb, mb, db.part,
                            fused ? t + pa.split.tiles : nullptr, fused ? nullptr : xpb};
    };
    const char * names = KA == Kind::Q4_K ? "q4_K + q6_K" : "q6_K + q4_K";
    int bad = 0;
    for (int n = 1; n <= lbq::kMaxN; ++n) {
        for (bool fused : {true, false}) {
            if (fused && n > lbq::kFusedMaxN) continue;
            run(KA, pa, da, ma, kl, n, rba, fused);
            run(KB, pb, db, mb, kl, n, rbb, fused);
            std::vector<float> want_a(size_t(n * ma)), want_b(size_t(n * mb)), got_a(want_a.size()), got_b(want_b.size());
            CK(cudaMemcpy(want_a.data(), da.y, want_a.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(want_b.data(), db.y, want_b.size() * 4, cudaMemcpyDeviceToHost));
            for (bool unit : {false, true}) {
                lbq::PairMember a, b;
                members(unit, fused, a, b);
                CK(cudaMemset(ya, 0xff, size_t(n * ma * 4))); CK(cudaMemset(yb, 0xff, size_t(n * mb * 4)));
                const bool fits = lbq::pair_fits<KA, KB>(n, fused, g_smem_limit);
                const bool launched = lbq::launch_pair<KA, KB>(a, b, da.x, kl, n, int(kl), fused, g_smem_limit, 0);
                CK(cudaGetLastError());
                CK(cudaMemcpy(got_a.data(), ya, got_a.size() * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(got_b.data(), yb, got_b.size() * 4, cudaMemcpyDeviceToHost));
                bool ok;
                if (launched) {
                    ok = std::memcmp(got_a.data(), want_a.data(), got_a.size() * 4) == 0 &&
                         std::memcmp(got_b.data(), want_b.data(), got_b.size() * 4) == 0;
                } else {  // refused: nothing written (every byte still 0xff)
                    auto untouched = [](const std::vector<float> & v) {
                        const uint8_t * p = reinterpret_cast<const uint8_t *>(v.data());
                        return std::all_of(p, p + v.size() * 4, [](uint8_t c) { return c == 0xff; });
                    };
                    ok = untouched(got_a) && untouched(got_b);
                }
                ok = ok && launched == fits;
                // every count at the 27B's shapes would flood the log: those and each failure
                if (!ok || n == 1 || n == lbq::kFusedMaxN || n == 23 || n == lbq::kMaxN) {
                    std::printf("pair %s m=%lld+%lld k=%lld n=%2d %s%s: %s\n", names, (long long)ma, (long long)mb,
                                (long long)kl, n, fused ? "fused " : "staged", unit ? " by unit" : "",
                                !ok ? "FAIL" : launched ? "ok (the bits of each launched alone)"
                                                        : "ok (refused: the GPU's shared memory)");
                }
                bad += !ok;
            }
        }
    }
    if (timed) {
        void * flush; const size_t fl = 256u << 20; CK(cudaMalloc(&flush, fl));
        auto flushed = [&](int it) { CK(cudaMemsetAsync(flush, it, fl)); };
        Dev ta = da, tb = db;
        ta.w = ua; tb.w = ub;
        const double bytes = double(ma * rba + mb * rbb);
        for (int n : {1, 23}) {
            const bool fused = n <= lbq::kFusedMaxN;
            const float apart = best_ms(10, [&] {
                run(KA, pa, ta, ma, kl, n, lbq::kByUnit, fused);
                run(KB, pb, tb, mb, kl, n, lbq::kByUnit, fused);
            }, flushed);
            lbq::PairMember a, b;
            members(true, fused, a, b);
            const float paired = best_ms(10, [&] { lbq::launch_pair<KA, KB>(a, b, da.x, kl, n, int(kl), fused, g_smem_limit, 0); },
                                         flushed);
            std::printf("bench pair %s m=%lld+%lld k=%lld n=%2d by unit: apart %.1f us (%.0f GB/s), one launch %.1f us "
                        "(%.0f GB/s)\n", names, (long long)ma, (long long)mb, (long long)kl, n, apart * 1e3,
                        bytes / (apart * 1e-3) / 1e9, paired * 1e3, bytes / (paired * 1e-3) / 1e9);
        }
        cudaFree(flush);
    }
    cudaFree(ua); cudaFree(ub); cudaFree(ya); cudaFree(yb); cudaFree(xpa); cudaFree(xpb); cudaFree(t);
    free_dev(da); free_dev(db);
    return bad;
}

// A prefill micro-batch's product (n columns, one launch): as lbq::launch runs it with the shape's plan, the same
// splits through memory at 4 n-tiles (reduce_splits), and wide with them through memory.
static void bench_prefill(Kind k, int64_t m, int64_t kl, int n, std::mt19937 & rng) {
    const int64_t row_bytes = packed_row_bytes(k, kl);
    const lbq::Plan plan = lbq::plan(int(m), int(kl), g_n_sm);
    lbq::Plan apart = plan;
    apart.slots = 1 << 30;  // no launch folds
    Dev d = timing_dev(k, m, kl, plan, rng, n);
    for (const lbq::Plan & p : {plan, apart}) {
        const float best = best_ms(6, [&] { run(k, p, d, m, kl, n, row_bytes, false); }, [](int) {});
        std::printf("prefill %s %-22s m=%6lld k=%5lld n=%4d %-25s: %8.1f us  %5.0f TFLOP/s\n", k == Kind::Q4_K ? "q4_K" : "q6_K",
                    plan_label(p).c_str(), (long long)m, (long long)kl, n, launch_kind(k, p, m, n), best * 1e3,
                    2.0 * m * kl * n / (best * 1e-3) / 1e12);
    }
    // wide with the splits through memory (the launch wide_apart picks), for every shape
    if (can_wide_apart(k, plan, n)) {
        const float best = best_ms(6, [&] { run_wide_apart(k, plan, d, m, kl, n, row_bytes); }, [](int) {});
        std::printf("prefill %s %-22s m=%6lld k=%5lld n=%4d wide, through memory (forced): %8.1f us  %5.0f TFLOP/s\n",
                    k == Kind::Q4_K ? "q4_K" : "q6_K", plan_label(plan).c_str(), (long long)m, (long long)kl, n, best * 1e3,
                    2.0 * m * kl * n / (best * 1e-3) / 1e12);
    }
    free_dev(d);
}

// One launch per decode shape at 1 and 23 columns (the path ggml takes), for Nsight Compute.
static void profile() {
    std::mt19937 rng(7);
    const struct { Kind k; int64_t m, kl; } shapes[] = {{Kind::Q4_K, 17408, 5120}, {Kind::Q4_K, 5120, 17408},
                                                       {Kind::Q6_K, 5120, 17408}, {Kind::Q4_K, 34816, 5120}};
    for (const auto & sh : shapes) {
        const lbq::Plan plan = lbq::plan(int(sh.m), int(sh.kl), g_n_sm);
        Dev d = timing_dev(sh.k, sh.m, sh.kl, plan, rng);
        const int64_t row_bytes = packed_row_bytes(sh.k, sh.kl);
        for (int n : {1, 23}) run(sh.k, plan, d, sh.m, sh.kl, n, row_bytes, true);
        CK(cudaDeviceSynchronize());
        free_dev(d);
    }
}

// The 27B's shapes at an AR step's, a verify's and a prefill micro-batch's column counts with random weights and
// activations: the shape's plan (slot_plan) against wave_plan (other cuts, so close, not equal: rel <= 1e-2), no
// NaN; then the one-column products launched back to back on one stream (dependent launch overlapping them, as in
// ggml's graph) against each alone, bit for bit.
static int engine_shapes() {
    std::mt19937 rng(11);
    const struct { Kind k; int64_t m, kl; } shapes[] = {{Kind::Q4_K, 16480, 5120}, {Kind::Q4_K, 5120, 6144},
        {Kind::Q4_K, 34816, 5120}, {Kind::Q4_K, 5120, 17408}, {Kind::Q6_K, 5120, 17408}, {Kind::Q6_K, 10240, 5120},
        {Kind::Q4_K, 14336, 5120}, {Kind::Q4_K, 48, 5120}, {Kind::Q6_K, 248320, 5120}};
    constexpr int kN = 512;
    int bad = 0;
    std::vector<Dev> devs;
    std::vector<std::vector<float>> alone;  // each shape's one-column result, launched alone
    for (const auto & sh : shapes) {
        const int64_t row_bytes = packed_row_bytes(sh.k, sh.kl);
        const int n_max = sh.m > 100000 ? 23 : kN;
        const lbq::Plan slot = lbq::slot_plan(int(sh.m), int(sh.kl), g_n_sm), wave = lbq::wave_plan(int(sh.m), int(sh.kl), g_n_sm);
        Dev d = timing_dev(sh.k, sh.m, sh.kl, larger_part(slot, wave, sh.m, n_max), rng, n_max);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(size_t(n_max * sh.kl));  // random activations in place of timing_dev's zeros
        for (auto & v : x) v = nd(rng);
        CK(cudaMemcpy(d.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        for (int n : {1, 8, 23, kN}) {
            if (n > n_max) continue;
            std::vector<float> ys(size_t(n * sh.m)), yw(ys.size());
            for (int which = 0; which < 2; ++which) {
                CK(cudaMemset(d.y, 0xff, ys.size() * 4));
                run(sh.k, which ? wave : slot, d, sh.m, sh.kl, n, row_bytes, true);
                CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
                CK(cudaMemcpy((which ? yw : ys).data(), d.y, ys.size() * 4, cudaMemcpyDeviceToHost));
            }
            double maxd = 0, maxr = 0;
            bool finite = true;
            for (size_t i = 0; i < ys.size(); ++i) {
                finite = finite && std::isfinite(ys[i]);
                maxd = std::fmax(maxd, std::fabs(double(ys[i]) - yw[i]));
                maxr = std::fmax(maxr, std::fabs(double(yw[i])));
            }
            const bool ok = finite && maxd <= 1e-2 * maxr;
            bad += !ok;
            std::printf("engine %s m=%6lld k=%5lld n=%3d %s vs %s: max diff %.2e of max %.2e%s %s\n",
                        sh.k == Kind::Q4_K ? "q4_K" : "q6_K", (long long)sh.m, (long long)sh.kl, n, plan_label(slot).c_str(),
                        plan_label(wave).c_str(), maxd, maxr, finite ? "" : " (not finite)", ok ? "ok" : "FAIL");
            if (n == 1) alone.push_back(std::vector<float>(ys.begin(), ys.end()));
        }
        devs.push_back(d);
    }
    // back to back: every shape's one-column product into its own y, no synchronisation between them
    std::vector<float *> ys(devs.size());
    for (size_t i = 0; i < devs.size(); ++i) CK(cudaMalloc(&ys[i], size_t(shapes[i].m * 4)));
    unsigned int * tickets = alloc_tickets();
    int64_t part_max = 1;  // one partial-sum buffer for all (ggml's pool hands the next product the same memory)
    for (const auto & sh : shapes) part_max = std::max(part_max, lbq::part_floats(lbq::slot_plan(int(sh.m), int(sh.kl), g_n_sm), int(sh.m), 1));
    float * part; CK(cudaMalloc(&part, size_t(part_max) * 4));
    for (int rep = 0; rep < 3; ++rep) {
        for (size_t i = 0; i < devs.size(); ++i) {
            const auto & sh = shapes[i];
            Dev d = devs[i];
            d.y = ys[i];
            d.part = part;
            d.tickets = tickets;  // one set for the stream, as ggml's
            run(sh.k, lbq::slot_plan(int(sh.m), int(sh.kl), g_n_sm), d, sh.m, sh.kl, 1, packed_row_bytes(sh.k, sh.kl), true);
        }
    }
    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    for (size_t i = 0; i < devs.size(); ++i) {
        std::vector<float> y(size_t(shapes[i].m));
        CK(cudaMemcpy(y.data(), ys[i], y.size() * 4, cudaMemcpyDeviceToHost));
        const bool ok = std::memcmp(y.data(), alone[i].data(), y.size() * 4) == 0;
        bad += !ok;
        std::printf("engine back to back m=%6lld k=%5lld n=1: %s\n", (long long)shapes[i].m, (long long)shapes[i].kl,
                    ok ? "bitwise equal to alone ok" : "DIFFERENT FAIL");
        cudaFree(ys[i]);
        free_dev(devs[i]);
    }
    cudaFree(tickets);
    cudaFree(part);
    return bad;
}


// One launch per prefill shape at kMaxLaunchN columns (the shape's plan, folded where the launch allows), for
// Nsight Compute.
static void profile_prefill() {
    std::mt19937 rng(7);
    const struct { Kind k; int64_t m, kl; } shapes[] = {{Kind::Q4_K, 34816, 5120}, {Kind::Q4_K, 5120, 17408},
                                                       {Kind::Q6_K, 10240, 5120}};
    for (const auto & sh : shapes) {
        const lbq::Plan plan = lbq::plan(int(sh.m), int(sh.kl), g_n_sm);
        Dev d = timing_dev(sh.k, sh.m, sh.kl, plan, rng, lbq::kMaxLaunchN);
        run(sh.k, plan, d, sh.m, sh.kl, lbq::kMaxLaunchN, packed_row_bytes(sh.k, sh.kl), false);
        CK(cudaDeviceSynchronize());
        free_dev(d);
    }
}

// Stands in for the small ggml op between two products (a norm, an add): reads the last product's
// output, writes the next input, a thread an element (a column per grid row). Launched and synchronized like
// ggml's kernels (dependent launch, the next kernel let start first, as ggml's rms_norm does). (One block a
// column looping over k, as this was until the nineteenth session, took 5-19 us a call: a third of the chain.)
__global__ void glue(const float * y, int64_t m, float * x, int64_t k, int n) {
    const unsigned long long t0 = gtimer();
    ggml_cuda_pdl_lc();
    ggml_cuda_pdl_sync();
    const unsigned long long t1 = gtimer();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < k) x[int64_t(blockIdx.y) * k + i] = 1e-3f * y[int64_t(blockIdx.y) * m + i % m];
    trace_record(t0, t1, -1, 0);
}

// The trace of one chain run, kernel by kernel in launch order: its blocks, and from the moment its first block
// returned from the dependent-launch wait (all its inputs ready), when the median and the last block ended, in us;
// then per shape, the share of a product's time after its median block ended (the tail: blocks of equal work end
// at different times), over the chain's layers. A kernel's blocks are told apart from its shape's next launch by
// time (a shape's launches do not overlap one another).
static void trace_report(const std::vector<TraceRec> & recs) {
    std::map<std::pair<int, long long>, std::vector<TraceRec>> by_shape;
    for (const TraceRec & r : recs) by_shape[{r.m_rows, r.row_bytes}].push_back(r);
    struct Kernel { int m_rows; long long row_bytes; int blocks; double first, sync, p50, last; };
    std::vector<Kernel> ks;
    for (auto & [shape, rs] : by_shape) {
        std::sort(rs.begin(), rs.end(), [](const TraceRec & a, const TraceRec & b) { return a.t0 < b.t0; });
        for (size_t i = 0; i < rs.size(); i += size_t(rs[i].grid)) {
            const size_t e = std::min(rs.size(), i + size_t(rs[i].grid));
            std::vector<unsigned long long> ends;
            unsigned long long first = ~0ull, sync = ~0ull;
            for (size_t j = i; j < e; ++j) {
                first = std::min(first, rs[j].t0);
                sync = std::min(sync, rs[j].t1);
                ends.push_back(rs[j].t2);
            }
            std::sort(ends.begin(), ends.end());
            ks.push_back({shape.first, shape.second, int(e - i), double(first), double(sync), double(ends[ends.size() / 2]),
                          double(ends.back())});
        }
    }
    std::sort(ks.begin(), ks.end(), [](const Kernel & a, const Kernel & b) { return a.first < b.first; });
    if (ks.empty()) return;
    const double t_base = ks[0].first;
    std::printf("  %-18s %6s %9s %9s %9s %9s   (us from the first start; last - wait = the kernel's own time)\n", "kernel", "blocks",
                "start", "wait done", "median", "last");
    for (size_t i = 0; i < ks.size() && i < 16; ++i) {
        const Kernel & k = ks[i];
        char name[32];
        if (k.m_rows < 0) std::snprintf(name, sizeof name, "glue");
        else std::snprintf(name, sizeof name, "%d x %lld B", k.m_rows, k.row_bytes);
        std::printf("  %-18s %6d %9.2f %9.2f %9.2f %9.2f   %.2f\n", name, k.blocks, (k.first - t_base) * 1e-3,
                    (k.sync - t_base) * 1e-3, (k.p50 - t_base) * 1e-3, (k.last - t_base) * 1e-3, (k.last - k.sync) * 1e-3);
    }
    std::map<std::pair<int, long long>, std::pair<double, double>> tail;  // shape -> (sum of tails, sum of times)
    for (const Kernel & k : ks) {
        if (k.m_rows < 0) continue;
        auto & t = tail[{k.m_rows, k.row_bytes}];
        t.first += k.last - k.p50;
        t.second += k.last - k.sync;
    }
    for (auto & [shape, t] : tail) {
        std::printf("  %d x %lld B: after the median block %.0f%% of the product's time\n", shape.first, shape.second,
                    100.0 * t.first / t.second);
    }
}

// A 27B DeltaNet layer's products at n columns (23: as verify runs them; 1: an AR step; in-projections
// sharing one input, the output projection, the ffn), back to back in a CUDA graph with a glue kernel
// wherever the real graph has ops in between, over 8 copies of the weights (1.2 GB, past L2). `fused` runs
// the products that share an input as one taller matrix (qkv|z|beta|alpha, gate|up), `one_kernel` lets
// launches of at most 8 columns run as one kernel. All Q4_K. `trace`: one more run recorded through the hooks and
// reported by trace_report. `glu` (stacked only): the ffn down product reads gate|up's output as a SwiGLU input
// (lbq::Ups, patch 0051) instead of a glue kernel's output.
static void chain_bench(bool fused, int n, bool one_kernel, bool waves = false, bool trace = false, bool unit = false,
                        bool glu = false) {
    const int n_layers = 8;
    struct Prod { int64_t m, k; int in, out; };  // in/out: activation buffer 0 (5120), 1 (6144), 2 (17408)
    static const Prod kFused[] = {{16480, 5120, 0, 1}, {5120, 6144, 1, 0}, {34816, 5120, 0, 2}, {5120, 17408, 2, 0}};
    static const Prod kSeparate[] = {{10240, 5120, 0, -1}, {6144, 5120, 0, -1}, {48, 5120, 0, -1}, {48, 5120, 0, 1},
                                     {5120, 6144, 1, 0},   {17408, 5120, 0, -1}, {17408, 5120, 0, 2}, {5120, 17408, 2, 0}};
    const std::vector<Prod> layer = fused ? std::vector<Prod>(std::begin(kFused), std::end(kFused))
                                          : std::vector<Prod>(std::begin(kSeparate), std::end(kSeparate));
    const int64_t ks[3] = {5120, 6144, 17408};
    float * xs[3];
    for (int i = 0; i < 3; ++i) { CK(cudaMalloc(&xs[i], size_t(32 * ks[i] * 4))); CK(cudaMemset(xs[i], 0, size_t(32 * ks[i] * 4))); }
    __half * xp; CK(cudaMalloc(&xp, lbq::xp_halfs(17408, 32) * 2));
    size_t part_max = 1, wbytes = 0;
    std::vector<uint8_t *> ws; std::vector<float *> ys; std::vector<lbq::Plan> plans;
    for (int l = 0; l < n_layers; ++l)
        for (const Prod & p : layer) {
            const size_t bytes = size_t(p.m * packed_row_bytes(Kind::Q4_K, p.k));  // either layout
            uint8_t * w; CK(cudaMalloc(&w, bytes)); CK(cudaMemset(w, 0, bytes)); ws.push_back(w);
            float * y; CK(cudaMalloc(&y, size_t(32 * p.m * 4))); ys.push_back(y);
            plans.push_back(waves ? lbq::wave_plan(int(p.m), int(p.k), g_n_sm) : lbq::slot_plan(int(p.m), int(p.k), g_n_sm));
            part_max = std::max<size_t>(part_max, size_t(lbq::part_floats(plans.back(), int(p.m), 32)));
            wbytes += bytes;
        }
    float * part; CK(cudaMalloc(&part, part_max * 4));
    unsigned int * tickets = one_kernel ? alloc_tickets() : nullptr;
    cudaStream_t st; CK(cudaStreamCreate(&st));
    const char * env = std::getenv("GGML_CUDA_PDL");
    const bool pdl = !(env && std::atoi(env) == 0);  // as ggml_cuda_kernel_launch reads it (for the report)
    auto enqueue = [&] {
        size_t i = 0;
        for (int l = 0; l < n_layers; ++l)
            for (const Prod & p : layer) {
                const int64_t row_bytes = unit ? lbq::kByUnit : packed_row_bytes(Kind::Q4_K, p.k);
                const bool reads_glu = glu && fused && p.in == 2;  // ffn down after gate|up (ys[i - 1]: gates, ups)
                const float * x = reads_glu ? ys[i - 1] : xs[p.in];
                const int64_t ldx = reads_glu ? 2 * p.k : p.k;
                const lbq::Ups ups{reads_glu ? ys[i - 1] + p.k : nullptr, ldx};
                lbq::launch<Kind::Q4_K>(plans[i], ws[i], row_bytes, int(p.m), int(p.k), x, ldx, n, xp, part, tickets, ys[i],
                                        p.m, g_smem_limit, st, ups);
                if (p.out >= 0 && !(glu && fused && p.out == 2)) {
                    ggml_cuda_kernel_launch(glue, ggml_cuda_kernel_launch_params(dim3((ks[p.out] + 255) / 256, n), dim3(256), 0, st),
                                            static_cast<const float *>(ys[i]), p.m, xs[p.out], ks[p.out], n);
                }
                ++i;
            }
    };
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    enqueue();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    float best = 1e30f;
    for (int it = 0; it < 12; ++it) {
        cudaEventRecord(a, st);
        CK(cudaGraphLaunch(ge, st));
        cudaEventRecord(b, st);
        CK(cudaEventSynchronize(b));
        float ms; cudaEventElapsedTime(&ms, a, b);
        if (it >= 2) best = std::fmin(best, ms);
    }
    if (trace) {  // one more run, recorded
        const unsigned int zero = 0;
        const bool on = true, off = false;
        CK(cudaMemcpyToSymbol(g_trace_n, &zero, sizeof zero));
        CK(cudaMemcpyToSymbol(g_trace_on, &on, sizeof on));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpyToSymbol(g_trace_on, &off, sizeof off));
        unsigned int n_rec = 0;
        CK(cudaMemcpyFromSymbol(&n_rec, g_trace_n, sizeof n_rec));
        std::vector<TraceRec> recs(std::min(n_rec, kTraceMax));
        CK(cudaMemcpyFromSymbol(recs.data(), g_trace, recs.size() * sizeof(TraceRec)));
        std::printf("trace of the chain below:\n");
        trace_report(recs);
    }
    std::printf("chain n=%2d %s%s %s%s%s (dependent launch %s): %zu products, %.1f us per layer, %.0f GB/s of "
                "weights\n", n, fused ? "stacked  " : "separate ",
                n > lbq::kFusedMaxN ? "" : one_kernel ? "one kernel   " : "three kernels",
                waves ? "wave_plan" : "slot_plan", unit ? ", by unit" : "", glu ? ", down reads the SwiGLU" : "",
                pdl ? "on" : "off", ws.size(),
                best * 1e3 / n_layers, wbytes / (best * 1e-3) / 1e9);
    for (auto w : ws) cudaFree(w);
    for (auto y : ys) cudaFree(y);
    for (auto x : xs) cudaFree(x);
    cudaFree(xp); cudaFree(part); cudaFree(tickets); cudaGraphExecDestroy(ge); cudaGraphDestroy(g); cudaStreamDestroy(st);
}

int main(int argc, char ** argv) {
    CK(cudaDeviceGetAttribute(&g_n_sm, cudaDevAttrMultiProcessorCount, 0));
    int optin = 0;
    CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    const char * cap = std::getenv("GGML_CUDA_INVARIANT_SMEM");
    g_smem_limit = cap && std::atol(cap) > 0 ? std::min<size_t>(size_t(optin), size_t(std::atol(cap))) : size_t(optin);
    std::printf("shared memory per block: %zu bytes\n", g_smem_limit);
    if (argc > 1 && std::strcmp(argv[1], "profile") == 0) {
        profile();
        return 0;
    }
    if (argc > 1 && std::strcmp(argv[1], "profile_prefill") == 0) {
        profile_prefill();
        return 0;
    }
    auto chains = [] {
        for (bool waves : {false, true}) {
            chain_bench(false, 23, true, waves);
            chain_bench(true, 23, true, waves);
            chain_bench(true, 1, false, waves);
            chain_bench(true, 1, true, waves);
        }
        // the matrices stored by unit (lbq::kByUnit), then with ffn down reading the SwiGLU (no glue kernel before it)
        chain_bench(true, 23, true, false, false, true);
        chain_bench(true, 1, true, false, false, true);
        chain_bench(true, 23, true, false, false, true, true);
        chain_bench(true, 1, true, false, false, true, true);
    };
    if (argc > 1 && std::strcmp(argv[1], "trace") == 0) {
        chain_bench(true, 1, true, false, true);
        chain_bench(true, 23, true, false, true);
        chain_bench(true, 1, true, false, true, true);
        return 0;
    }
    if (argc > 1 && std::strcmp(argv[1], "chain") == 0) {
        chains();
        return 0;
    }
    std::mt19937 rng(7);
    if (argc > 1 && std::strcmp(argv[1], "engine") == 0) {
        const int bad = engine_shapes();
        std::printf("%s\n", bad ? "engine shapes: FAILED" : "engine shapes: all ok");
        return bad ? 1 : 0;
    }
    // the 27B's pairs (a Q6_K qkv with its Q4_K z|beta|alpha, Q4_K q|k with a Q6_K v), checked and timed
    auto pairs = [&](bool timed) {
        int bad = pair<Kind::Q4_K, Kind::Q6_K>(6240, 10240, 5120, timed, rng);
        bad += pair<Kind::Q4_K, Kind::Q6_K>(13312, 1024, 5120, timed, rng);
        return bad;
    };
    if (argc > 1 && std::strcmp(argv[1], "pair") == 0) {
        const int bad = pairs(true);
        std::printf("%s\n", bad ? "pairs: FAILED" : "pairs: all ok");
        return bad ? 1 : 0;
    }
    if (argc > 1 && std::strcmp(argv[1], "l2") == 0) {
        // the products after a gap in the 27B's step: attention out and DeltaNet out (6144 -> 5120), then ffn down
        l2_bench(Kind::Q4_K, 5120, 6144, rng);
        l2_bench(Kind::Q6_K, 5120, 6144, rng);
        l2_bench(Kind::Q4_K, 5120, 17408, rng);
        return 0;
    }
    if (argc > 1 && std::strcmp(argv[1], "decode") == 0) {
        g_bench_ns = {1, 23};
        g_fused_only = true;
        bench(Kind::Q4_K, 17408, 5120, rng);
        bench(Kind::Q4_K, 5120, 17408, rng);
        bench(Kind::Q6_K, 5120, 17408, rng);
        bench(Kind::Q6_K, 10240, 5120, rng);
        bench(Kind::Q6_K, 248320, 5120, rng);
        // a stack holds one type: where Q4_K_M's qkv is Q6_K, z|beta|alpha is a product of its own, as is a Q6_K
        // attention v; against a whole DeltaNet stack of about their bytes (what one launch for a pair would be)
        bench(Kind::Q4_K, 16480, 5120, rng);
        bench(Kind::Q4_K, 6240, 5120, rng);
        bench(Kind::Q6_K, 1024, 5120, rng);
        chains();
        return 0;
    }
    int bad = 0;
    bad += dequant_check(rng);
    bad += check(Kind::Q4_K, 200, 512, 0, rng);    // a partial last block of rows
    bad += check(Kind::Q4_K, 64, 2560, 0, rng);
    bad += check(Kind::Q6_K, 136, 768, 0, rng);
    bad += check(Kind::Q6_K, 300, 2304, 0, rng);
    bad += check(Kind::Q6_K, 130, 1280, 6, rng);   // rows 2-byte aligned only
    bad += check(Kind::Q4_K, 9000, 256, 0, rng);   // many row blocks, one super-block
    bad += check(Kind::Q4_K, 9000, 512, 0, rng);   // 7 worker ranges: some row tiles cut, most whole
    bad += check_glu(Kind::Q4_K, 200, 512, rng);
    bad += check_glu(Kind::Q6_K, 300, 2304, rng);
    bad += check_glu(Kind::Q4_K, 9000, 512, rng);
    // which plans cut k (each shape's slot_plan): the second, the first, neither, both; a partial last tile each
    bad += pair<Kind::Q6_K, Kind::Q4_K>(300, 9000, 512, false, rng);
    bad += pair<Kind::Q4_K, Kind::Q6_K>(9000, 300, 512, false, rng);
    bad += pair<Kind::Q4_K, Kind::Q6_K>(200, 130, 512, false, rng);
    bad += pair<Kind::Q4_K, Kind::Q6_K>(200, 130, 2560, false, rng);
    bad += pairs(false);
    if (bad) { std::printf("FAILED: %d checks\n", bad); }
    if (argc > 1 && std::strcmp(argv[1], "check") == 0) {
        return bad ? 1 : 0;
    }
    // the 27B's decode shapes: ffn gate/up, ffn down, DeltaNet qkv, lm head
    bench(Kind::Q4_K, 17408, 5120, rng);
    bench(Kind::Q4_K, 5120, 17408, rng);
    bench(Kind::Q6_K, 5120, 17408, rng);
    bench(Kind::Q6_K, 10240, 5120, rng);
    bench(Kind::Q6_K, 248320, 5120, rng);
    // the 27B's stacked prefill products: DeltaNet qkv|z|beta|alpha, ffn gate|up, attention q|k|v, ffn down,
    // DeltaNet out, and the Q6_K ones of Q4_K_M's "more bits" layers (DeltaNet qkv, ffn down)
    for (int n : {512, lbq::kMaxLaunchN}) {
        bench_prefill(Kind::Q4_K, 16480, 5120, n, rng);
        bench_prefill(Kind::Q4_K, 34816, 5120, n, rng);
        bench_prefill(Kind::Q4_K, 14336, 5120, n, rng);
        bench_prefill(Kind::Q6_K, 10240, 5120, n, rng);
        bench_prefill(Kind::Q4_K, 5120, 17408, n, rng);
        bench_prefill(Kind::Q6_K, 5120, 17408, n, rng);
        bench_prefill(Kind::Q4_K, 5120, 6144, n, rng);
    }
    chains();
    return bad ? 1 : 0;
}
