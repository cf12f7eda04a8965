// commit_graph.cpp: see commit_graph.hpp.
#include "commit_graph.hpp"

#include <algorithm>

namespace lb {

namespace {

// DeltaNet layers replayed side by side: fewer launches the more, but each group's intermediates (its gathered
// inputs, conv output and the delta net's output with its states) take compute memory: the 27B's commit buffer is
// 68 MiB at 16 (a 16-token path; it was 114 MiB for all path lengths' graphs with one graph a layer).
constexpr int64_t kCommitLayers = 16;

}  // namespace

std::unique_ptr<CommitGraph> build_commit(const TargetModel & m, const TargetCache & c, int32_t n_path, bool move_kv) {
    const TargetHparams & hp = m.hp;
    auto cg = std::make_unique<CommitGraph>(graph_max_nodes(hp.n_layer));
    cg->n_path = n_path;
    cg->move_kv = move_kv;
    ggml_context * ctx = cg->meta.ctx.get();
    ggml_cgraph * gf = cg->meta.gf;

    const int64_t n_rec = hp.n_recurrent_layers();
    // one row of the path per layer of a group: the batched gathers of g and beta take an index row per layer
    cg->path = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_path, std::max<int64_t>(1, std::min(n_rec, kCommitLayers)));
    ggml_set_input(cg->path);
    if (move_kv && hp.n_attn_layers() > 0) {
        cg->kv_src = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_path);
        cg->kv_dst = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_path);
        ggml_set_input(cg->kv_src);
        ggml_set_input(cg->kv_dst);
    }

    for (int32_t il = 0; cg->kv_src && il < hp.n_layer; ++il) {
        if (m.layers[size_t(il)].recurrent) continue;
        for (ggml_tensor * raw : {c.k_raw[size_t(il)], c.v_raw[size_t(il)]}) {
            ggml_tensor * rows = ggml_get_rows(ctx, raw, cg->kv_src);  // [row_words, n_path]
            ggml_build_forward_expand(gf, ggml_set_rows(ctx, raw, rows, cg->kv_dst));
        }
    }

    const int64_t C = hp.conv_channels();
    for (int64_t r0 = 0; r0 < n_rec; r0 += kCommitLayers) {
        const int64_t L = std::min(kCommitLayers, n_rec - r0);
        // layers r0 .. r0 + L - 1 of the stacks: C columns (tree_qkv_all) or C rows (conv_all, conv1d_all) a layer,
        // or one index of the last dimension (tree_g_all, tree_beta_all, ssm_all)
        auto columns = [&](ggml_tensor * t) {
            return ggml_view_2d(ctx, t, C * L, t->ne[1], t->nb[1], size_t(r0 * C) * t->nb[0]);
        };
        auto rows = [&](ggml_tensor * t) {
            return ggml_view_2d(ctx, t, t->ne[0], C * L, t->nb[1], size_t(r0 * C) * t->nb[1]);
        };
        auto last_3d = [&](ggml_tensor * t) {
            return ggml_view_3d(ctx, t, t->ne[0], t->ne[1], L, t->nb[1], t->nb[2], size_t(r0) * t->nb[2]);
        };
        ggml_tensor * path = ggml_view_2d(ctx, cg->path, n_path, L, cg->path->nb[1], 0);
        ggml_tensor * node = ggml_view_1d(ctx, cg->path, n_path, 0);
        ggml_tensor * qkv = ggml_get_rows(ctx, columns(c.tree_qkv_all), node);   // [C L, n_path]
        ggml_tensor * g = ggml_get_rows(ctx, last_3d(c.tree_g_all), path);        // [Hv, n_path, L]
        ggml_tensor * beta = ggml_get_rows(ctx, last_3d(c.tree_beta_all), path);  // [Hv, n_path, L]
        ggml_tensor * conv_state = rows(c.conv_all);
        ggml_tensor * ssm = c.ssm_all;
        ggml_tensor * ssm_state = ggml_view_4d(ctx, ssm, ssm->ne[0], ssm->ne[1], ssm->ne[2], L, ssm->nb[1], ssm->nb[2],
                                               ssm->nb[3], size_t(r0) * ssm->nb[3]);
        DeltaOut d = build_delta_core(ctx, hp, rows(m.conv1d_all), conv_state, ssm_state, qkv, g, beta, nullptr);
        store_delta_state(ctx, gf, d, conv_state, ssm_state);
    }
    return cg;
}

}  // namespace lb
