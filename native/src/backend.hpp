// backend.hpp: the one ggml backend the engine runs on (CPU or one CUDA device) and log routing.
//
// All weights, caches and compute buffers live on this backend: there is no scheduler and no
// CPU fallback, so every graph is checked op by op (check_graph_supported) before its first run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"

namespace lb {

struct Backend {
    ggml_backend_ptr handle;
    int32_t device = -1;   // -1: CPU, else the CUDA device index
    int32_t n_threads = 0; // CPU threads (CPU backend only)

    ggml_backend_t get() const { return handle.get(); }
    bool is_cpu() const { return device < 0; }
    std::string name() const;
};

// Creates the backend; throws Error(LB_E_UNSUPPORTED) for a CUDA device this build or machine
// does not have, Error(LB_E_BACKEND) when initialisation fails.
void backend_init(Backend & b, int32_t device, int32_t n_threads, bool batch_invariant);

// While alive, lets ggml-cuda pick its faster batch-dependent kernels (lb_params.batch_invariant off).
// For a graph whose shapes never differ between the runs that must agree bit for bit (the draft's
// proposal: always one block over the same context): its kernels are then chosen by those same shapes,
// so it stays deterministic. A no-op on the CPU and when invariance is off already.
class BatchDependentKernels {
public:
    BatchDependentKernels();
    ~BatchDependentKernels();
    BatchDependentKernels(const BatchDependentKernels &) = delete;
    BatchDependentKernels & operator=(const BatchDependentKernels &) = delete;

private:
    bool was_invariant_ = false;
};

// Bounds of lb_params.n_threads on the CPU backend: ggml's thread pool holds at most
// GGML_MAX_N_THREADS, and far more threads than cores only spin (20000 hang, 100000 crash).
int32_t max_cpu_threads();

// Allocates every tensor of ctx in one buffer on `backend`. A failed host or device allocation
// (cudaMalloc included) throws Error(LB_E_OOM) naming the size, `what`, and `fix`.
ggml_backend_buffer_ptr alloc_tensors_or_throw(ggml_context * ctx, ggml_backend_t backend, const std::string & what,
                                               const std::string & fix);
// ggml_gallocr_alloc_graph, with the same LB_E_OOM message (size included) when it fails.
void alloc_graph_or_throw(ggml_gallocr_t galloc, ggml_cgraph * gf, ggml_backend_t backend, const std::string & what,
                          const std::string & fix);

// Memory planning. mark_placed: gives every tensor of ctx that has no memory a stand-in address, so
// a graph allocator treats it as placed elsewhere (weights, caches) and sizes only the graph's own
// tensors; the address is never read (plan_graph_bytes plans offsets only). plan_graph_bytes: the
// compute buffer ggml_gallocr would allocate for gf in buffers of `buft`.
void mark_placed(ggml_context * ctx);
size_t plan_graph_bytes(ggml_cgraph * gf, ggml_backend_buffer_type_t buft);

// Copies `bytes` of host memory into graph input t, from its start, on the backend's
// stream ahead of the graph that reads it, without waiting for the copy: ggml_backend_tensor_set waits for each one
// (a copy and a stream sync of its own, several a decode step). A pageable source may change as soon as this returns:
// the driver stages it first (CUDA's API synchronization rules); a pinned one is read when the copy runs, so it must
// not change before the graph's wait (every engine call ends with one but lb_commit, whose sources are pageable).
// Inputs a graph does not use have no buffer and are skipped; a tensor outside the backend's own buffers, and the CPU
// backend, get ggml_backend_tensor_set.
void set_input(ggml_backend_t backend, ggml_tensor * t, const void * data, size_t bytes);
// set_input of n_copies runs of `size` bytes, stride_data apart in host memory and stride_tensor apart in t from byte
// `offset` (ggml_backend_tensor_set_2d's arguments).
void set_input_2d(ggml_backend_t backend, ggml_tensor * t, const void * data, size_t offset, size_t size,
                  size_t n_copies, size_t stride_tensor, size_t stride_data);

// Tags a graph that will be computed again unchanged (same tensors, same addresses; only input
// values differ), so ggml-cuda replays its captured CUDA graph without re-checking every node
// (~1 MB of node properties per 64-layer decode step). Needs ggml's internal ggml-impl.h on the
// include path (ggml's src/ folder); without it this is a no-op and ggml-cuda checks as usual.
void mark_graph_reusable(ggml_cgraph * gf);

// Throws Error(LB_E_UNSUPPORTED) naming the first node the backend cannot run.
void check_graph_supported(ggml_backend_t backend, ggml_cgraph * gf, const char * what);

// Stores a weight matrix (placed and filled) in the order the GPU's product kernel streams it where the backend has
// one (CUDA: Q4_K / Q6_K, patch 0049; read faster, the same bits with batch-invariant kernels). Afterwards its only
// use must be as a whole mat-mul's weights. Whether it did (not on the CPU, not other types, not without scratch
// memory for the copy).
bool store_for_products(ggml_tensor * w);
// The same for a draft's Q8_0 matrix (CUDA: q8s, patch 0076, 8-bit integer MMAs; each column the same bits at any
// column count), where ggml has it on (GGML_CUDA_Q8S=1). Its only uses afterwards: whole mat-muls by it or by a
// range of its rows in whole 16-row strips (StackedMatrices' members).
bool store_for_draft_products(ggml_tensor * w);

// A graph built once and computed again while its shape holds, with its own compute buffer: reusing
// the graph object keeps tensor addresses (and ggml-cuda's captured CUDA graph) stable across calls,
// so a call only uploads its inputs. The one graph-reuse mechanism of the target (engine.hpp) and the
// draft (draft_model.hpp). Graph: a struct with `GraphMeta meta` (and `shape` for graph_for).
template <class Graph>
struct GraphSlot {
    std::unique_ptr<Graph> graph;
    ggml_gallocr_ptr galloc;  // grows to the largest graph the slot has held; never shrinks
    int32_t builds = 0;       // graphs installed so far (tests check that calls reuse them)
};

// Makes a freshly built graph the slot's: checks every op runs on the backend, marks the graph
// reusable and places its tensors in the slot's compute buffer (LB_E_OOM names `fix`), or in `shared`'s: an
// allocator whose graphs never run at once (the caller re-installs the others if its buffer grew).
template <class Graph>
Graph & install_graph(ggml_backend_t backend, GraphSlot<Graph> & slot, std::unique_ptr<Graph> g, const char * what,
                      const std::string & fix, ggml_gallocr_t shared = nullptr) {
    check_graph_supported(backend, g->meta.gf, what);
    mark_graph_reusable(g->meta.gf);
    if (!shared && !slot.galloc) slot.galloc.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend)));
    alloc_graph_or_throw(shared ? shared : slot.galloc.get(), g->meta.gf, backend, what, fix);
    slot.graph = std::move(g);
    ++slot.builds;
    return *slot.graph;
}

// The slot's graph when it was built for `shape` (compared with Graph::shape), else the graph
// build() returns (a std::unique_ptr<Graph>), installed in its place.
template <class Graph, class Shape, class Build>
Graph & graph_for(ggml_backend_t backend, GraphSlot<Graph> & slot, const Shape & shape, Build && build,
                  const char * what, const std::string & fix) {
    if (slot.graph && slot.graph->shape == shape) return *slot.graph;
    slot.graph.reset();  // its tensors' metadata before the next graph's
    return install_graph(backend, slot, build(), what, fix);
}

// Routes ggml's log through lucebox's level (LB_LOG_*); process-wide, last call wins.
void set_log_level(int32_t level);
int32_t log_level();

// printf-style message to stderr when level <= the current log level.
void log_msg(int32_t level, const char * fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace lb
