// state.cpp: snapshots of the committed state (lb_state_size / save / load), for prefix reuse.
//
// Blob layout (host byte order; valid only for an engine of the same shape, see shape_key):
//   Header                                  magic, format, shape key, P, draft bytes
//   per full-attention layer il:  K rows 0..P-1, then V rows 0..P-1   (P * k[il]->nb[1] bytes each)
//   per DeltaNet layer il:        conv[il], then ssm[il]              (whole tensors, f32)
//   draft context (if a draft):   DraftModel::state_save's bytes
// Rows at P and beyond are not saved: they are masked out until a later forward rewrites them.
#include <algorithm>
#include <cstring>

#include "engine.hpp"
#include "error.hpp"

using lb::Error;
using lb::check;

namespace {

constexpr uint32_t kMagic = 0x5453424C;  // "LBST"
constexpr uint32_t kFormat = 1;

struct Header {
    uint32_t magic;
    uint32_t format;
    uint64_t shape_key;
    int32_t n_past;
    int32_t reserved;
    int64_t draft_bytes;
};

// FNV-1a over the numbers that decide a blob's layout.
struct ShapeKey {
    uint64_t h = 1469598103934665603ull;
    void add(uint64_t v) {
        for (int i = 0; i < 8; ++i) {
            h ^= (v >> (8 * i)) & 0xff;
            h *= 1099511628211ull;
        }
    }
};

size_t live_rows_bytes(const ggml_tensor * t, int32_t n) { return size_t(n) * t->nb[1]; }

}  // namespace

namespace lb {

// --- the draft's context -------------------------------------------------------------------------
uint64_t DraftModel::shape_key() const {
    ShapeKey k;
    k.add(uint64_t(cfg_.n_layer));
    k.add(uint64_t(ctx_size_));
    k.add(uint64_t(rows_));
    for (size_t l = 0; l < k_cache_.size(); ++l) {
        k.add(k_cache_[l]->nb[1]);
        k.add(v_cache_[l]->nb[1]);
        k.add(uint64_t(k_cache_[l]->type));
    }
    return k.h;
}

size_t DraftModel::state_bytes() const {
    const size_t n_valid = size_t(std::min(n_past_, ctx_size_));
    size_t n = 2 * sizeof(int32_t) + n_valid * sizeof(int32_t);
    for (size_t l = 0; l < k_cache_.size(); ++l) n += n_valid * (k_cache_[l]->nb[1] + v_cache_[l]->nb[1]);
    return n;
}

void DraftModel::state_save(uint8_t * out) const {
    const int32_t n_valid = std::min(n_past_, ctx_size_);
    std::memcpy(out, &n_past_, sizeof(int32_t));
    std::memcpy(out + sizeof(int32_t), &n_valid, sizeof(int32_t));
    out += 2 * sizeof(int32_t);
    std::memcpy(out, slot_pos_.data(), size_t(n_valid) * sizeof(int32_t));
    out += size_t(n_valid) * sizeof(int32_t);
    if (n_valid == 0) return;
    for (size_t l = 0; l < k_cache_.size(); ++l) {
        for (const ggml_tensor * t : {k_cache_[l], v_cache_[l]}) {
            const size_t bytes = live_rows_bytes(t, n_valid);
            ggml_backend_tensor_get(t, out, 0, bytes);
            out += bytes;
        }
    }
}

void DraftModel::state_load(const uint8_t * in, size_t n) {
    int32_t n_past = 0, n_valid = 0;
    check(n >= 2 * sizeof(int32_t), LB_E_FORMAT, "lb_state_load: the draft part of the snapshot is truncated");
    std::memcpy(&n_past, in, sizeof(int32_t));
    std::memcpy(&n_valid, in + sizeof(int32_t), sizeof(int32_t));
    check(n_past >= 0 && n_valid == std::min(n_past, ctx_size_), LB_E_FORMAT,
          "lb_state_load: the draft part of the snapshot is corrupt");
    size_t need = 2 * sizeof(int32_t) + size_t(n_valid) * sizeof(int32_t);
    for (size_t l = 0; l < k_cache_.size(); ++l) need += size_t(n_valid) * (k_cache_[l]->nb[1] + v_cache_[l]->nb[1]);
    check(n == need, LB_E_FORMAT, "lb_state_load: the draft part of the snapshot has the wrong size");
    in += 2 * sizeof(int32_t);
    std::fill(slot_pos_.begin(), slot_pos_.end(), -1);
    std::memcpy(slot_pos_.data(), in, size_t(n_valid) * sizeof(int32_t));
    in += size_t(n_valid) * sizeof(int32_t);
    for (size_t l = 0; l < k_cache_.size() && n_valid > 0; ++l) {
        for (ggml_tensor * t : {k_cache_[l], v_cache_[l]}) {
            const size_t bytes = live_rows_bytes(t, n_valid);
            ggml_backend_tensor_set(t, in, 0, bytes);
            in += bytes;
        }
    }
    n_past_ = n_past;
}

}  // namespace lb

