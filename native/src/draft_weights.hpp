// draft_weights.hpp: the DFlash draft's own tensors, uploaded to one ggml backend.
// The draft has no embedding or lm_head: those are the target's (see draft_model.hpp).
// Shapes are ggml order (ne0 first): a torch Linear weight [out, in] is ggml [in, out].
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"

#include "draft_config.hpp"
#include "matmul.hpp"

namespace lb {

// Storage type of the draft's matrices on the device. Norm vectors and biases are always F32.
enum class DraftWeightType {
    keep,  // as in the checkpoint (BF16 for z-lab drafts): exact, 3.46 GB for the 27B draft
    f32,   // exact reference arithmetic (tests)
    f16,
    bf16,
    q8_0,  // half the bytes of BF16; matrices whose rows are not a multiple of 32 fall back to F16
};

// Parses "keep" | "f32" | "f16" | "bf16" | "q8_0"; false when unknown.
bool draft_weight_type_from_string(const std::string & s, DraftWeightType * out);

struct DraftLayerWeights {
    ggml_tensor * attn_norm = nullptr;  // [n_embd]
    StackedMatrices attn_qkv;           // q [n_embd, n_head*head_dim], k, v [n_embd, n_head_kv*head_dim]
    ggml_tensor * wo = nullptr;         // [n_head*head_dim, n_embd]
    ggml_tensor * bq = nullptr, * bk = nullptr, * bv = nullptr, * bo = nullptr;  // attention_bias only
    ggml_tensor * q_norm = nullptr;     // [head_dim]
    ggml_tensor * k_norm = nullptr;     // [head_dim]
    ggml_tensor * ffn_norm = nullptr;   // [n_embd]
    StackedMatrices ffn_gate_up;        // gate, up: [n_embd, n_ff] each
    ggml_tensor * ffn_down = nullptr;   // [n_ff, n_embd]
};

struct DraftWeights {
    ggml_context_ptr ctx;                     // tensor metadata only
    ggml_backend_buffer_ptr buffer;           // all tensor data, on the backend (freed before ctx)
    ggml_tensor * fc = nullptr;               // [n_feat, n_embd]: concat of target features -> hidden
    ggml_tensor * hidden_norm = nullptr;      // [n_embd], applied after fc
    ggml_tensor * out_norm = nullptr;         // [n_embd], before the target's output matrix
    std::vector<DraftLayerWeights> layers;

    size_t nbytes() const;
};

// Reads `dir`'s safetensors (single or sharded), checks every tensor's shape against cfg, converts
// to `wtype` and uploads. Throws Error: LB_E_IO, LB_E_FORMAT (missing tensor, wrong shape),
// LB_E_UNSUPPORTED (dtype, DFlash2 tensors), LB_E_OOM (device allocation).
std::unique_ptr<DraftWeights> draft_weights_load(const std::string & dir, const DraftConfig & cfg,
                                                 ggml_backend_t backend, DraftWeightType wtype);
// The same tensors laid out from the checkpoint's headers, with no data (the memory planner's).
std::unique_ptr<DraftWeights> draft_weights_layout(const std::string & dir, const DraftConfig & cfg,
                                                   DraftWeightType wtype);

}  // namespace lb
