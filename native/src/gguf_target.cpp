// gguf_target.cpp: a qwen35 GGUF (opened by GgufFile) -> hyperparameters, validated tensors on
// the backend.
//
// Checks after the file ones (gguf_file.cpp): architecture (UNSUPPORTED) -> hyperparameters
// (FORMAT / UNSUPPORTED) -> every needed tensor present with the shape the metadata implies
// (FORMAT) and a type we run (UNSUPPORTED).
#include "gguf_target.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "backend.hpp"
#include "error.hpp"
#include "ggml-alloc.h"
#include "ggml-cpu.h"
#include "gguf_file.hpp"
#include "host_convert.hpp"
#include "matmul.hpp"

namespace lb {

namespace {

constexpr const char * kArch = "qwen35";

// Bounds far above any real model (Qwen3.5-27B: 64 layers, n_embd 5120, n_ff 17408): a value past
// them is a corrupt file, and the bounds keep every size product formed below inside int32/int64.
constexpr int64_t kMaxTargetLayers = 4096;
constexpr int64_t kMaxTargetDim = 1 << 20;
constexpr int64_t kMaxVocab = 1 << 24;

// Matrix storage types: the Q4_K_M / UD-Q4_K_XL families, their neighbours and the float types.
bool matrix_type_supported(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
        case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ3_XXS:
        case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ1_M: case GGML_TYPE_IQ4_NL:
        case GGML_TYPE_IQ4_XS:
            return true;
        default:
            return false;
    }
}

// Small tensors read by element-wise ops: kept (or converted to) F32 on the device.
bool float_type_convertible(ggml_type t) {
    return t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16;
}

std::string shape_str(const int64_t * ne, int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

// Creates the model's tensors from the file's tensor infos, then places their data.
class TensorLoader {
public:
    TensorLoader(GgufFile & f, TargetModel & m) : f_(f), m_(m) {}
    void create_tensors();
    void upload(ggml_backend_t backend, bool backend_is_cpu);
    // What upload() allocates in buffers of `buft`: on the CPU the mapped file plus own copies.
    size_t plan_bytes(ggml_backend_buffer_type_t buft, bool backend_is_cpu);

private:
    ggml_tensor * need(const std::string & name, std::vector<int64_t> ne, bool must_be_f32, bool required = true,
                       bool host_only = false);
    StackedMatrices need_stacked(const std::vector<std::pair<std::string, std::vector<int64_t>>> & members);
    // An F32 tensor of shape ne read into rows [row0, row0 + ne[1]) of `stack` (a view of it).
    ggml_tensor * need_rows_of(const std::string & name, std::vector<int64_t> ne, ggml_tensor * stack, int64_t row0);
    int64_t check_tensor(const std::string & name, std::vector<int64_t> & ne, bool must_be_f32, bool required);

    GgufFile & f_;
    TargetModel & m_;
    // per created tensor: its GGUF index and whether it needs an F32 conversion on upload
    // host_only: read on the host alone (tok_embd when untied): no memory on a GPU backend
    struct Source { ggml_tensor * t; int64_t gguf_id; bool convert; bool host_only; };
    std::vector<Source> sources_;
    void set_data(const Source & s);
    void set_embedding_table();  // points m_.embedding at tok_embd's rows in the mapping
    // CPU: the tensors that get memory of their own (stacked matrices, whose members are apart in
    // the file, and converted ones) as (model tensor, its copy in *own, a new metadata context);
    // `copied` gets their sources. Every other source can point into the mapping.
    std::vector<std::pair<ggml_tensor *, ggml_tensor *>> own_copies(ggml_context_ptr * own,
                                                                    std::vector<const Source *> * copied) const;
};

TargetHparams read_hparams(const GgufFile & f) {
    TargetHparams hp;
    const std::string where = f.where();
    const std::string a = std::string(kArch) + ".";
    const std::string fix = "; re-convert the model";
    // an integer hyperparameter in [lo, hi], named in the message when it is not
    auto bounded = [&](const std::string & key, int64_t v, int64_t lo, int64_t hi) {
        check(v >= lo && v <= hi, LB_E_FORMAT,
              where + ": metadata " + a + key + " = " + std::to_string(v) + " is outside [" + std::to_string(lo) +
                  ", " + std::to_string(hi) + "]" + fix);
        return int32_t(v);
    };
    auto get_dim = [&](const std::string & key, bool required, int64_t dflt, int64_t lo = 1, int64_t hi = kMaxTargetDim) {
        return bounded(key, f.has_key(a + key) || required ? int64_t(f.get_u32(a + key, required)) : dflt, lo, hi);
    };
    const int32_t n_block = get_dim("block_count", true, 0, 1, kMaxTargetLayers);
    hp.n_nextn = get_dim("nextn_predict_layers", false, 0, 0, kMaxTargetLayers);
    check(n_block > hp.n_nextn, LB_E_FORMAT, where + ": block_count <= nextn_predict_layers" + fix);
    hp.n_layer = n_block - hp.n_nextn;
    hp.n_embd = get_dim("embedding_length", true, 0);
    hp.n_ctx_train = int32_t(f.get_u32(a + "context_length", false, 0));
    hp.rms_eps = f.get_f32(a + "attention.layer_norm_rms_epsilon", true, 1e-6f);
    // ggml's rms_norm asserts eps >= 0; 0 divides by zero on an all-zero row; real models use 1e-6
    check(hp.rms_eps > 0.0f && hp.rms_eps <= 1.0f, LB_E_FORMAT,
          where + ": metadata " + a + "attention.layer_norm_rms_epsilon = " + std::to_string(hp.rms_eps) +
              " is outside (0, 1]" + fix);

    // feed_forward_length: a scalar, or one entry per block
    {
        if (f.is_array(a + "feed_forward_length")) {
            const std::vector<int64_t> v = f.get_ints(a + "feed_forward_length");
            check(int64_t(v.size()) >= int64_t(hp.n_layer), LB_E_FORMAT,
                  where + ": feed_forward_length has " + std::to_string(v.size()) + " entries for " +
                      std::to_string(n_block) + " blocks" + fix);
            for (int32_t il = 0; il < hp.n_layer; ++il) hp.n_ff.push_back(bounded("feed_forward_length", v[size_t(il)], 1, kMaxTargetDim));
        } else {
            hp.n_ff.assign(size_t(hp.n_layer), get_dim("feed_forward_length", true, 0));
        }
    }

    hp.n_head = get_dim("attention.head_count", true, 0);
    hp.n_head_kv = get_dim("attention.head_count_kv", false, hp.n_head);
    hp.head_dim = get_dim("attention.key_length", false, hp.n_embd / hp.n_head);
    const int32_t head_dim_v = get_dim("attention.value_length", false, hp.head_dim);
    hp.n_rot = get_dim("rope.dimension_count", false, hp.head_dim);
    hp.rope_freq_base = f.get_f32(a + "rope.freq_base", false, 10000.0f);
    check(hp.rope_freq_base > 0.0f, LB_E_FORMAT, where + ": metadata " + a + "rope.freq_base must be positive" + fix);
    if (f.has_key(a + "rope.dimension_sections")) {
        const std::vector<int64_t> s = f.get_ints(a + "rope.dimension_sections");
        for (size_t i = 0; i < 4 && i < s.size(); ++i) {
            hp.rope_sections[i] = bounded("rope.dimension_sections", s[i], 0, hp.n_rot / 2);
        }
    }

    hp.d_conv = get_dim("ssm.conv_kernel", true, 0, 2, 64);
    hp.head_k_dim = get_dim("ssm.state_size", true, 0);
    hp.n_k_heads = get_dim("ssm.group_count", true, 0);
    hp.n_v_heads = get_dim("ssm.time_step_rank", true, 0);
    const int32_t d_inner = get_dim("ssm.inner_size", true, 0);

    // which layers are Gated DeltaNet: an explicit per-block array, else every
    // full_attention_interval-th layer is full attention
    hp.recurrent.assign(size_t(hp.n_layer), false);
    if (f.has_key(a + "attention.recurrent_layers")) {
        const std::vector<int64_t> r = f.get_ints(a + "attention.recurrent_layers");
        check(int64_t(r.size()) >= hp.n_layer, LB_E_FORMAT, where + ": attention.recurrent_layers is too short" + fix);
        for (int32_t il = 0; il < hp.n_layer; ++il) hp.recurrent[size_t(il)] = r[size_t(il)] != 0;
    } else {
        const int32_t interval = get_dim("full_attention_interval", false, 4, 1, kMaxTargetLayers);
        for (int32_t il = 0; il < hp.n_layer; ++il) hp.recurrent[size_t(il)] = (il + 1) % interval != 0;
    }

    // shapes the ops can run (ggml asserts otherwise, so refuse here)
    const std::string bad = where + " has hyperparameters lucebox cannot run: ";
    check(hp.n_embd > 0 && hp.n_layer > 0, LB_E_FORMAT, where + ": embedding_length / block_count is 0");
    check(hp.n_head_kv > 0 && hp.n_head % hp.n_head_kv == 0, LB_E_UNSUPPORTED,
          bad + "head_count must be a multiple of head_count_kv");
    check(head_dim_v == hp.head_dim, LB_E_UNSUPPORTED, bad + "attention key_length != value_length");
    check(hp.n_rot > 0 && hp.n_rot <= hp.head_dim && hp.n_rot % 2 == 0, LB_E_UNSUPPORTED,
          bad + "rope.dimension_count must be even and <= key_length");
    check(hp.d_conv >= 2, LB_E_UNSUPPORTED, bad + "ssm.conv_kernel must be >= 2");
    check(hp.n_k_heads > 0 && hp.n_v_heads > 0 && hp.n_v_heads % hp.n_k_heads == 0, LB_E_UNSUPPORTED,
          bad + "ssm.time_step_rank (value heads) must be a multiple of ssm.group_count (key heads)");
    check(d_inner % hp.n_v_heads == 0, LB_E_FORMAT, where + ": ssm.inner_size is not a multiple of the value heads");
    hp.head_v_dim = d_inner / hp.n_v_heads;
    // M-RoPE sections (in rotary pairs). Text positions are equal in every section, so only their
    // validity matters to ggml: none at all means one section over every rotary pair.
    int32_t sect_sum = 0;
    for (int32_t s : hp.rope_sections) {
        check(s >= 0, LB_E_FORMAT, where + ": rope.dimension_sections has a negative entry");
        sect_sum += s;
    }
    if (sect_sum == 0) hp.rope_sections[0] = hp.n_rot / 2;
    check(sect_sum <= hp.n_rot / 2, LB_E_UNSUPPORTED, bad + "rope.dimension_sections cover more than the rotary pairs");
    check(hp.head_v_dim == hp.head_k_dim, LB_E_UNSUPPORTED, bad + "DeltaNet key and value head sizes differ");
    for (int32_t f : hp.n_ff) check(f > 0, LB_E_FORMAT, where + ": feed_forward_length is 0");
    return hp;
}

// The GGUF index of tensor `name` after checking its shape (ne, padded to 4 dims here) and type;
// -1 when it is absent and not required.
int64_t TensorLoader::check_tensor(const std::string & name, std::vector<int64_t> & ne, bool must_be_f32, bool required) {
    const int64_t id = f_.find_tensor(name);
    if (id < 0) {
        check(!required, LB_E_FORMAT, f_.where() + " is missing tensor '" + name + "'; re-convert the model");
        return -1;
    }
    const int64_t * fne = f_.tensor_ne(id);
    ne.resize(GGML_MAX_DIMS, 1);
    for (int i = 0; i < GGML_MAX_DIMS; ++i) {
        if (fne[i] != ne[size_t(i)]) {
            throw Error(LB_E_FORMAT, f_.where() + ": tensor '" + name + "' has shape " + shape_str(fne, 4) +
                                         " but the metadata implies " + shape_str(ne.data(), 4));
        }
    }
    const ggml_type type = f_.tensor_type(id);
    if (must_be_f32) {
        check(float_type_convertible(type), LB_E_UNSUPPORTED,
              f_.where() + ": tensor '" + name + "' has type " + ggml_type_name(type) + "; lucebox needs F32/F16/BF16 there");
    } else {
        check(matrix_type_supported(type), LB_E_UNSUPPORTED,
              f_.where() + ": tensor '" + name + "' has type " + ggml_type_name(type) +
                  ", which lucebox does not run; use a F32/F16/BF16/Q8_0/Q4_0/K-quant/IQ4 GGUF");
    }
    return id;
}

ggml_tensor * TensorLoader::need(const std::string & name, std::vector<int64_t> ne, bool must_be_f32, bool required,
                                 bool host_only) {
    const int64_t id = check_tensor(name, ne, must_be_f32, required);
    if (id < 0) return nullptr;
    const ggml_type type = f_.tensor_type(id);
    const bool convert = must_be_f32 && type != GGML_TYPE_F32;
    if (host_only && !m_.host_ctx) {
        ggml_init_params ip = {ggml_tensor_overhead(), nullptr, true};
        m_.host_ctx.reset(ggml_init(ip));
        check(m_.host_ctx != nullptr, LB_E_OOM, "cannot create the target's host tensor context");
    }
    ggml_context * ctx = host_only ? m_.host_ctx.get() : m_.ctx.get();
    ggml_tensor * t = ggml_new_tensor(ctx, convert ? GGML_TYPE_F32 : type, GGML_MAX_DIMS, ne.data());
    ggml_set_name(t, name.c_str());
    sources_.push_back({t, id, convert, host_only});
    return t;
}

// Matrices [ne0, rows_i] that multiply one input (see StackedMatrices).
StackedMatrices TensorLoader::need_stacked(
    const std::vector<std::pair<std::string, std::vector<int64_t>>> & members) {
    std::vector<int64_t> ids;
    std::vector<StackMember> layout;
    for (const auto & mem : members) {
        std::vector<int64_t> ne = mem.second;
        ids.push_back(check_tensor(mem.first, ne, false, true));
        layout.push_back({mem.first, f_.tensor_type(ids.back()), ne[1]});
    }
    StackedMatrices out(m_.ctx.get(), members[0].second[0], layout);
    for (size_t i = 0; i < out.size(); ++i) sources_.push_back({out[i], ids[i], false, false});
    return out;
}

ggml_tensor * TensorLoader::need_rows_of(const std::string & name, std::vector<int64_t> ne, ggml_tensor * stack,
                                        int64_t row0) {
    const int64_t id = check_tensor(name, ne, /*must_be_f32=*/true, /*required=*/true);
    ggml_tensor * t = ggml_view_2d(m_.ctx.get(), stack, ne[0], ne[1], stack->nb[1], size_t(row0) * stack->nb[1]);
    ggml_set_name(t, name.c_str());
    sources_.push_back({t, id, f_.tensor_type(id) != GGML_TYPE_F32, false});
    return t;
}

void TensorLoader::create_tensors() {
    const TargetHparams & hp = m_.hp;
    const int64_t id_embd = f_.find_tensor("token_embd.weight");
    check(id_embd >= 0, LB_E_FORMAT, f_.where() + " is missing tensor 'token_embd.weight'; re-convert the model");
    const int64_t n_vocab = f_.tensor_ne(id_embd)[1];
    check(n_vocab >= 1 && n_vocab <= kMaxVocab, LB_E_FORMAT,
          f_.where() + ": token_embd.weight has " + std::to_string(n_vocab) + " rows, outside [1, " +
              std::to_string(kMaxVocab) + "]; re-convert the model");
    m_.hp.n_vocab = int32_t(n_vocab);

    ggml_init_params ip = {ggml_tensor_overhead() * size_t(16 + 24 * hp.n_layer), nullptr, true};
    m_.ctx.reset(ggml_init(ip));
    check(m_.ctx != nullptr, LB_E_OOM, "cannot create the target's tensor context");

    const int64_t E = hp.n_embd, V = hp.n_vocab;
    const bool tied = f_.find_tensor("output.weight") < 0;  // the embedding is the lm head too
    m_.tok_embd = need("token_embd.weight", {E, V}, false, true, /*host_only=*/!tied);
    m_.output_norm = need("output_norm.weight", {E}, true);
    m_.output = tied ? m_.tok_embd : need("output.weight", {E, V}, false);

    m_.layers.resize(size_t(hp.n_layer));
    if (hp.n_recurrent_layers() > 0) {
        m_.conv1d_all = ggml_new_tensor_2d(m_.ctx.get(), GGML_TYPE_F32, hp.d_conv,
                                           int64_t(hp.conv_channels()) * hp.n_recurrent_layers());
        ggml_set_name(m_.conv1d_all, "ssm_conv1d.stack");
    }
    int64_t n_rec = 0;  // DeltaNet layers before this one
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        TargetLayer & L = m_.layers[size_t(il)];
        const std::string p = "blk." + std::to_string(il) + ".";
        const int64_t F = hp.n_ff[size_t(il)];
        L.recurrent = hp.recurrent[size_t(il)];
        L.attn_norm = need(p + "attn_norm.weight", {E}, true);
        L.post_norm = need(p + "post_attention_norm.weight", {E}, true);
        L.ffn_gate_up = need_stacked({{p + "ffn_gate.weight", {E, F}}, {p + "ffn_up.weight", {E, F}}});
        L.ffn_down = need(p + "ffn_down.weight", {F, E}, false);
        if (L.recurrent) {
            const int64_t C = hp.conv_channels(), Dv = hp.value_dim(), Hv = hp.n_v_heads;
            L.ssm_in = need_stacked({{p + "attn_qkv.weight", {E, C}}, {p + "attn_gate.weight", {E, Dv}},
                                     {p + "ssm_beta.weight", {E, Hv}}, {p + "ssm_alpha.weight", {E, Hv}}});
            L.conv1d = need_rows_of(p + "ssm_conv1d.weight", {hp.d_conv, C}, m_.conv1d_all, C * n_rec++);
            L.ssm_dt = need(p + "ssm_dt.bias", {Hv}, true);
            L.ssm_a = need(p + "ssm_a", {Hv}, true);
            L.ssm_norm = need(p + "ssm_norm.weight", {hp.head_v_dim}, true);
            L.ssm_out = need(p + "ssm_out.weight", {Dv, E}, false);
        } else {
            const int64_t D = hp.head_dim;
            L.attn_qkv = need_stacked({{p + "attn_q.weight", {E, 2 * D * hp.n_head}},
                                       {p + "attn_k.weight", {E, D * hp.n_head_kv}},
                                       {p + "attn_v.weight", {E, D * hp.n_head_kv}}});
            L.wo = need(p + "attn_output.weight", {D * hp.n_head, E}, false);
            L.q_norm = need(p + "attn_q_norm.weight", {D}, true);
            L.k_norm = need(p + "attn_k_norm.weight", {D}, true);
        }
    }
}

void TensorLoader::upload(ggml_backend_t backend, bool backend_is_cpu) {
    auto src_ptr = [&](const Source & s) { return (const char *) f_.tensor_data(s.gguf_id); };

    if (backend_is_cpu) {
        // Zero copy: tensors point into the mapping. Converted tensors and stacked matrices (whose
        // members are not adjacent in the file) get memory of their own, then their data.
        m_.map.addr = f_.adopt_map(&m_.map.size);
        ggml_backend_buffer_t map_buf = ggml_backend_cpu_buffer_from_ptr(m_.map.addr, m_.map.size);
        check(map_buf != nullptr, LB_E_OOM, "cannot wrap the mapped " + f_.where());
        m_.buffers.emplace_back(map_buf);
        ggml_context_ptr own;                // the copies' metadata: freed on return or throw
        std::vector<const Source *> copied;  // sources whose data is set below
        const std::vector<std::pair<ggml_tensor *, ggml_tensor *>> owned = own_copies(&own, &copied);
        ggml_context * own_ctx = own.get();
        for (const Source & s : sources_) {
            if (!s.t->view_src && !s.convert) {
                const ggml_status st = ggml_backend_tensor_alloc(map_buf, s.t, (void *) src_ptr(s));
                check(st == GGML_STATUS_SUCCESS, LB_E_BACKEND, "cannot place tensor " + std::string(s.t->name));
            }
            m_.weight_bytes += ggml_nbytes(s.t);
        }
        if (!owned.empty()) {
            m_.buffers.push_back(alloc_tensors_or_throw(own_ctx, backend, "target's stacked and converted tensors",
                                                        "free host memory"));
            ggml_backend_buffer_t buf = m_.buffers.back().get();
            // the model tensor must own the memory: alias it onto the allocated copy
            for (auto & o : owned) ggml_backend_tensor_alloc(buf, o.first, o.second->data);
            for (const Source * s : copied) {
                if (s->t->view_src) ggml_backend_view_init(s->t);
                set_data(*s);
            }
        }
        set_embedding_table();
        return;
    }

    m_.buffers.push_back(alloc_tensors_or_throw(m_.ctx.get(), backend, "target weights",
                                                "use a smaller quant or free GPU memory"));
    // no graph writes them: ggml-cuda's kernels may read them before waiting for the kernel before (patch 0069)
    ggml_backend_buffer_set_usage(m_.buffers.back().get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (const Source & s : sources_) {
        if (s.host_only) continue;
        set_data(s);
        m_.weight_bytes += ggml_nbytes(s.t);
    }
    // Every matrix on the GPU is a product's weights (the embedding rows are read from the mapping), so each
    // may take the order the product kernel streams fastest; a stack once, through its first member.
    int n_stored = 0;
    for (const Source & s : sources_) {
        if (s.host_only) continue;
        n_stored += store_for_products(s.t->view_src ? s.t->view_src : s.t) ? 1 : 0;
    }
    if (n_stored > 0) log_msg(LB_LOG_INFO, "target: %d matrices stored in the GPU product kernel's order", n_stored);
    // The mapping stays for the embedding rows; drop the pages the upload read from this process
    // (they stay in the page cache) so its resident memory is not the whole file.
    m_.map.addr = f_.adopt_map(&m_.map.size);
    madvise(m_.map.addr, m_.map.size, MADV_DONTNEED);
    set_embedding_table();
}

void TensorLoader::set_embedding_table() {
    const auto src = std::find_if(sources_.begin(), sources_.end(), [&](const Source & s) { return s.t == m_.tok_embd; });
    m_.embedding.set_host_rows((const char *) f_.tensor_data(src->gguf_id));
}

std::vector<std::pair<ggml_tensor *, ggml_tensor *>> TensorLoader::own_copies(
    ggml_context_ptr * own, std::vector<const Source *> * copied) const {
    ggml_init_params ip = {ggml_tensor_overhead() * (sources_.size() + 1), nullptr, true};
    own->reset(ggml_init(ip));
    check(*own != nullptr, LB_E_OOM, "cannot create a tensor context for the target");
    ggml_context * own_ctx = own->get();
    std::vector<std::pair<ggml_tensor *, ggml_tensor *>> owned;
    for (const Source & s : sources_) {
        if (s.t->view_src) {
            ggml_tensor * stack = s.t->view_src;
            const bool seen = std::any_of(owned.begin(), owned.end(), [&](const auto & o) { return o.first == stack; });
            if (!seen) owned.push_back({stack, ggml_dup_tensor(own_ctx, stack)});
            copied->push_back(&s);
        } else if (s.convert) {
            owned.push_back({s.t, ggml_dup_tensor(own_ctx, s.t)});
            copied->push_back(&s);
        }
    }
    return owned;
}

size_t TensorLoader::plan_bytes(ggml_backend_buffer_type_t buft, bool backend_is_cpu) {
    if (!backend_is_cpu) return ggml_backend_alloc_ctx_tensors_from_buft_size(m_.ctx.get(), buft);
    ggml_context_ptr own;
    std::vector<const Source *> copied;
    const bool any = !own_copies(&own, &copied).empty();
    return f_.size() + (any ? ggml_backend_alloc_ctx_tensors_from_buft_size(own.get(), buft) : 0);
}

void TensorLoader::set_data(const Source & s) {
    const char * src = (const char *) f_.tensor_data(s.gguf_id);
    if (s.convert) {
        std::vector<float> f(size_t(ggml_nelements(s.t)));
        to_f32(f_.tensor_type(s.gguf_id), src, f.data(), ggml_nelements(s.t));
        ggml_backend_tensor_set(s.t, f.data(), 0, ggml_nbytes(s.t));
    } else {
        ggml_backend_tensor_set(s.t, src, 0, ggml_nbytes(s.t));
    }
}

}  // namespace

int32_t TargetHparams::n_attn_layers() const {
    int32_t n = 0;
    for (bool r : recurrent) n += r ? 0 : 1;
    return n;
}

int32_t TargetHparams::n_recurrent_layers() const { return n_layer - n_attn_layers(); }

TargetModel::Mapping::~Mapping() {
    if (addr) munmap(addr, size);
}

namespace {

// Opens, checks and lays out the target, then hands its loader to `place` (upload, or size) while
// the file is open.
template <typename Place>
std::unique_ptr<TargetModel> read_target(const std::string & path, Place && place) {
    auto m = std::make_unique<TargetModel>();
    m->path = path;
    GgufFile file(path);
    const std::string arch = file.has_key("general.architecture") ? file.get_str("general.architecture") : "";
    check(!arch.empty(), LB_E_FORMAT,
          file.where() + " has no general.architecture; re-convert it with llama.cpp's convert_hf_to_gguf.py");
    check(arch == kArch, LB_E_UNSUPPORTED,
          file.where() + " has architecture '" + arch + "'; lucebox runs qwen35 targets (Qwen3.5 / Qwen3.6) only");
    m->hp = read_hparams(file);
    TensorLoader loader(file, *m);
    loader.create_tensors();
    place(loader);
    return m;
}

}  // namespace

std::unique_ptr<TargetModel> plan_target(const std::string & path, ggml_backend_buffer_type_t buft, bool backend_is_cpu,
                                         size_t * weight_bytes) {
    return read_target(path, [&](TensorLoader & loader) { *weight_bytes = loader.plan_bytes(buft, backend_is_cpu); });
}

std::unique_ptr<TargetModel> load_target(const std::string & path, ggml_backend_t backend, bool backend_is_cpu) {
    auto m = read_target(path, [&](TensorLoader & loader) { loader.upload(backend, backend_is_cpu); });
    log_msg(LB_LOG_INFO, "target %s: %d layers (%d full attention), n_embd %d, vocab %d, %.1f MiB of weights",
            path.c_str(), m->hp.n_layer, m->hp.n_attn_layers(), m->hp.n_embd, m->hp.n_vocab,
            double(m->weight_bytes) / (1 << 20));
    return m;
}

}  // namespace lb
