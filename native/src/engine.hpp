// engine.hpp: struct lb_engine, the object behind the C ABI's opaque handle.
//
// It owns the backend, the target weights, the caches and one reusable graph per kind of call
// (prefill micro-batch, AR step, tree verify, commit). All methods throw lb::Error; api.cpp turns
// that into a status code. State invariant between calls: n_past committed tokens are in the caches.
//
// The DFlash draft (draft_*.cpp) is wired in load_draft() (engine.cpp) through what it borrows here:
//   backend.get()                        the ggml backend every buffer below is on
//   model->tok_embd / ->output           [n_embd, n_vocab] token embedding / lm head (== tok_embd if tied)
//   model->output_norm                   [n_embd] final norm weight
//   model->hp                            every hyperparameter (n_embd, n_layer, n_vocab, ...)
//   set_capture_layers({l0, l1, ...})    from then on every forward writes, for each token, the residual
//                                        stream after target layer l_j (0-based) to cache.capture[j], an f32
//                                        [n_embd, capture_rows] tensor on the backend (column t = token t of
//                                        the last forward: prefill micro-batch, step, or verify node t)
//   on_commit(rows, n, unread)           called after tokens are committed: rows == nullptr means columns
//                                        0..n-1 of cache.capture (prefill micro-batch / step); otherwise
//                                        rows[i] is the capture column of the i-th committed token (the
//                                        accepted path of a verify); the first `unread` of them no draft
//                                        proposal will read (later tokens of the same prefill take their
//                                        ring slots). Matches DraftModel::append(feats, rows, n, unread).
//   on_reset()                           called by reset() (forget the draft context too)
//   &call_clock                          the draft's graphs go through it, timed as part of the call that runs them
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "call_clock.hpp"
#include "caches.hpp"
#include "commit_graph.hpp"
#include "draft_model.hpp"
#include "ggml-alloc.h"
#include "gguf_target.hpp"
#include "lucebox.h"
#include "mask_stage.hpp"
#include "sample_draw.hpp"
#include "target_graph.hpp"

struct lb_engine {
    // --- configuration (as loaded) -------------------------------------------------------
    std::string target_path;
    int32_t max_ctx = 0;
    int32_t ubatch = 0;
    int32_t max_tree = 0;
    ggml_type type_k = GGML_TYPE_F16;
    ggml_type type_v = GGML_TYPE_F16;

    // --- what the engine owns (destroyed in reverse order) ----------------------------------
    lb::Backend backend;
    // where each kind of call's host time went (lb_call_times_get; api.cpp starts and ends each call); the draft
    // borrows it, so it outlives the draft
    lb::CallClock call_clock;
    std::unique_ptr<lb::TargetModel> model;
    lb::TargetCache cache;
    std::unique_ptr<lb::DraftModel> draft;  // optional; fed through on_commit / on_reset

    // --- decode state ----------------------------------------------------------------------
    int32_t n_past = 0;  // P: committed tokens

    // --- hooks for the draft ---------------------------------------------------------------
    std::function<void(const int32_t * rows, int32_t n, int32_t unread)> on_commit;
    std::function<void()> on_reset;

    void load(const lb_params & p);

    void reset();
    // Feeds toks[0..n) after the prefix in micro-batches; *out_next = argmax after the last token.
    // sampling (optional): run the sampling tail too (see lucebox.h lb_sampling)
    void prefill(const int32_t * toks, int32_t n, int32_t * out_next, float * logits, int64_t logits_cap,
                 const lb_sampling * sampling = nullptr);
    void step(int32_t tok, int32_t * out_next, const lb_sampling * sampling = nullptr);
    void verify(const int32_t * toks, const int32_t * parents, int32_t n, int32_t * out_argmax, float * logits,
                int64_t logits_cap, const lb_sampling * sampling = nullptr);
    // Row `row` of the last sampled forward's processed logits (lb_processed_row).
    void processed_row(int32_t row, float * out, int64_t cap);
    // Leaves its graphs running (the target's replay, the draft's append): the next call's host work overlaps them.
    // Every other call but draft_block (whose reads wait for its own graph, queued after them) starts with settle().
    void commit(const int32_t * path, int32_t n_path);
    // Waits for the graphs commit left running (api.cpp, before any call that reads or writes device memory).
    void settle() { call_clock.settle(backend.get()); }
    // Drafts the block after `last` (see lucebox.h lb_draft). LB_E_STATE without a draft.
    void draft_block(int32_t last, int32_t top_k, int32_t * ids, float * logp, int64_t cap);

    void set_capture_layers(const std::vector<int32_t> & layers);

    // Snapshots of the committed state (see lucebox.h lb_state_*; state.cpp).
    size_t state_size() const;
    size_t state_save(uint8_t * buf, int64_t cap) const;
    void state_load(const uint8_t * buf, int64_t n);

    lb_model_info info() const;
    lb_memory memory() const;  // lb_memory_get

private:
    // One cached graph per call kind, with its own compute buffer (see GraphSlot); declared after
    // the backend and caches they use, so destroyed before them.
    using ForwardSlot = lb::GraphSlot<lb::ForwardGraph>;
    using CommitSlot = lb::GraphSlot<lb::CommitGraph>;
    ForwardSlot prefill_slot_, step_slot_, verify_slot_;
    // commit graphs by (n_path, move_kv): accepted lengths vary every step, and a graph per length is cheaper
    // than re-planning one graph per call. They never run at once, so they share one compute buffer (commit_galloc_,
    // as large as the largest; a graph keeps its addresses until the buffer grows, which re-installs the others).
    std::map<std::pair<int32_t, bool>, CommitSlot> commit_slots_;
    ggml_gallocr_ptr commit_galloc_;
    uint32_t capture_gen_ = 0;

    // the last verify, kept for commit
    bool verify_pending_ = false;
    std::vector<int32_t> verify_parents_;

    // the last sampled forward, for processed_row (nullptr once anything else ran)
    lb::ForwardGraph * sampled_graph_ = nullptr;
    int32_t sampled_rows_ = 0;
    lb::SampleInputs sample_inputs_;
    lb::Drawer drawer_;

    // host staging for graph inputs, reused by every call
    std::vector<int32_t> pos_host_;
    std::vector<int64_t> kv_idx_host_;
    std::vector<int64_t> draw_pos_host_;
    // the attention masks of the prefill, step and verify graphs, each kept from its slot's last call (mask_stage.hpp)
    lb::MaskStage prefill_mask_, step_mask_, verify_mask_;
    std::vector<int32_t> depth_host_;
    std::vector<int32_t> i32_host_;
    std::vector<uint8_t> allowed_host_;

    lb::ForwardGraph & forward_graph(ForwardSlot & slot, const lb::ForwardShape & shape, const char * what);
    int32_t n_kv_for(int32_t n_tokens) const;
    void check_tokens(const int32_t * toks, int32_t n, const char * what) const;
    // logits capacity, token range and room in the context for a forward over n tokens
    void check_batch(const int32_t * toks, int32_t n, const float * logits, int64_t logits_cap, const char * what,
                     const char * noun) const;
    void set_positions_and_slots(lb::ForwardGraph & g, int32_t n, const int32_t * depth);
    void set_chain_inputs(lb::ForwardGraph & g, const ForwardSlot & slot, lb::MaskStage & mask, const int32_t * toks,
                          int32_t n);
    void run_sampled(lb::ForwardGraph & g, const lb_sampling * sampling, const lb::CallTokens & call, int32_t rows,
                     const char * what);
    void compute(ggml_cgraph * gf, const char * what, bool wait = true);
    void load_draft(const std::string & dir, const lb::DraftOptions & options);
};
