// safetensors.hpp: index of the tensors in a safetensors checkpoint folder, and reads by name.
// A folder holds either one `model.safetensors` or shards listed by `model.safetensors.index.json`.
// Only headers are read at open; tensor bytes are read on demand (no mmap: we convert as we upload).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace lb {

struct StTensor {
    std::string name;
    std::string dtype;           // as written: "BF16", "F16", "F32", ...
    std::vector<int64_t> shape;  // row-major, outermost first (torch order)
    int file = 0;                // index into SafetensorsSet::files()
    uint64_t offset = 0;         // absolute byte offset in the file
    uint64_t nbytes = 0;

    int64_t numel() const;
    std::string shape_str() const;  // "[4096, 5120]"
};

class SafetensorsSet {
public:
    // Opens `dir`/model.safetensors.index.json if present, else `dir`/model.safetensors.
    // Throws Error (LB_E_IO: missing/unreadable; LB_E_FORMAT: corrupt header, bad offsets).
    static SafetensorsSet open_dir(const std::string & dir);
    // One file (used by open_dir; handy in tests).
    static SafetensorsSet open_file(const std::string & path);

    const StTensor * find(const std::string & name) const;  // nullptr when absent
    const std::vector<StTensor> & tensors() const { return tensors_; }
    const std::vector<std::string> & files() const { return files_; }

    // Reads the tensor's nbytes raw bytes into dst. Throws Error(LB_E_IO) on a short read.
    void read(const StTensor & t, void * dst) const { read_bytes(t, 0, t.nbytes, dst); }
    // Reads bytes [begin, begin + n) of the tensor's data (bounded staging for big tensors).
    void read_bytes(const StTensor & t, uint64_t begin, uint64_t n, void * dst) const;

private:
    void add_file(const std::string & path, const std::vector<std::string> * only);

    std::vector<std::string> files_;
    std::vector<StTensor> tensors_;
    std::unordered_map<std::string, size_t> by_name_;
};

// Bytes per element of a safetensors dtype string, or 0 when unknown.
size_t st_dtype_size(const std::string & dtype);

}  // namespace lb
