// draft_config.cpp: config.json -> DraftConfig, mirroring dflash's and Qwen3Config's defaults.
#include "draft_config.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "error.hpp"
#include "file_io.hpp"
#include "json.hpp"

namespace lb {

namespace {

// Sizes beyond this are corrupt configs; the bound keeps every product we form inside int64.
constexpr int64_t kMaxDim = 1 << 24;
constexpr int64_t kMaxDraftLayers = 256;    // z-lab drafts have 1-8 layers
// Tokens per drafted block: z-lab drafts use 16. The verify tree, the draft graph and its cache all
// grow with it, and a block past 64 is a corrupt config rather than a draft anyone trained.
constexpr int64_t kMaxBlockSize = 64;

struct Reader {
    const json::Value & top;
    const json::Value * dflash;  // "dflash_config" object
    const std::string & origin;

    [[noreturn]] void fail(int32_t status, const std::string & what) const {
        throw Error(status, origin + ": " + what + (status == LB_E_FORMAT ? "; fix or re-download the draft's config.json" : ""));
    }

    // Present and not null.
    static const json::Value * get(const json::Value * obj, const char * key) {
        const json::Value * v = obj ? json::find(*obj, key) : nullptr;
        return (v && !v->is_null()) ? v : nullptr;
    }
    // dflash's _draft_value: dflash_config first, then the top level.
    const json::Value * draft_value(const char * key) const {
        const json::Value * v = get(dflash, key);
        return v ? v : get(&top, key);
    }

