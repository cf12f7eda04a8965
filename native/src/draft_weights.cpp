// draft_weights.cpp: safetensors -> ggml tensors on the backend, converted in bounded chunks.
#include "draft_weights.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include "ggml-alloc.h"

#include "backend.hpp"
#include "error.hpp"
#include "host_convert.hpp"
#include "matmul.hpp"
#include "safetensors.hpp"

namespace lb {

namespace {

// Host staging per upload step; bounds peak host memory for the 262 MB fc of the 27B draft.
constexpr int64_t kChunkElems = 8 << 20;

struct Pending {
    ggml_tensor * dst;
    const StTensor * src;
};

// The ggml type of a checkpoint tensor (its dtype is BF16, F16 or F32: checked on lookup).
ggml_type source_type(const StTensor & t) {
    if (t.dtype == "BF16") return GGML_TYPE_BF16;
    if (t.dtype == "F16") return GGML_TYPE_F16;
    return GGML_TYPE_F32;
}

ggml_type storage_type(DraftWeightType w, const StTensor & src, int64_t row_len) {
    switch (w) {
        case DraftWeightType::f32: return GGML_TYPE_F32;
        case DraftWeightType::f16: return GGML_TYPE_F16;
        case DraftWeightType::bf16: return GGML_TYPE_BF16;
        case DraftWeightType::q8_0: return row_len % ggml_blck_size(GGML_TYPE_Q8_0) == 0 ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
        case DraftWeightType::keep: break;
    }
    return source_type(src);
}

// Converts n_rows rows of `row_len` elements from the checkpoint's src_type to `type`.
void convert_rows(ggml_type src_type, const void * src, ggml_type type, void * dst, int64_t n_rows, int64_t row_len,
                  float * tmp) {
    const int64_t n = n_rows * row_len;
    if (type == src_type) {
        std::memcpy(dst, src, size_t(n) * ggml_type_size(type));
        return;
    }
    float * f = type == GGML_TYPE_F32 ? (float *) dst : tmp;
    to_f32(src_type, src, f, n);
    if (type == GGML_TYPE_F16) ggml_fp32_to_fp16_row(f, (ggml_fp16_t *) dst, n);
    else if (type == GGML_TYPE_BF16) ggml_fp32_to_bf16_row(f, (ggml_bf16_t *) dst, n);
    else if (type == GGML_TYPE_Q8_0) ggml_quantize_chunk(type, f, dst, 0, n_rows, row_len, nullptr);
}

// Row-parallel convert_rows: quantizing the 27B draft to q8_0 on one core takes many seconds.
void convert_rows_parallel(ggml_type src_type, const uint8_t * src, ggml_type type, uint8_t * dst, int64_t n_rows,
                           int64_t row_len, std::vector<float> & tmp) {
    tmp.resize(size_t(n_rows * row_len));
    const size_t src_row = ggml_row_size(src_type, row_len), dst_row = ggml_row_size(type, row_len);
    const int64_t n_threads = std::max<int64_t>(1, std::min<int64_t>(std::thread::hardware_concurrency(), n_rows / 64));
    const int64_t per = (n_rows + n_threads - 1) / n_threads;
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < n_threads; ++t) {
        const int64_t r0 = t * per, nr = std::min(per, n_rows - r0);
        if (nr <= 0) break;
        pool.emplace_back(convert_rows, src_type, src + size_t(r0) * src_row, type, dst + size_t(r0) * dst_row,
                          nr, row_len, tmp.data() + size_t(r0 * row_len));
    }
    for (auto & th : pool) th.join();
}

void upload(const SafetensorsSet & st, const Pending & p) {
    const StTensor & s = *p.src;
    const int64_t row_len = s.shape.empty() ? 1 : s.shape.back();
    const int64_t n_rows = row_len == 0 ? 0 : s.numel() / row_len;
    const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkElems / std::max<int64_t>(1, row_len));
    const size_t src_row = size_t(row_len) * st_dtype_size(s.dtype);
    const size_t dst_row = ggml_row_size(p.dst->type, row_len);
    std::vector<uint8_t> raw, out;
    std::vector<float> tmp;
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
        const int64_t nr = std::min(rows_per_chunk, n_rows - r0);
        raw.resize(size_t(nr) * src_row);
        out.resize(size_t(nr) * dst_row);
        st.read_bytes(s, uint64_t(r0) * src_row, raw.size(), raw.data());
        convert_rows_parallel(source_type(s), raw.data(), p.dst->type, out.data(), nr, row_len, tmp);
        ggml_backend_tensor_set(p.dst, out.data(), size_t(r0) * dst_row, out.size());
    }
}

