// attn_check: the batch-invariant flash attention of patch 0009 at the target's shapes (27B: head size
// 256, 24 query heads on 4 KV heads; and two small ones), for every cache type pair it takes.
//   attn_check          every check below; one line per case; exit 1 if any fails
//   attn_check bench    also times one call (1 query, a 23-node tree, a 512-query prefill tile) at
//                       several depths, invariant mode vs ggml's own kernels
//   attn_check time     only those timings, no checks (an A/B of settings the checks passed with)
//   attn_check profile  only runs the invariant kernels at the 27B shape (1 query, a 23-node tree and a
//                       512-query tile at 8K, F16; 1 query and a tree at 32K and 128K, Q4_0), for a profiler
//                       (ncu -k regex:fattn_invariant)
//   attn_check profile_ggml  only runs ggml's own kernels on the 23-node tree at 128K (F16, then Q4_0), the design the
//                       invariant kernel is measured against (ncu -k regex:flash_attn)
// Checks, all bit for bit except the last:
//   tree == AR     each node of a random 23-node tree (ancestors at scattered slots, siblings masked)
//                  equals one query whose path sits in consecutive slots (the AR step of that node);
//   prefill        each query of a causal 300-query batch equals the query alone, and the key length
//                  padded by masked rows changes nothing;
//   vs CPU         the result is within rounding of ggml's CPU flash attention.
// The checks run with GGML_CUDA_INVARIANT_WALK_BLOCKS=32 (unless set): a grid of at least 32 one-chunk blocks
// walks segments of chunks (the way long prompts and deep trees run), so the trees and prefill batches walk
// while the shallower single queries they are compared with do not (the deeper ones walk too; then a tree
// node's scattered chunk is chained by the merge, its AR step's by the walking block). Timings: default rule.
#include "compute_once.hpp"
#include "ggml-cpu.h"
#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cuda.h"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

struct Shape {
    int D, H, Hkv;
};

// One attention problem: K/V rows by slot (n_kv slots, all KV heads) and queries with their mask rows.
struct Problem {
    int n_kv = 0, n_q = 0;
    std::vector<float> k, v;     // [n_kv][Hkv][D]
    std::vector<float> q;        // [n_q][H][D]
    std::vector<uint16_t> mask;  // [n_q][n_kv] f16 bits: 0 visible, -inf hidden
};

const uint16_t kVisible = ggml_fp32_to_fp16(0.0f), kHidden = ggml_fp32_to_fp16(-INFINITY);

// out [n_q][H][D]
// With `us`, the graph holds kCopies of the op and *us is the median time of one over `reps` runs.
constexpr int kCopies = 10;
std::vector<float> attend(ggml_backend_t backend, const Shape & s, ggml_type tk, ggml_type tv, const Problem & p,
                          int reps = 1, double * us = nullptr) {
    ggml_init_params ip = {ggml_tensor_overhead() * (16 + kCopies) + 2 * ggml_graph_overhead(), nullptr, true};
    const ggml_context_ptr owned(ggml_init(ip));
    ggml_context * ctx = owned.get();
    ggml_tensor * kf = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, s.D, s.Hkv, p.n_kv);
    ggml_tensor * vf = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, s.D, s.Hkv, p.n_kv);
    ggml_tensor * kc = ggml_new_tensor_3d(ctx, tk, s.D, s.Hkv, p.n_kv);
    ggml_tensor * vc = ggml_new_tensor_3d(ctx, tv, s.D, s.Hkv, p.n_kv);
    ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, s.D, s.H, p.n_q);
    ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, p.n_kv, p.n_q);
    // the cache as the engine holds it: rows of all KV heads, viewed per head
    ggml_cgraph * fill = ggml_new_graph(ctx);
    ggml_tensor * kcpy = ggml_cpy(ctx, kf, kc), * vcpy = ggml_cpy(ctx, vf, vc);
    ggml_build_forward_expand(fill, kcpy);
    ggml_build_forward_expand(fill, vcpy);
    ggml_tensor * kv_k = ggml_view_3d(ctx, kc, s.D, p.n_kv, s.Hkv, kc->nb[2], kc->nb[1], 0);
    ggml_tensor * kv_v = ggml_view_3d(ctx, vc, s.D, p.n_kv, s.Hkv, vc->nb[2], vc->nb[1], 0);
    ggml_tensor * qp = ggml_permute(ctx, q, 0, 2, 1, 3);  // [D, n_q, H]
    ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_tensor * o = nullptr;
    for (int c = 0; c < (us ? kCopies : 1); ++c) {
        o = ggml_flash_attn_ext(ctx, qp, kv_k, kv_v, mask, 1.0f / std::sqrt(float(s.D)), 0.0f, 0.0f);
        ggml_build_forward_expand(g, o);
    }
    const ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx, backend));
    ggml_backend_tensor_set(kf, p.k.data(), 0, ggml_nbytes(kf));
    ggml_backend_tensor_set(vf, p.v.data(), 0, ggml_nbytes(vf));
    ggml_backend_tensor_set(q, p.q.data(), 0, ggml_nbytes(q));
    ggml_backend_tensor_set(mask, p.mask.data(), 0, ggml_nbytes(mask));
    if (ggml_backend_graph_compute(backend, fill) != GGML_STATUS_SUCCESS) std::exit(1);
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        if (ggml_backend_graph_compute(backend, g) != GGML_STATUS_SUCCESS) {
            std::fprintf(stderr, "attn_check: compute failed on %s\n", ggml_backend_name(backend));
            std::exit(1);
        }
        ggml_backend_synchronize(backend);
        times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    if (us) {
        std::sort(times.begin(), times.end());
        *us = times[times.size() / 2] / kCopies;
    }
    std::vector<float> out(size_t(p.n_q) * s.H * s.D);
    ggml_backend_tensor_get(o, out.data(), 0, ggml_nbytes(o));  // [D, H, n_q]
    return out;
}

