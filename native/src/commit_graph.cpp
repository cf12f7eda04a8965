// commit_graph.cpp: see commit_graph.hpp.
#include "commit_graph.hpp"

namespace lb {

std::unique_ptr<CommitGraph> build_commit(const TargetModel & m, const TargetCache & c, int32_t n_path, bool move_kv) {
    const TargetHparams & hp = m.hp;
    auto cg = std::make_unique<CommitGraph>(graph_max_nodes(hp.n_layer));
    cg->n_path = n_path;
    cg->move_kv = move_kv;
    ggml_context * ctx = cg->meta.ctx.get();
    ggml_cgraph * gf = cg->meta.gf;

    cg->path = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_path);
    ggml_set_input(cg->path);
    if (move_kv && hp.n_attn_layers() > 0) {
        cg->kv_src = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_path);
        cg->kv_dst = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_path);
        ggml_set_input(cg->kv_src);
        ggml_set_input(cg->kv_dst);
    }

    for (int32_t il = 0; il < hp.n_layer; ++il) {
        const TargetLayer & L = m.layers[size_t(il)];
        if (!L.recurrent) {
            if (!cg->kv_src) continue;
            for (ggml_tensor * raw : {c.k_raw[size_t(il)], c.v_raw[size_t(il)]}) {
                ggml_tensor * rows = ggml_get_rows(ctx, raw, cg->kv_src);  // [row_words, n_path]
                ggml_build_forward_expand(gf, ggml_set_rows(ctx, raw, rows, cg->kv_dst));
            }
            continue;
        }
        ggml_tensor * qkv = ggml_get_rows(ctx, c.tree_qkv[size_t(il)], cg->path);    // [C, n_path]
        ggml_tensor * g = ggml_get_rows(ctx, c.tree_g[size_t(il)], cg->path);        // [Hv, n_path]
        ggml_tensor * beta = ggml_get_rows(ctx, c.tree_beta[size_t(il)], cg->path);  // [Hv, n_path]
        DeltaOut d = build_delta_core(ctx, hp, L, c.conv[size_t(il)], c.ssm[size_t(il)], qkv, g, beta, nullptr);
        store_delta_state(ctx, gf, d, c.conv[size_t(il)], c.ssm[size_t(il)]);
    }
    return cg;
}

}  // namespace lb