class Builder {
public:
    Builder(const SafetensorsSet & st, DraftWeights & w, DraftWeightType wtype, std::string prefix)
        : st_(st), w_(w), wtype_(wtype), prefix_(std::move(prefix)) {}

    // A checkpoint tensor named prefix+name with torch shape `shape` (outermost first).
    ggml_tensor * get(const std::string & name, std::vector<int64_t> shape, bool matrix) {
        const StTensor * s = find(name, shape);
        const ggml_type type = matrix ? storage_type(wtype_, *s, shape.back()) : GGML_TYPE_F32;
        ggml_tensor * t = shape.size() == 2 ? ggml_new_tensor_2d(w_.ctx.get(), type, shape[1], shape[0])
                                            : ggml_new_tensor_1d(w_.ctx.get(), type, shape[0]);
        ggml_set_name(t, name.c_str());
        pending.push_back({t, s});
        return t;
    }

    // Matrices [rows_i, n_in] that multiply one input (see StackedMatrices).
    StackedMatrices get_stacked(const std::vector<std::pair<std::string, std::vector<int64_t>>> & members) {
        std::vector<const StTensor *> src;
        std::vector<StackMember> layout;
        const int64_t n_in = members[0].second[1];
        for (const auto & m : members) {
            src.push_back(find(m.first, m.second));
            layout.push_back({m.first, storage_type(wtype_, *src.back(), n_in), m.second[0]});
        }
        StackedMatrices out(w_.ctx.get(), n_in, layout);
        for (size_t i = 0; i < out.size(); ++i) pending.push_back({out[i], src[i]});
        return out;
    }

    std::vector<Pending> pending;

private:
    const StTensor * find(const std::string & name, const std::vector<int64_t> & shape) const {
        const StTensor * s = st_.find(prefix_ + name);
        if (!s) {
            throw Error(LB_E_FORMAT, "draft checkpoint has no tensor \"" + prefix_ + name +
                                              "\": not a DFlash draft, or an incomplete download");
        }
        if (s->dtype != "BF16" && s->dtype != "F16" && s->dtype != "F32") {
            throw Error(LB_E_UNSUPPORTED, "draft tensor \"" + s->name + "\" has dtype " + s->dtype +
                                                   "; only BF16, F16 and F32 checkpoints are supported");
        }
        if (s->shape != shape) {
            StTensor want;
            want.shape = shape;
            throw Error(LB_E_FORMAT, "draft tensor \"" + s->name + "\" has shape " + s->shape_str() +
                                              " but config.json implies " + want.shape_str());
        }
        return s;
    }

    const SafetensorsSet & st_;
    DraftWeights & w_;
    DraftWeightType wtype_;
    std::string prefix_;
};

void reject_dflash2(const SafetensorsSet & st) {
    for (const auto & t : st.tensors()) {
        if (t.name.find("candidate_selector") != std::string::npos || t.name.find("attention_conv") != std::string::npos ||
            t.name.find("mlp_conv") != std::string::npos) {
            throw Error(LB_E_UNSUPPORTED, "draft tensor \"" + t.name + "\" belongs to a DFlash2 draft, which is "
                                                   "not supported; use a DFlash draft (e.g. z-lab/Qwen3.5-27B-DFlash)");
        }
    }
}

}  // namespace

bool draft_weight_type_from_string(const std::string & s, DraftWeightType * out) {
    static const std::pair<const char *, DraftWeightType> names[] = {
        {"keep", DraftWeightType::keep}, {"f32", DraftWeightType::f32}, {"f16", DraftWeightType::f16},
        {"bf16", DraftWeightType::bf16}, {"q8_0", DraftWeightType::q8_0}};
    for (const auto & n : names) {
        if (s == n.first) {
            *out = n.second;
            return true;
        }
    }
    return false;
}

size_t DraftWeights::nbytes() const {
    return buffer ? ggml_backend_buffer_get_size(buffer.get()) : 0;
}

