// load_params.cpp: see load_params.hpp.
#include "load_params.hpp"

#include <algorithm>
#include <iterator>
#include <string>

#include "caches.hpp"
#include "error.hpp"
#include "layers.hpp"
#include "ggml-cpp.h"
#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cuda.h"
#endif

namespace lb {

namespace {

// LB_KV_* <-> ggml types, in LB_KV_* order
constexpr ggml_type kKvTypes[] = {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_F32, GGML_TYPE_BF16};

void check_range(const char * name, int32_t v, int32_t lo, int32_t hi, const std::string & hint = "") {
    check(v >= lo && v <= hi, LB_E_INVALID_ARG,
          std::string(name) + " " + std::to_string(v) + " is out of range [" + std::to_string(lo) + ", " +
              std::to_string(hi) + "]" + hint);
}

// ggml-cuda's index of `dev`, or -1 when it is not a CUDA device (or this build has no CUDA)
int cuda_index(ggml_backend_dev_t dev) {
#ifdef LUCEBOX_WITH_CUDA
    ggml_backend_reg_t reg = ggml_backend_cuda_reg();
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
        if (ggml_backend_reg_dev_get(reg, i) == dev) return int(i);
    }
#else
    (void) dev;
#endif
    return -1;
}

// Whether ggml-cuda's batch-invariant flash attention takes this K/V pair on `dev` (mixed pairs need
// its tensor-core path); false on any other GPU backend.
bool invariant_attention(ggml_backend_dev_t dev, ggml_type k, ggml_type v) {
    const int i = cuda_index(dev);
#ifdef LUCEBOX_WITH_CUDA
    return i >= 0 && ggml_backend_cuda_invariant_attention_supported(i, k, v);
#else
    (void) i; (void) k; (void) v;
    return false;
#endif
}

}  // namespace

void check_params(const lb_params & p) {
    check(p.target_path != nullptr && p.target_path[0] != '\0', LB_E_INVALID_ARG,
          "lb_params.target_path is empty; pass the path of a qwen35 GGUF");
    check_range("max_ctx", p.max_ctx, 1, kMaxCtxLimit);
    check_range("ubatch", p.ubatch, 1, kMaxUbatchLimit);
    check_range("max_tree", p.max_tree, 1, kMaxTreeLimit);
    check(p.device >= -1, LB_E_INVALID_ARG, "device must be -1 (CPU) or a CUDA device index");
    check_range("draft_window", p.draft_window, 0, kMaxCtxLimit,
                " (0: the draft's sliding_window, else " + std::to_string(LB_DRAFT_WINDOW_DEFAULT) + ")");
    kv_type_from_lb(p.type_k, "type_k");
    kv_type_from_lb(p.type_v, "type_v");
    check(p.batch_invariant == 0 || p.batch_invariant == 1, LB_E_INVALID_ARG,
          "batch_invariant must be 0 or 1, got " + std::to_string(p.batch_invariant));
    check(p.draft_weights == LB_DRAFT_WEIGHTS_KEEP || p.draft_weights == LB_DRAFT_WEIGHTS_Q8_0, LB_E_INVALID_ARG,
          "draft_weights must be LB_DRAFT_WEIGHTS_KEEP (0) or LB_DRAFT_WEIGHTS_Q8_0 (1), got " +
              std::to_string(p.draft_weights));
}

ggml_type kv_type_from_lb(int32_t t, const char * field) {
    if (t >= 0 && t < int32_t(std::size(kKvTypes))) return kKvTypes[t];
    throw Error(LB_E_INVALID_ARG, std::string(field) + " " + std::to_string(t) +
                                      " is unknown; use LB_KV_F16, LB_KV_BF16, LB_KV_Q8_0, LB_KV_Q4_0 or LB_KV_F32");
}

int32_t kv_type_to_lb(ggml_type t) {
    return int32_t(std::find(std::begin(kKvTypes), std::end(kKvTypes), t) - std::begin(kKvTypes));
}

