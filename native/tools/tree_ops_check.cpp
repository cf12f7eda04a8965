// tree_ops_check: runs one tree op (or the stock op it generalizes) on a ggml backend, for the tests
// (tests/test_tree_ops.py) and for timing on the GPU.
//
//   tree_ops_check run DIR [--backend cpu|cuda] [--threads N]
//       DIR/spec.txt: "key value" lines (see Spec); inputs: DIR/<name>.bin, raw little-endian, logical
//       contiguous ggml layout. Writes DIR/out.bin (the op's whole result).
//   tree_ops_check bench [--backend cuda|cpu] [--threads N] [--reps R] [--ns 1,8,16,23,32]
//       27B DeltaNet shapes (16 key heads, 48 value heads, head 128; conv 4 over 10240 channels):
//       each tree op vs the stock op at equal N, prints a markdown table.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"
#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cuda.h"
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

[[noreturn]] void fail(const std::string & msg) {
    throw std::runtime_error(msg);
}

// --- backend -----------------------------------------------------------------------------

ggml_backend_ptr make_backend(const std::string & name, int n_threads) {
    if (name == "cpu") {
        ggml_backend_ptr be(ggml_backend_cpu_init());
        ggml_backend_cpu_set_n_threads(be.get(), n_threads);
        return be;
    }
    if (name == "cuda") {
#ifdef LUCEBOX_WITH_CUDA
        ggml_backend_ptr be(ggml_backend_cuda_init(0));
        if (be == nullptr) {
            fail("no CUDA device: run on a GPU machine or use --backend cpu");
        }
        return be;
#else
        fail("this build has no CUDA: configure with -DLUCEBOX_CUDA=ON or use --backend cpu");
#endif
    }
    fail("unknown backend '" + name + "': use cpu or cuda");
}

// --- spec and files ----------------------------------------------------------------------

// Spec keys: op (conv_tree conv_chain gdn_tree gdn_chain), S (head size), H_k, H_v, n (tokens),
// n_seqs, qk_seqs (sequences of q/k, broadcast over n_seqs), kda (0/1: per-row gate), K (stock
// snapshot slots), par_seqs (1: one tree for all sequences, else n_seqs), pad (extra floats after
// each token's q/k/v heads: strided views), branch_states_only (0/1: gdn_tree may skip the states it does
// not read back), d_conv, ch (channels).
struct Spec {
    std::map<std::string, int64_t> v;
    std::string op;

    int64_t get(const std::string & key, int64_t dflt) const {
        auto it = v.find(key);
        return it == v.end() ? dflt : it->second;
    }
};

Spec read_spec(const std::string & dir) {
    std::ifstream f(dir + "/spec.txt");
    if (!f) {
        fail("cannot read " + dir + "/spec.txt: write the case first (tests/test_tree_ops.py does)");
    }
    Spec spec;
    std::string key, val;
    while (f >> key >> val) {
        if (key == "op") {
            spec.op = val;
        } else {
            spec.v[key] = std::stoll(val);
        }
    }
    return spec;
}

template <typename T>
std::vector<T> read_bin(const std::string & path, size_t count) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        fail("cannot read " + path);
    }
    std::vector<T> data(count);
    f.read(reinterpret_cast<char *>(data.data()), count * sizeof(T));
    if ((size_t) f.gcount() != count * sizeof(T)) {
        fail(path + ": expected " + std::to_string(count * sizeof(T)) + " bytes, got " + std::to_string(f.gcount()));
    }
    return data;
}

void write_bin(const std::string & path, const void * data, size_t bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(static_cast<const char *>(data), bytes);
    if (!f) {
        fail("cannot write " + path);
    }
}

// --- graph -------------------------------------------------------------------------------

// Inputs live in their own context and buffer (like weights and caches, they outlive the graph);
// the op's graph is placed by ggml_gallocr, as an engine would.
struct Inputs {
    ggml_context_ptr        owned_ctx;
    ggml_context *          ctx = nullptr;
    ggml_backend_buffer_ptr buf;  // freed before owned_ctx
    std::vector<std::pair<ggml_tensor *, std::vector<char>>> uploads; // tensor, bytes to set

    explicit Inputs(int n_tensors) {
        ggml_init_params p = { ggml_tensor_overhead() * (size_t) n_tensors, nullptr, true };
        owned_ctx.reset(ggml_init(p));
        ctx = owned_ctx.get();
    }