namespace {

// Lays out every tensor of the checkpoint `st` (checked against cfg); *pending: where each one's
// data comes from.
std::unique_ptr<DraftWeights> build_weights(const SafetensorsSet & st, const DraftConfig & cfg, DraftWeightType wtype,
                                            std::vector<Pending> * pending) {
    reject_dflash2(st);
    // Saved from DFlashDraftModel the names have no prefix; accept a wrapper's "model." too.
    std::string prefix;
    if (!st.find("fc.weight") && st.find("model.fc.weight")) prefix = "model.";

    auto w = std::make_unique<DraftWeights>();
    const size_t n_tensors = 3 + size_t(cfg.n_layer) * 18;
    ggml_init_params ip = {ggml_tensor_overhead() * n_tensors, nullptr, /*no_alloc=*/true};
    w->ctx.reset(ggml_init(ip));
    if (!w->ctx) throw Error(LB_E_OOM, "cannot allocate the draft's tensor metadata");

    const int64_t E = cfg.n_embd, D = cfg.head_dim, F = cfg.n_ff;
    const int64_t QD = int64_t(cfg.n_head) * D, KD = int64_t(cfg.n_head_kv) * D;
    Builder b(st, *w, wtype, prefix);
    w->fc = b.get("fc.weight", {E, int64_t(cfg.n_feat())}, true);
    w->hidden_norm = b.get("hidden_norm.weight", {E}, false);
    w->out_norm = b.get("norm.weight", {E}, false);
    for (int32_t i = 0; i < cfg.n_layer; ++i) {
        const std::string p = "layers." + std::to_string(i) + ".";
        DraftLayerWeights L;
        L.attn_norm = b.get(p + "input_layernorm.weight", {E}, false);
        L.attn_qkv = b.get_stacked({{p + "self_attn.q_proj.weight", {QD, E}},
                                    {p + "self_attn.k_proj.weight", {KD, E}},
                                    {p + "self_attn.v_proj.weight", {KD, E}}});
        L.wo = b.get(p + "self_attn.o_proj.weight", {E, QD}, true);
        if (cfg.attention_bias) {
            L.bq = b.get(p + "self_attn.q_proj.bias", {QD}, false);
            L.bk = b.get(p + "self_attn.k_proj.bias", {KD}, false);
            L.bv = b.get(p + "self_attn.v_proj.bias", {KD}, false);
            L.bo = b.get(p + "self_attn.o_proj.bias", {E}, false);
        }
        L.q_norm = b.get(p + "self_attn.q_norm.weight", {D}, false);
        L.k_norm = b.get(p + "self_attn.k_norm.weight", {D}, false);
        L.ffn_norm = b.get(p + "post_attention_layernorm.weight", {E}, false);
        L.ffn_gate_up = b.get_stacked({{p + "mlp.gate_proj.weight", {F, E}}, {p + "mlp.up_proj.weight", {F, E}}});
        L.ffn_down = b.get(p + "mlp.down_proj.weight", {E, F}, true);
        w->layers.push_back(L);
    }
    *pending = std::move(b.pending);
    return w;
}

// store_for_draft_products on each of the draft's tensors (a stack, not its members; ggml takes only the matrices its
// kernel has); how many it stored. A stack goes only where each member is whole 16-row strips of it: a product by a
// run of members reads such a range.
int store_matrices(const DraftWeights & w) {
    ggml_context * ctx = w.ctx.get();
    std::vector<const ggml_tensor *> misaligned;  // stacks with a member that is not
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        const bool strips = t->view_src && (t->view_offs / t->nb[1]) % 16 == 0 && t->ne[1] % 16 == 0;
        if (t->view_src && !strips) misaligned.push_back(t->view_src);
    }
    int n = 0;
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        const bool whole_strips = std::find(misaligned.begin(), misaligned.end(), t) == misaligned.end();
        if (!t->view_src && whole_strips) n += store_for_draft_products(t);
    }
    return n;
}

}  // namespace

std::unique_ptr<DraftWeights> draft_weights_layout(const std::string & dir, const DraftConfig & cfg,
                                                   DraftWeightType wtype) {
    std::vector<Pending> pending;
    return build_weights(SafetensorsSet::open_dir(dir), cfg, wtype, &pending);
}

std::unique_ptr<DraftWeights> draft_weights_load(const std::string & dir, const DraftConfig & cfg,
                                                 ggml_backend_t backend, DraftWeightType wtype) {
    const SafetensorsSet st = SafetensorsSet::open_dir(dir);
    std::vector<Pending> pending;
    std::unique_ptr<DraftWeights> w = build_weights(st, cfg, wtype, &pending);
    w->buffer = alloc_tensors_or_throw(w->ctx.get(), backend, "draft weights",
                                       "free memory, or load the draft with a smaller weight type (q8_0)");
    ggml_backend_buffer_set_usage(w->buffer.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (const Pending & p : pending) upload(st, p);
    const int n_stored = store_matrices(*w);
    if (n_stored > 0) log_msg(LB_LOG_INFO, "draft: %d matrices stored in the GPU product kernel's order", n_stored);
    return w;
}

}  // namespace lb