void fill_normal(std::vector<float> & x, std::mt19937 & rng, float sd) {
    std::normal_distribution<float> nd(0.0f, sd);
    for (float & e : x) e = nd(rng);
}

// unit-normal K, V and queries; every slot hidden
Problem random_problem(const Shape & s, int n_q, int n_kv, std::mt19937 & rng) {
    Problem p;
    p.n_kv = n_kv;
    p.n_q = n_q;
    p.k.resize(size_t(n_kv) * s.Hkv * s.D);
    p.v.resize(p.k.size());
    p.q.resize(size_t(n_q) * s.H * s.D);
    fill_normal(p.k, rng, 1.0f);
    fill_normal(p.v, rng, 1.0f);
    fill_normal(p.q, rng, 1.0f);
    p.mask.assign(size_t(n_q) * n_kv, kHidden);
    return p;
}

// a committed prefix of n_past slots, then a random tree: node i's parent is a node before it (or the
// prefix); its slot is n_past + i; masked slots follow up to n_kv
Problem tree_problem(const Shape & s, int n_past, int n_nodes, int n_kv, std::mt19937 & rng,
                     std::vector<std::vector<int>> & paths) {
    Problem p = random_problem(s, n_nodes, n_kv, rng);
    paths.assign(size_t(n_nodes), {});
    for (int i = 0; i < n_nodes; ++i) {
        const int parent = i == 0 ? -1 : int(rng() % uint32_t(i + 1)) - 1;  // -1: the prefix
        if (parent >= 0) paths[size_t(i)] = paths[size_t(parent)];
        paths[size_t(i)].push_back(i);
        for (int r = 0; r < n_past; ++r) p.mask[size_t(i) * n_kv + r] = kVisible;
        for (int a : paths[size_t(i)]) p.mask[size_t(i) * n_kv + n_past + a] = kVisible;
    }
    return p;
}

// node i's AR step: the prefix, then its path's rows in consecutive slots, one query
Problem ar_problem(const Shape & s, const Problem & tree, int n_past, const std::vector<int> & path, int node,
                   int n_kv) {
    Problem p;
    p.n_kv = n_kv;
    p.n_q = 1;
    const size_t row = size_t(s.Hkv) * s.D;
    p.k.assign(size_t(n_kv) * row, 0.5f);  // masked filler
    p.v.assign(p.k.size(), -0.5f);
    std::copy(tree.k.begin(), tree.k.begin() + n_past * row, p.k.begin());
    std::copy(tree.v.begin(), tree.v.begin() + n_past * row, p.v.begin());
    for (size_t j = 0; j < path.size(); ++j) {
        const size_t from = size_t(n_past + path[j]) * row, to = (n_past + j) * row;
        std::copy(tree.k.begin() + from, tree.k.begin() + from + row, p.k.begin() + to);
        std::copy(tree.v.begin() + from, tree.v.begin() + from + row, p.v.begin() + to);
    }
    const size_t qrow = size_t(s.H) * s.D;
    p.q.assign(tree.q.begin() + node * qrow, tree.q.begin() + (node + 1) * qrow);
    p.mask.assign(size_t(n_kv), kHidden);
    for (size_t r = 0; r < n_past + path.size(); ++r) p.mask[r] = kVisible;
    return p;
}

// queries at positions n_past .. n_past + n_q - 1, each seeing the slots up to its own
Problem prefill_problem(const Shape & s, int n_past, int n_q, int n_kv, std::mt19937 & rng) {
    Problem p = random_problem(s, n_q, n_kv, rng);
    for (int i = 0; i < n_q; ++i) {
        for (int r = 0; r <= n_past + i; ++r) p.mask[size_t(i) * n_kv + r] = kVisible;
    }
    return p;
}

