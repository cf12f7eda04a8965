// sample_graph.cpp: see sample_graph.hpp.
#include "sample_graph.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine.hpp"
#include "error.hpp"
#include "sample_draw.hpp"

namespace lb {

namespace {

constexpr int32_t kMaxPenaltyLastN = 1024;

void check_arg(bool ok, const std::string & message) { check(ok, LB_E_INVALID_ARG, message); }

ggml_tensor * input(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1, const char * name) {
    ggml_tensor * t = ne1 > 0 ? ggml_new_tensor_2d(ctx, type, ne0, ne1) : ggml_new_tensor_1d(ctx, type, ne0);
    ggml_set_name(t, name);
    ggml_set_input(t);
    return t;
}

void output(ggml_cgraph * gf, ggml_tensor * t, const char * name) {
    ggml_set_name(t, name);
    ggml_set_output(t);
    ggml_build_forward_expand(gf, t);
}

}  // namespace

SampleTail build_sample_tail(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * logits, int32_t n_cand,
                             int32_t pen_slots) {
    const int64_t V = logits->ne[0], rows = logits->ne[1];
    SampleTail t;
    t.n_cand = n_cand;
    t.pen_slots = pen_slots;
    t.inv_temp = input(ctx, GGML_TYPE_F32, 1, 0, "inp_inv_temp");

    ggml_tensor * processed = logits;
    if (pen_slots > 0) {
        const int64_t E = int64_t(pen_slots) * rows;
        t.pen_get = input(ctx, GGML_TYPE_I32, E, 0, "inp_pen_get");
        t.pen_set = input(ctx, GGML_TYPE_I64, E, 0, "inp_pen_set");
        t.pen_pos = input(ctx, GGML_TYPE_F32, 1, E, "inp_pen_pos");
        t.pen_neg = input(ctx, GGML_TYPE_F32, 1, E, "inp_pen_neg");
        t.pen_sub = input(ctx, GGML_TYPE_F32, 1, E, "inp_pen_sub");
        ggml_tensor * flat = ggml_reshape_2d(ctx, logits, 1, V * rows);  // one logit per "row"
        ggml_tensor * g = ggml_get_rows(ctx, flat, t.pen_get);            // [1, E]
        // select, not blend: step() is exactly 0 or 1, so each entry is one product, exactly
        ggml_tensor * above = ggml_mul(ctx, ggml_step(ctx, g), ggml_mul(ctx, g, t.pen_pos));
        ggml_tensor * below = ggml_mul(ctx, ggml_step(ctx, ggml_neg(ctx, g)), ggml_mul(ctx, g, t.pen_neg));
        ggml_tensor * p = ggml_sub(ctx, ggml_add(ctx, above, below), t.pen_sub);
        // a copy: the raw logits (and their argmax) stay as they were
        ggml_tensor * scattered = ggml_set_rows(ctx, ggml_dup(ctx, flat), p, t.pen_set);
        processed = ggml_reshape_2d(ctx, scattered, V, rows);
    }
    t.processed = processed;

    t.cand_ids = ggml_top_k(ctx, processed, n_cand);  // [C, rows]
    t.cand_vals = ggml_reshape_2d(ctx, ggml_get_rows(ctx, ggml_reshape_3d(ctx, processed, 1, V, rows), t.cand_ids),
                                  n_cand, rows);
    ggml_tensor * best = ggml_reshape_2d(ctx, ggml_argmax(ctx, t.cand_vals), 1, rows);
    t.row_max = ggml_reshape_2d(ctx, ggml_get_rows(ctx, ggml_reshape_3d(ctx, t.cand_vals, 1, n_cand, rows), best), 1, rows);
    ggml_tensor * scaled = ggml_mul(ctx, ggml_sub(ctx, processed, t.row_max), t.inv_temp);
    t.row_lse = ggml_log(ctx, ggml_sum_rows(ctx, ggml_exp(ctx, scaled)));  // [1, rows]

    if (processed != logits) output(gf, processed, "out_processed");
    output(gf, t.cand_ids, "out_cand_ids");
    output(gf, t.cand_vals, "out_cand_vals");
    output(gf, t.row_max, "out_row_max");
    output(gf, t.row_lse, "out_row_lse");
    return t;
}

int32_t penalty_slots(int32_t penalty_last_n, int32_t n_vocab) { return std::min(penalty_last_n, n_vocab); }

void SampleInputs::check(const lb_sampling & s, int32_t rows, int32_t n_vocab) const {
    const auto finite = [](float x) { return std::isfinite(x); };
    check_draw(s, rows);
    check_arg(finite(s.repeat_penalty) && s.repeat_penalty > 0.0f, "lb_sampling.repeat_penalty must be finite and > 0");
    check_arg(finite(s.presence_penalty) && finite(s.frequency_penalty),
              "lb_sampling.presence_penalty and frequency_penalty must be finite");
    check_arg(s.n_candidates <= n_vocab, "lb_sampling.n_candidates = " + std::to_string(s.n_candidates) +
                                             " must be in [1, n_vocab = " + std::to_string(n_vocab) + "]");
    check_arg(s.penalty_last_n >= 0 && s.penalty_last_n <= kMaxPenaltyLastN,
              "lb_sampling.penalty_last_n = " + std::to_string(s.penalty_last_n) + " must be in [0, " +
                  std::to_string(kMaxPenaltyLastN) + "]");
    if (s.penalty_last_n == 0) return;
    check_arg(s.n_history >= 0 && (s.history || s.n_history == 0),
              "lb_sampling: history must hold n_history = " + std::to_string(s.n_history) + " >= 0 tokens");
    // the windows read at most the last N - 1 history tokens
    for (int64_t i = std::max<int64_t>(0, s.n_history - (s.penalty_last_n - 1)); i < s.n_history; ++i) {
        if (s.history[i] < 0 || s.history[i] >= n_vocab) {
            throw Error(LB_E_INVALID_ARG, "lb_sampling.history[" + std::to_string(i) + "] = " +
                                              std::to_string(s.history[i]) + " is outside the vocabulary [0, " +
                                              std::to_string(n_vocab) + ")");
        }
    }
}

void SampleInputs::upload(ggml_backend_t backend, const SampleTail & t, const lb_sampling & s, const CallTokens & call,
                          int32_t rows, int32_t n_vocab) {
    // float32 1/T of T rounded to float32 (greedy: T = 1, for an lse its draw never reads)
    const float inv_temp = s.temperature > 0.0 ? 1.0f / float(s.temperature) : 1.0f;
    set_input(backend, t.inv_temp, &inv_temp, sizeof(float));
    if (t.pen_slots == 0) return;
    windows_.build(s.history, s.n_history, call, rows, s.penalty_last_n);
    upload_slots(backend, t, &s, rows, n_vocab);
}

void SampleInputs::upload_neutral(ggml_backend_t backend, const SampleTail & t, int32_t rows, int32_t n_vocab) {
    const float one = 1.0f;
    set_input(backend, t.inv_temp, &one, sizeof(float));
    if (t.pen_slots > 0) upload_slots(backend, t, nullptr, rows, n_vocab);
}

// Row r's W slots: its window's distinct tokens with the penalties' factors, then distinct tokens
// it does not name with neutral factors (l' = l exactly), so every graph of one shape has W slots.
void SampleInputs::upload_slots(ggml_backend_t backend, const SampleTail & t, const lb_sampling * s, int32_t rows,
                                int32_t n_vocab) {
    const int32_t W = t.pen_slots;
    const size_t E = size_t(W) * size_t(rows);
    get_.resize(E);
    set_.resize(E);
    pos_.resize(E);
    neg_.resize(E);
    sub_.resize(E);
    const float pos = s ? 1.0f / s->repeat_penalty : 1.0f, neg = s ? s->repeat_penalty : 1.0f;
    for (int32_t r = 0; r < rows; ++r) {
        const int32_t named = s ? windows_.size(r) : 0;
        const int32_t * toks = s ? windows_.tokens(r) : nullptr;  // ascending
        const int32_t * counts = s ? windows_.counts(r) : nullptr;
        int32_t next_free = 0, skip = 0;  // the next token no named one equals; toks[skip] >= it
        for (int32_t j = 0; j < W; ++j) {
            const size_t e = size_t(r) * W + size_t(j);
            int32_t tok;
            if (j < named) {
                tok = toks[j];
                pos_[e] = pos;
                neg_[e] = neg;
                sub_[e] = float(double(counts[j]) * double(s->frequency_penalty) + double(s->presence_penalty));
            } else {
                while (skip < named && toks[skip] < next_free) ++skip;
                while (skip < named && toks[skip] == next_free) {
                    ++next_free;
                    ++skip;
                }
                tok = next_free++;
                pos_[e] = 1.0f;
                neg_[e] = 1.0f;
                sub_[e] = 0.0f;
            }
            get_[e] = int32_t(int64_t(r) * n_vocab + tok);
            set_[e] = int64_t(r) * n_vocab + tok;
        }
    }
    set_input(backend, t.pen_get, get_.data(), E * sizeof(int32_t));
    set_input(backend, t.pen_set, set_.data(), E * sizeof(int64_t));
    set_input(backend, t.pen_pos, pos_.data(), E * sizeof(float));
    set_input(backend, t.pen_neg, neg_.data(), E * sizeof(float));
    set_input(backend, t.pen_sub, sub_.data(), E * sizeof(float));
}

void SampleInputs::download(const SampleTail & t, const lb_sampling & s, int32_t rows) {
    const size_t rc = size_t(rows) * size_t(t.n_cand);
    ggml_backend_tensor_get(t.cand_ids, s.cand_ids, 0, rc * sizeof(int32_t));
    ggml_backend_tensor_get(t.cand_vals, s.cand_logits, 0, rc * sizeof(float));
    ggml_backend_tensor_get(t.row_max, s.row_max, 0, size_t(rows) * sizeof(float));
    ggml_backend_tensor_get(t.row_lse, s.row_lse, 0, size_t(rows) * sizeof(float));
}

}  // namespace lb
