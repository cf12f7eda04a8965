// Pieces of the standalone probes in benchmarks/kernels (tree_attn_probe.cu, stream_probe.cu, gdn_chain_probe.cu,
// mmf_split_probe.cu, bf16_stream_probe.cu, q8_stream_probe.cu, q8s_check.cu; the transposed probe of session 31 is on
// branch wip/tree-attn-transposed):
// the 27B's attention shape, an error check, cp.async / named barrier / setmaxnreg wrappers, the Q4_0 -> f16
// conversion the invariant attention uses (so a probe's tiles hold the fork's values), the segment merge, and on the
// host the probes' data, their double-precision reference, launch timers and the copy bandwidth.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                                    \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            std::fprintf(stderr, "%s: %s: %s\n", __FILE__, #x, cudaGetErrorString(e_));             \
            std::exit(2);                                                                           \
        }                                                                                           \
    } while (0)

constexpr int D = 256, G = 6, HKV = 4, H = HKV * G;  // the 27B's attention layers
constexpr int kRowBytes = D / 32 * 18;               // a Q4_0 row of one head: 8 blocks of (f16 d, 16 bytes)

__device__ __forceinline__ unsigned smem_addr(const void * p) { return unsigned(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(void * dst, const void * src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n"); }
// at most kPending of this thread's newest cp.async groups still in flight
template <int kPending> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// a warpgroup's register allocation, lowered (a producer's) or raised (a consumer's) to kRegs a thread
template <int kRegs> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
__device__ __forceinline__ void named_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ unsigned pack2(float x, float y) {
    const half2 h = __floats2half2_rn(x, y);
    return *(const unsigned *) &h;
}

// Q4_0 quant block (d, then 16 bytes: value i in the low nibble of byte i, value i + 16 in its high one) -> 32 f16,
// as the invariant kernel converts (raw_block_to_half): the block read as the 5 words around it (it starts 0 or 2 bytes
// into a word), each nibble put under 0x64 (the f16 1024 + n), minus 1032, times d: d (n - 8) rounded once to f16, the
// bits __int2half_rn + __hmul2 give, in ~2 instructions a value instead of two conversions (the first version of this
// probe converted that way: Q4_0 ~300 us over F16 at 128K, H100, twenty-eighth session).
// dst: values 8 j .. 8 j + 7 at dst + j stride bytes (16: contiguous)
// (q4_0_words_to_f16: the block already in registers, as the 5 words around it; odd: it starts 2 bytes into the first)
// (q4_0_words_to_halves: the 32 values as 16 half2 words, value 2 i in the low half of out[i])
__device__ __forceinline__ void q4_0_words_to_halves(const unsigned (&wv)[5], unsigned odd, unsigned (&out)[16]) {
    const unsigned d_bits = __byte_perm(wv[0], 0, odd ? 0x3232 : 0x1010);
    const half2 d2 = *(const half2 *) &d_bits, off = __float2half2_rn(1032.0f);
    auto put = [&](unsigned x, int v0) {  // 4 nibbles as bytes -> values v0 .. v0 + 3
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned bits = __byte_perm(x, 0x64646464u, h == 0 ? 0x4140 : 0x4342);
            const half2 r = __hmul2(__hsub2(*(const half2 *) &bits, off), d2);
            out[v0 / 2 + h] = *(const unsigned *) &r;
        }
    };
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned q = __byte_perm(wv[i], wv[i + 1], odd ? 0x7654 : 0x5432);
        put(q & 0x0F0F0F0Fu, 4 * i);
        put((q >> 4) & 0x0F0F0F0Fu, 16 + 4 * i);
    }
}
__device__ __forceinline__ void q4_0_words_to_f16(const unsigned (&wv)[5], unsigned odd, uint8_t * dst, int stride) {
    unsigned out[16];
    q4_0_words_to_halves(wv, odd, out);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        *(uint4 *) (dst + i * stride) = make_uint4(out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
    }
}
__device__ __forceinline__ void q4_0_to_f16(const uint8_t * src, uint8_t * dst, int stride) {
    const unsigned odd = unsigned(uintptr_t(src)) & 2;
    const unsigned * w = (const unsigned *) (src - odd);
    unsigned wv[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) wv[i] = w[i];
    q4_0_words_to_f16(wv, odd, dst, stride);
}

// A whole Q4_0 row of one head (kRowBytes, as words) -> its D values, 8 j .. 8 j + 7 at dst + j stride bytes: block qb
// is bytes 18 qb .., from word 18 qb / 4, 2 bytes in where qb is odd
__device__ __forceinline__ void q4_0_row_to_f16(const unsigned (&row)[kRowBytes / 4], uint8_t * dst, int stride) {
#pragma unroll
    for (int qb = 0; qb < D / 32; ++qb) {
        unsigned wv[5];
#pragma unroll
        for (int j = 0; j < 5; ++j) wv[j] = row[18 * qb / 4 + j];
        q4_0_words_to_f16(wv, (qb & 1) * 2, dst + 4 * qb * stride, stride);
    }
}

__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// dst [n_q][H][D] f32: the segments of each row merged in segment order; one thread a (row, dimension). part:
// [segment][HKV][n_rows][D + 2] (row r: query r / G, head kvh G + r % G; O unnormalized, then m in log2 units, then l)
__global__ void probe_merge(const float * part, float * dst, int n_q, int n_seg, int n_rows) {
    const int kvh = blockIdx.y, row = blockIdx.x, d = threadIdx.x;
    if (row >= n_q * G) return;
    float M = -INFINITY;
    for (int s = 0; s < n_seg; ++s) M = fmaxf(M, part[((size_t(s) * HKV + kvh) * n_rows + row) * (D + 2) + D]);
    float O = 0.0f, L = 0.0f;
    for (int s = 0; s < n_seg; ++s) {
        const float * p = part + ((size_t(s) * HKV + kvh) * n_rows + row) * (D + 2);
        const float w = exp2f(p[D] - M);
        O += w * p[d];
        L += w * p[D + 1];
    }
    dst[(size_t(row / G) * H + kvh * G + row % G) * D + d] = O / L;
}

// xorshift: uniform doubles in [0, 1)
struct Xorshift {
    uint64_t s = 12345;
    double operator()() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return double(s >> 11) / double(1ull << 53);
    }
};

