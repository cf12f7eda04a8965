// sample_graph.hpp: the sampling tail of a forward graph (lb_prefill_sampled / lb_verify_sampled).
//
// Per output row (a tree node, or the last prompt token) the tail turns the target's logits into
// what the host needs to draw the next token exactly, without a full-vocabulary row crossing:
//   1. penalties: the host names, per row, up to W (token, count) pairs (the row's penalty
//      window, penalty_window.hpp); they are gathered from the flat logits, rescaled and
//      scattered back:
//        l' = (l > 0 ? l * (1/repeat) : l * repeat) - (count * frequency + presence)
//      Empty slots point at distinct untouched entries with factors 1, 1 and 0 (l' = l exactly),
//      so every graph of one shape has the same W slots per row.
//   2. the top-C candidates of the processed row (unordered) and their processed logits;
//   3. the row maximum and the log-normaliser at temperature T over the whole vocabulary:
//        lse = log(sum_v exp((l'_v - max) * (1/T))).
// The processed rows stay on the device for lb_processed_row (the rare draw past the C candidates).
#pragma once

#include <cstdint>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "lucebox.h"
#include "penalty_window.hpp"

namespace lb {

struct SampleTail {
    int32_t n_cand = 0;     // C
    int32_t pen_slots = 0;  // W (0: no penalty stage)
    // inputs
    ggml_tensor * pen_get = nullptr;   // i32 [W*rows]: flat index row*V + token (gather)
    ggml_tensor * pen_set = nullptr;   // i64 [W*rows]: the same indices (scatter)
    ggml_tensor * pen_pos = nullptr;   // f32 [1, W*rows]: factor for a logit > 0
    ggml_tensor * pen_neg = nullptr;   // f32 [1, W*rows]: factor for a logit <= 0
    ggml_tensor * pen_sub = nullptr;   // f32 [1, W*rows]: subtracted afterwards
    ggml_tensor * inv_temp = nullptr;  // f32 [1]: 1 / T
    // outputs
    ggml_tensor * processed = nullptr;  // f32 [V, rows]: penalised logits (before temperature)
    ggml_tensor * cand_ids = nullptr;   // i32 [C, rows], unordered
    ggml_tensor * cand_vals = nullptr;  // f32 [C, rows]: processed logits of cand_ids
    ggml_tensor * row_max = nullptr;    // f32 [1, rows]
    ggml_tensor * row_lse = nullptr;    // f32 [1, rows]
};

// Adds the tail after logits [V, rows] (contiguous); every output is marked as a graph output.
SampleTail build_sample_tail(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * logits, int32_t n_cand,
                             int32_t pen_slots);

// The penalty slots per row of sampled calls with windows of penalty_last_n tokens: the most
// distinct tokens a window can hold (0: no penalty stage).
int32_t penalty_slots(int32_t penalty_last_n, int32_t n_vocab);

// Host side of one sampled forward: checks `s` (throws lb::Error), uploads 1/T and each row's
// penalty slots (its window: penalty_window.hpp) on the backend's stream (set_input), and after compute
// copies the outputs into s's buffers.
class SampleInputs {
public:
    void check(const lb_sampling & s, int32_t rows, int32_t n_vocab) const;
    // rows: the call's last `rows` tokens
    void upload(ggml_backend_t backend, const SampleTail & t, const lb_sampling & s, const CallTokens & call,
                int32_t rows, int32_t n_vocab);
    // a tail this call does not read: neutral inputs (T = 1, no penalty) keep its unused math finite
    void upload_neutral(ggml_backend_t backend, const SampleTail & t, int32_t rows, int32_t n_vocab);
    static void download(const SampleTail & t, const lb_sampling & s, int32_t rows);

private:
    PenaltyWindows windows_;
    std::vector<int32_t> get_;
    std::vector<int64_t> set_;
    std::vector<float> pos_, neg_, sub_;

    void upload_slots(ggml_backend_t backend, const SampleTail & t, const lb_sampling * s, int32_t rows,
                      int32_t n_vocab);
};

}  // namespace lb