    int64_t as_int(const json::Value * v, const char * key, int64_t lo, int64_t hi) const {
        const std::optional<int64_t> i = json::as_integer(*v);
        if (!i) fail(LB_E_FORMAT, std::string("\"") + key + "\" must be an integer, got " + json::type_name(*v));
        if (*i < lo || *i > hi) {
            fail(LB_E_FORMAT, std::string("\"") + key + "\" = " + std::to_string(*i) + " is out of range [" +
                                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
        }
        return *i;
    }
    int32_t required_int(const char * key, int64_t lo = 1, int64_t hi = kMaxDim) const {
        const json::Value * v = get(&top, key);
        if (!v) fail(LB_E_FORMAT, std::string("missing \"") + key + "\"");
        return int32_t(as_int(v, key, lo, hi));
    }
    int32_t optional_int(const json::Value * v, const char * key, int32_t fallback, int64_t lo = 1,
                         int64_t hi = kMaxDim) const {
        return v ? int32_t(as_int(v, key, lo, hi)) : fallback;
    }
    float optional_float(const json::Value * v, const char * key, float fallback) const {
        if (!v) return fallback;
        if (!v->is_number() || !std::isfinite(v->get<double>())) fail(LB_E_FORMAT, std::string("\"") + key + "\" must be a number");
        return float(v->get<double>());
    }
    bool optional_bool(const json::Value * v, const char * key, bool fallback) const {
        if (!v) return fallback;
        if (!v->is_boolean()) fail(LB_E_FORMAT, std::string("\"") + key + "\" must be true or false");
        return v->get<bool>();
    }
};

// dflash's build_target_layer_ids: evenly spaced over [1, n_target - 3], Python round (half-even).
std::vector<int32_t> default_target_layer_ids(int32_t n_target, int32_t n_draft) {
    if (n_draft == 1) return {n_target / 2};
    const double start = 1.0, span = double(n_target - 3) - start;
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < n_draft; ++i) ids.push_back(int32_t(std::nearbyint(start + (i * span) / (n_draft - 1))));
    return ids;
}

void read_rope(const Reader & r, DraftConfig & cfg) {
    const json::Value * params = Reader::get(&r.top, "rope_parameters");
    const json::Value * scaling = Reader::get(&r.top, "rope_scaling");
    if (params && !params->is_object()) r.fail(LB_E_FORMAT, "\"rope_parameters\" must be an object");
    if (scaling && !scaling->is_object()) r.fail(LB_E_FORMAT, "\"rope_scaling\" must be an object");
    const json::Value * p = params ? params : scaling;  // transformers folds legacy rope_scaling in
    const json::Value * theta = p ? Reader::get(p, "rope_theta") : nullptr;
    if (!theta) theta = Reader::get(&r.top, "rope_theta");
    cfg.rope_theta = r.optional_float(theta, "rope_theta", 10000.0f);
    if (!(cfg.rope_theta > 0.0f)) r.fail(LB_E_FORMAT, "\"rope_theta\" must be positive");
    std::string type = "default";
    if (p) {
        const json::Value * t = Reader::get(p, "rope_type");
        if (!t) t = Reader::get(p, "type");
        if (t && !t->is_string()) r.fail(LB_E_FORMAT, "\"rope_type\" must be a string");
        if (t) type = t->get<std::string>();
    }
    if (type == "linear") {
        const float factor = r.optional_float(Reader::get(p, "factor"), "factor", 1.0f);
        if (!(factor > 0.0f)) r.fail(LB_E_FORMAT, "rope \"factor\" must be positive");
        cfg.rope_freq_scale = 1.0f / factor;
    } else if (type != "default") {
        r.fail(LB_E_UNSUPPORTED, "rope_type \"" + type + "\" is not supported (only \"default\" and \"linear\")");
    }
}

void read_attention_layout(const Reader & r, DraftConfig & cfg) {
    const bool use_sliding = r.optional_bool(Reader::get(&r.top, "use_sliding_window"), "use_sliding_window", false);
    const json::Value * w = json::find(r.top, "sliding_window");
    if (w && !w->is_null()) cfg.sliding_window = int32_t(r.as_int(w, "sliding_window", 1, int64_t(1) << 30));
    // Qwen3Config: sliding_window defaults to 4096 but is dropped unless use_sliding_window.
    int32_t window = 0;
    if (use_sliding) window = w ? cfg.sliding_window : 4096;
    const int32_t max_window_layers = r.optional_int(Reader::get(&r.top, "max_window_layers"), "max_window_layers", 28, 0);
    std::vector<bool> sliding(cfg.n_layer, false);
    if (const json::Value * lt = Reader::get(&r.top, "layer_types")) {
        if (!lt->is_array() || lt->size() != size_t(cfg.n_layer)) {
            r.fail(LB_E_FORMAT, "\"layer_types\" must list one type per layer (" + std::to_string(cfg.n_layer) + ")");
        }
        for (int32_t i = 0; i < cfg.n_layer; ++i) {
            const json::Value & t = (*lt)[i];
            if (t == "sliding_attention") sliding[i] = true;
            else if (t != "full_attention") {
                r.fail(LB_E_UNSUPPORTED, "layer_types[" + std::to_string(i) +
                                             "] must be \"full_attention\" or \"sliding_attention\"");
            }
        }
    } else {
        for (int32_t i = 0; i < cfg.n_layer; ++i) sliding[i] = window > 0 && i >= max_window_layers;
    }
    const json::Value * is_causal = Reader::get(&r.top, "is_causal");
    const bool has_is_causal = is_causal != nullptr;
    const bool causal_all = r.optional_bool(is_causal, "is_causal", false);
    cfg.attn.resize(cfg.n_layer);
    for (int32_t i = 0; i < cfg.n_layer; ++i) {
        cfg.attn[i].causal = has_is_causal ? causal_all : bool(sliding[i]);
        cfg.attn[i].window = sliding[i] ? window : 0;
    }
}

}  // namespace

bool DraftConfig::any_sliding() const {
    for (const auto & a : attn) {
        if (a.window > 0) return true;
    }
    return false;
}

DraftConfig draft_config_parse(const std::string & text, const std::string & origin) {
    json::Value top;
    try {
        top = json::parse(text.data(), text.size());
    } catch (const std::runtime_error & e) {
        throw Error(LB_E_FORMAT, origin + ": " + e.what() + "; fix or re-download the draft's config.json");
    }
    if (!top.is_object()) throw Error(LB_E_FORMAT, origin + ": not a JSON object; fix or re-download the draft's config.json");

    if (const json::Value * arch = json::find(top, "architectures"); arch && arch->is_array()) {
        for (const auto & a : *arch) {
            if (a == "DFlash2DraftModel") {
                throw Error(LB_E_UNSUPPORTED, origin + ": DFlash2 drafts (dynamic conv + candidate selector) are "
                                                            "not supported; use a DFlash draft (e.g. z-lab/Qwen3.5-27B-DFlash)");
            }
        }
    }
    const json::Value * dflash = json::find(top, "dflash_config");
    if (!dflash || !dflash->is_object()) {
        throw Error(LB_E_FORMAT, origin + ": no \"dflash_config\" object, so this is not a DFlash draft "
                                               "(z-lab *-DFlash checkpoints have one); check draft_path");
    }
    const Reader r{top, dflash, origin};
    DraftConfig cfg;
    cfg.n_layer = r.required_int("num_hidden_layers", 1, kMaxDraftLayers);
    cfg.n_embd = r.required_int("hidden_size");
    cfg.n_head = r.required_int("num_attention_heads");
    cfg.n_head_kv = r.optional_int(Reader::get(&top, "num_key_value_heads"), "num_key_value_heads", cfg.n_head);
    cfg.head_dim = r.optional_int(Reader::get(&top, "head_dim"), "head_dim", 128);  // Qwen3Config's default
    cfg.n_ff = r.required_int("intermediate_size");
    cfg.n_vocab = r.optional_int(Reader::get(&top, "vocab_size"), "vocab_size", 0);
    cfg.num_target_layers = r.optional_int(Reader::get(&top, "num_target_layers"), "num_target_layers", 0);
    cfg.rms_eps = r.optional_float(Reader::get(&top, "rms_norm_eps"), "rms_norm_eps", 1e-6f);
    cfg.attention_bias = r.optional_bool(Reader::get(&top, "attention_bias"), "attention_bias", false);
    if (cfg.n_head % cfg.n_head_kv != 0) {
        r.fail(LB_E_FORMAT, "num_attention_heads (" + std::to_string(cfg.n_head) + ") is not a multiple of "
                            "num_key_value_heads (" + std::to_string(cfg.n_head_kv) + ")");
    }
    if (cfg.head_dim % 2 != 0) r.fail(LB_E_FORMAT, "\"head_dim\" must be even (RoPE rotates pairs)");
    if (!(cfg.rms_eps > 0.0f && cfg.rms_eps <= 1.0f)) {
        r.fail(LB_E_FORMAT, "\"rms_norm_eps\" = " + std::to_string(cfg.rms_eps) + " is outside (0, 1] (drafts use 1e-6)");
    }
    if (const json::Value * act = Reader::get(&top, "hidden_act"); act && *act != "silu") {
        r.fail(LB_E_UNSUPPORTED, "hidden_act must be \"silu\" (the Qwen3 MLP)");
    }
    read_rope(r, cfg);
    read_attention_layout(r, cfg);

    cfg.block_size = r.optional_int(r.draft_value("block_size"), "block_size", 16, 2, kMaxBlockSize);
    const json::Value * mask = r.draft_value("mask_token_id");
    if (!mask) r.fail(LB_E_FORMAT, "dflash_config has no \"mask_token_id\"; a DFlash draft needs its mask token");
    cfg.mask_token_id = int32_t(r.as_int(mask, "mask_token_id", 0, kMaxDim * 64));
    if (const json::Value * ids = r.draft_value("target_layer_ids")) {
        if (!ids->is_array() || ids->empty()) r.fail(LB_E_FORMAT, "\"target_layer_ids\" must be a non-empty list");
        for (const auto & v : *ids) {
            const int32_t id = int32_t(r.as_int(&v, "target_layer_ids", 0, 1 << 16));
            // each entry selects one feature slice of fc's input: a repeat is a corrupt config
            if (std::find(cfg.target_layer_ids.begin(), cfg.target_layer_ids.end(), id) != cfg.target_layer_ids.end()) {
                r.fail(LB_E_FORMAT, "\"target_layer_ids\" lists layer " + std::to_string(id) + " twice");
            }
            cfg.target_layer_ids.push_back(id);
        }
    } else {
        if (cfg.num_target_layers < 4) {
            r.fail(LB_E_FORMAT, "dflash_config has no \"target_layer_ids\" and no usable \"num_target_layers\" to derive them");
        }
        cfg.target_layer_ids = default_target_layer_ids(cfg.num_target_layers, cfg.n_layer);
    }
    if (int64_t(cfg.target_layer_ids.size()) * cfg.n_embd > kMaxDim * 16) r.fail(LB_E_FORMAT, "fc input is implausibly wide");
    cfg.input_embedding_scale = r.optional_float(r.draft_value("input_embedding_scale"), "input_embedding_scale", 1.0f);
    cfg.output_multiplier = r.optional_float(r.draft_value("output_multiplier"), "output_multiplier", 1.0f);
    cfg.logit_softcap = std::max(0.0f, r.optional_float(r.draft_value("final_logit_softcapping"), "final_logit_softcapping", 0.0f));
    return cfg;
}

DraftConfig draft_config_load(const std::string & dir) {
    const std::string path = dir + "/config.json";
    const std::string text = read_text_file(path, "draft_path must be a DFlash draft folder with config.json");
    return draft_config_parse(text, path);
}

void draft_config_check_target(const DraftConfig & cfg, int32_t n_embd, int32_t n_vocab, int32_t n_layer) {
    auto mismatch = [](const std::string & what) {
        throw Error(LB_E_MISMATCH, "draft does not fit the target: " + what + "; use the draft made for this target");
    };
    if (cfg.n_embd != n_embd) {
        mismatch("draft hidden_size " + std::to_string(cfg.n_embd) + " != target n_embd " + std::to_string(n_embd));
    }
    if (cfg.n_vocab != 0 && cfg.n_vocab != n_vocab) {
        mismatch("draft vocab_size " + std::to_string(cfg.n_vocab) + " != target vocabulary " + std::to_string(n_vocab));
    }
    if (cfg.mask_token_id >= n_vocab) {
        mismatch("mask_token_id " + std::to_string(cfg.mask_token_id) + " is outside the target vocabulary (" +
                 std::to_string(n_vocab) + ")");
    }
    if (cfg.num_target_layers != 0 && cfg.num_target_layers != n_layer) {
        mismatch("draft was trained on a " + std::to_string(cfg.num_target_layers) + "-layer target, this one has " +
                 std::to_string(n_layer));
    }
    // Layer L's feature is the residual stream after target layer L (0-based). The last layer's
    // "hidden state" in the reference is the final-normed output instead, which we do not capture.
    for (int32_t id : cfg.target_layer_ids) {
        if (id < 0 || id > n_layer - 2) {
            mismatch("target_layer_ids entry " + std::to_string(id) + " is not in [0, " + std::to_string(n_layer - 2) + "]");
        }
    }
}

}  // namespace lb