// --- the engine ------------------------------------------------------------------------------------
namespace {

uint64_t engine_shape_key(const lb::TargetCache & c, int32_t max_ctx, const lb::DraftModel * draft) {
    ShapeKey k;
    k.add(uint64_t(max_ctx));
    k.add(uint64_t(c.type_k));
    k.add(uint64_t(c.type_v));
    k.add(c.k.size());
    for (size_t il = 0; il < c.k.size(); ++il) {
        k.add(c.k[il] ? c.k[il]->nb[1] : 0);
        k.add(c.v[il] ? c.v[il]->nb[1] : 0);
        k.add(c.conv[il] ? ggml_nbytes(c.conv[il]) : 0);
        k.add(c.ssm[il] ? ggml_nbytes(c.ssm[il]) : 0);
    }
    k.add(draft ? draft->shape_key() : 0);
    return k.h;
}

size_t target_bytes(const lb::TargetCache & c, int32_t n_past) {
    size_t n = 0;
    for (size_t il = 0; il < c.k.size(); ++il) {
        if (c.k[il]) n += live_rows_bytes(c.k[il], n_past) + live_rows_bytes(c.v[il], n_past);
        if (c.conv[il]) n += ggml_nbytes(c.conv[il]) + ggml_nbytes(c.ssm[il]);
    }
    return n;
}

}  // namespace

size_t lb_engine::state_size() const {
    return sizeof(Header) + target_bytes(cache, n_past) + (draft ? draft->state_bytes() : 0);
}

size_t lb_engine::state_save(uint8_t * buf, int64_t cap) const {
    const size_t need = state_size();
    check(cap >= 0 && size_t(cap) >= need, LB_E_INVALID_ARG,
          "lb_state_save: buf holds " + std::to_string(cap) + " bytes, the snapshot needs " + std::to_string(need) +
              " (ask lb_state_size)");
    Header h{kMagic, kFormat, engine_shape_key(cache, max_ctx, draft.get()), n_past, 0,
             int64_t(draft ? draft->state_bytes() : 0)};
    std::memcpy(buf, &h, sizeof h);
    uint8_t * out = buf + sizeof h;
    for (size_t il = 0; il < cache.k.size(); ++il) {
        for (const ggml_tensor * t : {cache.k[il], cache.v[il]}) {
            if (!t || n_past == 0) continue;
            const size_t bytes = live_rows_bytes(t, n_past);
            ggml_backend_tensor_get(t, out, 0, bytes);
            out += bytes;
        }
        for (const ggml_tensor * t : {cache.conv[il], cache.ssm[il]}) {
            if (!t) continue;
            ggml_backend_tensor_get(t, out, 0, ggml_nbytes(t));
            out += ggml_nbytes(t);
        }
    }
    if (draft) draft->state_save(out);
    return need;
}

void lb_engine::state_load(const uint8_t * buf, int64_t n) {
    Header h{};
    check(n >= int64_t(sizeof h), LB_E_FORMAT, "lb_state_load: " + std::to_string(n) + " bytes are not a snapshot");
    std::memcpy(&h, buf, sizeof h);
    check(h.magic == kMagic && h.format == kFormat, LB_E_FORMAT,
          "lb_state_load: not a lucebox snapshot (or one from another lucebox version)");
    check(h.shape_key == engine_shape_key(cache, max_ctx, draft.get()), LB_E_MISMATCH,
          "lb_state_load: the snapshot comes from an engine of another shape (model, max_ctx, KV types or draft)");
    check(h.n_past >= 0 && h.n_past <= max_ctx, LB_E_FORMAT, "lb_state_load: the snapshot's position is corrupt");
    const size_t body = target_bytes(cache, h.n_past);
    check(h.draft_bytes >= 0 && uint64_t(n) == sizeof h + body + uint64_t(h.draft_bytes), LB_E_FORMAT,
          "lb_state_load: the snapshot has the wrong size (truncated or corrupt)");
    // the draft part first: it is the only part that can still refuse the blob
    const uint8_t * in = buf + sizeof h;
    if (draft) draft->state_load(in + body, size_t(h.draft_bytes));
    for (size_t il = 0; il < cache.k.size(); ++il) {
        for (ggml_tensor * t : {cache.k[il], cache.v[il]}) {
            if (!t || h.n_past == 0) continue;
            const size_t bytes = live_rows_bytes(t, h.n_past);
            ggml_backend_tensor_set(t, in, 0, bytes);
            in += bytes;
        }
        for (ggml_tensor * t : {cache.conv[il], cache.ssm[il]}) {
            if (!t) continue;
            ggml_backend_tensor_set(t, in, 0, ggml_nbytes(t));
            in += ggml_nbytes(t);
        }
    }
    n_past = h.n_past;
    verify_pending_ = false;
}
