// safetensors.cpp: header parsing and bounded reads. Format: u64 LE header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data.
#include "safetensors.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "error.hpp"
#include "file_io.hpp"
#include "json.hpp"

namespace lb {

namespace {

// A real header is a few hundred KB; anything huge is a corrupt or hostile file.
constexpr uint64_t kMaxHeader = 100ull << 20;
constexpr int64_t kMaxElems = int64_t(1) << 40;

constexpr const char * kOpenFix = "check the path and permissions";

[[noreturn]] void bad(const std::string & path, const std::string & what) {
    throw Error(LB_E_FORMAT, path + ": " + what + " (not a valid safetensors file; re-download it)");
}

}  // namespace

size_t st_dtype_size(const std::string & dtype) {
    if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
    if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
    if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
    if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
    return 0;
}

int64_t StTensor::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string StTensor::shape_str() const {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

SafetensorsSet SafetensorsSet::open_file(const std::string & path) {
    SafetensorsSet set;
    set.add_file(path, nullptr);
    return set;
}

SafetensorsSet SafetensorsSet::open_dir(const std::string & dir) {
    const std::string index_path = dir + "/model.safetensors.index.json";
    const std::string single_path = dir + "/model.safetensors";
    SafetensorsSet set;
    if (!is_file(index_path)) {
        if (!is_file(single_path)) {
            throw Error(LB_E_IO, "no model.safetensors or model.safetensors.index.json in " + dir +
                                          ": point draft_path at the DFlash draft folder");
        }
        set.add_file(single_path, nullptr);
        return set;
    }
    json::Value index;
    try {
        const std::string text = read_text_file(index_path, kOpenFix);
        index = json::parse(text.data(), text.size());
    } catch (const std::runtime_error & e) {
        if (dynamic_cast<const Error *>(&e)) throw;
        throw Error(LB_E_FORMAT, index_path + ": " + e.what());
    }
    const json::Value * map = json::find(index, "weight_map");
    if (!map || !map->is_object()) throw Error(LB_E_FORMAT, index_path + ": no \"weight_map\" object");
    // Shards in first-seen order (of the names, sorted); each shard must hold the names the map assigns to it.
    std::vector<std::string> shards;
    std::unordered_map<std::string, std::vector<std::string>> names_of;
    for (const auto & [name, file] : map->items()) {
        const std::string * shard = file.get_ptr<const std::string *>();
        if (!shard || shard->empty() || shard->find('/') != std::string::npos) {
            throw Error(LB_E_FORMAT, index_path + ": weight_map[\"" + name + "\"] is not a file name");
        }
        auto & names = names_of[*shard];
        if (names.empty()) shards.push_back(*shard);
        names.push_back(name);
    }
    for (const auto & shard : shards) set.add_file(dir + "/" + shard, &names_of[shard]);
    return set;
}

void SafetensorsSet::add_file(const std::string & path, const std::vector<std::string> * only) {
    File f = open_binary(path, kOpenFix);
    if (std::fseek(f.get(), 0, SEEK_END) != 0) throw Error(LB_E_IO, "cannot seek in " + path);
    const long long file_size = ftello(f.get());
    std::rewind(f.get());
    unsigned char len_bytes[8];
    if (file_size < 8 || std::fread(len_bytes, 1, 8, f.get()) != 8) bad(path, "file shorter than its 8-byte header length");
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
    if (header_len > kMaxHeader || header_len + 8 > uint64_t(file_size)) bad(path, "header length out of range");
    std::string header(header_len, '\0');
    if (std::fread(header.data(), 1, header_len, f.get()) != header_len) bad(path, "truncated header");

    json::Value root;
    try {
        root = json::parse(header.data(), header.size());
    } catch (const std::runtime_error & e) {
        bad(path, std::string("header: ") + e.what());
    }
    if (!root.is_object()) bad(path, "header is not a JSON object");

    const int file_index = int(files_.size());
    files_.push_back(path);
    const uint64_t data_start = 8 + header_len;
    const uint64_t data_size = uint64_t(file_size) - data_start;
    std::vector<std::pair<uint64_t, uint64_t>> spans;  // [begin, end) of each tensor in the data section
    for (const auto & [name, e] : root.items()) {
        if (name == "__metadata__") continue;
        const json::Value * dtype = json::find(e, "dtype");
        const json::Value * shape = json::find(e, "shape");
        const json::Value * offs = json::find(e, "data_offsets");
        if (!dtype || !dtype->is_string() || !shape || !shape->is_array() || !offs || !offs->is_array() ||
            offs->size() != 2) {
            bad(path, "tensor \"" + name + "\" lacks dtype/shape/data_offsets");
        }
        StTensor t;
        t.name = name;
        t.dtype = dtype->get<std::string>();
        t.file = file_index;
        // every dim, and their product, bounded so numel() cannot overflow (the data section bounds it anyway)
        int64_t numel = 1;
        for (const auto & d : *shape) {
            const std::optional<int64_t> dim = json::as_integer(d);
            if (!dim || *dim < 0 || *dim > kMaxElems || (*dim > 0 && numel > kMaxElems / *dim)) {
                bad(path, "tensor \"" + name + "\" has a bad shape");
            }
            numel *= *dim;
            t.shape.push_back(*dim);
        }
        const std::optional<int64_t> begin = json::as_integer((*offs)[0]);
        const std::optional<int64_t> end = json::as_integer((*offs)[1]);
        if (!begin || !end || *begin < 0 || *end < *begin || uint64_t(*end) > data_size) {
            bad(path, "tensor \"" + name + "\" has data_offsets outside the file");
        }
        t.offset = data_start + uint64_t(*begin);
        t.nbytes = uint64_t(*end - *begin);
        const size_t esize = st_dtype_size(t.dtype);
        if (esize != 0 && uint64_t(t.numel()) * esize != t.nbytes) {
            bad(path, "tensor \"" + name + "\" byte size does not match " + t.dtype + " " + t.shape_str());
        }
        if (by_name_.count(t.name)) bad(path, "tensor \"" + t.name + "\" appears in two shards");
        spans.push_back({uint64_t(*begin), uint64_t(*end)});
        by_name_[t.name] = tensors_.size();
        tensors_.push_back(std::move(t));
    }
    // The format's rule: the tensors tile the data section exactly, no gaps, no overlaps. A header
    // length off by a few bytes (every tensor shifted) or a cut/extended file fails here.
    std::sort(spans.begin(), spans.end());
    uint64_t at = 0;
    for (const auto & sp : spans) {
        if (sp.first != at) bad(path, "tensor data leaves a gap or overlaps at byte " + std::to_string(at) + " of the data");
        at = sp.second;
    }
    if (at != data_size) {
        bad(path, "the tensors cover " + std::to_string(at) + " of the " + std::to_string(data_size) +
                      " data bytes after the header");
    }
    if (only) {
        for (const auto & name : *only) {
            const StTensor * t = find(name);
            if (!t || t->file != file_index) bad(path, "the index lists \"" + name + "\" in this shard but it is not there");
        }
    }
}

const StTensor * SafetensorsSet::find(const std::string & name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsSet::read_bytes(const StTensor & t, uint64_t begin, uint64_t n, void * dst) const {
    if (begin > t.nbytes || n > t.nbytes - begin) {
        throw Error(LB_E_INVALID_ARG, "read past the end of \"" + t.name + "\"");
    }
    File f = open_binary(files_[t.file], kOpenFix);
    if (fseeko(f.get(), off_t(t.offset + begin), SEEK_SET) != 0 || std::fread(dst, 1, n, f.get()) != n) {
        throw Error(LB_E_IO, "short read of \"" + t.name + "\" from " + files_[t.file]);
    }
}

}  // namespace lb