    ggml_tensor * add(ggml_type type, std::vector<int64_t> ne, std::vector<char> bytes, const char * name) {
        ggml_tensor * t = ggml_new_tensor(ctx, type, (int) ne.size(), ne.data());
        ggml_set_name(t, name);
        if (bytes.size() != ggml_nbytes(t)) {
            fail(std::string(name) + ": " + std::to_string(bytes.size()) + " bytes for a tensor of " + std::to_string(ggml_nbytes(t)));
        }
        uploads.emplace_back(t, std::move(bytes));
        return t;
    }

    void upload(ggml_backend_t backend) {
        buf.reset(ggml_backend_alloc_ctx_tensors(ctx, backend));
        if (buf == nullptr) {
            fail("cannot allocate the inputs on the backend");
        }
        for (auto & [t, bytes] : uploads) {
            ggml_backend_tensor_set(t, bytes.data(), 0, bytes.size());
        }
    }
};

template <typename T>
std::vector<char> as_bytes(const std::vector<T> & v) {
    std::vector<char> b(v.size() * sizeof(T));
    memcpy(b.data(), v.data(), b.size());
    return b;
}

// [S*H, n*n_seqs] rows stored with `pad` extra floats after each, viewed back as [S, H, n, n_seqs]:
// the op must honour row strides (q/k/v are views of a fused projection in the model)
ggml_tensor * add_heads(Inputs & in, const std::vector<float> & logical, int64_t S, int64_t H, int64_t n,
                        int64_t n_seqs, int64_t pad, const char * name) {
    const int64_t row = S * H, stride = row + pad;
    std::vector<float> padded((size_t) (stride * n * n_seqs), 1e30f); // poison: a stride bug shows
    for (int64_t r = 0; r < n * n_seqs; ++r) {
        memcpy(&padded[r * stride], &logical[r * row], row * sizeof(float));
    }
    ggml_tensor * base = in.add(GGML_TYPE_F32, { stride, n, n_seqs }, as_bytes(padded), name);
    return ggml_view_4d(in.ctx, base, S, H, n, n_seqs, S * sizeof(float), stride * sizeof(float),
                        stride * n * sizeof(float), 0);
}

struct GdnInputs {
    ggml_tensor * q, * k, * v, * g, * beta, * state, * parents;
};

// builds the gdn inputs from DIR files (dir non-empty) or from a fixed pseudo-random fill (bench)
GdnInputs gdn_inputs(Inputs & in, const Spec & s, const std::string & dir, const std::vector<int32_t> & bench_parents) {
    const int64_t S = s.get("S", 128), Hk = s.get("H_k", 16), Hv = s.get("H_v", 48), n = s.get("n", 1);
    const int64_t ns = s.get("n_seqs", 1), qks = s.get("qk_seqs", ns), G = s.get("kda", 0) ? S : 1;
    const int64_t ps = s.get("par_seqs", 1), pad = s.get("pad", 0);

    uint32_t seed = 12345;
    auto fill = [&](size_t count, float lo, float hi) {
        std::vector<float> x(count);
        for (auto & e : x) {
            seed = seed * 1664525u + 1013904223u;
            e = lo + (hi - lo) * ((seed >> 8) * (1.0f / 16777216.0f));
        }
        return x;
    };
    auto load = [&](const char * name, size_t count, float lo, float hi) {
        return dir.empty() ? fill(count, lo, hi) : read_bin<float>(dir + "/" + name + ".bin", count);
    };

    GdnInputs r;
    r.q = add_heads(in, load("q", S * Hk * n * qks, -0.1f, 0.1f), S, Hk, n, qks, pad, "q");
    r.k = add_heads(in, load("k", S * Hk * n * qks, -0.1f, 0.1f), S, Hk, n, qks, pad, "k");
    r.v = add_heads(in, load("v", S * Hv * n * ns, -1.0f, 1.0f), S, Hv, n, ns, pad, "v");
    r.g     = in.add(GGML_TYPE_F32, { G, Hv, n, ns }, as_bytes(load("g", G * Hv * n * ns, -1.0f, -0.01f)), "g");
    r.beta  = in.add(GGML_TYPE_F32, { 1, Hv, n, ns }, as_bytes(load("beta", Hv * n * ns, 0.1f, 0.9f)), "beta");
    r.state = in.add(GGML_TYPE_F32, { S, S, Hv, ns }, as_bytes(load("state", S * S * Hv * ns, -0.5f, 0.5f)), "state");
    std::vector<int32_t> par = dir.empty() ? bench_parents : read_bin<int32_t>(dir + "/parents.bin", n * ps);
    r.parents = in.add(GGML_TYPE_I32, { n, ps }, as_bytes(par), "parents");
    return r;
}

