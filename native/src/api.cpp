// api.cpp: the extern "C" boundary. Every call runs inside guarded(): C++ exceptions become a
// status code plus a thread-local message (lb_last_error), and never cross into the caller.
#include <new>
#include <string>
#include <utility>

#include "engine.hpp"
#include "error.hpp"
#include "load_params.hpp"
#include "memory_plan.hpp"
#include "sample_draw.hpp"
#include "lucebox.h"

namespace {

thread_local std::string t_last_error;

// One line whatever the message quotes (an architecture name, a tensor name, a path from the
// file): control characters become '?'.
int32_t fail(int32_t status, const char * message) {
    t_last_error = message;
    for (char & c : t_last_error) {
        if ((unsigned char) c < 0x20 || c == 0x7f) c = '?';
    }
    return status;
}

template <typename F>
int32_t guarded(F && f) {
    try {
        f();
        return LB_OK;
    } catch (const lb::Error & e) {
        return fail(e.status, e.what());
    } catch (const std::bad_alloc &) {
        return fail(LB_E_OOM, "out of host memory");
    } catch (const std::exception & e) {
        return fail(LB_E_BACKEND, e.what());
    } catch (...) {
        return fail(LB_E_BACKEND, "unknown native error");
    }
}

#define LB_NEED_ENGINE(e, fn) \
    if (!(e)) return fail(LB_E_INVALID_ARG, fn ": engine is NULL (load it with lb_load first)")

// guarded() for a call that reaches device memory: it first waits for the graphs lb_commit left running
// (lb_engine::settle). lb_draft alone does not: its inputs queue after them and its reads wait for its own graph.
template <typename F>
int32_t settled(lb_engine * e, F && f) {
    return guarded([&] {
        e->settle();
        f();
    });
}

// settled() (guarded() for lb_draft) for a call that runs graphs: the engine's clock times it as a call of `kind`
// (lb_call_times_get)
template <typename F>
int32_t timed(lb_engine * e, int32_t kind, F && f) {
    e->call_clock.begin(kind);
    const int32_t st = kind == LB_CALL_DRAFT ? guarded(std::forward<F>(f)) : settled(e, std::forward<F>(f));
    e->call_clock.end(st == LB_OK);
    return st;
}

}  // namespace

