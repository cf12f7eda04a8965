/*
 * lucebox.h: the flat C ABI of liblucebox (speculative decoding on a pinned ggml).
 *
 * Conventions
 *  - Every function that can fail returns int32_t: LB_OK (0) or a negative LB_E_* status;
 *    lb_last_error() then returns a one-line, thread-local message naming the problem and the fix.
 *  - The caller owns every buffer (pointer + element count). Only lb_free() frees the engine.
 *  - No function aborts or exits on user input; C++ exceptions never cross this boundary.
 *  - Token ids are int32; "position" P is the number of committed tokens in the cache.
 *
 * Decode state after prefill / commit: P committed tokens are in the caches (target KV, DeltaNet
 * state, draft context); `last` (returned by prefill, or the bonus token of a step) is the next token
 * to feed, NOT yet in any cache. A verify tree is rooted at `last`.
 *
 * Python mirror: lucebox/_native.py (same order; bump LB_ABI_VERSION on any change here).
 */
#ifndef LUCEBOX_H
#define LUCEBOX_H

#include <stdint.h>

#if defined(_WIN32)
#  define LB_API __declspec(dllexport)
#else
#  define LB_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define LB_ABI_VERSION 7

/* status codes */
#define LB_OK              0
#define LB_E_INVALID_ARG  -1  /* a bad argument: null pointer, size out of range, invalid tree   */
#define LB_E_IO           -2  /* file missing or unreadable                                      */
#define LB_E_FORMAT       -3  /* not a GGUF / safetensors, truncated, corrupt, missing tensor   */
#define LB_E_UNSUPPORTED  -4  /* wrong architecture, tensor type or device we cannot run         */
#define LB_E_MISMATCH     -5  /* draft does not fit target (hidden size, vocab, layer ids)       */
#define LB_E_CONTEXT      -6  /* the tokens would exceed max_ctx                                 */
#define LB_E_OOM          -7  /* a host or device allocation failed                             */
#define LB_E_BACKEND      -8  /* ggml backend / graph compute failure                            */
#define LB_E_STATE        -9  /* call out of order (e.g. commit without verify, draft w/o draft) */

/* KV cache element types (lb_params.type_k / type_v, llama.cpp's --cache-type-k / -v).
   Bytes per element: f32 4, f16 / bf16 2, q8_0 34/32, q4_0 18/32. */
#define LB_KV_F16   0
#define LB_KV_Q8_0  1
#define LB_KV_Q4_0  2
#define LB_KV_F32   3  /* exact reference arithmetic (tests); 2x the bytes of f16 */
#define LB_KV_BF16  4

/* How the draft's weights are stored (lb_params.draft_weights). The draft only proposes tokens, so
   either keeps the output AR's; a smaller draft may accept fewer. */
#define LB_DRAFT_WEIGHTS_KEEP 0  /* as in the checkpoint (BF16 for z-lab drafts)                     */
#define LB_DRAFT_WEIGHTS_Q8_0 1  /* Q8_0 matrices: ~0.53x the bytes of BF16 (1.6 GiB less on the 27B) */

/* The draft's context window when neither lb_params.draft_window nor the draft's config.json
   (sliding_window) names one: the reference implementation's feature ring. */
#define LB_DRAFT_WINDOW_DEFAULT 4096

/* log levels for lb_params.log_level (messages go to stderr) */
#define LB_LOG_QUIET 0
#define LB_LOG_ERROR 1
#define LB_LOG_INFO  2
#define LB_LOG_DEBUG 3

typedef struct lb_engine lb_engine; /* opaque */

/* Kinds of call that run graphs, for lb_call_times_get */
#define LB_CALL_PREFILL 0  /* lb_prefill, lb_prefill_sampled */
#define LB_CALL_STEP    1  /* lb_step, lb_step_sampled         */
#define LB_CALL_DRAFT   2  /* lb_draft                         */
#define LB_CALL_VERIFY  3  /* lb_verify, lb_verify_sampled     */
#define LB_CALL_COMMIT  4  /* lb_commit                        */
#define LB_CALL_KINDS   5