// The probes' data, one xorshift stream (the same in every probe): Q4_0 K and V caches of n_kv rows of the HKV heads
// (d uniform in [0.02, 0.12), random nibbles), then n_q queries of H heads (uniform in [-1, 1)); rnd: the stream after
struct ProbeData {
    std::vector<uint8_t> k, v;  // [n_kv][HKV][kRowBytes]
    std::vector<half> q;        // [n_q][H][D]
    Xorshift rnd;
};
inline ProbeData probe_data(int n_kv, int n_q) {
    ProbeData p;
    p.k.resize(size_t(n_kv) * HKV * kRowBytes);
    p.v.resize(p.k.size());
    p.q.resize(size_t(n_q) * H * D);
    for (auto * buf : {&p.k, &p.v}) {
        for (size_t b = 0; b < buf->size() / 18; ++b) {
            const half d = __float2half(float(0.02 + 0.1 * p.rnd()));
            std::memcpy(buf->data() + b * 18, &d, 2);
            for (int i = 0; i < 16; ++i) (*buf)[b * 18 + 2 + i] = uint8_t(p.rnd() * 256.0);
        }
    }
    for (auto & x : p.q) x = __float2half(float(2.0 * p.rnd() - 1.0));
    return p;
}

// the f16 values the kernels convert the first n_kv rows of a Q4_0 cache to: [key][HKV][D], d (n - 8) rounded once
inline std::vector<half> q4_0_values(const std::vector<uint8_t> & buf, int n_kv) {
    std::vector<half> x(size_t(n_kv) * HKV * D);
    for (size_t r = 0; r < size_t(n_kv) * HKV; ++r) {
        for (int d = 0; d < D; ++d) {
            const uint8_t * blk = buf.data() + r * kRowBytes + (d / 32) * 18;
            half hd;
            std::memcpy(&hd, blk, 2);
            const int i = d % 32, nib = i < 16 ? blk[2 + i] & 0xF : blk[2 + i - 16] >> 4;
            x[r * D + d] = __float2half(float(nib - 8) * __half2float(hd));  // exact, then rounded
        }
    }
    return x;
}

// the largest |got - exact| over n_q queries ([n_q][H][D]) attending to the first n_kv keys of the f16 caches kf, vf
// ([key][HKV][D]), the exact result in double precision
inline double worst_vs_double(const std::vector<half> & q, const std::vector<half> & kf, const std::vector<half> & vf,
                              int n_q, int n_kv, const std::vector<float> & got) {
    double worst = 0.0;
    std::vector<double> sc(n_kv);
    for (int qi = 0; qi < n_q; ++qi) {
        for (int h = 0; h < H; ++h) {
            const int kvh = h / G;
            const half * qr = q.data() + (size_t(qi) * H + h) * D;
            double mx = -1e300;
            for (int t = 0; t < n_kv; ++t) {
                const half * kr = kf.data() + (size_t(t) * HKV + kvh) * D;
                double s = 0.0;
                for (int d = 0; d < D; ++d) s += double(__half2float(qr[d])) * double(__half2float(kr[d]));
                sc[t] = s / std::sqrt(double(D));
                mx = std::max(mx, sc[t]);
            }
            double L = 0.0;
            for (auto & x : sc) L += (x = std::exp(x - mx));
            for (int d = 0; d < D; ++d) {
                double O = 0.0;
                for (int t = 0; t < n_kv; ++t) O += sc[t] * double(__half2float(vf[(size_t(t) * HKV + kvh) * D + d]));
                worst = std::max(worst, std::fabs(O / L - double(got[(size_t(qi) * H + h) * D + d])));
            }
        }
    }
    return worst;
}

// the mean time of launch(i) (kernels on the default stream) over iters launches back to back, after `warmups`
// untimed ones (i counts from 0 over both: a probe may cycle its weights by it), us
template <class Launch> double time_back_to_back_us(Launch launch, int warmups, int iters) {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < warmups; ++i) launch(i);
    CHECK(cudaEventRecord(e0));
    for (int i = 0; i < iters; ++i) launch(warmups + i);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaGetLastError());
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    return 1e3 * ms / iters;
}

// a device-to-device copy's rate (2 bytes moved a byte copied) over 10 copies of 512 MiB: the bandwidth a streaming
// kernel could reach at best, GB/s
inline double copy_gbs() {
    const size_t bytes = size_t(512) << 20;
    void * a, * b;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    const double us = time_back_to_back_us([&](int) { CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); },
                                           1, 10);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    return 2.0 * bytes / (us * 1e3);
}

// the mean time of launch() (kernels on the default stream) over iters runs after `warmups` untimed ones, us
template <class Launch> float time_us(Launch launch, int warmups, int iters) {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float us = 0.0f;
    for (int it = -warmups; it < iters; ++it) {
        CHECK(cudaEventRecord(e0));
        launch();
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 0) us += 1000.0f * ms / iters;
    }
    CHECK(cudaGetLastError());
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    return us;
}