Problem one_query(const Shape & s, const Problem & p, int i, int n_kv) {
    Problem one;
    one.n_kv = n_kv;
    one.n_q = 1;
    const size_t row = size_t(s.Hkv) * s.D, qrow = size_t(s.H) * s.D;
    one.k.assign(size_t(n_kv) * row, 0.25f);
    one.v.assign(one.k.size(), 0.25f);
    const int n = std::min(n_kv, p.n_kv);
    std::copy(p.k.begin(), p.k.begin() + n * row, one.k.begin());
    std::copy(p.v.begin(), p.v.begin() + n * row, one.v.begin());
    one.q.assign(p.q.begin() + i * qrow, p.q.begin() + (i + 1) * qrow);
    one.mask.assign(size_t(n_kv), kHidden);
    for (int r = 0; r < n; ++r) one.mask[size_t(r)] = p.mask[size_t(i) * p.n_kv + r];
    return one;
}

bool same_bits(const float * a, const float * b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

double max_abs_diff(const std::vector<float> & a, const std::vector<float> & b) {
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
    return m;
}

// f16-class error bound for the attention of unit-variance values (the K/V types round further)
double tolerance(ggml_type tk, ggml_type tv) {
    auto t = [](ggml_type x) { return x == GGML_TYPE_Q4_0 ? 0.1 : x == GGML_TYPE_Q8_0 ? 0.03 : 0.01; };
    return t(tk) + t(tv);
}

}  // namespace

