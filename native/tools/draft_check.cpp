// draft_check: drives the DFlash draft module outside the engine, for tests and timing.
//
//   draft_check run --draft DIR --target MODEL.gguf --script CMDS --features F32FILE --out OUTFILE
//                   [--wtype keep|f32|f16|bf16|q8_0] [--kv f32|f16] [--ctx N] [--attn auto|flash|plain]
//                   [--threads N] [--device D]
//     CMDS, one per line (features are read from F32FILE in order, n_feat floats per token):
//       append N                  host path: the next N tokens' features
//       append_rows N M r1 .. rN  device path: upload the next M tokens as per-layer tensors,
//                                 then append their columns r1..rN (a tree path)
//       propose LAST K            appends (B-1)*K int32 ids, then (B-1)*K float32 log-probs to OUTFILE
//       reset
//   draft_check bench --config config.json --n-vocab V --n-layer L [--ctx-tokens N] [--iters N]
//                   [--wtype ...] [--kv ...] [--out-type q6_k|q8_0|bf16] [--device D] [--tmp DIR]
//     writes a random draft with that config to --tmp, random target embedding/output matrices,
//     and prints the mean append and propose times.
// Errors: "error <status>: <message>" on stderr, exit code 2.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "ggml-cpp.h"
#include "ggml-cpu.h"
#include "gguf.h"
#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cuda.h"
#endif

// The draft module is internal to liblucebox (hidden symbols); the tool links its objects (lucebox_core).
#include "draft_model.hpp"
#include "error.hpp"

namespace {

using lb::Error;

struct Args {
    std::map<std::string, std::string> kv;
    std::string get(const std::string & k, const std::string & dflt = "") const {
        auto it = kv.find(k);
        return it == kv.end() ? dflt : it->second;
    }
    std::string need(const std::string & k) const {
        auto it = kv.find(k);
        if (it == kv.end()) throw Error(LB_E_INVALID_ARG, "missing --" + k);
        return it->second;
    }
};

// A ggml context + backend buffer holding a few tensors we own.
struct Owned {
    ggml_context * ctx = nullptr;
    explicit Owned(size_t n_tensors) {
        ggml_init_params p = {ggml_tensor_overhead() * n_tensors, nullptr, true};
        ctx_.reset(ggml_init(p));
        ctx = ctx_.get();
    }
    void alloc(ggml_backend_t be) {
        buf_.reset(ggml_backend_alloc_ctx_tensors(ctx, be));
        if (!buf_) throw Error(LB_E_OOM, "tool: allocation failed");
    }

private:
    ggml_context_ptr ctx_;
    ggml_backend_buffer_ptr buf_;  // freed before ctx_
};

ggml_backend_ptr make_backend(int device, int threads) {
    if (device < 0) {
        ggml_backend_ptr be(ggml_backend_cpu_init());
        ggml_backend_cpu_set_n_threads(be.get(), threads > 0 ? threads : int(std::thread::hardware_concurrency()));
        return be;
    }
#ifdef LUCEBOX_WITH_CUDA
    if (ggml_backend_t be = ggml_backend_cuda_init(device)) return ggml_backend_ptr(be);
#endif
    throw Error(LB_E_UNSUPPORTED, "tool: CUDA device " + std::to_string(device) + " is not available");
}

// The target's token embedding and output matrix (tied when output.weight is absent).
struct TargetTensors {
    Owned own{2};
    std::vector<char> embd_rows;  // the embedding on the host, as the engine reads it
    lb::TokenEmbedding embedding;
    lb::CallClock clock;  // the draft runs its graphs through one; the tool reads no times
    lb::DraftTarget view{nullptr, nullptr, nullptr, 0, &clock};

