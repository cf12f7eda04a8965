// target_check: drives the engine's internal capture API (lb_engine::set_capture_layers +
// on_commit) outside the C ABI, for tests.
//
//   target_check --model M.gguf --layers 1,3,5 --prefix TOKENS.i32 --out FEATS.f32
//                [--tree TREE.i32] [--kv f32|f16|q8_0] [--ubatch N] [--device D] [--threads N]
//
// Prefills the prefix; with --tree (int32: n, toks[n], parents[n], n_path, path[n_path]) then
// verifies that tree and commits the path. Writes, in commit order, every committed token's
// captured features as float32 [n_committed, n_layers, n_embd] (what the draft would receive).
// Errors: "error <status>: <message>" on stderr, exit code 2.
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <cstring>
#include <string>
#include <vector>

// The engine is internal to liblucebox (hidden symbols); the tool links its objects (lucebox_core).
#include "engine.hpp"
#include "error.hpp"
#include "lucebox.h"

namespace {

std::vector<int32_t> read_i32(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    lb::check(bool(f), LB_E_IO, "cannot read " + path);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<int32_t> out(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
    return out;
}

int run(int argc, char ** argv) {
    std::map<std::string, std::string> kv;
    for (int i = 1; i + 1 < argc; i += 2) kv[std::string(argv[i]).substr(2)] = argv[i + 1];
    auto get = [&](const std::string & k, const std::string & d) { return kv.count(k) ? kv[k] : d; };

    lb_params p;
    lb_params_default(&p);
    p.target_path = kv["model"].c_str();
    p.max_ctx = 2048;
    const std::string kv_name = get("kv", "f32");
    p.type_k = p.type_v = kv_name == "f16" ? LB_KV_F16 : kv_name == "q8_0" ? LB_KV_Q8_0 : LB_KV_F32;
    p.device = std::stoi(get("device", "-1"));
    p.n_threads = std::stoi(get("threads", "0"));
    p.ubatch = std::stoi(get("ubatch", "512"));

    lb_engine e;
    e.load(p);
    std::vector<int32_t> layers;
    std::stringstream ss(get("layers", ""));
    for (std::string item; std::getline(ss, item, ',');) layers.push_back(std::stoi(item));
    e.set_capture_layers(layers);

    // the hook copies the committed columns of every capture tensor to the host, in commit order
    const int32_t n_embd = e.model->hp.n_embd;
    std::vector<float> out, col(static_cast<size_t>(n_embd));
    e.on_commit = [&](const int32_t * rows, int32_t n, int32_t /* unread: 0 without a draft */) {
        e.settle();  // a commit's graph may still run (lb_engine::commit): these reads go around the backend's stream
        for (int32_t i = 0; i < n; ++i) {
            const int32_t c = rows ? rows[i] : i;
            for (ggml_tensor * t : e.cache.capture) {
                ggml_backend_tensor_get(t, col.data(), size_t(c) * t->nb[1], col.size() * sizeof(float));
                out.insert(out.end(), col.begin(), col.end());
            }
        }
    };

    const std::vector<int32_t> prefix = read_i32(kv["prefix"]);
    int32_t next = 0;
    e.prefill(prefix.data(), int32_t(prefix.size()), &next, nullptr, 0);
    if (kv.count("tree")) {
        const std::vector<int32_t> t = read_i32(kv["tree"]);
        const int32_t n = t[0];
        const int32_t * toks = &t[1];
        const int32_t * parents = &t[1 + size_t(n)];
        const int32_t n_path = t[1 + 2 * size_t(n)];
        const int32_t * path = &t[2 + 2 * size_t(n)];
        std::vector<int32_t> argmax(static_cast<size_t>(n));
        e.verify(toks, parents, n, argmax.data(), nullptr, 0);
        e.commit(path, n_path);
    }
    std::ofstream f(kv["out"], std::ios::binary);
    f.write(reinterpret_cast<const char *>(out.data()), std::streamsize(out.size() * sizeof(float)));
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    try {
        return run(argc, argv);
    } catch (const lb::Error & err) {
        std::fprintf(stderr, "error %d: %s\n", err.status, err.what());
        return 2;
    }
}
