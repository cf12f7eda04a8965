// target_graph.cpp: see target_graph.hpp.
#include "target_graph.hpp"
#include "matmul.hpp"

#include <algorithm>
#include <cmath>

namespace lb {

namespace {

struct ForwardBuilder {
    const TargetModel & m;
    const TargetHparams & hp;
    const TargetCache & c;
    const ForwardShape & s;
    ForwardGraph & fg;
    ggml_context * ctx;
    ggml_cgraph * gf;

    ggml_tensor * attention(int32_t il, ggml_tensor * x);
    ggml_tensor * delta_net(int32_t il, ggml_tensor * x);
    ggml_tensor * ffn(int32_t il, ggml_tensor * x);
    void build();
};

ggml_tensor * ForwardBuilder::attention(int32_t il, ggml_tensor * x) {
    const TargetLayer & L = m.layers[size_t(il)];
    const int64_t n = s.n_tokens, D = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv;

    // attn_q interleaves, per head, D query values and D gate values
    const std::vector<ggml_tensor *> qkv = L.attn_qkv.project(ctx, x);
    // q|k's product next to v's where v is a product of its own (a Q6_K v beside Q4_K q and k; a stack holds one
    // type): ggml-cuda runs two such products of an AR step as one launch (patch 0057), as the delta net's below
    ggml_build_forward_expand(gf, qkv[0]);
    ggml_build_forward_expand(gf, qkv[2]);
    ggml_tensor * qg = qkv[0];  // [2*D*H, n]
    const size_t es = ggml_element_size(qg);
    ggml_tensor * q = ggml_view_3d(ctx, qg, D, H, n, 2 * D * es, qg->nb[1], 0);
    ggml_tensor * gate = ggml_view_3d(ctx, qg, D, H, n, 2 * D * es, qg->nb[1], D * es);
    gate = ggml_cont_2d(ctx, gate, D * H, n);

    q = rms_norm(ctx, q, L.q_norm, hp.rms_eps);
    ggml_tensor * k = rms_norm(ctx, ggml_view_3d(ctx, qkv[1], D, Hkv, n, D * es, qkv[1]->nb[1], 0), L.k_norm, hp.rms_eps);
    ggml_tensor * v = qkv[2];  // [D*Hkv, n]

    // Text positions are equal in every M-RoPE section, but the sections are honoured so the
    // rotation is the model's own (interleaved M-RoPE over the first n_rot dims of each head).
    int sections[GGML_MROPE_SECTIONS];
    std::copy(hp.rope_sections, hp.rope_sections + 4, sections);
    const int mode = GGML_ROPE_TYPE_IMROPE;
    q = ggml_rope_multi(ctx, q, fg.pos, nullptr, hp.n_rot, sections, mode, hp.n_ctx_train, hp.rope_freq_base, 1.0f,
                        0.0f, 1.0f, 32.0f, 1.0f);
    k = ggml_rope_multi(ctx, k, fg.pos, nullptr, hp.n_rot, sections, mode, hp.n_ctx_train, hp.rope_freq_base, 1.0f,
                        0.0f, 1.0f, 32.0f, 1.0f);

    // write this batch's K/V to its slots, then read the first n_kv slots back (views of the
    // set_rows results, so the reads are ordered after the writes)
    // (a view, not a reshape, between rope and set_rows: ggml-cuda fuses that triple)
    ggml_tensor * k2d = ggml_view_2d(ctx, k, D * Hkv, n, k->nb[2], 0);
    ggml_tensor * kc = ggml_set_rows(ctx, c.k[size_t(il)], k2d, fg.kv_idx);
    ggml_tensor * vc = ggml_set_rows(ctx, c.v[size_t(il)], v, fg.kv_idx);
    ggml_tensor * kv_k = ggml_view_3d(ctx, kc, D, s.n_kv, Hkv, c.k[size_t(il)]->nb[1], ggml_row_size(c.type_k, D), 0);
    ggml_tensor * kv_v = ggml_view_3d(ctx, vc, D, s.n_kv, Hkv, c.v[size_t(il)]->nb[1], ggml_row_size(c.type_v, D), 0);

    // Flash attention for every cache type: it visits a query's unmasked key rows in slot order and
    // skips masked ones outright, so a tree node (ancestors at scattered slots, siblings masked) gets
    // the bits its path gets in an AR step. A mul_mat + softmax over all slots would sum the masked
    // zeros in with the rest, in an order that depends on where the path's rows sit.
    const float scale = 1.0f / std::sqrt(float(D));
    ggml_tensor * qp = ggml_permute(ctx, q, 0, 2, 1, 3);  // [D, n, H]
    ggml_tensor * o = lb::attention(ctx, qp, kv_k, kv_v, fg.mask, scale, /*flash=*/true);  // [D*H, n]
    o = ggml_mul(ctx, o, ggml_sigmoid(ctx, gate));
    return matmul(ctx, L.wo, o);
}

ggml_tensor * ForwardBuilder::delta_net(int32_t il, ggml_tensor * x) {
    const TargetLayer & L = m.layers[size_t(il)];
    const int64_t n = s.n_tokens, S = hp.head_v_dim, Hv = hp.n_v_heads;

    const std::vector<ggml_tensor *> in = L.ssm_in.project(ctx, x);
    ggml_tensor * qkv = in[0];  // [C, n]
    ggml_tensor * z = in[1];    // [value_dim, n]
    ggml_tensor * alpha = in[3];
    // The gates' ops go into the graph one after the other (alpha's view first): ggml-cuda runs that run as one kernel
    // with the same bits (patch 0034), and with the conv after it (0052), where nothing but views sits between them.
    // So qkv's product, where it is its own (a Q6_K qkv next to Q4_K z|beta|alpha), goes in before the gates; after
    // alpha's, or the allocator places the conv's output partly over qkv's, which the conv fusion refuses. There it
    // follows z|beta|alpha's product with only alpha's view between: ggml-cuda runs the two as one launch (patch 0057).
    ggml_build_forward_expand(gf, alpha);
    ggml_build_forward_expand(gf, qkv);
    ggml_tensor * beta = ggml_sigmoid(ctx, ggml_is_contiguous(in[2]) ? in[2] : ggml_cont(ctx, in[2]));  // [Hv, n]
    ggml_build_forward_expand(gf, beta);
    ggml_tensor * g = ggml_mul(ctx, ggml_softplus(ctx, ggml_add(ctx, alpha, L.ssm_dt)), L.ssm_a);  // [Hv, n]
    ggml_build_forward_expand(gf, g);

    DeltaOut d = build_delta_core(ctx, hp, L.conv1d, c.conv[size_t(il)], c.ssm[size_t(il)], qkv, g, beta,
                                  s.tree ? fg.parents : nullptr);
    if (s.tree) {
        // commit replays the accepted path from these (see commit_graph.hpp). They go in after the delta net, so
        // that only views sit between the gates and the tree's conv, where ggml-cuda can run the gates, the conv and
        // the l2 norm as one kernel (patch 0063)
        ggml_build_forward_expand(gf, d.y);
        const auto keep = [&](ggml_tensor * src, ggml_tensor * dst) {
            ggml_build_forward_expand(gf, ggml_cpy(ctx, src, ggml_view_2d(ctx, dst, src->ne[0], n, dst->nb[1], 0)));
        };
        keep(beta, c.tree_beta[size_t(il)]);
        keep(g, c.tree_g[size_t(il)]);
        keep(qkv, c.tree_qkv[size_t(il)]);
    } else {
        store_delta_state(ctx, gf, d, c.conv[size_t(il)], c.ssm[size_t(il)]);
    }
    // gated RMS norm per value head, then the output projection
    ggml_tensor * y = ggml_mul(ctx, ggml_rms_norm(ctx, d.y, hp.rms_eps), L.ssm_norm);
    y = ggml_swiglu_split(ctx, z, ggml_reshape_2d(ctx, y, S * Hv, n));  // silu(z) * y
    return matmul(ctx, L.ssm_out, y);
}

ggml_tensor * ForwardBuilder::ffn(int32_t il, ggml_tensor * x) {
    const TargetLayer & L = m.layers[size_t(il)];
    const std::vector<ggml_tensor *> gate_up = L.ffn_gate_up.project(ctx, x);
    ggml_tensor * h = ggml_swiglu_split(ctx, gate_up[0], gate_up[1]);
    return matmul(ctx, L.ffn_down, h);
}

void ForwardBuilder::build() {
    const int64_t n = s.n_tokens;
    fg.tokens = graph_input(ctx, GGML_TYPE_I32, n);
    fg.pos = graph_input(ctx, GGML_TYPE_I32, 4 * n);
    ggml_set_name(fg.tokens, "inp_tokens");
    ggml_set_name(fg.pos, "inp_pos");
    if (hp.n_attn_layers() > 0) {
        fg.kv_idx = graph_input(ctx, GGML_TYPE_I64, n);
        fg.mask = graph_input(ctx, GGML_TYPE_F16, s.n_kv, n);
        ggml_set_name(fg.kv_idx, "inp_kv_idx");
        ggml_set_name(fg.mask, "inp_mask");
        // a step's or a verify's mask keeps its memory between computes (never reused within the graph), so the
        // next call sends only the slots that changed (mask_stage.hpp); a prefill's changes whole anyway
        if (s.tree || n == 1) ggml_set_output(fg.mask);
    }
    if (s.tree) {
        fg.parents = graph_input(ctx, GGML_TYPE_I32, n);
        ggml_set_name(fg.parents, "inp_parents");
    }

    ggml_tensor * x = ggml_get_rows(ctx, m.embedding.rows(), fg.tokens);  // [n_embd, n] f32 (tokens: staged rows)
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        const TargetLayer & L = m.layers[size_t(il)];
        ggml_tensor * h = rms_norm(ctx, x, L.attn_norm, hp.rms_eps);
        h = L.recurrent ? delta_net(il, h) : attention(il, h);
        x = ggml_add(ctx, x, h);
        h = rms_norm(ctx, x, L.post_norm, hp.rms_eps);
        x = ggml_add(ctx, x, ffn(il, h));

        for (size_t j = 0; j < c.capture_layers.size(); ++j) {
            if (c.capture_layers[j] != il) continue;
            ggml_tensor * dst = c.capture[j];
            ggml_build_forward_expand(gf, ggml_cpy(ctx, x, ggml_view_2d(ctx, dst, dst->ne[0], n, dst->nb[1], 0)));
        }
    }
    if (!s.all_rows) {
        x = ggml_view_2d(ctx, x, x->ne[0], 1, x->nb[1], size_t(n - 1) * x->nb[1]);
    }
    fg.n_out = s.all_rows ? int32_t(n) : 1;
    x = rms_norm(ctx, x, m.output_norm, hp.rms_eps);
    fg.logits = matmul(ctx, m.output, x);  // [n_vocab, n_out]
    fg.argmax = ggml_argmax(ctx, fg.logits);
    ggml_set_name(fg.logits, "out_logits");
    ggml_set_name(fg.argmax, "out_argmax");
    ggml_set_output(fg.logits);
    ggml_set_output(fg.argmax);
    ggml_build_forward_expand(gf, fg.argmax);
    if (s.n_cand > 0) fg.sample = build_sample_tail(ctx, gf, fg.logits, s.n_cand, s.pen_slots);
}

}  // namespace

std::unique_ptr<ForwardGraph> build_forward(const TargetModel & m, const TargetCache & c, const ForwardShape & s) {
    auto fg = std::make_unique<ForwardGraph>(graph_max_nodes(m.hp.n_layer));
    fg->shape = s;
    ForwardBuilder b{m, m.hp, c, s, *fg, fg->meta.ctx.get(), fg->meta.gf};
    b.build();
    return fg;
}

}  // namespace lb