    // Stages rows of `embd` (on the backend) from a host copy: blocks of up to 64 tokens.
    void set_embedding(ggml_tensor * embd, ggml_backend_t be) {
        embd_rows.resize(ggml_nbytes(embd));
        ggml_backend_tensor_get(embd, embd_rows.data(), 0, embd_rows.size());
        embedding.layout(embd, 64);
        embedding.alloc(be);
        embedding.set_host_rows(embd_rows.data());
        view.tok_embd = embd;
        view.embedding = &embedding;
    }
};

void load_target(const std::string & path, ggml_backend_t be, TargetTensors & out) {
    ggml_context * meta_raw = nullptr;
    gguf_init_params gp = {true, &meta_raw};
    const gguf_context_ptr owned(gguf_init_from_file(path.c_str(), gp));
    const ggml_context_ptr meta(meta_raw);
    gguf_context * g = owned.get();
    if (!g) throw Error(LB_E_FORMAT, "tool: cannot read GGUF " + path);
    const std::string arch = gguf_get_val_str(g, gguf_find_key(g, "general.architecture"));
    int32_t n_layer = int32_t(gguf_get_val_u32(g, gguf_find_key(g, (arch + ".block_count").c_str())));
    const int64_t nextn = gguf_find_key(g, (arch + ".nextn_predict_layers").c_str());
    if (nextn >= 0) n_layer -= int32_t(gguf_get_val_u32(g, nextn));
    const char * names[2] = {"token_embd.weight", gguf_find_tensor(g, "output.weight") >= 0 ? "output.weight" : "token_embd.weight"};
    ggml_tensor * dst[2];
    for (int i = 0; i < 2; ++i) dst[i] = ggml_dup_tensor(out.own.ctx, ggml_get_tensor(meta.get(), names[i]));
    out.own.alloc(be);
    std::ifstream f(path, std::ios::binary);
    for (int i = 0; i < 2; ++i) {
        std::vector<char> data(ggml_nbytes(dst[i]));
        f.seekg(std::streamoff(gguf_get_data_offset(g) + gguf_get_tensor_offset(g, gguf_find_tensor(g, names[i]))));
        f.read(data.data(), std::streamsize(data.size()));
        if (!f) throw Error(LB_E_IO, "tool: short read of " + std::string(names[i]));
        ggml_backend_tensor_set(dst[i], data.data(), 0, data.size());
    }
    out.set_embedding(dst[0], be);
    out.view.output = dst[1];
    out.view.n_layer = n_layer;
}

lb::DraftOptions options(const Args & a) {
    lb::DraftOptions o;
    if (!lb::draft_weight_type_from_string(a.get("wtype", "keep"), &o.weight_type)) {
        throw Error(LB_E_INVALID_ARG, "tool: unknown --wtype");
    }
    o.kv_type = a.get("kv", "f32") == "f16" ? GGML_TYPE_F16 : GGML_TYPE_F32;
    o.ctx_size = std::stoi(a.get("ctx", "4096"));
    const std::string attn = a.get("attn", "auto");
    o.attention = attn == "flash" ? lb::DraftOptions::Attention::flash
                : attn == "plain" ? lb::DraftOptions::Attention::plain : lb::DraftOptions::Attention::automatic;
    return o;
}

int run(const Args & a) {
    const ggml_backend_ptr backend = make_backend(std::stoi(a.get("device", "-1")), std::stoi(a.get("threads", "0")));
    ggml_backend_t be = backend.get();
    TargetTensors tt;
    load_target(a.need("target"), be, tt);
    auto model = lb::DraftModel::load(a.need("draft"), be, tt.view, options(a));
    const lb::DraftConfig & c = model->config();
    std::ifstream feats(a.get("features", "/dev/null"), std::ios::binary);
    std::ifstream script(a.need("script"));
    std::ofstream out(a.need("out"), std::ios::binary);
    auto read_feats = [&](int32_t n) {
        std::vector<float> v(size_t(n) * size_t(c.n_feat()));
        feats.read((char *) v.data(), std::streamsize(v.size() * sizeof(float)));
        if (!feats) throw Error(LB_E_IO, "tool: features file too short");
        return v;
    };
    std::string line;
    while (std::getline(script, line)) {
        std::istringstream ss(line);
        std::string cmd;
        if (!(ss >> cmd)) continue;
        if (cmd == "append") {
            int32_t n;
            ss >> n;
            model->append_host(read_feats(n).data(), n);
            tt.clock.settle(be);  // the append's graphs run unwaited (DraftModel::append_chunk)
        } else if (cmd == "append_rows") {
            int32_t n, m;
            ss >> n >> m;
            std::vector<int32_t> rows(static_cast<size_t>(n));
            for (auto & r : rows) ss >> r;
            const std::vector<float> v = read_feats(m);
            const size_t n_cap = c.target_layer_ids.size();
            Owned own(n_cap);
            std::vector<ggml_tensor *> ts;
            for (size_t j = 0; j < n_cap; ++j) ts.push_back(ggml_new_tensor_2d(own.ctx, GGML_TYPE_F32, c.n_embd, m));
            own.alloc(be);
            std::vector<float> col(size_t(m) * size_t(c.n_embd));
            for (size_t j = 0; j < n_cap; ++j) {
                for (int32_t t = 0; t < m; ++t) {
                    std::memcpy(&col[size_t(t) * c.n_embd], &v[size_t(t) * c.n_feat() + j * c.n_embd], size_t(c.n_embd) * 4);
                }
                ggml_backend_tensor_set(ts[j], col.data(), 0, col.size() * 4);
            }
            model->append(ts, rows.data(), n);
            tt.clock.settle(be);  // before `own` frees the features the append reads
        } else if (cmd == "propose") {
            int32_t last, k;
            ss >> last >> k;
            const size_t n = size_t(c.block_size - 1) * size_t(k);
            std::vector<int32_t> ids(n);
            std::vector<float> lp(n);
            model->propose(last, k, ids.data(), lp.data());
            out.write((const char *) ids.data(), std::streamsize(n * 4));
            out.write((const char *) lp.data(), std::streamsize(n * 4));
        } else if (cmd == "reset") {
            model->reset();
        } else {
            throw Error(LB_E_INVALID_ARG, "tool: unknown script command " + cmd);
        }
    }
    std::printf("draft graph builds: %d\n", model->graph_builds());  // the tests check calls reuse graphs
    return 0;
}

// ---- bench: random weights at real sizes --------------------------------------------------

// Uniform in [-scale, scale) from a hash of (seed, index): fast, and parallel without shared state.
void fill_random(float * v, size_t n, uint64_t seed, float scale) {
    const size_t n_threads = std::max<size_t>(1, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (size_t t = 0; t < n_threads; ++t) {
        pool.emplace_back([=] {
            for (size_t i = t; i < n; i += n_threads) {
                uint64_t z = seed * 0x9E3779B97F4A7C15ull + i;
                z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
                z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
                z ^= z >> 31;
                v[i] = scale * (float((z >> 40) & 0xFFFFFF) / float(1 << 23) - 1.0f);
            }
        });
    }
    for (auto & th : pool) th.join();
}

void write_random_draft(const std::string & dir, const lb::DraftConfig & c) {
    struct Item { std::string name; std::vector<int64_t> shape; };
    std::vector<Item> items = {{"fc.weight", {c.n_embd, c.n_feat()}}, {"hidden_norm.weight", {c.n_embd}}, {"norm.weight", {c.n_embd}}};
    const int64_t QD = int64_t(c.n_head) * c.head_dim, KD = int64_t(c.n_head_kv) * c.head_dim;
    for (int l = 0; l < c.n_layer; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        items.push_back({p + "input_layernorm.weight", {c.n_embd}});
        items.push_back({p + "post_attention_layernorm.weight", {c.n_embd}});
        items.push_back({p + "self_attn.q_proj.weight", {QD, c.n_embd}});
        items.push_back({p + "self_attn.k_proj.weight", {KD, c.n_embd}});
        items.push_back({p + "self_attn.v_proj.weight", {KD, c.n_embd}});
        items.push_back({p + "self_attn.o_proj.weight", {c.n_embd, QD}});
        items.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
        items.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
        items.push_back({p + "mlp.gate_proj.weight", {c.n_ff, c.n_embd}});
        items.push_back({p + "mlp.up_proj.weight", {c.n_ff, c.n_embd}});
        items.push_back({p + "mlp.down_proj.weight", {c.n_embd, c.n_ff}});
    }
    std::string header = "{";
    uint64_t off = 0;
    for (size_t i = 0; i < items.size(); ++i) {
        int64_t n = 1;
        std::string shape;
        for (size_t d = 0; d < items[i].shape.size(); ++d) {
            n *= items[i].shape[d];
            shape += (d ? "," : "") + std::to_string(items[i].shape[d]);
        }
        header += (i ? "," : "") + std::string("\"") + items[i].name + "\":{\"dtype\":\"BF16\",\"shape\":[" + shape +
                  "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + uint64_t(n) * 2) + "]}";
        off += uint64_t(n) * 2;
    }
    header += "}";
    std::ofstream f(dir + "/model.safetensors", std::ios::binary);
    const uint64_t hl = header.size();
    f.write((const char *) &hl, 8);
    f.write(header.data(), std::streamsize(hl));
    std::vector<float> tmp;
    std::vector<ggml_bf16_t> bf;
    for (size_t i = 0; i < items.size(); ++i) {
        int64_t n = 1;
        for (int64_t d : items[i].shape) n *= d;
        tmp.resize(size_t(n));
        const bool norm = items[i].shape.size() == 1;
        if (norm) std::fill(tmp.begin(), tmp.end(), 1.0f);
        else fill_random(tmp.data(), tmp.size(), i + 1, 1.7f / std::sqrt(float(items[i].shape[1])));
        bf.resize(tmp.size());
        ggml_fp32_to_bf16_row(tmp.data(), bf.data(), n);
        f.write((const char *) bf.data(), std::streamsize(bf.size() * 2));
    }
}

