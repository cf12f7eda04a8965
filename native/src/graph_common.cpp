// graph_common.cpp: see graph_common.hpp.
#include "graph_common.hpp"

#include <cmath>

#include "error.hpp"

namespace lb {

namespace {

// transformers' l2norm: x * rsqrt(sum(x^2) + 1e-6), written as a scaled RMS norm so it is one
// fused-friendly op on every backend: rms_norm(x, eps/n) / sqrt(n) == x / sqrt(sum(x^2) + eps).
constexpr float kL2NormEps = 1e-6f;

ggml_tensor * l2_norm(ggml_context * ctx, ggml_tensor * x) {
    const float n = float(x->ne[0]);
    return ggml_scale(ctx, ggml_rms_norm(ctx, x, kL2NormEps / n), 1.0f / std::sqrt(n));
}

}  // namespace

size_t graph_max_nodes(int32_t n_layer) { return size_t(n_layer) * 96 + 512; }

DeltaOut build_delta_core(ggml_context * ctx, const TargetHparams & hp, ggml_tensor * conv1d, ggml_tensor * conv_state,
                          ggml_tensor * ssm_state, ggml_tensor * qkv, ggml_tensor * g, ggml_tensor * beta,
                          ggml_tensor * parents) {
    const int64_t n = qkv->ne[1];
    const int64_t L = ssm_state->ne[3];
    const int64_t C = hp.conv_channels(), CL = C * L;
    const int64_t S = hp.head_v_dim, Hk = hp.n_k_heads, Hv = hp.n_v_heads;
    const int64_t key_dim = hp.key_dim();
    GGML_ASSERT(qkv->ne[0] == CL && conv_state->ne[1] == CL && conv1d->ne[1] == CL && (!parents || L == 1));
    DeltaOut out;

    // conv input: the committed window (oldest first) followed by the new tokens, time along ne0
    ggml_tensor * sx = ggml_concat(ctx, conv_state, ggml_transpose(ctx, qkv), 0);  // [d_conv-1+n, C L]
    sx = ggml_reshape_3d(ctx, sx, sx->ne[0], CL, 1);
    ggml_tensor * conv = parents ? ggml_ssm_conv_tree(ctx, sx, conv1d, parents) : ggml_ssm_conv(ctx, sx, conv1d);
    conv = ggml_reshape_2d(ctx, ggml_silu(ctx, conv), CL, n);  // silu right after the conv: ggml-cuda fuses the pair
    if (!parents) {
        out.new_conv = ggml_view_2d(ctx, sx, hp.d_conv - 1, CL, sx->nb[1], ggml_row_size(sx->type, n));
    }

    const size_t es = ggml_element_size(conv);
    // q and k lie side by side in each layer's part of a token's row (q | k | v): one l2 norm over both heads' rows of
    // every layer (one launch; a row's arithmetic is the same), then q and k as views of its output [S, 2 Hk, L, n]
    ggml_tensor * qk = l2_norm(ctx, ggml_view_4d(ctx, conv, S, 2 * Hk, L, n, S * es, C * es, conv->nb[1], 0));
    // [S, H, n, L]: the layers are the delta net's sequences (each its own state)
    ggml_tensor * q = ggml_view_4d(ctx, qk, S, Hk, n, L, qk->nb[1], qk->nb[3], qk->nb[2], 0);
    ggml_tensor * k = ggml_view_4d(ctx, qk, S, Hk, n, L, qk->nb[1], qk->nb[3], qk->nb[2], size_t(Hk) * qk->nb[1]);
    ggml_tensor * v = ggml_view_4d(ctx, conv, S, Hv, n, L, S * es, conv->nb[1], C * es, 2 * key_dim * es);
    ggml_tensor * g4 = ggml_reshape_4d(ctx, g, 1, Hv, n, L);
    ggml_tensor * b4 = ggml_reshape_4d(ctx, beta, 1, Hv, n, L);
    ggml_tensor * s4 = ggml_reshape_4d(ctx, ssm_state, S, S, Hv, L);

    // Both ops pack y first: [S*Hv, n * L] rows; the chain op then holds the final states.
    // the tree op's per-token states are scratch here (commit replays the accepted path): only the ones it reads
    // back on a branch switch are stored
    ggml_tensor * r = parents ? ggml_gated_delta_net_tree(ctx, q, k, v, g4, b4, s4, parents, /*branch_states_only=*/true)
                              : ggml_gated_delta_net(ctx, q, k, v, g4, b4, s4, /*K=*/1);
    const size_t rs = ggml_element_size(r);
    out.y = ggml_view_4d(ctx, r, S, Hv, n, L, S * rs, S * Hv * rs, S * Hv * n * rs, 0);
    if (!parents) {
        out.new_state = ggml_view_3d(ctx, r, S, S, Hv * L, S * rs, S * S * rs, size_t(S * Hv * n * L) * rs);
    }
    return out;
}

void store_delta_state(ggml_context * ctx, ggml_cgraph * gf, const DeltaOut & d, ggml_tensor * conv_state,
                       ggml_tensor * ssm_state) {
    ggml_build_forward_expand(gf, ggml_cpy(ctx, d.new_conv, conv_state));
    const int64_t L = ssm_state->ne[3], D = ggml_nelements(ssm_state) / L;
    const size_t es = ggml_element_size(ssm_state);
    ggml_tensor * flat = ggml_view_3d(ctx, ssm_state, D, L, 1, size_t(D) * es, size_t(D * L) * es, 0);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, d.new_state, flat));
}

}  // namespace lb
