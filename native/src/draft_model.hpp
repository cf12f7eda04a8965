// draft_model.hpp: the DFlash block-diffusion draft on a ggml backend.
//
// State: a context K/V cache per draft layer holding, for every committed token, the draft's
// projections of that token's captured target features (k_norm + RoPE at its own position, v):
//     h_ctx = hidden_norm(fc(concat_j feature_j))        feature_j = residual stream after target
//     K_l = rope(k_norm(Wk_l h_ctx)), V_l = Wv_l h_ctx   layer target_layer_ids[j] (0-based)
// so each commit projects only the new tokens (dflash_generate's draft cache does the same).
//
// propose(): the block [last, MASK x (B-1)] at positions P..P+B-1 is embedded with the TARGET's
// token embedding, runs the draft layers attending to cached context + the block (per-layer
// causal/window mask from config.json), the draft's final norm, then the TARGET's output matrix;
// top-k and log-softmax happen on the device and only (B-1) x K ids + log-probs come back.
//
// Engine wiring (see engine.hpp's draft hooks):
//   lb_load   d = DraftModel::load(draft_path, backend, {tok_embd, output, hp.n_layer},
//                                  {keep, F16 on CUDA / F32 on CPU, ctx_size = draft_window,
//                                   ctx_limit = max_ctx});
//             set_capture_layers(d->config().target_layer_ids); info: block_size, mask_token_id
//   commit    on_commit(rows, n) -> d->append(capture tensors, rows, n): after each prefill
//             micro-batch and step (rows = nullptr) and after lb_commit (rows = the path's nodes)
//   lb_draft  require d->n_past() == P and cap >= (B-1)*top_k; d->propose(last, top_k, ids, logp)
//   lb_reset  d->reset()
#pragma once

#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"

#include "backend.hpp"
#include "call_clock.hpp"
#include "draft_config.hpp"
#include "draft_weights.hpp"
#include "layers.hpp"
#include "pinned_buffer.hpp"
#include "token_embedding.hpp"

namespace lb {

// Borrowed from the target; must outlive the DraftModel and live where `backend` can read it.
struct DraftTarget {
    ggml_tensor * tok_embd = nullptr;  // [n_embd, n_vocab], any type ggml_get_rows takes (shape only)
    TokenEmbedding * embedding = nullptr;  // its rows, staged per call (laid out before the first propose)
    ggml_tensor * output = nullptr;    // [n_embd, n_vocab] lm head (tok_embd when tied)
    int32_t n_layer = 0;               // target decoder layers (an MTP block not counted)
    CallClock * clock = nullptr;       // the engine's: the draft's graphs count in the calls that run them (load()
                                       // needs it; plan() runs none)
};

struct DraftOptions {
    DraftWeightType weight_type = DraftWeightType::keep;
    ggml_type kv_type = GGML_TYPE_F16;  // context K/V storage: F16 or F32 (F32: exact tests on CPU)
    // Context rows kept: a ring of the most recent tokens (full-attention draft layers then see
    // only those); >= the engine's max_ctx reproduces the reference exactly. 0: the config's
    // sliding_window, else LB_DRAFT_WINDOW_DEFAULT. At most ctx_limit rows either way.
    int32_t ctx_size = 0;
    int32_t ctx_limit = INT32_MAX;
    // Attention kernel: auto = flash attention where the backend supports the shapes, else plain
    // ops (tests force either to cover both).
    enum class Attention { automatic, flash, plain } attention = Attention::automatic;
};

// The k best entries of each row of logits [n, R] (unordered) and their log-softmax, as
// (logit - max) - log(sum(exp(logit - max))): finite for every entry. The row maximum is the best
// of the k picks. (ggml-cuda selects k <= 32 in one pass over the row: vendor/patches/0007.)
struct TopKLogProbs {
    ggml_tensor * ids;   // [k, R] i32, unordered
    ggml_tensor * logp;  // [k, R] f32
};
TopKLogProbs top_k_log_softmax(ggml_context * ctx, ggml_tensor * logits, int32_t k);

// What a loaded draft holds, in bytes of one buffer type (DraftModel::plan).
struct DraftMemory {
    size_t weights = 0, cache = 0, compute = 0;
};

class DraftModel {
public:
    // Loads config + weights, checks them against the target, allocates the context cache.
    // Throws Error (LB_E_IO / FORMAT / UNSUPPORTED / MISMATCH / OOM / INVALID_ARG).
    static std::unique_ptr<DraftModel> load(const std::string & dir, ggml_backend_t backend,
                                            const DraftTarget & target, const DraftOptions & opt);
    // What load() on `dev` would hold, without memory: weights, context cache, and the compute
    // buffers once appends of every size up to max_append tokens of `feats` (the target's capture
    // tensors, which may be unplaced) and a propose over a full ring with top_k candidates have run.
    static DraftMemory plan(const std::string & dir, ggml_backend_dev_t dev, const DraftTarget & target,
                            const DraftOptions & opt, const std::vector<ggml_tensor *> & feats, int32_t max_append,
                            int32_t top_k);
    ~DraftModel() = default;
    DraftModel(const DraftModel &) = delete;
    DraftModel & operator=(const DraftModel &) = delete;