struct ConvInputs {
    ggml_tensor * sx, * c, * parents;
};

ConvInputs conv_inputs(Inputs & in, const Spec & s, const std::string & dir, const std::vector<int32_t> & bench_parents) {
    const int64_t dc = s.get("d_conv", 4), ch = s.get("ch", 10240), n = s.get("n", 1);
    const int64_t ns = s.get("n_seqs", 1), ps = s.get("par_seqs", 1);
    auto load = [&](const char * name, size_t count) {
        return dir.empty() ? std::vector<float>(count, 0.25f) : read_bin<float>(dir + "/" + name + ".bin", count);
    };
    ConvInputs r;
    r.sx = in.add(GGML_TYPE_F32, { dc - 1 + n, ch, ns }, as_bytes(load("sx", (dc - 1 + n) * ch * ns)), "sx");
    r.c  = in.add(GGML_TYPE_F32, { dc, ch }, as_bytes(load("c", dc * ch)), "c");
    std::vector<int32_t> par = dir.empty() ? bench_parents : read_bin<int32_t>(dir + "/parents.bin", n * ps);
    r.parents = in.add(GGML_TYPE_I32, { n, ps }, as_bytes(par), "parents");
    return r;
}

ggml_tensor * build_op(ggml_context * ctx, const Spec & s, const GdnInputs * gi, const ConvInputs * ci) {
    const std::string & op = s.op;
    if (op == "conv_tree")   return ggml_ssm_conv_tree(ctx, ci->sx, ci->c, ci->parents);
    if (op == "conv_chain")  return ggml_ssm_conv(ctx, ci->sx, ci->c);
    if (op == "gdn_tree") {
        return ggml_gated_delta_net_tree(ctx, gi->q, gi->k, gi->v, gi->g, gi->beta, gi->state, gi->parents,
                                         s.get("branch_states_only", 0) != 0);
    }
    if (op == "gdn_chain")   return ggml_gated_delta_net(ctx, gi->q, gi->k, gi->v, gi->g, gi->beta, gi->state, s.get("K", 1));
    fail("unknown op '" + op + "': use conv_tree conv_chain gdn_tree gdn_chain");
}

bool is_conv(const std::string & op) {
    return op.rfind("conv_", 0) == 0;
}

// A graph of `copies` independent instances of the op (one for checks; several to time launches away).
struct OpGraph {
    ggml_context_ptr ctx;
    ggml_cgraph *    graph = nullptr;
    ggml_gallocr_ptr alloc;  // freed before ctx
    std::vector<ggml_tensor *> outs;

    OpGraph(ggml_backend_t backend, const Spec & s, const GdnInputs * gi, const ConvInputs * ci, int copies) {
        ggml_init_params p = { ggml_tensor_overhead() * (size_t) (copies + 8) + ggml_graph_overhead(), nullptr, true };
        ctx.reset(ggml_init(p));
        graph = ggml_new_graph(ctx.get());
        for (int i = 0; i < copies; ++i) {
            ggml_tensor * out = build_op(ctx.get(), s, gi, ci);
            if (!ggml_backend_supports_op(backend, out)) {
                fail(std::string("backend ") + ggml_backend_name(backend) + " does not support " + ggml_op_desc(out) + " at these shapes");
            }
            ggml_set_output(out);
            ggml_build_forward_expand(graph, out);
            outs.push_back(out);
        }
        alloc.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend)));
        if (!ggml_gallocr_alloc_graph(alloc.get(), graph)) {
            fail("cannot allocate the op's graph");
        }
    }

    void compute(ggml_backend_t backend) {
        if (ggml_backend_graph_compute(backend, graph) != GGML_STATUS_SUCCESS) {
            fail("graph compute failed");
        }
        ggml_backend_synchronize(backend);
    }
};

// --- run ---------------------------------------------------------------------------------

int cmd_run(const std::string & dir, const std::string & backend_name, int n_threads) {
    const Spec s = read_spec(dir);
    const ggml_backend_ptr owned_backend = make_backend(backend_name, n_threads);
    ggml_backend_t backend = owned_backend.get();

    Inputs in(16);
    GdnInputs gi{};
    ConvInputs ci{};
    if (is_conv(s.op)) {
        ci = conv_inputs(in, s, dir, {});
    } else {
        gi = gdn_inputs(in, s, dir, {});
    }
    in.upload(backend);
    OpGraph og(backend, s, &gi, &ci, 1);
    og.compute(backend);

    ggml_tensor * out = og.outs[0];
    std::vector<char> host(ggml_nbytes(out));
    ggml_backend_tensor_get(out, host.data(), 0, host.size());
    write_bin(dir + "/out.bin", host.data(), host.size());
    return 0;
}

