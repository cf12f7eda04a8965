// Small-batch K-quant matrix multiplication on tensor cores (lucebox).
//
// y[n][m] = sum_k w[m][k] * x[n][k] for a Q4_K or Q6_K weight matrix in ggml's own block layout and
// 1..32 activation columns (an autoregressive step, a speculative verify tree). Weights are read once,
// dequantized to fp16 in registers straight into mma.sync A fragments, and multiplied by fp16
// activations with fp32 accumulation.
//
// Batch invariance: a column's result depends only on that column. The K split, the order of the
// k-steps and the cross-warp reduction are fixed by the matrix shape alone, and a tensor-core dot
// product of one output element does not depend on the other columns, so a column computes to the
// same bits whether it is multiplied alone (N = 1) or in a batch of 32.
//
// Layout trick: the mma contracts over k in any order as long as A and B agree. Each thread takes
// whole bytes of the quantized weights and the activations are pre-permuted (lbq_prepare_x) into
// exactly the k order those bytes hold, so weights need no shuffling and no shared memory.
//
// This header has no ggml dependency so that a standalone test can include it.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

namespace lbq {

constexpr int kQK       = 256;  // weights per super-block (QK_K)
constexpr int kQ4KBytes = 144;  // block_q4_K: d, dmin (half), scales[12], qs[128]
constexpr int kQ6KBytes = 210;  // block_q6_K: ql[128], qh[64], scales[16] (int8), d (half)
constexpr int kMaxN     = 32;   // activation columns: 4 mma n-tiles of 8
constexpr int kWarps    = 4;    // warps of a block split K (super-blocks interleaved)
constexpr int kMT       = 2;    // 16-row m-tiles per warp: a block owns 32 rows

enum class Kind { Q4_K, Q6_K };

// k-values one lane covers per chunk and how a chunk splits: a Q4_K chunk is 64 weights (32 bytes of
// qs: low nibbles = first 32, high = next 32), a Q6_K chunk is 128 weights (one half super-block).
template <Kind K> struct Traits;
template <> struct Traits<Kind::Q4_K> {
    static constexpr int R = 2;                 // 32-weight groups per chunk (nibble planes)
    static constexpr int chunk = 32 * R;        // weights per chunk
    static constexpr int chunks_per_sb = kQK / chunk;
};
template <> struct Traits<Kind::Q6_K> {
    static constexpr int R = 4;
    static constexpr int chunk = 32 * R;
    static constexpr int chunks_per_sb = kQK / chunk;
};

// Activation permutation. Lane (g, t) of n-tile c covers column n = 8c + g; in chunk j, for word
// w (0, 1) and group r (0..R-1), it holds the 4 k-values base + 32 r + 8 t + 4 w + {0, 2, 1, 3}:
// (k0, k2) and (k1, k3) are the fragment halves b0 and b1 of the k16-step (w, r).
// Xp layout (halfs): [chunk][n-tile][lane][w][r][4].
template <Kind K>
__global__ void prepare_x(const float * __restrict__ x, int64_t ldx, int n_cols, int k_len, int n_tiles,
                          __half * __restrict__ xp) {
    constexpr int R = Traits<K>::R;
    const int lane = threadIdx.x & 31;
    const int slot = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);  // (chunk, n-tile)
    const int n_chunks = k_len / Traits<K>::chunk;
    if (slot >= n_chunks * n_tiles) {
        return;
    }
    const int chunk = slot / n_tiles, tile = slot % n_tiles;
    const int g = lane >> 2, t = lane & 3;
    const int n = tile * 8 + g;
    const int base = chunk * Traits<K>::chunk + 8 * t;
    __align__(16) __half out[8 * R];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int k = base + 32 * r + 4 * w;
            float v0 = 0.0f, v1 = 0.0f, v2 = 0.0f, v3 = 0.0f;
            if (n < n_cols) {
                const float * xr = x + int64_t(n) * ldx + k;
                v0 = xr[0]; v1 = xr[1]; v2 = xr[2]; v3 = xr[3];
            }
            __half * o = out + (w * R + r) * 4;
            o[0] = __float2half_rn(v0);
            o[1] = __float2half_rn(v2);
            o[2] = __float2half_rn(v1);
            o[3] = __float2half_rn(v3);
        }
    }
    uint4 * dst = reinterpret_cast<uint4 *>(xp) + (int64_t(slot) * 32 + lane) * R;
    const uint4 * src = reinterpret_cast<const uint4 *>(out);