    const DraftConfig & config() const { return cfg_; }
    int32_t n_past() const { return n_past_; }   // tokens whose features are in the context
    int32_t ctx_size() const { return ctx_size_; }  // ring slots: the most recent tokens it keeps
    size_t weight_bytes() const { return weights_->nbytes(); }
    size_t cache_bytes() const;
    size_t compute_bytes() const;  // the cached graphs' compute buffers
    int32_t graph_builds() const;  // append and propose graphs built so far (calls reuse them)
    void reset() { n_past_ = 0; }                 // forget the context (lb_reset)

    // The context as bytes (state.cpp's snapshots): n_past, each live slot's position, then per
    // layer the live K and V rows. shape_key() differs between drafts whose blobs do not fit.
    size_t state_bytes() const;
    void state_save(uint8_t * out) const;
    // Checks `n` bytes against this draft's shape first; throws Error(LB_E_MISMATCH) and changes
    // nothing when they do not fit.
    void state_load(const uint8_t * in, size_t n);
    uint64_t shape_key() const;

    // Appends n committed tokens (positions n_past .. n_past+n-1) from device-resident features.
    // feats: tensors whose ne0 add up to n_feat, in target_layer_ids order (one per captured
    //   layer [n_embd, N], or one [n_feat, N]); F32/F16/BF16; column c = captured token c.
    // rows: which n columns to take, in commit order (e.g. a verify tree's accepted path);
    //   nullptr = columns 0..n-1. unread: the first `unread` of the n tokens no proposal will read (later
    //   tokens of the same prefill take their slots first): they advance the context unprojected.
    //   Throws Error(LB_E_INVALID_ARG / LB_E_BACKEND).
    void append(const std::vector<ggml_tensor *> & feats, const int32_t * rows, int32_t n, int32_t unread = 0);
    // Same from host memory: feats[t * n_feat + f], token-major, layers concatenated in order.
    void append_host(const float * feats, int32_t n);

    // Drafts one block after the context. ids, logp: (B-1) * top_k each; row j = position j+1,
    // best first (ties: lower id first); logp = log-softmax over the target vocabulary.
    // Throws Error(LB_E_INVALID_ARG) for top_k outside [1, n_vocab] or a bad token id.
    void propose(int32_t last, int32_t top_k, int32_t * ids, float * logp);

private:
    DraftModel() = default;
    size_t graph_nodes() const { return 1024 + size_t(cfg_.n_layer) * 64; }
    static std::unique_ptr<DraftModel> layout(const std::string & dir, ggml_backend_dev_t dev,
                                              const DraftTarget & target, const DraftOptions & opt);
    // A device feature tensor as an append graph reads it: the same tensor object reallocated
    // (other data, type or row stride) needs a new graph.
    struct FeatureSource {
        ggml_tensor * tensor = nullptr;
        const void * data = nullptr;
        ggml_type type = GGML_TYPE_F32;
        int64_t ne0 = 0;
        size_t nb1 = 0;
        bool operator==(const FeatureSource & o) const {
            return tensor == o.tensor && data == o.data && type == o.type && ne0 == o.ne0 && nb1 == o.nb1;
        }
    };
    // What an append graph is built for: n tokens, their features from host rows (feats empty) or
    // gathered from device tensors.
    struct AppendShape {
        int32_t n = 0;
        std::vector<FeatureSource> feats;
        bool operator==(const AppendShape & o) const { return n == o.n && feats == o.feats; }
    };
    // The append graph and its inputs: positions and ring slots of the n tokens, and their features
    // as host rows or as device columns to gather.
    struct AppendGraph {
        AppendShape shape;
        GraphMeta meta;
        ggml_tensor * pos = nullptr;    // i32 [n]
        ggml_tensor * slots = nullptr;  // i64 [n]
        ggml_tensor * host = nullptr;   // f32 [n_feat, n] (host features) or nullptr
        ggml_tensor * rows = nullptr;   // i32 [n] (device features) or nullptr