void random_matrix(ggml_tensor * t, uint64_t seed) {
    const int64_t rows = t->ne[1], cols = t->ne[0], chunk = 16384;
    std::vector<float> f(size_t(chunk * cols));
    std::vector<uint8_t> q(ggml_row_size(t->type, cols) * size_t(chunk));
    const size_t row = ggml_row_size(t->type, cols);
    for (int64_t r = 0; r < rows; r += chunk) {
        const int64_t nr = std::min(chunk, rows - r);
        fill_random(f.data(), size_t(nr * cols), seed + uint64_t(r), 0.05f);
        std::vector<std::thread> pool;
        const int64_t nt = 16, per = (nr + nt - 1) / nt;
        for (int64_t k = 0; k < nt && k * per < nr; ++k) {
            pool.emplace_back([&, k] {
                const int64_t r0 = k * per, n = std::min(per, nr - r0);
                ggml_quantize_chunk(t->type, f.data() + r0 * cols, q.data() + size_t(r0) * row, 0, n, cols, nullptr);
            });
        }
        for (auto & th : pool) th.join();
        ggml_backend_tensor_set(t, q.data(), size_t(r) * row, size_t(nr) * row);
    }
}

// Times the draft's head on its own (the part whose cost does not depend on the draft's weights).
double time_head(ggml_backend_t be, ggml_tensor * outm, int rows, int k, int iters, bool full) {
    std::vector<uint8_t> meta(ggml_tensor_overhead() * 256 + ggml_graph_overhead());
    ggml_init_params p = {meta.size(), meta.data(), true};
    const ggml_context_ptr owned(ggml_init(p));
    ggml_context * ctx = owned.get();
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, outm->ne[0], rows);
    ggml_set_input(x);
    ggml_tensor * logits = ggml_mul_mat(ctx, outm, x);
    ggml_tensor * out = logits;
    if (full) {
        const lb::TopKLogProbs top = lb::top_k_log_softmax(ctx, logits, k);
        out = top.logp;
        ggml_build_forward_expand(gf, top.ids);
    }
    ggml_set_output(out);
    ggml_build_forward_expand(gf, out);
    const ggml_gallocr_ptr ga(ggml_gallocr_new(ggml_backend_get_default_buffer_type(be)));
    ggml_gallocr_alloc_graph(ga.get(), gf);
    std::vector<float> xv(size_t(ggml_nelements(x)));
    fill_random(xv.data(), xv.size(), 9, 1.0f);
    ggml_backend_tensor_set(x, xv.data(), 0, ggml_nbytes(x));
    ggml_backend_graph_compute(be, gf);
    float sink;
    ggml_backend_tensor_get(out, &sink, 0, sizeof sink);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
        ggml_backend_graph_compute(be, gf);
        ggml_backend_tensor_get(out, &sink, 0, sizeof sink);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
    return ms;
}