typedef struct lb_params {
    const char * target_path;  /* GGUF file of the target (arch qwen35); required                 */
    const char * draft_path;   /* DFlash draft folder (config.json + *.safetensors) or NULL       */
    int32_t max_ctx;           /* tokens of context to allocate (KV cache rows)                   */
    int32_t type_k;            /* LB_KV_* of the K cache (llama.cpp's type_k)                     */
    int32_t type_v;            /* LB_KV_* of the V cache: any pair on the CPU; on CUDA one type for
                                  both, or any pair of f16 / q8_0 / q4_0 on compute capability 8.0+
                                  (LB_E_UNSUPPORTED otherwise)                                       */
    int32_t device;            /* -1: CPU; >= 0: CUDA device index                                */
    int32_t n_threads;         /* CPU threads; <= 0: all cores                                    */
    int32_t ubatch;            /* prefill micro-batch (tokens per graph)                          */
    int32_t max_tree;          /* most nodes (root included) one lb_verify may take               */
    int32_t log_level;         /* LB_LOG_*                                                         */
    int32_t batch_invariant;   /* 1 (default): every token computes to the same bits whatever batch it
                                  shares (a step, a verify tree, a prefill micro-batch), so greedy
                                  speculative output equals AR output bit for bit. 0: on CUDA, the
                                  faster batch-dependent kernels (outputs may part at near-ties). The
                                  CPU kernels are always invariant. CUDA: process-wide (ggml-cuda's). */
    int32_t draft_window;      /* W: the draft attends to at most the last W committed tokens, whose K/V
                                  it keeps in a ring of W rows (memory O(W), not O(max_ctx)). 0: the
                                  draft config's sliding_window, else LB_DRAFT_WINDOW_DEFAULT; W >=
                                  max_ctx keeps the whole context. Only the draft's proposals (hence
                                  acceptance) depend on it, never the output.                          */
    int32_t draft_weights;     /* LB_DRAFT_WEIGHTS_*: KEEP (default) or Q8_0                          */
} lb_params;

typedef struct lb_model_info {
    int32_t n_vocab;           /* rows of the target's output matrix                              */
    int32_t n_embd;
    int32_t n_layer;           /* target layers used (an MTP/nextn block is not counted)          */
    int32_t max_ctx;
    int32_t n_past;            /* P: committed tokens                                             */
    int32_t has_draft;         /* 1 when a draft is loaded                                        */
    int32_t block_size;        /* draft block size B (0 without draft)                            */
    int32_t mask_token_id;     /* draft mask token (-1 without draft)                             */
    int32_t max_tree;
    int32_t device;            /* as loaded: -1 CPU, else the CUDA device                         */
    int32_t draft_window;      /* rows of the draft's context ring: min(W, max_ctx); 0 without draft */
    int32_t n_ctx_train;       /* the target's trained context length (GGUF context_length)        */
    int32_t type_k;            /* LB_KV_* as loaded                                                */
    int32_t type_v;
} lb_model_info;

/*
 * Memory by what holds it, in bytes of the engine's device (GPU memory on CUDA, host memory on the
 * CPU): lb_memory_get reports what a loaded engine holds now, lb_memory_plan what one would hold
 * at most without loading anything.
 */
typedef struct lb_memory {
    int64_t weights;           /* target weights (CPU: the mapped GGUF + converted / stacked copies) */
    int64_t draft;             /* draft weights (0 without draft)                                  */
    int64_t kv;                /* target KV cache: K and V rows of every full-attention layer      */
    int64_t recurrent;         /* DeltaNet conv windows and recurrent states                       */
    int64_t tree;              /* tree-verify scratch and the captured target features             */
    int64_t draft_cache;       /* the draft's context ring (its K/V of the last W tokens)          */
    int64_t compute;           /* graph compute buffers (prefill, step, verify, commit, draft)     */
} lb_memory;

/* The largest calls lb_memory_plan sizes the compute buffers for. */
typedef struct lb_plan_shape {
    int32_t verify_nodes;      /* nodes of the largest lb_verify tree (budget + 1), <= max_tree    */
    int32_t draft_top_k;       /* lb_draft's top_k                                                 */
    int32_t n_candidates;      /* sampled calls' lb_sampling.n_candidates; 0: greedy calls only    */
    int32_t penalty_last_n;    /* sampled calls' lb_sampling.penalty_last_n                        */
} lb_plan_shape;