        AppendGraph(const AppendShape & s, size_t max_nodes) : shape(s), meta(max_nodes) {}
    };
    // feats: the device tensors, or nullptr for host features
    void set_append_shape(AppendShape & s, const std::vector<ggml_tensor *> * feats, int32_t n) const;
    std::unique_ptr<AppendGraph> build_append(const AppendShape & s, const std::vector<ggml_tensor *> * feats) const;
    void append_chunk(const std::vector<ggml_tensor *> * feats, const int32_t * rows, const float * host,
                      int32_t n);
    ggml_tensor * project_context(ggml_context * ctx, ggml_tensor * feat_cat) const;
    ggml_tensor * rms(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w) const;
    // the engine's clock's compute (wait == false: left running, see CallClock::compute)
    void compute(ggml_cgraph * gf, const char * what, bool wait = true);
    bool flash_supported(ggml_backend_dev_t dev) const;

    // propose(), in stages (draft_propose.cpp): the graph, its inputs and outputs.
    struct ProposeShape {
        int32_t n_kv = 0;   // context cache rows attended (live context + block, padded)
        int32_t top_k = 0;  // K
        bool operator==(const ProposeShape & o) const { return n_kv == o.n_kv && top_k == o.top_k; }
    };
    struct ProposeGraph {
        ProposeShape shape;
        GraphMeta meta;
        ggml_tensor * toks = nullptr;        // i32 [B]: last, then mask tokens
        ggml_tensor * pos = nullptr;         // i32 [B]: positions P..P+B-1
        ggml_tensor * slots = nullptr;       // i64 [B]: cache rows the block's K/V go to
        std::vector<ggml_tensor *> masks;    // f16 [n_kv, B] per mask kind
        TopKLogProbs top{};                  // [K, B-1] each

        ProposeGraph(const ProposeShape & s, size_t max_nodes) : shape(s), meta(max_nodes) {}
    };
    void init_mask_kinds();
    std::unique_ptr<ProposeGraph> build_propose(const ProposeShape & s) const;
    ggml_tensor * block_layer(ggml_context * ctx, const ProposeGraph & g, int32_t l, ggml_tensor * x) const;
    void set_propose_inputs(const ProposeGraph & g, int32_t last, int32_t n_valid);
    void fill_mask(const DraftLayerAttn & kind, int32_t n_valid, int32_t n_kv, int32_t B, ggml_fp16_t * out) const;
    void read_top_k(const ProposeGraph & g, int32_t top_k, int32_t * ids, float * logp);

    DraftConfig cfg_;
    DraftTarget target_;
    ggml_backend_t backend_ = nullptr;
    std::unique_ptr<DraftWeights> weights_;
    int32_t n_vocab_ = 0;

    // context cache: per layer K and V as [head_dim * n_head_kv, rows] (rows = ring + block)
    ggml_context_ptr kv_ctx_;
    ggml_backend_buffer_ptr kv_buf_;
    std::vector<ggml_tensor *> k_cache_, v_cache_;
    int32_t ctx_size_ = 0;               // ring slots for context tokens
    int32_t rows_ = 0;                   // allocated rows: ctx_size_ + B, padded
    std::vector<int32_t> slot_pos_;      // position held by each ring slot
    int32_t n_past_ = 0;

    bool use_flash_ = true;
    // Cached graphs (GraphSlot), each with its own compute buffer, rebuilt only when their shape
    // changes: one append graph per size up to a block (accepted paths and AR steps: the size changes
    // every step), one for larger chunks (prefill micro-batches), and the propose graph (its
    // attended rows change every kKvPad tokens).
    std::map<int32_t, GraphSlot<AppendGraph>> append_slots_;
    GraphSlot<AppendGraph> append_large_;
    GraphSlot<ProposeGraph> propose_slot_;
    AppendShape append_key_;  // reused by every append (no allocation per call)

    // propose(): one attention mask per distinct (causal, window) kind of layer (the 3.6 draft has
    // two, the 3.5 draft one)
    std::vector<DraftLayerAttn> mask_kinds_;
    std::vector<int32_t> mask_of_layer_;   // [n_layer]: index into mask_kinds_
    // host staging for graph inputs and outputs, reused by every append and propose
    struct HostStaging {
        std::vector<int32_t> toks, pos;    // [B] (pos: [n] in append)
        std::vector<int32_t> rows;         // [n] in append: the capture columns of its tokens
        std::vector<int64_t> slots;        // [B] ([n] in append)
        std::vector<int32_t> ids, order;   // [B-1, K], [K]
        std::vector<float> logp;           // [B-1, K]
    } host_;
    // [mask kinds][B, n_kv] f16, page-locked: ~128 KB a kind at 8K, a copy that from pageable memory may wait for the
    // stream, where a commit's graphs may still run (pinned_buffer.hpp)
    PinnedBuffer mask_host_;
};
}  // namespace lb
