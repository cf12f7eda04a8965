// Where a verify's gated delta net spends its time per token. The tree op (gated_delta_net_tree.cu) walks a chain
// of tokens on one column slice per warp, each token a dependent chain of FMAs and shuffles (gdn_token), and loads
// the next token's inputs (its rows of q and k, its columns' v, the gate and beta) one token ahead from global
// memory. In the engine a 23-token verify takes ~20 us a layer where one token takes ~4 us, far more than the
// arithmetic's ~500 cycles a token. This probe runs the same arithmetic (the real gated_delta_net_column.cuh) on
// the 27B's shapes (S_v 128, 48 value heads over 16 key heads, the conv's output as q|k|v rows of 10,240 floats a
// token) along one chain, with the inputs
//   global1: loaded one token ahead from global memory (the engine's kernel),
//   global2: two tokens ahead,
//   staged:  every token's inputs copied to shared memory by the block first, then read one token ahead from there,
//   none:    token 0's inputs for every token (no loads in the loop: the arithmetic's floor),
// and W warps a block each walking a chain of their own on the same slice (W = 2: the engine's two chains at once).
// It prints the kernel's time (events over back-to-back launches) and block 0's cycles a token (clock64). (A
// pipelined order, a token's output sums and the next token's kv sums in one butterfly, gave the same bits and ran
// slower: the fifty-first session's call 3, its code in git history, c3ec270.)
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I vendor/src/ggml/include -I vendor/src/ggml/src \
//        -I vendor/src/ggml/src/ggml-cuda benchmarks/kernels/gdn_chain_probe.cu -o gdn_chain_probe
#include "gated_delta_net_column.cuh"
#include "probe_common.cuh"

#include <cstdio>
#include <vector>

constexpr int kS   = 128;  // head size
constexpr int kH   = 48;   // value heads
constexpr int kHk  = 16;   // key heads
constexpr int kRow = 2 * kHk * kS + kH * kS;  // a token's q|k|v row of the conv's output (10,240 floats)
constexpr int kC   = 4;    // columns a thread
constexpr int kT   = gdn_threads<kS>();
constexpr int kMaxTokens = 32;  // the staged inputs: 33 KiB of static shared memory

enum Mode { GLOBAL1, GLOBAL2, STAGED, NONE };

template <int MODE>
__global__ void __launch_bounds__(4 * WARP_SIZE)
chain_probe(const float * qkv, const float * g, const float * beta, const float * state, float * y, float * state_out,
            int n, long long * cycles) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const gdn_place<kS, kC> at(lane);
    const int h = blockIdx.x, hk = h % kHk;
    const float * q = qkv + hk * kS;
    const float * k = qkv + kHk * kS + hk * kS;
    const float * v = qkv + 2 * kHk * kS + h * kS;
    float s[kC][kGdnRows];
    gdn_load_columns<true, kS, kC>(state + h * kS * kS + at.col0 * kS + at.r0, s);
    float * y_col = y + (warp * kMaxTokens * kH + h) * kS + at.col0;

    // staged: q and k rows of the head and the slice's v columns, every token
    __shared__ float sk[kMaxTokens][kS], sq[kMaxTokens][kS], sv[kMaxTokens][16], sg[kMaxTokens], sb[kMaxTokens];
    if constexpr (MODE == STAGED) {
        const int col_base = blockIdx.z * 16;
        for (int i = threadIdx.x; i < n * kS / 4; i += blockDim.x) {
            const int t = i / (kS / 4), c4 = i % (kS / 4);
            ((float4 *) sk[t])[c4] = ((const float4 *) (k + (long) t * kRow))[c4];
            ((float4 *) sq[t])[c4] = ((const float4 *) (q + (long) t * kRow))[c4];
        }
        for (int i = threadIdx.x; i < n * 16; i += blockDim.x) {
            sv[i / 16][i % 16] = v[(long) (i / 16) * kRow + col_base + i % 16];
        }
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            sg[i] = g[i * kH + h];
            sb[i] = beta[i * kH + h];
        }
        __syncthreads();
    }
    const int vc = at.col0 - blockIdx.z * 16;
    auto read = [&](int t, gdn_input<false, kC> & in) {
        if constexpr (MODE == STAGED) {
#pragma unroll
            for (int i = 0; i < kGdnRows; ++i) {
                in.k[i] = sk[t][at.r0 + i];
                in.q[i] = sq[t][at.r0 + i];
            }
#pragma unroll
            for (int c = 0; c < kC; ++c) {
                in.v[c] = sv[t][vc + c];
            }
            in.g[0] = sg[t];
            in.beta = sb[t];
        } else {
            gdn_load_rows<true>(k + (long) t * kRow + at.r0, in.k);
            gdn_load_rows<true>(q + (long) t * kRow + at.r0, in.q);
#pragma unroll
            for (int c = 0; c < kC; ++c) {
                in.v[c] = v[(long) t * kRow + at.col0 + c];
            }
            in.g[0] = g[t * kH + h];
            in.beta = beta[t * kH + h];
        }
    };
    const long long c0 = clock64();
    gdn_input<false, kC> in[3];
    read(0, in[0]);
    if constexpr (MODE == GLOBAL2) {
        if (n > 1) read(1, in[1]);
    }
    for (int t = 0; t < n; t += 3) {
#pragma unroll
        for (int j = 0; j < 3; ++j) {
            const int u = t + j;
            if (u >= n) break;
            constexpr int ahead = MODE == GLOBAL2 ? 2 : 1;
            if (MODE != NONE && u + ahead < n) {
                read(u + ahead, in[(j + ahead) % 3]);
            }
            float out[kC];
            gdn_token<kT, false, kC>(s, in[MODE == NONE ? 0 : j], out);
            gdn_write_outputs<kC>(y_col + (long) u * kS * kH, out, 0.088f, at.writer);
        }
    }
    const long long c1 = clock64();
    if (blockIdx.x == 0 && blockIdx.z == 0 && threadIdx.x == 0) {
        cycles[0] = c1 - c0;
    }
    if (warp == 0) {
        gdn_store_columns<true, kS, kC>(state_out + h * kS * kS + at.col0 * kS + at.r0, s);
    }
}