/*
 * Sampling tail of lb_prefill_sampled / lb_verify_sampled / lb_step_sampled: for each output row
 * the target's logits are processed on the device and reduced to what an exact draw needs (no full
 * row leaves):
 *   penalties  l' = (l > 0 ? l * (1 / repeat_penalty) : l * repeat_penalty)
 *                   - (count * frequency_penalty + presence_penalty)
 *              for each distinct token of the row's penalty window, seen count times there. The
 *              window of row r is the last penalty_last_n tokens of: history, then this call's
 *              tokens on the row's path (prefill / step: every token of the call up to the row;
 *              verify: node r's root path, its ancestors and itself, not its flat predecessors).
 *   outputs    the C best tokens of l' (unordered) with their l', max_v l'_v, and
 *              lse = log sum_v exp((l'_v - max) / T) over the whole vocabulary (T = temperature,
 *              or 1 when temperature is 0).
 * Then, on the host, the row's next token is drawn from its candidates (see lb_sampling_draw): row r
 * samples the position after its token's (prefill: the last prompt token's; verify: node r's,
 * P + depth(r)), with the uniform of (seed, that position). drawn[r] is -1 when the draw reaches past
 * the trusted candidates (those strictly better than the C-th): the caller finishes that draw on the
 * whole processed row (lb_processed_row) with uniforms[r].
 */
typedef struct lb_sampling {
    double temperature;         /* >= 0; 0 = greedy on l' (the best, lowest id among equals)      */
    float repeat_penalty;       /* > 0; 1 = off                                                 */
    float presence_penalty;     /* 0 = off                                                      */
    float frequency_penalty;    /* 0 = off                                                      */
    int32_t top_k;              /* >= 0; 0 = off                                                */
    double top_p;               /* in (0, 1]; 1 = off                                           */
    double min_p;               /* in [0, 1]; 0 = off                                           */
    uint64_t seed;              /* the draws' seed                                              */
    int32_t n_candidates;       /* C in [1, n_vocab]                                            */
    int32_t penalty_last_n;     /* N in [0, 1024]: tokens per penalty window; 0 = no penalties */
    const int32_t * history;    /* [n_history]: the tokens before this call's first one, oldest
                                   first (the committed tokens; only the last N - 1 are read)   */
    int64_t n_history;          /* >= 0; history may be NULL when 0 or when N = 0               */
    int32_t * cand_ids;         /* out [rows * C]                                               */
    float * cand_logits;        /* out [rows * C]: processed logits l' of cand_ids              */
    float * row_max;            /* out [rows]                                                   */
    float * row_lse;            /* out [rows]                                                   */
    int32_t * drawn;            /* out [rows]: the drawn token, or -1: draw on the whole row     */
    double * uniforms;          /* out [rows]: the uniform in [0, 1) each row's draw used        */
    int64_t rows_cap;           /* rows the outputs hold                                        */
} lb_sampling;

/* ABI version of the loaded library; the Python side refuses a mismatch. */
LB_API int32_t lb_abi_version(void);

/* Thread-local message for the last failing call on this thread ("" if none). */
LB_API const char * lb_last_error(void);

/* Number of CUDA devices this build can use (0 in a CPU-only build). Never fails. */
LB_API int32_t lb_device_count(void);

/* Memory of `device` (-1: the host) as ggml reports it: free and total bytes. ggml counts all of
   the host's physical memory as free; on CUDA, free is what the driver has left now. */
LB_API int32_t lb_device_memory(int32_t device, int64_t * free_bytes, int64_t * total_bytes);

/* Fill *p with defaults (max_ctx 4096, f16 KV, CPU, all threads, ubatch 512, max_tree 64, invariant,
   draft_window 0 = from the draft's config). */
LB_API void lb_params_default(lb_params * p);

/* Load the target (and draft, if p->draft_path) and allocate caches. *out is set on success. */
LB_API int32_t lb_load(const lb_params * p, lb_engine ** out);

/*
 * What lb_load(p) would hold at most, by part, without loading anything: the GGUF's metadata and
 * the draft's config.json and safetensors headers are read and checked as lb_load does (same
 * errors); the same tensors are laid out, and the same graphs sized, for p->max_ctx KV rows: a
 * prefill micro-batch of p->ubatch tokens, the AR step and a verify of s->verify_nodes nodes (each
 * with and without the sampling tail), every commit up to the draft's block size, the draft's
 * largest append and its proposal over a full ring. An engine holds this once each kind of call
 * has run at full depth. Not counted: what a backend allocates outside ggml's buffers (the CUDA
 * context, cuBLAS workspace, kernel scratch pools) and host memory of the calling process.
 */