extern "C" {

LB_API int32_t lb_abi_version(void) { return LB_ABI_VERSION; }

LB_API const char * lb_last_error(void) { return t_last_error.c_str(); }

LB_API int32_t lb_device_memory(int32_t device, int64_t * free_bytes, int64_t * total_bytes) {
    if (!free_bytes || !total_bytes) return fail(LB_E_INVALID_ARG, "lb_device_memory: outputs must not be NULL");
    return guarded([&] {
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(lb::device_of(device), &free, &total);
        *free_bytes = int64_t(free);
        *total_bytes = int64_t(total);
    });
}

LB_API void lb_params_default(lb_params * p) {
    if (!p) return;
    p->target_path = nullptr;
    p->draft_path = nullptr;
    p->max_ctx = 4096;
    p->type_k = LB_KV_F16;
    p->type_v = LB_KV_F16;
    p->device = -1;
    p->n_threads = 0;
    p->ubatch = 512;
    p->max_tree = 64;
    p->log_level = LB_LOG_ERROR;
    p->batch_invariant = 1;
    p->draft_window = 0;
    p->draft_weights = LB_DRAFT_WEIGHTS_KEEP;
}

LB_API int32_t lb_load(const lb_params * p, lb_engine ** out) {
    if (!out) return fail(LB_E_INVALID_ARG, "lb_load: out must not be NULL");
    *out = nullptr;
    if (!p) return fail(LB_E_INVALID_ARG, "lb_load: params must not be NULL (fill them with lb_params_default)");
    lb_engine * e = nullptr;
    const int32_t st = guarded([&] {
        e = new lb_engine();
        e->load(*p);
    });
    if (st != LB_OK) {
        delete e;
        return st;
    }
    *out = e;
    return LB_OK;
}

LB_API int32_t lb_memory_plan(const lb_params * p, const lb_plan_shape * s, lb_memory * out) {
    if (!p || !s || !out) return fail(LB_E_INVALID_ARG, "lb_memory_plan: params, shape and out must not be NULL");
    return guarded([&] { *out = lb::plan_memory(*p, *s); });
}

LB_API int32_t lb_model_info_get(const lb_engine * e, lb_model_info * out) {
    LB_NEED_ENGINE(e, "lb_model_info_get");
    if (!out) return fail(LB_E_INVALID_ARG, "lb_model_info_get: out must not be NULL");
    return guarded([&] { *out = e->info(); });
}

LB_API int32_t lb_memory_get(const lb_engine * e, lb_memory * out) {
    LB_NEED_ENGINE(e, "lb_memory_get");
    if (!out) return fail(LB_E_INVALID_ARG, "lb_memory_get: out must not be NULL");
    return guarded([&] { *out = e->memory(); });
}

LB_API int32_t lb_reset(lb_engine * e) {
    LB_NEED_ENGINE(e, "lb_reset");
    return settled(e, [&] { e->reset(); });
}

LB_API int32_t lb_prefill(lb_engine * e, const int32_t * toks, int32_t n, int32_t * out_next, float * logits,
                          int64_t logits_cap) {
    LB_NEED_ENGINE(e, "lb_prefill");
    return timed(e, LB_CALL_PREFILL, [&] { e->prefill(toks, n, out_next, logits, logits_cap); });
}

LB_API int32_t lb_draft(lb_engine * e, int32_t last, int32_t top_k, int32_t * ids, float * logp, int64_t cap) {
    LB_NEED_ENGINE(e, "lb_draft");
    return timed(e, LB_CALL_DRAFT, [&] { e->draft_block(last, top_k, ids, logp, cap); });
}

LB_API int32_t lb_verify(lb_engine * e, const int32_t * toks, const int32_t * parents, int32_t n, int32_t * out_argmax,
                         float * logits, int64_t logits_cap) {
    LB_NEED_ENGINE(e, "lb_verify");
    return timed(e, LB_CALL_VERIFY, [&] { e->verify(toks, parents, n, out_argmax, logits, logits_cap); });
}

LB_API int32_t lb_commit(lb_engine * e, const int32_t * path, int32_t n_path) {
    LB_NEED_ENGINE(e, "lb_commit");
    return timed(e, LB_CALL_COMMIT, [&] { e->commit(path, n_path); });
}

LB_API int32_t lb_step(lb_engine * e, int32_t tok, int32_t * out_next) {
    LB_NEED_ENGINE(e, "lb_step");
    return timed(e, LB_CALL_STEP, [&] { e->step(tok, out_next); });
}

LB_API int32_t lb_prefill_sampled(lb_engine * e, const int32_t * toks, int32_t n, int32_t * out_next,
                                  const lb_sampling * s) {
    LB_NEED_ENGINE(e, "lb_prefill_sampled");
    if (!s) return fail(LB_E_INVALID_ARG, "lb_prefill_sampled: sampling must not be NULL (use lb_prefill)");
    return timed(e, LB_CALL_PREFILL, [&] { e->prefill(toks, n, out_next, nullptr, 0, s); });
}

LB_API int32_t lb_verify_sampled(lb_engine * e, const int32_t * toks, const int32_t * parents, int32_t n,
                                 int32_t * out_argmax, const lb_sampling * s) {
    LB_NEED_ENGINE(e, "lb_verify_sampled");
    if (!s) return fail(LB_E_INVALID_ARG, "lb_verify_sampled: sampling must not be NULL (use lb_verify)");
    return timed(e, LB_CALL_VERIFY, [&] { e->verify(toks, parents, n, out_argmax, nullptr, 0, s); });
}

LB_API int32_t lb_step_sampled(lb_engine * e, int32_t tok, int32_t * out_next, const lb_sampling * s) {
    LB_NEED_ENGINE(e, "lb_step_sampled");
    if (!s) return fail(LB_E_INVALID_ARG, "lb_step_sampled: sampling must not be NULL (use lb_step)");
    return timed(e, LB_CALL_STEP, [&] { e->step(tok, out_next, s); });
}

LB_API int32_t lb_processed_row(lb_engine * e, int32_t row, float * out, int64_t cap) {
    LB_NEED_ENGINE(e, "lb_processed_row");
    return settled(e, [&] { e->processed_row(row, out, cap); });
}

LB_API int32_t lb_sampling_draw(const lb_sampling * s, int32_t rows, const int64_t * positions) {
    if (!s || !positions) return fail(LB_E_INVALID_ARG, "lb_sampling_draw: s and positions must not be NULL");
    return guarded([&] {
        lb::check(rows >= 0, LB_E_INVALID_ARG, "lb_sampling_draw: rows = " + std::to_string(rows) + " must be >= 0");
        lb::check_draw(*s, rows);
        lb::Drawer().draw(*s, rows, positions);
    });
}

LB_API int32_t lb_state_size(const lb_engine * e, int64_t * out_bytes) {
    LB_NEED_ENGINE(e, "lb_state_size");
    if (!out_bytes) return fail(LB_E_INVALID_ARG, "lb_state_size: out_bytes must not be NULL");
    return guarded([&] { *out_bytes = int64_t(e->state_size()); });
}

LB_API int32_t lb_state_save(lb_engine * e, void * buf, int64_t cap, int64_t * out_written) {
    LB_NEED_ENGINE(e, "lb_state_save");
    if (!buf || !out_written) return fail(LB_E_INVALID_ARG, "lb_state_save: buf and out_written must not be NULL");
    return settled(e, [&] { *out_written = int64_t(e->state_save(static_cast<uint8_t *>(buf), cap)); });
}

LB_API int32_t lb_state_load(lb_engine * e, const void * buf, int64_t n) {
    LB_NEED_ENGINE(e, "lb_state_load");
    if (!buf) return fail(LB_E_INVALID_ARG, "lb_state_load: buf must not be NULL");
    return settled(e, [&] { e->state_load(static_cast<const uint8_t *>(buf), n); });
}

LB_API int32_t lb_call_times_get(const lb_engine * e, int32_t kind, lb_call_times * out) {
    LB_NEED_ENGINE(e, "lb_call_times_get");
    if (!out) return fail(LB_E_INVALID_ARG, "lb_call_times_get: out must not be NULL");
    if (kind < 0 || kind >= LB_CALL_KINDS) {
        return fail(LB_E_INVALID_ARG, ("lb_call_times_get: kind " + std::to_string(kind) +
                                       " is not an LB_CALL_* (0.." + std::to_string(LB_CALL_KINDS - 1) + ")").c_str());
    }
    *out = e->call_clock.last(kind);
    return LB_OK;
}

LB_API int32_t lb_sync(lb_engine * e) {
    LB_NEED_ENGINE(e, "lb_sync");
    return settled(e, [] {});
}

LB_API void lb_free(lb_engine * e) {
    if (e) settled(e, [] {});  // the buffers go before the graphs lb_commit left running would be done
    delete e;
}

}  // extern "C"
