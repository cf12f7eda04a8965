// backend.cpp: backend creation, op-support checks and log routing.
#include "backend.hpp"

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <thread>

#include "error.hpp"
#include "ggml-cpu.h"
#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cuda.h"
#endif
#if __has_include("ggml-impl.h")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "ggml-impl.h"  // ggml_cgraph::uid; ggml has no public setter for it
#pragma GCC diagnostic pop
#define LUCEBOX_HAVE_GRAPH_UID 1
#endif

namespace lb {

namespace {

std::atomic<int32_t> g_log_level{LB_LOG_ERROR};

void ggml_log_to_lucebox(enum ggml_log_level level, const char * text, void *) {
    int32_t lb_level = LB_LOG_DEBUG;
    switch (level) {
        case GGML_LOG_LEVEL_ERROR: lb_level = LB_LOG_ERROR; break;
        case GGML_LOG_LEVEL_WARN:  lb_level = LB_LOG_INFO; break;
        case GGML_LOG_LEVEL_INFO:  lb_level = LB_LOG_DEBUG; break;
        case GGML_LOG_LEVEL_CONT:  lb_level = LB_LOG_DEBUG; break;
        default: break;
    }
    if (lb_level <= g_log_level.load()) {
        fputs(text, stderr);
    }
}

// Routed when the library loads, so ggml's start-up messages (the CUDA device listing) follow the
// log level too, also in processes that never call lb_load (lb_device_count, the native tools).
[[maybe_unused]] const bool g_log_routed = (ggml_log_set(ggml_log_to_lucebox, nullptr), true);

}  // namespace

void set_log_level(int32_t level) {
    g_log_level.store(level);
    ggml_log_set(ggml_log_to_lucebox, nullptr);
}

int32_t log_level() { return g_log_level.load(); }

void log_msg(int32_t level, const char * fmt, ...) {
    if (level > g_log_level.load()) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("lucebox: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

std::string Backend::name() const {
    return handle ? ggml_backend_name(handle.get()) : "none";
}

int32_t max_cpu_threads() {
    const unsigned hw = std::thread::hardware_concurrency();
    return std::min<int32_t>(GGML_MAX_N_THREADS, hw > 0 ? int32_t(4 * hw) : GGML_MAX_N_THREADS);
}

namespace {

std::string mib(size_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

}  // namespace

ggml_backend_buffer_ptr alloc_tensors_or_throw(ggml_context * ctx, ggml_backend_t backend, const std::string & what,
                                               const std::string & fix) {
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(backend);
    ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft));
    if (!buf) {
        const size_t need = ggml_backend_alloc_ctx_tensors_from_buft_size(ctx, buft);
        throw Error(LB_E_OOM, "cannot allocate " + mib(need) + " for the " + what + " on " + ggml_backend_name(backend) +
                                  "; " + fix);
    }
    return buf;
}

void alloc_graph_or_throw(ggml_gallocr_t galloc, ggml_cgraph * gf, ggml_backend_t backend, const std::string & what,
                          const std::string & fix) {
    check(galloc != nullptr, LB_E_OOM, "cannot create the graph allocator for the " + what);
    if (ggml_gallocr_alloc_graph(galloc, gf)) return;
    size_t need = 0;  // the buffer the failed attempt asked for (one buffer type: one size)
    ggml_gallocr_reserve_n_size(galloc, gf, nullptr, nullptr, &need);
    throw Error(LB_E_OOM, "cannot allocate " + mib(need) + " of compute buffer for the " + what + " on " +
                              ggml_backend_name(backend) + "; " + fix);
}

void mark_placed(ggml_context * ctx) {
    // any non-null, well-aligned address: it only marks the tensor as having memory
    alignas(64) static uint8_t stand_in[64];
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (t->data) continue;
        t->data = t->view_src ? static_cast<uint8_t *>(t->view_src->data ? t->view_src->data : stand_in) + t->view_offs
                              : stand_in;
    }
}

size_t plan_graph_bytes(ggml_cgraph * gf, ggml_backend_buffer_type_t buft) {
    ggml_gallocr_ptr galloc(ggml_gallocr_new(buft));
    check(galloc != nullptr, LB_E_OOM, "cannot create a graph allocator to plan memory");
    size_t bytes = 0;
    ggml_gallocr_reserve_n_size(galloc.get(), gf, nullptr, nullptr, &bytes);
    return bytes;
}

void backend_init(Backend & b, int32_t device, int32_t n_threads, bool batch_invariant) {
    // checked for every device: a bogus value is a mistake even where the CPU threads go unused
    const int32_t most = max_cpu_threads();
    check(n_threads <= most, LB_E_INVALID_ARG,
          "n_threads " + std::to_string(n_threads) + " is more than this machine can use (at most " +
              std::to_string(most) + ", 4 per hardware thread); pass 0 for all cores");
    if (device < 0) {
        b.handle.reset(ggml_backend_cpu_init());
        check(b.handle != nullptr, LB_E_BACKEND, "cannot initialise the ggml CPU backend");
        const unsigned hw = std::thread::hardware_concurrency();
        b.n_threads = n_threads > 0 ? n_threads : int32_t(hw > 0 ? hw : 1);
        ggml_backend_cpu_set_n_threads(b.get(), b.n_threads);
        // Batch-invariant kernels: a token's logits must not depend on how many tokens share its
        // forward (AR step vs verify), or greedy speculative decoding stops being exactly lossless.
        // ggml's tiled / split-KV flash attention paths depend on the batch; the reference one does not.
        ggml_backend_cpu_set_use_ref(b.get(), true);
        b.device = -1;
        return;
    }
#ifdef LUCEBOX_WITH_CUDA
    const int n_dev = ggml_backend_cuda_get_device_count();
    check(device < n_dev, LB_E_UNSUPPORTED,
          "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n_dev) +
              " found); pick device -1 (CPU) or 0.." + std::to_string(n_dev - 1));
    b.handle.reset(ggml_backend_cuda_init(device));
    check(b.handle != nullptr, LB_E_BACKEND, "cannot initialise CUDA device " + std::to_string(device));
    // patch 0009: one kernel path per op whatever the batch (see lb_params.batch_invariant)
    ggml_backend_cuda_set_batch_invariant(batch_invariant);
    b.device = device;
    b.n_threads = n_threads;
#else
    (void) n_threads;
    (void) batch_invariant;
    throw Error(LB_E_UNSUPPORTED, "this liblucebox was built without CUDA; use device -1 (CPU) or rebuild with "
                                  "-DLUCEBOX_CUDA=ON");
#endif
}

BatchDependentKernels::BatchDependentKernels() {
#ifdef LUCEBOX_WITH_CUDA
    was_invariant_ = ggml_backend_cuda_get_batch_invariant();
    ggml_backend_cuda_set_batch_invariant(false);
#endif
}

BatchDependentKernels::~BatchDependentKernels() {
#ifdef LUCEBOX_WITH_CUDA
    ggml_backend_cuda_set_batch_invariant(was_invariant_);
#endif
}

namespace {
// whether t lives in the backend's own buffers, where its queued copies (the *_async setters) may go
bool in_own_buffer(ggml_backend_t backend, const ggml_tensor * t) {
    const ggml_backend_buffer_t buf = t->view_src ? t->view_src->buffer : t->buffer;
    return ggml_backend_buffer_get_type(buf) == ggml_backend_get_default_buffer_type(backend);
}
}  // namespace

void set_input(ggml_backend_t backend, ggml_tensor * t, const void * data, size_t bytes) {
    set_input_2d(backend, t, data, 0, bytes, 1, 0, 0);  // one run: ggml's 2-D setters copy it as their 1-D ones do
}

void set_input_2d(ggml_backend_t backend, ggml_tensor * t, const void * data, size_t offset, size_t size,
                  size_t n_copies, size_t stride_tensor, size_t stride_data) {
    if (!t || !t->buffer) return;
    if (in_own_buffer(backend, t)) {
        ggml_backend_tensor_set_2d_async(backend, t, data, offset, size, n_copies, stride_tensor, stride_data);
    } else {
        ggml_backend_tensor_set_2d(t, data, offset, size, n_copies, stride_tensor, stride_data);
    }
}

void mark_graph_reusable(ggml_cgraph * gf) {
#ifdef LUCEBOX_HAVE_GRAPH_UID
    gf->uid = ggml_graph_next_uid();
#else
    (void) gf;
#endif
}

bool store_for_products(ggml_tensor * w) {
#ifdef LUCEBOX_WITH_CUDA
    return ggml_backend_cuda_lbq_store_by_unit(w);
#else
    (void) w;
    return false;
#endif
}

bool store_for_draft_products(ggml_tensor * w) {
#ifdef LUCEBOX_WITH_CUDA
    return ggml_backend_cuda_q8s_store(w);
#else
    (void) w;
    return false;
#endif
}

void check_graph_supported(ggml_backend_t backend, ggml_cgraph * gf, const char * what) {
    const int n = ggml_graph_n_nodes(gf);
    for (int i = 0; i < n; ++i) {
        ggml_tensor * node = ggml_graph_node(gf, i);
        const ggml_op op = node->op;
        if (op == GGML_OP_NONE || op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE ||
            op == GGML_OP_TRANSPOSE) {
            continue;
        }
        if (!ggml_backend_supports_op(backend, node)) {
            const ggml_tensor * s0 = node->src[0];
            throw Error(LB_E_UNSUPPORTED,
                        std::string(what) + ": " + ggml_backend_name(backend) + " cannot run op " +
                            ggml_op_desc(node) + " on " + (s0 ? ggml_type_name(s0->type) : "-") + " [" +
                            std::to_string(s0 ? s0->ne[0] : 0) + ", " + std::to_string(s0 ? s0->ne[1] : 0) +
                            "] (node " + node->name +
                            "); this model shape or tensor type is not supported on this device");
        }
    }
}

}  // namespace lb
