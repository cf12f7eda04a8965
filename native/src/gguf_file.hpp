// gguf_file.hpp: one GGUF file, opened, checked and memory-mapped (the file format only; what
// the tensors mean is gguf_target's business).
//
// open() checks, each failure one line: the file exists and is readable (LB_E_IO), starts with the
// GGUF magic (LB_E_FORMAT), has a parseable header (LB_E_FORMAT), and holds every tensor's bytes
// (LB_E_FORMAT "truncated"). Metadata getters throw LB_E_FORMAT for a missing required key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml-cpp.h"
#include "ggml.h"

namespace lb {

class GgufFile {
public:
    explicit GgufFile(const std::string & path);  // opens, validates and maps (see above)
    ~GgufFile();
    GgufFile(const GgufFile &) = delete;
    GgufFile & operator=(const GgufFile &) = delete;

    const std::string & path() const { return path_; }
    size_t size() const { return size_; }  // bytes of the file (all of it is mapped)
    std::string where() const { return "target '" + path_ + "'"; }  // message prefix

    // metadata; required keys throw when absent, optional ones return dflt
    bool has_key(const std::string & key) const;
    bool is_array(const std::string & key) const;
    std::string get_str(const std::string & key) const;  // required
    uint32_t get_u32(const std::string & key, bool required, uint32_t dflt = 0) const;  // any int width
    float get_f32(const std::string & key, bool required, float dflt = 0.0f) const;
    std::vector<int64_t> get_ints(const std::string & key) const;  // required; int or bool array

    // tensors: id < 0 when absent
    int64_t find_tensor(const std::string & name) const;
    const int64_t * tensor_ne(int64_t id) const;  // GGML_MAX_DIMS entries
    ggml_type tensor_type(int64_t id) const;
    const void * tensor_data(int64_t id) const;   // inside the mapping

    // Hands the mapping to the caller for zero-copy use: it stays mapped after this object is
    // gone (tensor_data pointers remain valid) and the caller munmap()s it when done.
    void * adopt_map(size_t * size);

private:
    int64_t key_id(const std::string & key, bool required) const;

    std::string path_;
    int fd_ = -1;
    void * map_ = nullptr;
    size_t size_ = 0;
    bool owns_map_ = true;
    gguf_context_ptr gguf_;
};

}  // namespace lb