LB_API int32_t lb_memory_plan(const lb_params * p, const lb_plan_shape * s, lb_memory * out);

/* Sizes and current position. */
LB_API int32_t lb_model_info_get(const lb_engine * e, lb_model_info * out);

/* What the engine holds now, by part (see lb_memory). Compute buffers grow to the largest graph
   each kind of call has run so far. */
LB_API int32_t lb_memory_get(const lb_engine * e, lb_memory * out);

/* Forget everything committed (P = 0). */
LB_API int32_t lb_reset(lb_engine * e);

/*
 * Feed n tokens after the committed prefix and commit them (P += n), in micro-batches.
 * out_next: target argmax after the last token (the next `last`).
 * logits: NULL, or room for n * n_vocab floats (row i = logits after token i), f32.
 * LB_E_CONTEXT if P + n > max_ctx.
 */
LB_API int32_t lb_prefill(lb_engine * e, const int32_t * toks, int32_t n,
                          int32_t * out_next, float * logits, int64_t logits_cap);

/*
 * Draft one block: [last, MASK x (B-1)] at positions P..P+B-1, attending to the draft's cached
 * context (captured target features of the P committed tokens) and the block.
 * ids, logp: room for (B-1) * top_k each; row j = block position j+1, best first; logp is the
 * log-softmax over the target's vocabulary. LB_E_STATE without a draft.
 */
LB_API int32_t lb_draft(lb_engine * e, int32_t last, int32_t top_k,
                        int32_t * ids, float * logp, int64_t cap);

/*
 * One target forward over a token tree rooted at `last`.
 * toks[n], parents[n]: node 0 is the root (toks[0] = last, parents[0] = -1); every other node has
 * 0 <= parents[i] < i. Node i sits at position P + depth(i); it attends to the committed prefix and
 * its own ancestors; DeltaNet layers continue the parent's state.
 * out_argmax[n]: the target's greedy choice after each node.
 * logits: NULL or room for n * n_vocab floats (tests, sampling).
 * LB_E_INVALID_ARG on a malformed tree or n > max_tree; LB_E_CONTEXT if P + n > max_ctx.
 */
LB_API int32_t lb_verify(lb_engine * e, const int32_t * toks, const int32_t * parents, int32_t n,
                         int32_t * out_argmax, float * logits, int64_t logits_cap);

/*
 * Commit an accepted root-to-node path of the last lb_verify tree: path[0] = 0 (the root), and
 * path[i] is a child of path[i-1]. Afterwards the caches equal "prefix + toks[path]" (P += n_path):
 * KV rows moved into place, DeltaNet/conv state of the last path node, its captured features
 * appended to the draft context. LB_E_STATE without a preceding verify.
 * It returns once that work is queued on the device: the next call waits for it first, but for lb_draft,
 * whose host work overlaps it and whose results come after it.
 */
LB_API int32_t lb_commit(lb_engine * e, const int32_t * path, int32_t n_path);

/*
 * AR fast path: feed `tok` at position P, commit it, and return the target argmax in *out_next.
 * Same result as lb_verify(n = 1) + lb_commit([0]).
 */
LB_API int32_t lb_step(lb_engine * e, int32_t tok, int32_t * out_next);

/*
 * lb_prefill with the sampling tail on the last token's row (rows = 1); *out_next is still the
 * plain argmax. Same caches and commit as lb_prefill.
 */
LB_API int32_t lb_prefill_sampled(lb_engine * e, const int32_t * toks, int32_t n, int32_t * out_next,
                                  const lb_sampling * s);

/*
 * lb_verify with the sampling tail on every node's row (rows = n); out_argmax is still the plain
 * argmax per node. lb_commit follows as after lb_verify.
 */
LB_API int32_t lb_verify_sampled(lb_engine * e, const int32_t * toks, const int32_t * parents, int32_t n,
                                 int32_t * out_argmax, const lb_sampling * s);

/* lb_step with the sampling tail on its one row (rows = 1); *out_next is still the plain argmax. */
LB_API int32_t lb_step_sampled(lb_engine * e, int32_t tok, int32_t * out_next, const lb_sampling * s);

/*
 * Row `row` of the processed logits l' of the last lb_prefill_sampled / lb_verify_sampled /
 * lb_step_sampled, into
 * out[n_vocab]. Valid until the next call that runs a forward, commits or resets (LB_E_STATE after).
 */
