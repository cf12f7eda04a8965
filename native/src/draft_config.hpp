// draft_config.hpp: the sizes and attention layout of a z-lab DFlash draft, read from config.json.
//
// Field resolution follows the `dflash` package (model.py) on top of transformers' Qwen3Config:
//  - dflash values (block_size, mask_token_id, target_layer_ids, input_embedding_scale,
//    output_multiplier, final_logit_softcapping) come from "dflash_config", else the top level;
//  - sliding_window only counts when use_sliding_window is true (Qwen3Config drops it otherwise);
//  - layer_types, when absent, is Qwen3Config's default (sliding from max_window_layers on);
//  - per layer: causal = top-level is_causal if given, else (layer is sliding_attention);
//    window = sliding_window for sliding_attention layers, none for full_attention.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lb {

struct DraftLayerAttn {
    bool causal = false;   // key position <= query position
    int32_t window = 0;    // > 0: |query - key| < window (one-sided when causal); 0: unlimited
};

struct DraftConfig {
    int32_t n_layer = 0;          // draft layers (num_hidden_layers)
    int32_t n_embd = 0;           // hidden_size; equals the target's n_embd
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;
    int32_t n_ff = 0;             // intermediate_size
    int32_t n_vocab = 0;          // vocab_size if given (checked against the target), else 0
    int32_t num_target_layers = 0;  // if given (checked against the target), else 0
    int32_t block_size = 0;       // B: tokens per drafted block, including `last`
    int32_t mask_token_id = -1;
    std::vector<int32_t> target_layer_ids;  // target layer outputs feeding `fc`, in concat order
    float rope_theta = 10000.0f;
    float rope_freq_scale = 1.0f; // 1/factor for rope_type "linear"
    float rms_eps = 1e-6f;
    bool attention_bias = false;
    float input_embedding_scale = 1.0f;
    float output_multiplier = 1.0f;
    float logit_softcap = 0.0f;   // 0: off
    std::vector<DraftLayerAttn> attn;  // [n_layer]
    // config.json's top-level sliding_window when it is a number (whether or not use_sliding_window
    // applies it to layers), else 0: the default context window of the engine's draft ring
    int32_t sliding_window = 0;

    int32_t n_feat() const { return int32_t(target_layer_ids.size()) * n_embd; }  // fc input width
    bool any_sliding() const;
};

// Reads and self-checks `dir`/config.json. Throws Error: LB_E_IO (missing), LB_E_FORMAT
// (bad JSON, missing dflash_config / sizes), LB_E_UNSUPPORTED (DFlash2, rope scaling, activation).
DraftConfig draft_config_load(const std::string & dir);
DraftConfig draft_config_parse(const std::string & json_text, const std::string & origin);

// Checks the draft fits the target. Throws Error(LB_E_MISMATCH) naming the first mismatch.
void draft_config_check_target(const DraftConfig & cfg, int32_t target_n_embd, int32_t target_n_vocab,
                               int32_t target_n_layer);

}  // namespace lb