#pragma unroll
    for (int i = 0; i < R; ++i) {
        dst[i] = src[i];
    }
}

__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2 *>(&u); }

// Bytes 0 and 2 of v (each < 256), as the half2 (1024 + b0, 1024 + b2): exact.
__device__ __forceinline__ __half2 bytes02_biased(uint32_t v) { return bits_h2((v & 0x00ff00ffu) | 0x64006400u); }

// 4-byte and 8-byte loads at addresses that are only 2-byte aligned (Q6_K's 210-byte blocks).
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t * p) {
    const uint16_t * q = reinterpret_cast<const uint16_t *>(p);
    return uint32_t(__ldg(q)) | (uint32_t(__ldg(q + 1)) << 16);
}

// Q4_K: 6-bit scale and min of sub-block i from the 12 packed bytes (as ggml's get_scale_min_k4).
__device__ __forceinline__ void q4k_scale_min(const uint8_t * s, int i, int & sc, int & m) {
    if (i < 4) {
        sc = s[i] & 63;
        m = s[i + 4] & 63;
    } else {
        sc = (s[i + 4] & 0xF) | ((s[i - 4] >> 6) << 4);
        m = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
    }
}

// One row's share of one super-block for this lane, loaded up front (before any dequantization) so
// a warp has a whole super-block of rows in flight.
template <Kind K> struct RowSb;
template <> struct RowSb<Kind::Q4_K> {
    uint4 hdr;      // d, dmin, scales[12]
    uint2 qs[4];    // per 64-weight chunk: this lane's 8 qs bytes
};
template <> struct RowSb<Kind::Q6_K> {
    uint32_t ql0[2][2], ql1[2][2], qh[2][2];  // [chunk][word]
    uint32_t sc[4];                            // scales[16] (int8)
    float d;
};

template <Kind K>
__device__ __forceinline__ void load_sb(const uint8_t * sb, int t, RowSb<K> & rs);

template <>
__device__ __forceinline__ void load_sb<Kind::Q4_K>(const uint8_t * sb, int t, RowSb<Kind::Q4_K> & rs) {
    rs.hdr = __ldg(reinterpret_cast<const uint4 *>(sb));
#pragma unroll
    for (int c = 0; c < 4; ++c) rs.qs[c] = __ldg(reinterpret_cast<const uint2 *>(sb + 16 + 32 * c + 8 * t));
}

template <>
__device__ __forceinline__ void load_sb<Kind::Q6_K>(const uint8_t * sb, int t, RowSb<Kind::Q6_K> & rs) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const uint8_t * ql = sb + 64 * c + 8 * t;
        const uint8_t * qh = sb + 128 + 32 * c + 8 * t;
        rs.ql0[c][0] = ld_u32_a2(ql);
        rs.ql0[c][1] = ld_u32_a2(ql + 4);
        rs.ql1[c][0] = ld_u32_a2(ql + 32);
        rs.ql1[c][1] = ld_u32_a2(ql + 36);
        rs.qh[c][0] = ld_u32_a2(qh);
        rs.qh[c][1] = ld_u32_a2(qh + 4);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) rs.sc[i] = ld_u32_a2(sb + 192 + 4 * i);
    rs.d = __half2float(__ldg(reinterpret_cast<const __half *>(sb + 208)));
}

__device__ __forceinline__ int byte_of(const uint32_t (&w)[3], int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xFF; }

// Scale (and offset) per group r of chunk c, as half2 broadcasts.
template <Kind K> struct ChunkScales;
template <> struct ChunkScales<Kind::Q4_K> {
    __half2 s[2], o[2];
};
template <> struct ChunkScales<Kind::Q6_K> {
    __half2 s[4];
};

__device__ __forceinline__ void chunk_scales(const RowSb<Kind::Q4_K> & rs, int c, int t, ChunkScales<Kind::Q4_K> & cs) {
    const __half2 dm = bits_h2(rs.hdr.x);
    const float d = __low2float(dm), dmin = __high2float(dm);
    const uint32_t w[3] = {rs.hdr.y, rs.hdr.z, rs.hdr.w};  // scales[12]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = 2 * c + r;  // sub-block; as ggml's get_scale_min_k4
        int sc, m;
        if (i < 4) {
            sc = byte_of(w, i) & 63;
            m = byte_of(w, i + 4) & 63;
        } else {
            sc = (byte_of(w, i + 4) & 0xF) | ((byte_of(w, i - 4) >> 6) << 4);
            m = (byte_of(w, i + 4) >> 4) | ((byte_of(w, i) >> 6) << 4);
        }
        cs.s[r] = __float2half2_rn(d * float(sc));
        cs.o[r] = __float2half2_rn(dmin * float(m));
    }
}