// A pair outside the device's kernels fails at load, naming those it has, instead of at the first forward.
void check_kv_types(ggml_backend_dev_t dev, const TargetHparams & hp, ggml_type type_k, ggml_type type_v) {
    const bool is_cpu = device_is_cpu(dev);
    ggml_init_params ip = {ggml_tensor_overhead() * 8, nullptr, true};
    const ggml_context_ptr ctx(ggml_init(ip));
    check(ctx != nullptr, LB_E_OOM, "cannot create a context to check the KV types");
    const auto runs = [&](ggml_type k, ggml_type v) {
        const int64_t D = hp.head_dim, n_kv = kKvPad;
        ggml_tensor * q = ggml_new_tensor_3d(ctx.get(), GGML_TYPE_F32, D, 1, hp.n_head);
        ggml_tensor * kt = ggml_new_tensor_3d(ctx.get(), k, D, n_kv, hp.n_head_kv);
        ggml_tensor * vt = ggml_new_tensor_3d(ctx.get(), v, D, n_kv, hp.n_head_kv);
        ggml_tensor * mask = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F16, n_kv, 1);
        const bool ok = ggml_backend_dev_supports_op(dev, ggml_flash_attn_ext(ctx.get(), q, kt, vt, mask, 1.0f, 0.0f, 0.0f));
        ggml_reset(ctx.get());  // metadata only: the next probe reuses the room
        // on a GPU the pair must also have a batch-invariant kernel (vendor/patches/0009)
        return ok && (is_cpu || invariant_attention(dev, k, v));
    };
    if (hp.n_attn_layers() == 0 || runs(type_k, type_v)) return;
    std::string pairs;
    for (ggml_type k : kKvTypes) {
        for (ggml_type v : kKvTypes) {
            if (runs(k, v)) {
                pairs += std::string(pairs.empty() ? "" : ", ") + ggml_type_name(k) + "/" + ggml_type_name(v);
            }
        }
    }
    throw Error(LB_E_UNSUPPORTED, std::string("K cache ") + ggml_type_name(type_k) + " with V cache " +
                                      ggml_type_name(type_v) + " has no attention kernel on " +
                                      ggml_backend_dev_name(dev) + "; supported K/V pairs: " +
                                      (pairs.empty() ? "none" : pairs));
}

void check_attention_reach(ggml_backend_dev_t dev, const TargetHparams & hp, const lb_params & p) {
    const int i = cuda_index(dev);
    if (p.batch_invariant == 0 || hp.n_attn_layers() == 0 || i < 0) return;
#ifdef LUCEBOX_WITH_CUDA
    const int64_t reach = ggml_backend_cuda_invariant_attention_max_keys(i);
    const int64_t most = reach / kKvPad * kKvPad;  // the largest max_ctx whose padded rows fit
    check(pad_kv_rows(p.max_ctx) <= reach, LB_E_UNSUPPORTED,
          "max_ctx " + std::to_string(p.max_ctx) + " is more than the batch-invariant attention on " +
              ggml_backend_dev_name(dev) + " takes (" + std::to_string(most) + " tokens); lower max_ctx");
#endif
}

// ggml-cuda kernels are instantiated for these sizes only (and abort on others).
void check_cuda_shapes(const TargetHparams & hp) {
    const int32_t S = hp.head_v_dim, K = hp.d_conv;
    check(S == 16 || S == 32 || S == 64 || S == 128, LB_E_UNSUPPORTED,
          "DeltaNet head size " + std::to_string(S) + " has no CUDA kernel (16, 32, 64, 128); use device -1 (CPU)");
    check(K == 3 || K == 4 || K == 5 || K == 9 || K == 15, LB_E_UNSUPPORTED,
          "conv kernel " + std::to_string(K) + " has no CUDA kernel (3, 4, 5, 9, 15); use device -1 (CPU)");
}

ggml_backend_dev_t device_of(int32_t device) {
    if (device < 0) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        check(dev != nullptr, LB_E_BACKEND, "ggml has no CPU device");
        return dev;
    }
#ifdef LUCEBOX_WITH_CUDA
    ggml_backend_reg_t reg = ggml_backend_cuda_reg();
    const int n_dev = int(ggml_backend_reg_dev_count(reg));
    check(device < n_dev, LB_E_UNSUPPORTED,
          "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n_dev) +
              " found); pick device -1 (CPU) or 0.." + std::to_string(n_dev - 1));
    return ggml_backend_reg_dev_get(reg, size_t(device));
#else
    throw Error(LB_E_UNSUPPORTED, "this liblucebox was built without CUDA; use device -1 (CPU) or rebuild with "
                                  "-DLUCEBOX_CUDA=ON");
#endif
}

bool device_is_cpu(ggml_backend_dev_t dev) { return ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU; }

DraftOptions draft_options(bool is_cpu, const lb_params & p) {
    DraftOptions opt;
    opt.weight_type = p.draft_weights == LB_DRAFT_WEIGHTS_Q8_0 ? DraftWeightType::q8_0 : DraftWeightType::keep;
    opt.kv_type = is_cpu ? GGML_TYPE_F32 : GGML_TYPE_F16;
    opt.ctx_size = p.draft_window;  // 0: from the draft's config
    opt.ctx_limit = p.max_ctx;      // a ring longer than the context would only hold empty rows
    return opt;
}

}  // namespace lb