int main(int argc, char ** argv) {
#ifndef LUCEBOX_WITH_CUDA
    (void) argc;
    (void) argv;
    std::fprintf(stderr, "attn_check: this build has no CUDA (configure with -DLUCEBOX_CUDA=ON)\n");
    return 2;
#else
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout
    const bool time_only = argc > 1 && std::strcmp(argv[1], "time") == 0;
    const bool bench = time_only || (argc > 1 && std::strcmp(argv[1], "bench") == 0);
    const bool profile = argc > 1 && std::strcmp(argv[1], "profile") == 0;
    const CpuAndCuda backends = cpu_and_cuda("attn_check");
    ggml_backend_t cpu = backends.cpu.get(), cuda = backends.cuda.get();
    ggml_backend_cpu_set_use_ref(cpu, true);  // the engine's CPU path: no tiled / split-KV attention
    ggml_backend_cuda_set_batch_invariant(true);
    std::mt19937 rng(7);
    if (profile) {
        const Shape s = {256, 24, 4};
        std::vector<std::vector<int>> paths;
        const Problem tree = tree_problem(s, 8192 - 23, 23, 8192, rng, paths);
        const Problem pre = prefill_problem(s, 8192 - 512, 512, 8192, rng);
        for (const Problem * p : {&tree, &pre}) attend(cuda, s, GGML_TYPE_F16, GGML_TYPE_F16, *p);
        attend(cuda, s, GGML_TYPE_F16, GGML_TYPE_F16, one_query(s, tree, 22, 8192));
        // at depth, q4_0 (the long-context cache type)
        for (int depth : {32768, 131072}) {
            const Problem deep = tree_problem(s, depth - 23, 23, depth, rng, paths);
            attend(cuda, s, GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, deep);
            attend(cuda, s, GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, one_query(s, deep, 22, depth));
        }
        return 0;
    }
    if (argc > 1 && std::strcmp(argv[1], "profile_ggml") == 0) {
        ggml_backend_cuda_set_batch_invariant(false);
        const Shape s = {256, 24, 4};
        std::vector<std::vector<int>> paths;
        const Problem deep = tree_problem(s, 131072 - 23, 23, 131072, rng, paths);
        for (ggml_type t : {GGML_TYPE_F16, GGML_TYPE_Q4_0}) attend(cuda, s, t, t, deep);
        return 0;
    }
    const bool walk_set = std::getenv("GGML_CUDA_INVARIANT_WALK_BLOCKS") != nullptr;
    if (!walk_set) setenv("GGML_CUDA_INVARIANT_WALK_BLOCKS", "32", 1);
    int bad = 0;
    // the 27B's shape, and small ones: D = 64 (the tiny test models') and D = 32, where the tensor-core block's
    // warps split the m-tiles between them (a code path of its own)
    const Shape shapes[] = {{256, 24, 4}, {64, 4, 2}, {32, 4, 2}};
    const std::pair<ggml_type, ggml_type> kv_types[] = {
        {GGML_TYPE_F16, GGML_TYPE_F16},   {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0}, {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0},
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0}, {GGML_TYPE_F16, GGML_TYPE_Q8_0},  {GGML_TYPE_F32, GGML_TYPE_F32},
        {GGML_TYPE_BF16, GGML_TYPE_BF16}};
    for (const Shape & s : shapes) {
        if (time_only) break;
        for (const auto & [tk, tv] : kv_types) {
            const char * names = ggml_type_name(tk);
            // tree == AR, prefixes that end mid-chunk and on a chunk boundary, one whose segment 2 holds dense
            // chunks and then the tree's scattered ranks, and one whose nodes lie on both sides of 4,096 visible rows
            // (the Hopper path's segment length doubles there: two classes of rows in one block)
            for (int n_past : {700, 1024, 2600, 4090}) {
                std::vector<std::vector<int>> paths;
                const int n_kv = n_past + 64;
                Problem tree = tree_problem(s, n_past, 23, n_kv, rng, paths);
                const std::vector<float> got = attend(cuda, s, tk, tv, tree);
                int off = 0;
                for (int i = 0; i < tree.n_q; ++i) {
                    const Problem ar = ar_problem(s, tree, n_past, paths[size_t(i)], i, n_kv + 256);
                    const std::vector<float> one = attend(cuda, s, tk, tv, ar);
                    off += !same_bits(one.data(), got.data() + size_t(i) * s.H * s.D, one.size());
                }
                const double err = max_abs_diff(got, attend(cpu, s, tk, tv, tree));
                const bool ok = off == 0 && err < tolerance(tk, tv);
                bad += !ok;
                std::printf("%-4s D=%d H=%d/%d %-5s/%-5s tree(23) at %d == AR: %d of 23 differ; vs CPU %.2e  %s\n",
                            ok ? "ok" : "BAD", s.D, s.H, s.Hkv, names, ggml_type_name(tv), n_past, off, err,
                            ok ? "" : "<--");
            }
            // prefill: each query alone, and the key range padded (keys in one segment, and in two; and queries on
            // both sides of 4,096 visible rows)
            for (int n_past : {200, 1500, 3900}) {
                const int n_q = 300, n_kv = n_past + n_q;
                Problem pre = prefill_problem(s, n_past, n_q, n_kv, rng);
                const std::vector<float> got = attend(cuda, s, tk, tv, pre);
                int off = 0;
                for (int i = 0; i < n_q; i += 7) {
                    const std::vector<float> one = attend(cuda, s, tk, tv, one_query(s, pre, i, n_kv + 300));
                    off += !same_bits(one.data(), got.data() + size_t(i) * s.H * s.D, one.size());
                }
                const double err = max_abs_diff(got, attend(cpu, s, tk, tv, pre));
                const bool ok = off == 0 && err < tolerance(tk, tv);
                bad += !ok;
                std::printf("%-4s D=%d H=%d/%d %-5s/%-5s prefill(300) at %d == one query: %d of %d differ; "
                            "vs CPU %.2e  %s\n",
                            ok ? "ok" : "BAD", s.D, s.H, s.Hkv, names, ggml_type_name(tv), n_past, off, (n_q + 6) / 7,
                            err, ok ? "" : "<--");
            }
        }
    }
    if (!walk_set) unsetenv("GGML_CUDA_INVARIANT_WALK_BLOCKS");
    if (bench) {
        const Shape s = shapes[0];
        // its own backend: ggml-cuda replays a captured CUDA graph when a graph's nodes look unchanged,
        // so one backend would time the other mode's kernels
        const ggml_backend_ptr fast_owned(ggml_backend_cuda_init(0));
        ggml_backend_t cuda_fast = fast_owned.get();
        std::printf("\n| K/V | depth | queries | invariant us | ggml us | ratio |\n|---|---|---|---|---|---|\n");
        for (int depth : {4096, 8192, 32768, 131072}) {
            std::vector<std::vector<int>> paths;
            const Problem tree = tree_problem(s, depth - 23, 23, depth, rng, paths);
            const Problem one = one_query(s, tree, 22, depth);
            const Problem pre = depth <= 32768 ? prefill_problem(s, depth - 512, 512, depth, rng) : Problem{};
            for (ggml_type t : {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0}) {
                for (const Problem * p : {&one, &tree, &pre}) {
                    if (p->n_q == 0) continue;
                    double inv = 0, fast = 0;
                    ggml_backend_cuda_set_batch_invariant(true);
                    attend(cuda, s, t, t, *p, 20, &inv);
                    ggml_backend_cuda_set_batch_invariant(false);
                    attend(cuda_fast, s, t, t, *p, 20, &fast);
                    ggml_backend_cuda_set_batch_invariant(true);
                    std::printf("| %s | %d | %d | %.1f | %.1f | %.2f |\n", ggml_type_name(t), depth, p->n_q, inv, fast,
                                inv / fast);
                    std::fflush(stdout);
                }
            }
        }
    }
    std::printf("%s\n", time_only ? "attn_check: timings only, no checks"
                                   : bad ? "attn_check: FAILED" : "attn_check: all ok");
    return bad ? 1 : 0;
#endif
}