__device__ __forceinline__ void chunk_scales(const RowSb<Kind::Q6_K> & rs, int c, int t, ChunkScales<Kind::Q6_K> & cs) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int i = 8 * c + (t >> 1) + 2 * r;
        const int8_t sc = int8_t((rs.sc[i >> 2] >> (8 * (i & 3))) & 0xFF);
        cs.s[r] = __float2half2_rn(rs.d * float(sc));
    }
}

// The two A-fragment registers (k pairs (0,2) and (1,3) of this lane) of k16-step (w, r) of chunk c.
__device__ __forceinline__ void dequant(const RowSb<Kind::Q4_K> & rs, const ChunkScales<Kind::Q4_K> & cs, int c, int w,
                                        int r, uint32_t & lo, uint32_t & hi) {
    const uint32_t v = ((w == 0 ? rs.qs[c].x : rs.qs[c].y) >> (4 * r)) & 0x0f0f0f0fu;
    const __half2 bias = __float2half2_rn(1024.0f);
    const __half2 q02 = __hsub2(bytes02_biased(v), bias);
    const __half2 q13 = __hsub2(bytes02_biased(v >> 8), bias);
    lo = h2_bits(__hfma2(q02, cs.s[r], __hneg2(cs.o[r])));
    hi = h2_bits(__hfma2(q13, cs.s[r], __hneg2(cs.o[r])));
}

__device__ __forceinline__ void dequant(const RowSb<Kind::Q6_K> & rs, const ChunkScales<Kind::Q6_K> & cs, int c, int w,
                                        int r, uint32_t & lo, uint32_t & hi) {
    const uint32_t src = (r & 1) ? rs.ql1[c][w] : rs.ql0[c][w];
    const uint32_t q6 = ((src >> (4 * (r >> 1))) & 0x0f0f0f0fu) | (((rs.qh[c][w] >> (2 * r)) & 0x03030303u) << 4);
    const __half2 bias = __float2half2_rn(1056.0f);  // 1024 (the exponent trick) + 32 (Q6_K's offset)
    const __half2 q02 = __hsub2(bytes02_biased(q6), bias);
    const __half2 q13 = __hsub2(bytes02_biased(q6 >> 8), bias);
    lo = h2_bits(__hmul2(q02, cs.s[r]));
    hi = h2_bits(__hmul2(q13, cs.s[r]));
}

template <Kind K> __host__ __device__ constexpr int block_bytes() { return K == Kind::Q4_K ? kQ4KBytes : kQ6KBytes; }

// One block: 16 * MT rows; warp w takes super-blocks w, w + kWarps, ... of every row; the partial sums
// of the warps are added in warp order. NT = n-tiles (ceil(N / 8)).
template <Kind K, int NT, int MT>
__global__ void __launch_bounds__(32 * kWarps) gemm(const uint8_t * __restrict__ w_data, int64_t row_bytes, int m_rows,
                                                    int n_sb, const __half * __restrict__ xp, float * __restrict__ y,
                                                    int64_t ldy, int n_cols) {
    constexpr int R = Traits<K>::R;
    constexpr int CPS = Traits<K>::chunks_per_sb;
    constexpr int ROWS = 16 * MT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row_base = blockIdx.x * ROWS;

    const uint8_t * rows[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = min(row_base + 16 * mt + 8 * h + g, m_rows - 1);  // past the end: read, never stored
            rows[mt][h] = w_data + int64_t(r) * row_bytes;
        }
    }

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

    const uint4 * xp4 = reinterpret_cast<const uint4 *>(xp);