LB_API int32_t lb_processed_row(lb_engine * e, int32_t row, float * out, int64_t cap);

/*
 * The draw the sampled calls run after their forward, on rows [0, rows) of s's candidate buffers
 * as they stand (cand_ids, cand_logits, row_lse are read, not written): row r's token at position
 * positions[r] (the position it is drawn for) into drawn[r] (-1: needs the whole row), its uniform
 * into uniforms[r]. No engine: tests hold it to the Python reference on any candidates, and a
 * caller can draw again with another seed. Candidates best first by l', ties by token id; with
 * T = temperature, p_j = exp((l'_j - l'_0) / T - lse) over the trusted candidates; top-k
 * renormalises its k; top-p keeps the smallest prefix of mass >= top_p; min-p keeps
 * p_j >= min_p * p_0; the draw takes the first j whose running sum exceeds u (times the kept mass).
 */
LB_API int32_t lb_sampling_draw(const lb_sampling * s, int32_t rows, const int64_t * positions);

/*
 * Snapshots of the committed state, for prefix reuse across requests (a server's turns).
 * A snapshot holds P, the target KV rows 0..P-1 of every full-attention layer, every DeltaNet
 * layer's recurrent state and conv window, and the draft's context (its K/V ring rows, which
 * position each slot holds, its P). It does not hold `last` (the caller keeps it) nor a pending
 * verify. The blob is opaque host memory, valid only for an engine loaded with the same files,
 * max_ctx, type_k, type_v, draft_window and device kind.
 *
 * lb_state_size:  *out_bytes = the size lb_state_save needs now (grows with P).
 * lb_state_save:  writes the snapshot into buf[cap] (bytes), *out_written = its size.
 *                 LB_E_INVALID_ARG if cap is too small.
 * lb_state_load:  makes the engine's state equal to the snapshot in buf[n]; afterwards decoding
 *                 continues exactly as it would have from the moment of lb_state_save.
 *                 LB_E_MISMATCH if the blob comes from an engine of another shape, LB_E_FORMAT if it
 *                 is not a snapshot; the engine is unchanged on failure.
 */
LB_API int32_t lb_state_size(const lb_engine * e, int64_t * out_bytes);
LB_API int32_t lb_state_save(lb_engine * e, void * buf, int64_t cap, int64_t * out_written);
LB_API int32_t lb_state_load(lb_engine * e, const void * buf, int64_t n);

/*
 * Where the host's time went in the last successful call of one kind (LB_CALL_*), in milliseconds of the
 * host's clock: before_ms + launch_ms + wait_ms + between_ms + after_ms = total_ms. On a GPU, wait_ms is what
 * the device ran past the launches; time in the other parts is host work the device waits for. A commit does
 * not wait for its graphs (lb_commit): they finish in the next call's wait. On the CPU the launch runs the graph
 * (wait_ms ~ 0). All zeros before the first call of the kind. LB_E_INVALID_ARG for a kind
 * outside [0, LB_CALL_KINDS).
 */
typedef struct lb_call_times {
    int32_t graphs;      /* graphs the call ran: the target's, and the draft's (its propose; the append of what */
                         /* a prefill, step or commit committed)                                                */
    double  total_ms;    /* from the call's entry to its return                                                 */
    double  before_ms;   /* entry to the first launch: checks, graph lookup or build, inputs staged             */
    double  launch_ms;   /* in the backend's launches (ggml-cuda: its graph's change check, capture, replay)     */
    double  wait_ms;     /* waiting for the device to finish what was launched                                  */
    double  between_ms;  /* host work between one graph's wait and the next one's launch: a prefill's next      */
                         /* micro-batch staged, a step's results read back before the draft's append            */
    double  after_ms;    /* from the last wait to the return: results read back, the host draw                  */
} lb_call_times;

LB_API int32_t lb_call_times_get(const lb_engine * e, int32_t kind, lb_call_times * out);

/* Wait until the device has run everything the engine queued (what lb_commit left running); every other call
   already waits where it must. For callers that time the device's work, such as benchmarks. */
LB_API int32_t lb_sync(lb_engine * e);

/* Free the engine and everything it owns. NULL is a no-op. */
LB_API void lb_free(lb_engine * e);

#ifdef __cplusplus
}
#endif

#endif /* LUCEBOX_H */