// --- bench -------------------------------------------------------------------------------

// A DDTree-like tree of n nodes in DFS order: a top-1 chain over the first half, then short
// branches (one or two nodes) hanging off chain nodes, each one a branch switch for the kernel.
std::vector<int32_t> bench_tree(int64_t n, bool chain) {
    std::vector<int32_t> par((size_t) n);
    const int64_t chain_len = chain ? n : (n + 1) / 2;
    for (int64_t t = 0; t < n; ++t) {
        if (t < chain_len) {
            par[t] = (int32_t) (t - 1);
        } else if ((t - chain_len) % 2 == 1) {
            par[t] = (int32_t) (t - 1);                              // second node of a branch
        } else {
            par[t] = (int32_t) ((t - chain_len) * 3 % chain_len) - 1; // a new branch off the chain
        }
    }
    return par;
}

double median(std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
}

// median microseconds per op instance
double time_op(ggml_backend_t backend, const Spec & s, const GdnInputs * gi, const ConvInputs * ci, int copies, int reps) {
    OpGraph og(backend, s, gi, ci, copies);
    for (int i = 0; i < 3; ++i) {
        og.compute(backend); // warm-up: allocations, CUDA graph capture, caches
    }
    std::vector<double> us;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        og.compute(backend);
        const auto t1 = std::chrono::steady_clock::now();
        us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / copies);
    }
    return median(us);
}

// bytes every op must move at least: inputs read once, outputs written once (branch reloads of a
// parent's state are not counted: they mostly hit L2)
double gdn_bytes(const Spec & s, int64_t states_written) {
    const double S = s.get("S", 128), Hk = s.get("H_k", 16), Hv = s.get("H_v", 48), n = s.get("n", 1);
    const double in  = 2 * n * Hk * S + n * Hv * S + 2 * n * Hv + Hv * S * S;
    const double out = n * Hv * S + states_written * Hv * S * S;
    return 4 * (in + out);
}

double conv_bytes(const Spec & s) {
    const double dc = s.get("d_conv", 4), ch = s.get("ch", 10240), n = s.get("n", 1);
    return 4 * ((dc - 1 + n) * ch + dc * ch + n * ch);
}

// device-to-device copy of 256 MiB: the bandwidth an op could reach at best
double copy_gbps(ggml_backend_t backend, int reps) {
    const int64_t ne = 64ll << 20;
    ggml_init_params p = { 4 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    const ggml_context_ptr owned(ggml_init(p));
    ggml_context * ctx = owned.get();
    ggml_tensor * a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, ne);
    ggml_tensor * b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, ne);
    const ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx, backend));
    ggml_backend_buffer_clear(buf.get(), 0);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, a, b));
    std::vector<double> us;
    for (int i = 0; i < reps + 2; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(backend, gf);
        ggml_backend_synchronize(backend);
        const auto t1 = std::chrono::steady_clock::now();
        if (i >= 2) {
            us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
    }
    return 2.0 * ne * 4 / (median(us) * 1e3);
}