#pragma unroll 1
    for (int sb = warp; sb < n_sb; sb += kWarps) {
        // a whole super-block of rows in flight before any dequantization
        RowSb<K> rs[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) load_sb<K>(rows[mt][h] + int64_t(sb) * block_bytes<K>(), t, rs[mt][h]);
#pragma unroll
        for (int c = 0; c < CPS; ++c) {
            uint32_t b[NT][4 * R];
            const int chunk = sb * CPS + c;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint4 * src = xp4 + (int64_t(chunk * NT + nt) * 32 + lane) * R;
#pragma unroll
                for (int i = 0; i < R; ++i) {
                    const uint4 v = __ldg(src + i);
                    b[nt][4 * i + 0] = v.x; b[nt][4 * i + 1] = v.y; b[nt][4 * i + 2] = v.z; b[nt][4 * i + 3] = v.w;
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                ChunkScales<K> cs0, cs1;
                chunk_scales(rs[mt][0], c, t, cs0);
                chunk_scales(rs[mt][1], c, t, cs1);
#pragma unroll
                for (int w = 0; w < 2; ++w) {
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const int s = w * R + r;
                        uint32_t a0, a1, a2, a3;  // (row g, k 2t..), (row g+8, k 2t..), (row g, k 2t+8..), (row g+8, ..)
                        dequant(rs[mt][0], cs0, c, w, r, a0, a2);
                        dequant(rs[mt][1], cs1, c, w, r, a1, a3);
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) {
                            mma_16816(acc[mt][nt], a0, a1, a2, a3, b[nt][2 * s], b[nt][2 * s + 1]);
                        }
                    }
                }
            }
        }
    }

    // cross-warp sum in warp order, then the store (column-major y: y[n * ldy + m])
    __shared__ float part[kWarps][ROWS][NT * 8 + 1];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            part[warp][16 * mt + g][8 * nt + 2 * t] = acc[mt][nt][0];
            part[warp][16 * mt + g][8 * nt + 2 * t + 1] = acc[mt][nt][1];
            part[warp][16 * mt + g + 8][8 * nt + 2 * t] = acc[mt][nt][2];
            part[warp][16 * mt + g + 8][8 * nt + 2 * t + 1] = acc[mt][nt][3];
        }
    __syncthreads();
    for (int i = threadIdx.x; i < ROWS * NT * 8; i += 32 * kWarps) {
        const int row = i % ROWS, col = i / ROWS;
        if (col >= n_cols || row_base + row >= m_rows) {
            continue;
        }
        float s = part[0][row][col];
#pragma unroll
        for (int wi = 1; wi < kWarps; ++wi) s += part[wi][row][col];
        y[int64_t(col) * ldy + row_base + row] = s;
    }
}

// Halfs of the permuted activations for k_len and n_cols (the caller's scratch buffer).
inline int64_t xp_halfs(int k_len, int n_cols) { return int64_t(k_len) * ((n_cols + 7) / 8) * 8; }

template <Kind K, int NT, int MT = kMT>
inline void launch_nt(const uint8_t * w, int64_t row_bytes, int m_rows, int k_len, const float * x, int64_t ldx,
                      int n_cols, __half * xp, float * y, int64_t ldy, cudaStream_t stream) {
    const int n_chunks = k_len / Traits<K>::chunk;
    const int slots = n_chunks * NT;
    prepare_x<K><<<(slots + 3) / 4, 128, 0, stream>>>(x, ldx, n_cols, k_len, NT, xp);
    const int blocks = (m_rows + 16 * MT - 1) / (16 * MT);
    gemm<K, NT, MT><<<blocks, 32 * kWarps, 0, stream>>>(w, row_bytes, m_rows, k_len / kQK, xp, y, ldy, n_cols);
}

template <Kind K>
inline void launch(const uint8_t * w, int64_t row_bytes, int m_rows, int k_len, const float * x, int64_t ldx,
                   int n_cols, __half * xp, float * y, int64_t ldy, cudaStream_t stream) {
    switch ((n_cols + 7) / 8) {
        case 1: launch_nt<K, 1>(w, row_bytes, m_rows, k_len, x, ldx, n_cols, xp, y, ldy, stream); break;
        case 2: launch_nt<K, 2>(w, row_bytes, m_rows, k_len, x, ldx, n_cols, xp, y, ldy, stream); break;
        case 3: launch_nt<K, 3>(w, row_bytes, m_rows, k_len, x, ldx, n_cols, xp, y, ldy, stream); break;
        default: launch_nt<K, 4>(w, row_bytes, m_rows, k_len, x, ldx, n_cols, xp, y, ldy, stream); break;
    }
}

}  // namespace lbq