int bench(const Args & a) {
    std::ifstream cf(a.need("config"));
    std::stringstream ss;
    ss << cf.rdbuf();
    const lb::DraftConfig c = lb::draft_config_parse(ss.str(), a.need("config"));
    const std::string dir = a.get("tmp", "/tmp/lb_draft_bench");
    std::system(("mkdir -p " + dir).c_str());
    std::stringstream old;
    old << std::ifstream(dir + "/config.json").rdbuf();
    if (old.str() != ss.str() || !std::ifstream(dir + "/model.safetensors")) {  // reuse a previous run's draft
        std::ofstream(dir + "/config.json") << ss.str();
        write_random_draft(dir, c);
    }

    const ggml_backend_ptr backend = make_backend(std::stoi(a.get("device", "-1")), std::stoi(a.get("threads", "0")));
    ggml_backend_t be = backend.get();
    const int64_t n_vocab = std::stoll(a.need("n-vocab"));
    const std::string ot = a.get("out-type", "q6_k");
    const ggml_type otype = ot == "q8_0" ? GGML_TYPE_Q8_0 : ot == "bf16" ? GGML_TYPE_BF16 : GGML_TYPE_Q6_K;
    TargetTensors tt;
    // Like unsloth's Q4_K_M: Q4_K embedding, Q6_K output (F16 where rows do not fill a block).
    auto fits = [&](ggml_type t) { return c.n_embd % ggml_blck_size(t) == 0 ? t : GGML_TYPE_F16; };
    ggml_tensor * emb = ggml_new_tensor_2d(tt.own.ctx, fits(GGML_TYPE_Q4_K), c.n_embd, n_vocab);
    ggml_tensor * outm = ggml_new_tensor_2d(tt.own.ctx, fits(otype), c.n_embd, n_vocab);
    tt.own.alloc(be);
    random_matrix(emb, 7);
    random_matrix(outm, 11);
    tt.set_embedding(emb, be);
    tt.view.output = outm;
    tt.view.n_layer = std::stoi(a.need("n-layer"));
    auto model = lb::DraftModel::load(dir, be, tt.view, options(a));

    const int32_t n_ctx = std::stoi(a.get("ctx-tokens", "1024")), iters = std::stoi(a.get("iters", "20"));
    std::vector<float> feats(size_t(n_ctx) * size_t(c.n_feat()));
    fill_random(feats.data(), feats.size(), 3, 1.0f);
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    model->append_host(feats.data(), n_ctx);
    tt.clock.settle(be);  // appends leave their graphs running (DraftModel::append_chunk)
    const double append_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    const int K = 8;
    std::vector<int32_t> ids(size_t(c.block_size - 1) * K);
    std::vector<float> lp(ids.size());
    model->propose(1, K, ids.data(), lp.data());  // warm-up
    t0 = clock::now();
    for (int i = 0; i < iters; ++i) model->propose(1 + i, K, ids.data(), lp.data());
    const double prop_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count() / iters;
    t0 = clock::now();
    for (int i = 0; i < iters; ++i) model->append_host(feats.data() + size_t(i) * c.n_feat(), 4);
    tt.clock.settle(be);
    const double step_append_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count() / iters;
    const double gb = double(model->weight_bytes()) / 1e9;
    std::printf("backend %s | draft weights %.2f GB | cache %.2f GB | output %s %.2f GB\n", ggml_backend_name(be),
                gb, model->cache_bytes() / 1e9, ggml_type_name(outm->type), ggml_nbytes(outm) / 1e9);
    std::printf("prefill append %d tok: %.2f ms | propose (ctx %d, B %d, K %d): %.3f ms | append 4 tok: %.3f ms\n",
                n_ctx, append_ms, n_ctx, c.block_size, K, prop_ms, step_append_ms);
    std::printf("head alone (output matmul [%lld x %d] + log-softmax + top-k): %.3f ms | output matmul alone: %.3f ms\n",
                (long long) n_vocab, c.block_size - 1, time_head(be, outm, c.block_size - 1, K, iters, true),
                time_head(be, outm, c.block_size - 1, K, iters, false));
    return 0;
}

// ggml's start-up listing (CUDA devices) would precede our "error N:" line, which the tests parse.
void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char ** argv) {
    ggml_log_set(quiet_log, nullptr);
    if (argc < 2) {
        std::fprintf(stderr, "usage: draft_check run|bench --key value ... (see the header of draft_check.cpp)\n");
        return 2;
    }
    Args a;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (std::strncmp(argv[i], "--", 2) != 0) {
            std::fprintf(stderr, "error %d: expected --key value, got %s\n", LB_E_INVALID_ARG, argv[i]);
            return 2;
        }
        a.kv[argv[i] + 2] = argv[i + 1];
    }
    try {
        const std::string mode = argv[1];
        if (mode == "run") return run(a);
        if (mode == "bench") return bench(a);
        throw Error(LB_E_INVALID_ARG, "unknown mode " + mode);
    } catch (const Error & e) {
        std::fprintf(stderr, "error %d: %s\n", e.status, e.what());
        return 2;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error %d: %s\n", LB_E_INVALID_ARG, e.what());
        return 2;
    }
}