int cmd_bench(const std::string & backend_name, int n_threads, int reps, const std::vector<int64_t> & ns) {
    const ggml_backend_ptr owned_backend = make_backend(backend_name, n_threads);
    ggml_backend_t backend = owned_backend.get();
    const int copies = backend_name == "cuda" ? 8 : 1;

    const double ceiling = copy_gbps(backend, reps);
    printf("backend %s: 27B DeltaNet shapes (S 128, H_k 16, H_v 48; conv d_conv 4 x 10240 channels)\n",
           ggml_backend_name(backend));
    printf("copy bandwidth ceiling (256 MiB device copy): %.0f GB/s; times: median of %d reps, %d op instances per graph\n\n",
           ceiling, reps, copies);
    printf("| N | op | parents | us | x stock K=1 | x stock K=N | MB moved | GB/s | %% of copy |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");

    for (int64_t n : ns) {
        Spec s;
        s.v = { { "S", 128 }, { "H_k", 16 }, { "H_v", 48 }, { "n", n }, { "d_conv", 4 }, { "ch", 10240 } };
        double stock1 = 0, stockN = 0;
        auto ratio = [](double us, double base, char (&buf)[16]) {
            snprintf(buf, sizeof(buf), base > 0 ? "%.2f" : "-", us / base);
            return buf;
        };
        auto row = [&](const char * label, const char * parents, double us, double bytes) {
            const double gbps = bytes / (us * 1e3);
            char r1[16], rN[16];
            printf("| %lld | %s | %s | %.1f | %s | %s | %.1f | %.0f | %.0f%% |\n", (long long) n, label, parents, us,
                   ratio(us, stock1, r1), ratio(us, stockN, rN), bytes / 1e6, gbps, 100.0 * gbps / ceiling);
        };
        for (const bool chain : { true, false }) {
            if (!chain && n < 3) {
                continue;
            }
            const char * shape = chain ? "chain" : "tree";
            const std::vector<int32_t> par = bench_tree(n, chain);
            Inputs in(16);
            s.op = "gdn_tree";
            GdnInputs gi = gdn_inputs(in, s, "", par);
            in.upload(backend);
            if (chain) {
                s.op = "gdn_chain"; s.v["K"] = 1;
                stock1 = time_op(backend, s, &gi, nullptr, copies, reps);
                row("gated_delta_net K=1", "-", stock1, gdn_bytes(s, 1));
                s.v["K"] = n;
                stockN = time_op(backend, s, &gi, nullptr, copies, reps);
                row("gated_delta_net K=N", "-", stockN, gdn_bytes(s, n));
            }
            s.op = "gdn_tree";
            row("gated_delta_net_tree", shape, time_op(backend, s, &gi, nullptr, copies, reps), gdn_bytes(s, n));
            // as the engine runs it: only the states a branch reads back are stored
            int64_t read_back = 0;
            for (int64_t t = 0; t < n; ++t) {
                bool later = false;
                for (int64_t u = t + 2; u < n; ++u) later |= par[(size_t) u] == t;
                read_back += later;
            }
            s.v["branch_states_only"] = 1;
            row("gated_delta_net_tree, read-back states", shape, time_op(backend, s, &gi, nullptr, copies, reps),
                gdn_bytes(s, read_back));
            s.v.erase("branch_states_only");
        }
        stock1 = stockN = 0;
        for (const bool chain : { true, false }) {
            if (!chain && n < 3) {
                continue;
            }
            const std::vector<int32_t> par = bench_tree(n, chain);
            Inputs in(8);
            ConvInputs ci = conv_inputs(in, s, "", par);
            in.upload(backend);
            if (chain) {
                s.op = "conv_chain";
                stock1 = time_op(backend, s, nullptr, &ci, copies, reps);
                row("ssm_conv", "-", stock1, conv_bytes(s));
            }
            s.op = "conv_tree";
            row("ssm_conv_tree", chain ? "chain" : "tree", time_op(backend, s, nullptr, &ci, copies, reps), conv_bytes(s));
        }
    }
    return 0;
}

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

int usage() {
    fprintf(stderr,
        "usage: tree_ops_check run DIR [--backend cpu|cuda] [--threads N]\n"
        "       tree_ops_check bench [--backend cuda|cpu] [--threads N] [--reps R] [--ns 1,8,16,23,32]\n");
    return 2;
}

} // namespace

int main(int argc, char ** argv) {
    if (argc < 2) {
        return usage();
    }
    ggml_log_set(quiet_log, nullptr);
    const std::string cmd = argv[1];
    std::string dir, backend = cmd == "bench" ? "cuda" : "cpu";
    int n_threads = 2, reps = 20;
    std::vector<int64_t> ns = { 1, 8, 16, 23, 32 };
    try {
        for (int i = 2; i < argc; ++i) {
            const std::string a = argv[i];
            const bool has_val = i + 1 < argc;
            if (a == "--backend" && has_val) {
                backend = argv[++i];
            } else if (a == "--threads" && has_val) {
                n_threads = std::max(1, atoi(argv[++i]));
            } else if (a == "--reps" && has_val) {
                reps = std::max(1, atoi(argv[++i]));
            } else if (a == "--ns" && has_val) {
                ns.clear();
                std::stringstream ss(argv[++i]);
                for (std::string tok; std::getline(ss, tok, ',');) {
                    ns.push_back(std::max(1ll, std::stoll(tok)));
                }
            } else if (cmd == "run" && dir.empty() && a.rfind("--", 0) != 0) {
                dir = a;
            } else {
                return usage();
            }
        }
        if (cmd == "run" && !dir.empty()) {
            return cmd_run(dir, backend, n_threads);
        }
        if (cmd == "bench") {
            return cmd_bench(backend, n_threads, reps, ns);
        }
        return usage();
    } catch (const std::exception & e) {
        fprintf(stderr, "tree_ops_check: %s\n", e.what());
        return 1;
    }
}