template <int MODE>
void run(const char * name, int n, int warps, float * qkv, float * g, float * beta, float * st, float * y, float * st2,
         long long * cyc) {
    const dim3 grid(kH, 1, kS / kC * kT / WARP_SIZE), block(warps * WARP_SIZE);
    const double us = time_back_to_back_us(
        [&](int) { chain_probe<MODE><<<grid, block>>>(qkv, g, beta, st, y, st2, n, cyc); }, 20, 200);
    long long c = 0;
    CHECK(cudaMemcpy(&c, cyc, sizeof c, cudaMemcpyDeviceToHost));
    cudaFuncAttributes attr;
    CHECK(cudaFuncGetAttributes(&attr, chain_probe<MODE>));
    printf("| %s | %d | %d | %.2f | %.0f | %d |\n", name, n, warps, us, double(c) / n, attr.numRegs);
}

int main() {
    float * qkv, * g, * beta, * st, * y, * st2;
    long long * cyc;
    CHECK(cudaMalloc(&qkv, sizeof(float) * kMaxTokens * kRow));
    CHECK(cudaMalloc(&g, sizeof(float) * kMaxTokens * kH));
    CHECK(cudaMalloc(&beta, sizeof(float) * kMaxTokens * kH));
    CHECK(cudaMalloc(&st, sizeof(float) * kH * kS * kS));
    CHECK(cudaMalloc(&st2, sizeof(float) * kH * kS * kS));
    CHECK(cudaMalloc(&y, sizeof(float) * 4 * kMaxTokens * kH * kS));
    CHECK(cudaMalloc(&cyc, sizeof(long long)));
    std::vector<float> h(kMaxTokens * kRow);
    for (size_t i = 0; i < h.size(); ++i) h[i] = 0.01f * float(int(i * 2654435761u % 201) - 100);
    CHECK(cudaMemcpy(qkv, h.data(), sizeof(float) * h.size(), cudaMemcpyHostToDevice));
    std::vector<float> gb(kMaxTokens * kH, -0.05f);
    CHECK(cudaMemcpy(g, gb.data(), sizeof(float) * gb.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(beta, gb.data(), sizeof(float) * gb.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(st, 0, sizeof(float) * kH * kS * kS));
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    printf("27B delta net shapes: %d value heads, head size %d, 4 columns a thread; SM clock attribute %d MHz\n",
           kH, kS, clock_khz / 1000);
    printf("| inputs | tokens | warps a block | us a launch | cycles a token (block 0) | registers |\n"
           "|---|---|---|---|---|---|\n");
    for (int warps : { 1, 2 }) {
        for (int n : { 1, 8, 23, 32 }) {
            run<GLOBAL1>("global1", n, warps, qkv, g, beta, st, y, st2, cyc);
            run<GLOBAL2>("global2", n, warps, qkv, g, beta, st, y, st2, cyc);
            run<STAGED>("staged", n, warps, qkv, g, beta, st, y, st2, cyc);
            run<NONE>("none", n, warps, qkv, g, beta, st, y, st2, cyc);
        }
    }
    return 0;
}
