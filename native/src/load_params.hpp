// load_params.hpp: what lb_load and lb_memory_plan both decide from lb_params before any memory:
// argument checks, the KV cache types and whether the device runs them, the target shapes CUDA
// has kernels for, the device itself, and the draft's options.
#pragma once

#include <cstdint>

#include "draft_model.hpp"
#include "ggml-backend.h"
#include "gguf_target.hpp"
#include "lucebox.h"

namespace lb {

constexpr int32_t kMaxCtxLimit = 1 << 24;
// Most nodes one verify may take (lb_params.max_tree); mirrored by config.MAX_TREE_LIMIT (a test
// checks they agree). What a tree of n nodes costs bounds it: ggml-cuda's ssm_conv_tree keeps an
// n x d_conv window table in 48 KiB of shared memory (at most 3072 nodes at d_conv 4, the Qwen3.5
// conv), and a verify holds f32 logits for every node (~1 GiB at 1024 nodes for a 248K vocabulary)
// and each DeltaNet layer's per-node states (~3 MiB a node on 27B). 1024 runs on every backend; a
// DDTree over (block_size - 1) x top_k candidates gains nothing near it (the default budget is 22).
constexpr int32_t kMaxTreeLimit = 1024;
constexpr int32_t kMaxUbatchLimit = 1 << 16;  // tokens per prefill graph; mirrors config.MAX_UBATCH

// Throws Error(LB_E_INVALID_ARG) naming the first lb_params field out of range.
void check_params(const lb_params & p);

// LB_KV_* -> ggml type (Error(LB_E_INVALID_ARG) naming `field` for an unknown code), and back.
ggml_type kv_type_from_lb(int32_t t, const char * field);
int32_t kv_type_to_lb(ggml_type t);

// Throws Error(LB_E_UNSUPPORTED) when `dev`'s flash attention (the target's attention) cannot read
// a K cache of type_k with a V cache of type_v, naming the pairs it can.
void check_kv_types(ggml_backend_dev_t dev, const TargetHparams & hp, ggml_type type_k, ggml_type type_v);

// Throws Error(LB_E_UNSUPPORTED) when a context of p.max_ctx tokens has more key rows than `dev`'s
// batch-invariant attention takes (ggml-cuda: what its merge step's shared memory holds, ~5.9M keys on an
// H100, ~2.5M on an RTX 3090 / 4090 / 5090), naming the most it takes; ggml's own kernels (batch_invariant
// 0) have no such bound.
void check_attention_reach(ggml_backend_dev_t dev, const TargetHparams & hp, const lb_params & p);

// Throws Error(LB_E_UNSUPPORTED) for DeltaNet shapes ggml-cuda has no kernel for.
void check_cuda_shapes(const TargetHparams & hp);

// The ggml device of lb_params.device (-1: the CPU). Throws Error(LB_E_UNSUPPORTED) for a CUDA
// device this build or machine does not have.
ggml_backend_dev_t device_of(int32_t device);
bool device_is_cpu(ggml_backend_dev_t dev);

// The draft's options as lb_load sets them: context cache F32 on the CPU (exact), F16 on CUDA; a
// ring of p.draft_window rows (0: from its config), never more than p.max_ctx; p.draft_weights.
DraftOptions draft_options(bool is_cpu, const lb_params & p);

// Columns of the captured features: one per token of the largest forward (prefill or verify).
inline int32_t capture_rows(int32_t ubatch, int32_t max_tree) { return ubatch > max_tree ? ubatch : max_tree; }

// Rows of the token-embedding staging matrix: the tokens of the largest forward or draft block.
inline int32_t embedding_rows(int32_t ubatch, int32_t max_tree, int32_t draft_block) {
    const int32_t forward = capture_rows(ubatch, max_tree);
    return forward > draft_block ? forward : draft_block;
}

}  // namespace lb
