// gguf_target.hpp: the qwen35 target (Qwen3.5 / Qwen3.6) read from a GGUF file.
//
// Every dimension comes from the file's metadata; tensors keep the converter's layout (ggml
// order, ne0 first), which already differs from transformers in ways the graph relies on:
//   * RMS norm weights are stored as 1 + w (plain x * w here), except ssm_norm (gated norm, w as is);
//   * ssm_a holds -exp(A_log), so the DeltaNet gate is g = ssm_a * softplus(alpha + ssm_dt);
//   * DeltaNet value heads are regrouped "tiled" (v head h pairs with k head h % n_k_heads), which
//     is the broadcast ggml_gated_delta_net uses; q/k heads are not repeated;
//   * attn_q emits, per head, head_dim query values then head_dim output-gate values.
// An MTP (nextn) block stored after the trunk (block_count = n_layer + nextn_predict_layers) is
// not loaded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"
#include "matmul.hpp"
#include "token_embedding.hpp"

namespace lb {

struct TargetHparams {
    int32_t n_vocab = 0;        // rows of the output matrix
    int32_t n_embd = 0;
    int32_t n_layer = 0;        // trunk layers (MTP block excluded)
    int32_t n_nextn = 0;        // MTP blocks in the file (not loaded)
    int32_t n_ctx_train = 0;
    float rms_eps = 1e-6f;
    std::vector<int32_t> n_ff;  // per layer
    std::vector<bool> recurrent;  // per layer: Gated DeltaNet (true) or full attention

    // full-attention layers
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;
    int32_t n_rot = 0;          // rotary dims per head (partial rotary)
    int32_t rope_sections[4] = {0, 0, 0, 0};  // M-RoPE sections in rotary pairs
    float rope_freq_base = 10000.0f;

    // Gated DeltaNet layers
    int32_t d_conv = 0;         // conv kernel width
    int32_t head_k_dim = 0;     // ssm.state_size (== head_v_dim)
    int32_t n_k_heads = 0;      // ssm.group_count
    int32_t n_v_heads = 0;      // ssm.time_step_rank
    int32_t head_v_dim = 0;     // ssm.inner_size / n_v_heads

    int32_t key_dim() const { return head_k_dim * n_k_heads; }
    int32_t value_dim() const { return head_v_dim * n_v_heads; }
    int32_t conv_channels() const { return 2 * key_dim() + value_dim(); }  // q | k | v
    int32_t n_attn_layers() const;
    int32_t n_recurrent_layers() const;
};

struct TargetLayer {
    bool recurrent = false;
    ggml_tensor * attn_norm = nullptr;   // [n_embd]
    ggml_tensor * post_norm = nullptr;   // [n_embd] (post_attention_norm: before the FFN)
    StackedMatrices ffn_gate_up;         // gate, up: [n_embd, n_ff] each
    ggml_tensor * ffn_down = nullptr;    // [n_ff, n_embd]

    // full attention
    StackedMatrices attn_qkv;            // q [n_embd, 2*head_dim*n_head] (per head: q then gate),
                                         // k, v [n_embd, head_dim*n_head_kv]
    ggml_tensor * wo = nullptr;          // [head_dim*n_head, n_embd]
    ggml_tensor * q_norm = nullptr;      // [head_dim]
    ggml_tensor * k_norm = nullptr;      // [head_dim]

    // Gated DeltaNet
    StackedMatrices ssm_in;              // qkv [n_embd, conv_channels] (q | k | v, pre-conv),
                                         // z [n_embd, value_dim] (output gate), beta, alpha [n_embd, n_v_heads]
    ggml_tensor * conv1d = nullptr;      // [d_conv, conv_channels] f32 (rows of TargetModel::conv1d_all)
    ggml_tensor * ssm_dt = nullptr;      // [n_v_heads] f32 (dt bias)
    ggml_tensor * ssm_a = nullptr;       // [n_v_heads] f32 (-exp(A_log))
    ggml_tensor * ssm_norm = nullptr;    // [head_v_dim]
    ggml_tensor * ssm_out = nullptr;     // [value_dim, n_embd]
};

struct TargetModel {
    TargetHparams hp;
    std::string path;
    // [n_embd, n_vocab]. Forwards read its rows on the host through `embedding`; on a GPU it has no
    // device memory unless tied (then it is also the lm head).
    ggml_tensor * tok_embd = nullptr;
    ggml_tensor * output_norm = nullptr; // [n_embd]
    ggml_tensor * output = nullptr;      // [n_embd, n_vocab]; == tok_embd when tied
    std::vector<TargetLayer> layers;
    // [d_conv, conv_channels * n_recurrent_layers] f32: every DeltaNet layer's conv1d side by side (the layers' conv1d
    // are views of it), so commit replays many layers in one conv (commit_graph.hpp); nullptr without DeltaNet layers
    ggml_tensor * conv1d_all = nullptr;

    // Owned, freed in reverse: the mapping last (the buffers may wrap it), the context after its buffers.
    struct Mapping {
        void * addr = nullptr;
        size_t size = 0;
        Mapping() = default;
        Mapping(const Mapping &) = delete;
        Mapping & operator=(const Mapping &) = delete;
        ~Mapping();
    } map;                                         // the mmapped file (weights on the CPU, embedding rows)
    ggml_context_ptr ctx;                          // tensor metadata
    ggml_context_ptr host_ctx;                     // tok_embd's metadata when it lives on the host only
    TokenEmbedding embedding;                      // reads tok_embd's rows from `map`
    std::vector<ggml_backend_buffer_ptr> buffers;  // tensor data (device buffer, or mmap + converted)
    size_t weight_bytes = 0;
};

// Reads, validates and uploads the target to `backend`. Matrices that multiply one input (a
// DeltaNet layer's qkv|z|beta|alpha, an attention layer's q|k|v, gate|up) are StackedMatrices.
// On the CPU backend the other weights stay in the mmapped file (zero copy); stacked ones are
// copied, their members being apart in the file.
// Throws Error: LB_E_IO (missing/unreadable), LB_E_FORMAT (not a GGUF, truncated, missing key or
// tensor, wrong shape), LB_E_UNSUPPORTED (architecture, tensor type, hyperparameters the ops
// cannot run), LB_E_OOM (device allocation).
std::unique_ptr<TargetModel> load_target(const std::string & path, ggml_backend_t backend, bool backend_is_cpu);

// The memory planner's target: read and checked as load_target does, its tensors laid out without
// data; *weight_bytes = what load_target allocates for them in buffers of `buft`.
std::unique_ptr<TargetModel> plan_target(const std::string & path, ggml_backend_buffer_type_t buft, bool backend_is_cpu,
                                         size_t * weight_bytes);

}  // namespace lb
